"""The render path's choice (``backends.choice``), its settings, and what the general path does
in front of vLLM (``backends.vllm.forwarding``: media URLs fetched under mmprep's rules and inlined)."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
from typing import Any

import pytest

from mmprep_runtime import errors
from mmprep_runtime.backends import choice
from mmprep_runtime.backends.vllm import forwarding, worker_pool
from mmprep_runtime.backends.vllm.worker_pool import vllm_options
from mmprep_runtime.httpio import fetching
from mmprep_runtime.settings import FetchSettings, RenderSettings, SettingsError, render_settings_from_args


@pytest.mark.parametrize(
    ("setting", "processor", "vllm", "primary", "fallback"),
    [
        ("auto", "Qwen2VLProcessor", "0.33.0", "native", True),
        ("auto", "Qwen2_5_VLProcessor", "0.33.0", "native", True),
        ("auto", "Qwen2_5_VLProcessor", None, "native", False),
        ("auto", "Qwen3VLProcessor", "0.33.0", "native", True),
        ("auto", "Gemma3Processor", "0.33.0", "native", True),
        ("auto", "Glm4vProcessor", "0.33.0", "native", True),
        ("auto", "PixtralProcessor", "0.33.0", "native", True),
        ("auto", "LlavaOnevisionProcessor", "0.33.0", "native", True),
        ("auto", "InternVLProcessor", "0.33.0", "native", True),
        ("auto", "Idefics3Processor", "0.33.0", "native", True),
        ("auto", "Qwen2AudioProcessor", "0.33.0", "native", True),
        ("auto", "LlavaProcessor", "0.33.0", "general", False),
        ("auto", "LlavaProcessor", None, "native", False),
        ("native", "LlavaProcessor", "0.33.0", "native", False),
        ("general", "Qwen2VLProcessor", "0.33.0", "general", False),
    ],
)
def test_the_path_follows_the_family_and_what_is_installed(
    setting: str, processor: str, vllm: str | None, primary: str, fallback: bool
) -> None:
    path = choice.choose(setting, processor, vllm)
    assert (path.primary, path.general_fallback) == (primary, fallback)
    assert processor in path.reason or setting != "auto"
    assert path.needs_general == (primary == "general" or fallback)


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["--reasoning-parser", "qwen3"], "--reasoning-parser"),
        (["--chat-template=/t.jinja"], "--chat-template"),
        (["--default-chat-template-kwargs", "{}"], "--default-chat-template-kwargs"),
    ],
)
def test_a_vllm_option_the_native_path_does_not_implement_sends_a_native_family_to_vllm(args: list[str], name: str) -> None:
    path = choice.choose("auto", "Qwen2_5_VLProcessor", "0.33.0", ["--limit-mm-per-prompt", "{}", *args])
    assert (path.primary, path.general_fallback) == ("general", False) and name in path.reason, path
    with pytest.raises(choice.NoRenderPath, match=f"--render-path native does not implement {name}"):
        choice.choose("native", "Qwen2_5_VLProcessor", "0.33.0", args)
    # The tool options change only requests with tools, which the general path answers already.
    tools = choice.choose("auto", "Qwen2_5_VLProcessor", "0.33.0", ["--tool-call-parser", "hermes", "--enable-auto-tool-choice"])
    assert (tools.primary, tools.general_fallback) == ("native", True)


def test_the_general_path_without_vllm_is_refused_with_the_way_out() -> None:
    with pytest.raises(choice.NoRenderPath, match=r"mmprep\[vllm\]"):
        choice.choose("general", "LlavaProcessor", None)


def test_a_family_without_a_native_path_and_no_vllm_says_what_it_serves() -> None:
    assert "text only" in choice.choose("auto", "LlavaProcessor", None).reason


def _args(**values: Any) -> argparse.Namespace:
    return argparse.Namespace(**values)


def test_render_settings_from_flags_and_env() -> None:
    settings = render_settings_from_args(
        _args(render_path="general", render_processes=3, vllm_args="--limit-mm-per-prompt '{\"image\": 4}'"), {}
    )
    assert (settings.path, settings.processes) == ("general", 3)
    assert settings.vllm_args == ("--limit-mm-per-prompt", '{"image": 4}')
    from_env = render_settings_from_args(
        _args(), {"MMPREP_RENDER_PATH": "native", "MMPREP_RENDER_PROCESSES": "2", "MMPREP_VLLM_ARGS": "--max-num-seqs 4"}
    )
    assert (from_env.path, from_env.processes, from_env.vllm_args) == ("native", 2, ("--max-num-seqs", "4"))
    assert render_settings_from_args(_args(), {}).path == "auto"


def test_the_api_key_comes_from_its_flag_or_vllms_env_and_never_from_vllm_args() -> None:
    def parsed(environ: dict[str, str], **flags: Any) -> RenderSettings:
        return render_settings_from_args(argparse.Namespace(**flags), environ)

    assert parsed({}).api_key is None
    assert parsed({"VLLM_API_KEY": "from-env"}).api_key == "from-env"
    assert parsed({"VLLM_API_KEY": "from-env"}, api_key="from-flag").api_key == "from-flag"
    assert "from-flag" not in repr(parsed({}, api_key="from-flag")), "the key is never printed"
    with pytest.raises(SettingsError, match="--api-key"):
        parsed({}, vllm_args="--api-key k")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"render_path": "fast"}, "--render-path must be one of auto, native, general"),
        ({"render_processes": 0}, "--render-processes must be positive"),
        ({"vllm_args": "--chat-template 'unclosed"}, "--vllm-args cannot be split"),
    ],
)
def test_bad_render_settings_say_which(values: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        render_settings_from_args(_args(**values), {})


def test_vllms_options_mirror_mmprep_settings_and_the_given_ones_come_last() -> None:
    settings = RenderSettings(served_model_name="qwen", max_model_len=4096, normalized_pixels=True, vllm_args=("--x", "1"))
    assert vllm_options(settings) == [
        "--served-model-name",
        "qwen",
        "--max-model-len",
        "4096",
        "--no-mm-device-do-normalize",
        "--x",
        "1",
    ]
    assert vllm_options(RenderSettings()) == []


class _FakeFetcher(fetching.Fetcher):
    """The real URL checks, a canned body instead of the network."""

    def __init__(self, bodies: dict[str, bytes]) -> None:
        super().__init__(FetchSettings())
        self.bodies = bodies
        self.fetched: list[str] = []

    async def fetch(self, url: str, what: str) -> bytes:
        self._check_url(url, what)
        self.fetched.append(url)
        return self.bodies[url]


def _chat(*parts: dict[str, Any]) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "hi"}]}]}).encode()


def test_media_urls_are_fetched_here_and_handed_on_as_data_uris() -> None:
    fetcher = _FakeFetcher({"https://example.com/a.jpg": b"JPEG", "https://example.com/v.mp4": b"MP4"})
    body = _chat(
        {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}},
        {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    )
    out = json.loads(asyncio.run(forwarding.prepare(body, fetcher))[0])
    urls = [p[p["type"]]["url"] for p in out["messages"][0]["content"] if p["type"] != "text"]
    assert urls == [
        "data:application/octet-stream;base64," + base64.b64encode(b"JPEG").decode(),
        "data:application/octet-stream;base64," + base64.b64encode(b"MP4").decode(),
        "data:image/png;base64,AAAA",
    ]
    assert fetcher.fetched == ["https://example.com/a.jpg", "https://example.com/v.mp4"]


def test_anthropic_and_responses_media_urls_are_fetched_here_too() -> None:
    fetcher = _FakeFetcher({"https://example.com/a.jpg": b"JPEG", "https://example.com/b.jpg": b"JPEG2"})
    inlined = "data:application/octet-stream;base64,"
    anthropic = {
        "model": "m",
        "max_tokens": 4,
        "messages": [
            {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}}]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": [{"type": "image", "source": {"type": "url", "url": "https://example.com/b.jpg"}}],
                    }
                ],
            },
        ],
    }
    out = json.loads(asyncio.run(forwarding.prepare(json.dumps(anthropic).encode(), fetcher))[0])
    assert out["messages"][0]["content"][0]["source"]["url"] == inlined + base64.b64encode(b"JPEG").decode()
    assert out["messages"][1]["content"][0]["content"][0]["source"]["url"] == inlined + base64.b64encode(b"JPEG2").decode()
    responses = {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.jpg"}]}]}
    out = json.loads(asyncio.run(forwarding.prepare(json.dumps(responses).encode(), fetcher))[0])
    assert out["input"][0]["content"][0]["image_url"].startswith(inlined)
    private = {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://10.0.0.1/x.jpg"}]}]}
    with pytest.raises(errors.RequestError, match=r"input\[0\]\.content\[0\]\.image_url.*not a public address"):
        asyncio.run(forwarding.prepare(json.dumps(private).encode(), fetcher))


def test_a_local_file_url_is_a_400_unless_vllm_may_read_a_folder() -> None:
    body = _chat({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}})
    with pytest.raises(errors.BadMedia, match=r"messages\[0\]\.content\[0\]\.image_url: cannot load local files") as caught:
        asyncio.run(forwarding.prepare(body, _FakeFetcher({})))
    assert caught.value.status == 400
    # Given --allowed-local-media-path, vLLM's own rules decide (the body goes on as it came).
    assert asyncio.run(forwarding.prepare(body, _FakeFetcher({}), local_files=True))[0] is body


def test_a_body_without_urls_goes_on_byte_for_byte() -> None:
    body = _chat({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}})
    sent, parsed = asyncio.run(forwarding.prepare(body, _FakeFetcher({})))
    assert sent is body and parsed == json.loads(body)
    assert asyncio.run(forwarding.prepare(b"{not json http", _FakeFetcher({}))) == (b"{not json http", None)


def test_a_private_address_is_refused_before_vllm_sees_it() -> None:
    body = _chat({"type": "audio_url", "audio_url": {"url": "http://169.254.169.254/latest/meta-data"}})
    with pytest.raises(errors.RequestError, match="not a public address"):
        asyncio.run(forwarding.prepare(body, _FakeFetcher({})))


def test_a_url_spelled_with_json_escapes_is_fetched_here_too() -> None:
    # vLLM reads "\u0068ttp" as "http": a URL hidden that way must meet mmprep's rules all the same.
    body = _chat({"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data"}})
    escaped = body.replace(b'"http://', b'"\\u0068ttp\\u003a//')
    assert b"http" not in escaped and json.loads(escaped) == json.loads(body)
    with pytest.raises(errors.RequestError, match="not a public address"):
        asyncio.run(forwarding.prepare(escaped, _FakeFetcher({})))
    fetcher = _FakeFetcher({"https://example.com/a.jpg": b"JPEG"})
    public = _chat({"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}}).replace(b'"https', b'"\\u0068ttps')
    out = json.loads(asyncio.run(forwarding.prepare(public, fetcher))[0])
    assert out["messages"][0]["content"][0]["image_url"]["url"].startswith("data:") and fetcher.fetched == [
        "https://example.com/a.jpg"
    ]


def _audio_body(*parts: dict[str, Any]) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "?"}]}]}).encode()


def _after_vllm(status: int, body: bytes, fetcher: Any = None) -> None:
    """What the front does with vLLM's answer ``status`` to ``body``: returns when it passes on."""
    _, parsed = asyncio.run(forwarding.prepare(body, fetcher or _FakeFetcher({})))
    forwarding.check_server_error(status, parsed)


