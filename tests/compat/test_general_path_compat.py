"""The render tier against vLLM's own render server, for every family ``make-model`` builds.

For each family (``mmprep_runtime.synthetic.families``: weight-less folders with real processor
classes, small tokenizers and the published image sizes), both servers start once on the same
folder, from vLLM's virtualenv (``hack/vllm/venv.sh``; mmprep's general path runs vLLM's own
processing, so it runs there too):
- ``vllm launch render``, its processor cache off;
- ``mmprep-runtime serve --render-path auto``: Qwen2.5-VL and Qwen3-VL on mmprep's native fast path
  with the general path beside it for what the fast path does not render (their video), every
  other family on the general path (vLLM's render server in mmprep's worker processes).

Every case goes to both, by the modalities the family takes: one image, images of different sizes
and formats, an image URL (mmprep fetches it under its own rules and hands vLLM the bytes; vLLM
fetches it itself); a video of JPEG frames; one audio clip (``input_audio``), clips of different
lengths, an audio URL; and for every family text only and a completion prompt. vLLM's own models and
kwargs decoder (``support/vllm_check.py``, run once in vLLM's virtualenv over every answer) judge
each pair: token ids, placeholders, mm_hashes, sampling params and every decoded tensor equal
(request ids aside). A control pair with one token changed must be caught.
"""

from __future__ import annotations

import base64
import json
import pathlib
from typing import Any, Final

import pytest
from support.kube import REPO
from support.render_servers import Server, data_uri, rgba_png, vllm_check
from support.servers import free_port, vllm_render_command, vllm_render_env

from mmprep_runtime.synthetic import families, media, models

# Two servers start per family on a 2-core machine (vLLM's import and warm-up: 15-50 s each).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

FAMILIES = list(families.FAMILIES)
AUDIO_FAMILIES = [kind for kind, family in families.FAMILIES.items() if family.chat.audio]
CHAT = "/v1/chat/completions/render"
SYSTEM = {"role": "system", "content": [{"type": "text", "text": "Answer in one sentence."}]}
#: The families whose processor class has mmprep's native fast path (and the general one beside it).
NATIVE_FAMILIES = {"qwen2.5-vl", "qwen3-vl"}


def _image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _wav_part(seconds: float) -> dict[str, Any]:
    """OpenAI's inline audio part: base64 WAV bytes and their format."""
    encoded = data_uri(media.wav(seconds), "audio/wav").split(",", 1)[1]
    return {"type": "input_audio", "input_audio": {"data": encoded, "format": "wav"}}


def _image_cases(media_url: str) -> dict[str, tuple[str, dict[str, Any]]]:
    one = data_uri(media.jpeg(640, 480, seed=1), "image/jpeg")
    mixed = [data_uri(media.jpeg(320, 240, seed=2), "image/jpeg"), data_uri(rgba_png(200, 300), "image/png")]
    return {
        "one image": (
            CHAT,
            {"messages": [SYSTEM, {"role": "user", "content": [_image(one), {"type": "text", "text": "Describe this."}]}]},
        ),
        "images of different sizes and formats": (
            CHAT,
            {
                "messages": [
                    {
                        "role": "user",
                        # Text between the images, as people write: (Gemma 3's image markers would
                        # otherwise touch, which vLLM itself refuses.)
                        "content": [
                            {"type": "text", "text": "Compare"},
                            _image(mixed[0]),
                            {"type": "text", "text": "with"},
                            _image(mixed[1]),
                        ],
                    }
                ],
                "max_tokens": 16,
            },
        ),
        "an image URL": (
            CHAT,
            {"messages": [{"role": "user", "content": [_image(f"{media_url}/photo.jpg"), {"type": "text", "text": "Read it."}]}]},
        ),
    }


def _video_cases() -> dict[str, tuple[str, dict[str, Any]]]:
    frames = ",".join(data_uri(media.jpeg(320, 240, seed=s), "x").split(",", 1)[1] for s in range(8))
    video = {"type": "video_url", "video_url": {"url": f"data:video/jpeg;base64,{frames}"}}
    return {
        "a video of JPEG frames": (
            CHAT,
            {"messages": [{"role": "user", "content": [video, {"type": "text", "text": "What happens?"}]}], "max_tokens": 8},
        )
    }