def test_a_server_error_over_a_clip_no_decoder_opens_is_a_400_naming_the_part(monkeypatch: pytest.MonkeyPatch) -> None:
    # The decoders are vLLM's (its virtualenv has them; this one does not): stand-ins here, the real
    # ones in tests/compat. Each clip reaches the check decoded from base64.
    seen: list[bytes] = []

    def problem(clip: bytes) -> str | None:
        seen.append(clip)
        return "No 'data' chunk marker" if clip.startswith(b"BAD") else None

    monkeypatch.setattr(forwarding.decoding, "audio_decode_problem", problem)
    good = {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF ok").decode(), "format": "wav"}}
    bad_url = {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64," + base64.b64encode(b"BAD").decode()}}
    # An answer vLLM rendered needs no second opinion: no clip is opened.
    for status in (200, 400, 499):
        _after_vllm(status, _audio_body(good, bad_url))
    assert seen == []
    _after_vllm(500, _audio_body(good))  # every clip opens: vLLM's 500 stands
    with pytest.raises(errors.BadMedia, match=r"messages\[0\]\.content\[1\]\.audio_url: the audio cannot be decoded: No 'data'"):
        _after_vllm(500, _audio_body(good, bad_url))
    assert seen == [b"RIFF ok", b"RIFF ok", b"BAD"]


def test_a_fetched_audio_url_is_checked_once_inlined(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forwarding.decoding, "audio_decode_problem", lambda clip: "truncated" if clip == b"BAD" else None)
    fetcher = _FakeFetcher({"https://example.com/a.wav": b"BAD"})
    body = _audio_body({"type": "audio_url", "audio_url": {"url": "https://example.com/a.wav"}})
    with pytest.raises(errors.BadMedia, match=r"messages\[0\]\.content\[0\]\.audio_url: the audio cannot be decoded: truncated"):
        _after_vllm(503, body, fetcher)
    assert fetcher.fetched == ["https://example.com/a.wav"]


def test_audio_the_check_cannot_read_is_left_to_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forwarding.decoding, "audio_decode_problem", lambda clip: "never called")
    # Not base64, a data URI that is not base64, no audio at all, not JSON: vLLM's own answer stands.
    for body in (
        _audio_body({"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}}),
        _audio_body({"type": "audio_url", "audio_url": {"url": "data:audio/wav,RIFF"}}),
        _audio_body({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}),
        b"{not json input_audio",
    ):
        _after_vllm(500, body)


def test_without_an_audio_decoder_installed_nothing_is_refused() -> None:
    # This virtualenv has neither soundfile nor PyAV (vLLM's does): the check stands aside.
    assert forwarding.decoding.audio_decode_problem(b"definitely not audio") is None


def test_the_render_sockets_go_where_their_paths_fit(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    # A deep temp folder (an emptyDir mounted under a long path) would fail vLLM's bind.
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    monkeypatch.setattr(worker_pool.tempfile, "tempdir", str(deep))
    made = worker_pool._socket_dir(processes=4)
    try:
        assert not made.startswith(str(deep)) and len(os.path.join(made, "w3.sock")) <= 107, made
    finally:
        os.rmdir(made)
    shallow = tmp_path / "s"
    shallow.mkdir()
    monkeypatch.setattr(worker_pool.tempfile, "tempdir", str(shallow))
    assert worker_pool._socket_dir(processes=4).startswith(str(shallow))


@pytest.mark.parametrize(
    ("vllm_args", "serves"),
    [((), True), (("--tool-call-parser", "no-such-parser", "--enable-auto-tool-choice"), False)],
    ids=["no vLLM options: the native path serves on", "vLLM options given: the start fails"],
)
def test_a_fallback_that_cannot_start_stops_the_server_only_when_vllm_options_were_given(
    monkeypatch: pytest.MonkeyPatch, vllm_args: tuple[str, ...], serves: bool
) -> None:
    from types import SimpleNamespace

    from mmprep_runtime.backends import assembly
    from mmprep_runtime.backends.native.backend import NativeBackend
    from mmprep_runtime.settings import ModelSettings, ServeSettings

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise assembly.Unavailable("vLLM's render server exited with 1 while starting: no-such-parser")

    monkeypatch.setattr(assembly.VllmBackend, "start", refuse)
    monkeypatch.setattr(assembly.versions, "vllm_version", lambda: "0.33.0")
    settings = ServeSettings(ModelSettings("m"), render=RenderSettings(vllm_args=vllm_args))
    engine: Any = SimpleNamespace(facts=SimpleNamespace(processor_class="Qwen2_5_VLProcessor"))
    fetcher = fetching.Fetcher(FetchSettings())
    if not serves:
        with pytest.raises(assembly.Unavailable, match="no-such-parser"):
            assembly.start(settings, engine, object(), fetcher)  # type: ignore[arg-type]
        return
    rendering = assembly.start(settings, engine, object(), fetcher)  # type: ignore[arg-type]
    assert isinstance(rendering.backend, NativeBackend)
    assert rendering.path.general_fallback is False and "the fallback did not start: vLLM" in rendering.path.reason