def _audio_cases(media_url: str) -> dict[str, tuple[str, dict[str, Any]]]:
    clip_url = {"type": "audio_url", "audio_url": {"url": f"{media_url}/clip.wav"}}
    return {
        "one audio clip": (
            CHAT,
            {"messages": [SYSTEM, {"role": "user", "content": [_wav_part(1.0), {"type": "text", "text": "What is it?"}]}]},
        ),
        "audio clips of different lengths": (
            CHAT,
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "Compare"},
                            _wav_part(0.5),
                            {"type": "text", "text": "with"},
                            _wav_part(2.5),
                        ],
                    }
                ],
                "max_tokens": 16,
            },
        ),
        "an audio URL": (CHAT, {"messages": [{"role": "user", "content": [clip_url, {"type": "text", "text": "Hear it."}]}]}),
    }


#: A WAV cut off inside its header: neither server can decode it.
_TRUNCATED_WAV: Final = {"data": base64.b64encode(media.wav(1.0)[:30]).decode(), "format": "wav"}
CORRUPT_AUDIO: Final = {
    "messages": [
        {
            "role": "user",
            "content": [{"type": "input_audio", "input_audio": _TRUNCATED_WAV}, {"type": "text", "text": "What is it?"}],
        }
    ]
}


def cases(kind: str, media_url: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every request sent to both servers for ``kind``: those of each modality it takes, text only
    and a completion prompt."""
    chat = families.FAMILIES[kind].chat
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    if chat.image:
        out.update(_image_cases(media_url))
    if chat.video:
        out.update(_video_cases())
    if chat.audio:
        out.update(_audio_cases(media_url))
    out["text only"] = (CHAT, {"messages": [SYSTEM, {"role": "user", "content": "The quick brown fox jumps."}]})
    out["a completion prompt"] = ("/v1/completions/render", {"prompt": "The quick brown fox", "max_tokens": 5})
    return out


def _mmprep(venv: pathlib.Path, model: pathlib.Path, log: pathlib.Path) -> Server:
    command = [str(venv / "bin" / "python"), "-m", "mmprep_runtime.cli", "serve", "--model", str(model)]
    command += ["--host", "127.0.0.1", "--port", str(free_port()), "--render-path", "auto", "--render-processes", "1"]
    command += ["--fetch-allowed-networks", "127.0.0.1/32", "--vllm-args", "--mm-processor-cache-gb 0"]
    env = {**vllm_render_env(), "PYTHONPATH": str(REPO / "runtime")}
    return Server("mmprep", command, env, "/health", log)


def _vllm(venv: pathlib.Path, model: pathlib.Path, log: pathlib.Path) -> Server:
    return Server(
        "vLLM render", vllm_render_command(venv, model, free_port(), normalized=False), vllm_render_env(), "/health", log
    )


@pytest.fixture(scope="module")
def compared(vllm_venv: pathlib.Path, media_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Per family: both servers started once, every case sent to both, the answers kept; then
    vLLM's checker run once over all of them (importing vLLM takes seconds)."""
    work = tmp_path_factory.mktemp("general-compat")
    manifest: dict[str, list[str]] = {}
    found: dict[str, Any] = {"statuses": {}, "info": {}, "errors": {}, "work": work}
    found.update({"corrupt audio": {}, "after corrupt audio": {}})
    for kind in FAMILIES:
        folder = models.make_model(kind, work / kind)
        vllm, mmprep = (
            _vllm(vllm_venv, folder, work / f"{kind}.vllm.log"),
            _mmprep(vllm_venv, folder, work / f"{kind}.mmprep.log"),
        )
        try:
            vllm.wait()
            mmprep.wait()
            found["info"][kind] = mmprep.get("/v1/info")[1]
            for name, (path, body) in cases(kind, media_server).items():
                ours_status, ours = mmprep.post(path, body)
                theirs_status, theirs = vllm.post(path, body)
                found["statuses"][(kind, name)] = (ours_status, theirs_status, json.dumps(ours)[:1500], json.dumps(theirs)[:1500])
                slug = f"{kind}--{name.replace(' ', '-')}"
                (work / f"{slug}.ours.json").write_text(json.dumps(ours))
                (work / f"{slug}.vllm.json").write_text(json.dumps(theirs))
                if ours_status == theirs_status == 200:
                    manifest[f"{kind}: {name}"] = [str(work / f"{slug}.ours.json"), str(work / f"{slug}.vllm.json")]
            bad = {"messages": [{"role": "user", "content": [{"type": "video_frame", "x": 1}]}]}
            found["errors"][kind] = (mmprep.post(CHAT, bad), vllm.post(CHAT, bad))
            if kind in AUDIO_FAMILIES:
                found["corrupt audio"][kind] = (mmprep.post(CHAT, CORRUPT_AUDIO), vllm.post(CHAT, CORRUPT_AUDIO))
                found["after corrupt audio"][kind] = mmprep.post(CHAT, cases(kind, media_server)["one audio clip"][1])[0]
        finally:
            mmprep.stop()
            vllm.stop()
    # The control: a copy of one good answer with one token changed must not pass.
    first = next(iter(manifest.values()))
    tampered = json.loads(pathlib.Path(first[0]).read_text())
    tampered["token_ids"][-1] += 1
    (work / "control.ours.json").write_text(json.dumps(tampered))
    manifest["control: one token changed"] = [str(work / "control.ours.json"), first[1]]
    (work / "manifest.json").write_text(json.dumps(manifest))
    found["results"] = vllm_check(vllm_venv, work / "manifest.json")
    return found


CASES = [(kind, name) for kind in FAMILIES for name in cases(kind, "http://unused")]


@pytest.mark.parametrize(("kind", "case"), CASES, ids=[f"{k}: {c}" for k, c in CASES])
def test_mmprep_answers_what_vllm_answers(compared: dict[str, Any], kind: str, case: str) -> None:
    ours_status, theirs_status, ours, theirs = compared["statuses"][(kind, case)]
    assert theirs_status == 200, f"vLLM answered {theirs_status}: {theirs}; see {compared['work']}"
    assert ours_status == 200, f"mmprep answered {ours_status}: {ours}; see {compared['work']}"
    result = compared["results"][f"{kind}: {case}"]
    assert result["ok"], "\n".join(result["problems"])


def test_a_wrong_answer_is_caught(compared: dict[str, Any]) -> None:
    result = compared["results"]["control: one token changed"]
    assert not result["ok"] and any("token_ids" in p for p in result["problems"]), result


@pytest.mark.parametrize("kind", FAMILIES)
def test_info_says_which_path_serves_the_model_and_why(compared: dict[str, Any], kind: str) -> None:
    render = compared["info"][kind]["vllm_render"]
    assert render["vllm_version"] == compared["info"][kind]["versions"]["vllm"]
    if kind in NATIVE_FAMILIES:
        assert (render["path"], render["general_fallback"]) == ("native", True), render
        assert "native fast path" in render["path_reason"]
    else:
        assert (render["path"], render["general_fallback"]) == ("general", False), render
        assert "no native fast path" in render["path_reason"]
        assert render["general"]["processes"] == 1 and render["general"]["ready_processes"] == 1


@pytest.mark.parametrize("kind", FAMILIES)
def test_a_refused_request_gets_vllms_error(compared: dict[str, Any], kind: str) -> None:
    (ours_status, ours), (theirs_status, theirs) = compared["errors"][kind]
    assert ours_status == theirs_status == 400, (ours, theirs)
    assert set(ours["error"]) == set(theirs["error"]) and ours["error"]["code"] == theirs["error"]["code"], (ours, theirs)


@pytest.mark.parametrize("kind", AUDIO_FAMILIES)
def test_a_corrupt_audio_clip_is_a_400_naming_it_and_the_pool_serves_on(compared: dict[str, Any], kind: str) -> None:
    (ours_status, ours), (theirs_status, theirs) = compared["corrupt audio"][kind]
    # vLLM 0.33 answers 500 (its decoder's error escapes as a server error): a client would retry
    # what never succeeds. mmprep says 400 in vLLM's error shape, naming the part and the cause.
    assert theirs_status >= 400, (theirs_status, theirs)
    assert ours_status == 400, (ours_status, ours)
    assert set(ours["error"]) == set(theirs["error"]), (ours, theirs)
    assert "messages[0].content[0].input_audio: the audio cannot be decoded" in ours["error"]["message"], ours
    assert compared["after corrupt audio"][kind] == 200
