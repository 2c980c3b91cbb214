"""The render tier against vLLM's own render server, for every family ``make-model`` builds.

For each family (``mmprep_runtime.synthetic.families``: weight-less folders with real processor
classes, small tokenizers and the published image sizes), both servers start once on the same
folder, from vLLM's virtualenv (``hack/vllm/venv.sh``; mmprep's general path runs vLLM's own
processing, so it runs there too):
- ``vllm launch render``, its processor cache off;
- ``mmprep-runtime serve --render-path auto``: Qwen2.5-VL, Qwen3-VL, GLM-4.1V, Gemma 3 and Mistral 3 on
  mmprep's native fast path with the general path beside it for what the fast path does not render
  (video), every other family on the general path (vLLM's render server in mmprep's worker
  processes; LLaVA-OneVision's reasoning parser sends it there here).

Every case goes to both, by the modalities the family takes: one image, images of different sizes
and formats, an image URL (mmprep fetches it under its own rules and hands vLLM the bytes; vLLM
fetches it itself); a video of JPEG frames; one audio clip (``input_audio``), clips of different
lengths, an audio URL; and for every family text only and a completion prompt. vLLM's own models and
kwargs decoder (``support/vllm_check.py``, run once in vLLM's virtualenv over every answer) judge
each pair: token ids, placeholders, mm_hashes, sampling params and every decoded tensor equal
(request ids aside). A control pair with one token changed must be caught.

The rest of vLLM's render server goes to the same two servers: the Anthropic Messages and
Responses renders (judged as above), ``/tokenize``, ``/detokenize``, and the chat and completion
derenders, whole and streamed (1-3 tokens a call, each server's ``stream_state`` carried; one
stream begun at vLLM and finished at mmprep), compared answer by answer with vLLM's; with vLLM's
Hermes tool parser and Qwen3 reasoning parser on the families in ``PARSERS``, a tool call and a
reasoning block too; and bad bodies, which must get vLLM's status and error shape.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
from typing import Any, Final

import pytest
from support import openai_answers, token_routes
from support.kube import REPO
from support.render_servers import Server, data_uri, rgba_png, vllm_check
from support.servers import free_port, runtime_command, vllm_render_command, vllm_render_env
from support.tools import WEATHER_TOOL

from mmprep_runtime.synthetic import families, media, models

# Two servers start per family on a 2-core machine (vLLM's import and warm-up: 15-50 s each).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

#: MMPREP_COMPAT_FAMILIES=qwen2.5-vl,gemma3 narrows a run to those families (while developing).
FAMILIES = [k for k in families.FAMILIES if k in (os.environ.get("MMPREP_COMPAT_FAMILIES") or k).split(",")]
AUDIO_FAMILIES = [kind for kind in FAMILIES if families.FAMILIES[kind].chat.audio]
CHAT = "/v1/chat/completions/render"
MESSAGES = "/v1/messages/render"
RESPONSES = "/v1/responses/render"
SYSTEM = token_routes.SYSTEM
#: The families served on mmprep's native fast path here (and the general one beside it).
NATIVE_FAMILIES = {"qwen2.5-vl", "qwen3-vl", "glm4v", "gemma3", "mistral3", "internvl", "idefics3"}
#: Native families whose images (Qwen2-Audio: audio clips) are also rendered by mmprep without vLLM
#: (the default image: this virtualenv's transformers, not vLLM's pin) and judged against vLLM's
#: answers; Qwen2-VL's are in test_vllm_render_compat.
WITHOUT_VLLM: Final = ("gemma3", "glm4v", "mistral3", "llava-onevision", "internvl", "idefics3", "qwen2-audio")
#: Native families whose options here (``PARSERS``: a reasoning parser) send them to vLLM's
#: processing; the server without vLLM (``WITHOUT_VLLM``) renders them natively.
SENT_TO_VLLM = {"llava-onevision", "qwen2-audio"}


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


def _user(*content: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": list(content)}]}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _gemma_newline_cases() -> dict[str, tuple[str, dict[str, Any]]]:
    """Gemma 3 puts two newlines on each side of an image, and its tokenizer merges newlines that
    meet: vLLM then finds each image sequence across the merged tokens."""
    one = data_uri(media.jpeg(320, 240, seed=5), "image/jpeg")
    return {
        "an image between paragraphs": (CHAT, _user(_text("Look:\n\n"), _image(one), _text("\n\nWhat is it?\n"))),
        "an image last": (CHAT, _user(_text("Look at this"), _image(one))),
    }


#: Gemma 3 bodies vLLM cannot render, each with the status vLLM 0.33 answers and mmprep's: two
#: images that touch (their newlines merge: vLLM's placeholders overlap, which its request model
#: refuses) and a newline right before an image (the merged newlines hide the sequence: vLLM's
#: processor fails with a 500; mmprep says 422, an answer about this body, not a server error).
GEMMA_UNRENDERABLE: Final = {
    "two images that touch": (400, 400),
    "a newline right before an image": (500, 422),
}


def _touching_images() -> dict[str, Any]:
    one, two = data_uri(media.jpeg(320, 240, seed=6), "image/jpeg"), data_uri(media.jpeg(200, 300, seed=7), "image/jpeg")
    return _user(_image(one), _image(two), _text("Compare them."))


def _gemma_unrenderable() -> dict[str, dict[str, Any]]:
    one = data_uri(media.jpeg(320, 240, seed=6), "image/jpeg")
    return {
        "two images that touch": _touching_images(),
        "a newline right before an image": _user(_text("Look:\n"), _image(one), _text("\nWhat is it?")),
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
    if kind == "gemma3":
        out.update(_gemma_newline_cases())
    out["text only"] = (CHAT, {"messages": [SYSTEM, {"role": "user", "content": "The quick brown fox jumps."}]})
    out["a completion prompt"] = ("/v1/completions/render", {"prompt": "The quick brown fox", "max_tokens": 5})
    out.update(_other_protocol_cases(media_url, image=chat.image))
    return out


def _other_protocol_cases(media_url: str, *, image: bool) -> dict[str, tuple[str, dict[str, Any]]]:
    """Anthropic Messages and OpenAI Responses renders: vLLM turns both into its chat render."""
    text = "The quick brown fox jumps."
    out = {
        "an Anthropic message": (
            MESSAGES,
            {"max_tokens": 16, "system": "Answer in one sentence.", "messages": [{"role": "user", "content": text}]},
        ),
        "a Responses input": (RESPONSES, {"input": text, "instructions": "Answer in one sentence."}),
    }
    if image:
        source = {"type": "url", "url": f"{media_url}/photo.jpg"}
        out["an Anthropic image URL"] = (
            MESSAGES,
            {
                "max_tokens": 16,
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": source}, {"type": "text", "text": "Read it."}]}
                ],
            },
        )
        one = data_uri(media.jpeg(640, 480, seed=1), "image/jpeg")
        content = [{"type": "input_image", "image_url": one}, {"type": "input_text", "text": "Describe this."}]
        out["a Responses image"] = (RESPONSES, {"input": [{"role": "user", "content": content}]})
    return out


#: vLLM's parsers, given to both servers of these families (their folders have the markers):
#: Qwen2.5-VL keeps the native path with a tool parser (its chat derenders go to vLLM's parser; its
#: renders and completion derenders stay native); Qwen2-Audio and LLaVA-OneVision, two general
#: families, take both parsers, so every chat of theirs goes through vLLM's parsers.
PARSERS: Final = {
    "qwen2.5-vl": ["--tool-call-parser", "hermes", "--enable-auto-tool-choice"],
    "qwen2-audio": ["--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--reasoning-parser", "qwen3"],
    "llava-onevision": ["--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--reasoning-parser", "qwen3"],
}


TOOL_CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
REASONING_TEXT = "<think>The fox is quick.</think>" + token_routes.ANSWER_TEXT


def _parsed_exchanges(mmprep: Server, vllm: Server, *, reasoning: bool) -> dict[str, list[Any]]:
    """A tool call (and, with a reasoning parser, a reasoning block) derendered whole and streamed
    by both servers: vLLM's parsers read the engine's tokens, and mmprep must hand back the same."""
    both: dict[str, list[Any]] = {}
    chat = {
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        "tool_choice": "auto",
    }
    _, prompt = vllm.post("/tokenize", {**chat, "add_generation_prompt": True})
    texts = {"a tool call": TOOL_CALL_TEXT, **({"a reasoning block": REASONING_TEXT} if reasoning else {})}
    for what, text in texts.items():
        _, output = vllm.post("/tokenize", {"prompt": text, "add_special_tokens": False})
        tokens = output["tokens"]
        whole = {
            "generate_response": {"request_id": "r-5", "choices": [{"index": 0, "token_ids": tokens, "finish_reason": "stop"}]},
            "prompt_tokens": len(prompt["tokens"]),
            "prompt_token_ids": prompt["tokens"],
            "chat_request": chat,
        }
        both[f"derender {what}"] = [(mmprep.post(token_routes.DERENDER, whole), vllm.post(token_routes.DERENDER, whole))]
        chunks = [tokens[at : at + 2] for at in range(0, len(tokens), 2)]
        both[f"derender {what}, streamed"] = token_routes.stream_to_both(
            mmprep,
            vllm,
            len(chunks),
            lambda i, state, c=chunks: token_routes.event_body(c[i], i == len(c) - 1, state, prompt["tokens"], chat, "r-6"),
        )
    return both


def _mmprep(venv: pathlib.Path, model: pathlib.Path, log: pathlib.Path, options: list[str]) -> Server:
    command = [str(venv / "bin" / "python"), "-m", "mmprep_runtime.cli", "serve", "--model", str(model)]
    command += ["--host", "127.0.0.1", "--port", str(free_port()), "--render-path", "auto", "--render-processes", "1"]
    command += ["--fetch-allowed-networks", "127.0.0.1/32", "--vllm-args", " ".join(["--mm-processor-cache-gb 0", *options])]
    env = {**vllm_render_env(), "PYTHONPATH": str(REPO / "runtime")}
    return Server("mmprep", command, env, "/health", log)


def _as_vllms_parsers_leave_it(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """The body for the image without vLLM, which takes no parser: where this family's vLLM server
    has a reasoning parser, that parser keeps special tokens in the output (``skip_special_tokens``
    false in the rendered sampling parameters), so the request asks for it itself."""
    return {**body, "skip_special_tokens": False} if "--reasoning-parser" in PARSERS.get(kind, ()) else body


def _mmprep_without_vllm(model: pathlib.Path, log: pathlib.Path) -> Server:
    """mmprep as the default image runs it: this virtualenv (no vLLM; its own transformers)."""
    command = [*runtime_command(), "serve", "--model", str(model), "--host", "127.0.0.1", "--port", str(free_port())]
    return Server("mmprep without vLLM", [*command, "--fetch-allowed-networks", "127.0.0.1/32"], dict(os.environ), "/health", log)


def _vllm(venv: pathlib.Path, model: pathlib.Path, log: pathlib.Path, options: list[str]) -> Server:
    command = vllm_render_command(venv, model, free_port(), normalized=False, options=options)
    return Server("vLLM render", command, vllm_render_env(), "/health", log)


@pytest.fixture(scope="module")
def compared(vllm_venv: pathlib.Path, media_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Per family: both servers started once, every case sent to both, the answers kept; then
    vLLM's checker run once over all of them (importing vLLM takes seconds)."""
    work = tmp_path_factory.mktemp("general-compat")
    manifest: dict[str, list[str]] = {}
    found: dict[str, Any] = {"statuses": {}, "info": {}, "errors": {}, "work": work}
    found.update({"corrupt audio": {}, "after corrupt audio": {}, "token routes": {}, "native token jobs": {}, "probes": {}})
    found["native renders"] = {}
    found["without vLLM"] = {}
    found["touching without vLLM"] = {}
    for kind in FAMILIES:
        folder = models.make_model(kind, work / kind)
        vllm, mmprep = (
            _vllm(vllm_venv, folder, work / f"{kind}.vllm.log", _options(kind)),
            _mmprep(vllm_venv, folder, work / f"{kind}.mmprep.log", _options(kind)),
        )
        plain = _mmprep_without_vllm(folder, work / f"{kind}.plain.log") if kind in WITHOUT_VLLM else None
        try:
            vllm.wait()
            mmprep.wait()
            if plain is not None:
                plain.wait()
            found["info"][kind] = mmprep.get("/v1/info")[1]
            found["probes"][kind] = {path: (mmprep.get(path), vllm.get(path)) for path in (*PROBES, TOKENIZER_INFO)}
            for name, (path, body) in cases(kind, media_server).items():
                if path == MESSAGES:
                    body = {**body, "model": str(folder)}  # Anthropic's model is required: the one served
                jobs = openai_answers.metric(mmprep, "mmprep_processing_seconds_count")
                ours_status, ours = mmprep.post(path, body)
                found["native renders"][(kind, name)] = openai_answers.metric(mmprep, "mmprep_processing_seconds_count") - jobs
                theirs_status, theirs = vllm.post(path, body)
                found["statuses"][(kind, name)] = (ours_status, theirs_status, json.dumps(ours)[:1500], json.dumps(theirs)[:1500])
                slug = f"{kind}--{name.replace(' ', '-')}"
                (work / f"{slug}.ours.json").write_text(json.dumps(ours))
                (work / f"{slug}.vllm.json").write_text(json.dumps(theirs))
                if ours_status == theirs_status == 200:
                    manifest[f"{kind}: {name}"] = [str(work / f"{slug}.ours.json"), str(work / f"{slug}.vllm.json")]
                if plain is not None and (kind, name) in WITHOUT_VLLM_CASES:
                    plain_status, answer = plain.post(path, _as_vllms_parsers_leave_it(kind, body))
                    found["without vLLM"][(kind, name)] = (plain_status, theirs_status, json.dumps(answer)[:1500])
                    (work / f"{slug}.plain.json").write_text(json.dumps(answer))
                    if plain_status == theirs_status == 200:
                        manifest[f"{kind}: {name}, without vLLM"] = [
                            str(work / f"{slug}.plain.json"),
                            str(work / f"{slug}.vllm.json"),
                        ]
            image = bool(families.FAMILIES[kind].chat.image)
            found["token routes"][kind] = token_routes.exchanges(mmprep, vllm, image=image)
            jobs = openai_answers.metric(mmprep, "mmprep_processing_seconds_count")
            mmprep.post("/tokenize", {"messages": [{"role": "user", "content": "Count me."}]})
            mmprep.post("/detokenize", {"tokens": [1, 2, 3]})
            mmprep.post(
                "/v1/completions/derender",
                {"generate_responses": [{"request_id": "r", "choices": [{"index": 0, "token_ids": [1]}]}]},
            )
            whole_chat = {"generate_response": {"request_id": "r", "choices": [{"index": 0, "token_ids": [1]}]}}
            mmprep.post(token_routes.DERENDER, {**whole_chat, "chat_request": {"messages": []}})
            found["native token jobs"][kind] = openai_answers.metric(mmprep, "mmprep_processing_seconds_count") - jobs
            if kind in PARSERS:
                found["token routes"][kind].update(
                    _parsed_exchanges(mmprep, vllm, reasoning="--reasoning-parser" in PARSERS[kind])
                )
            bad = {"messages": [{"role": "user", "content": [{"type": "video_frame", "x": 1}]}]}
            found["errors"][kind] = (mmprep.post(CHAT, bad), vllm.post(CHAT, bad))
            if plain is not None and kind in TOUCHING_WITHOUT_VLLM:
                touching = _touching_images()
                (plain_status, answer), (theirs_status, theirs) = plain.post(CHAT, touching), vllm.post(CHAT, touching)
                found["touching without vLLM"][kind] = (plain_status, theirs_status, answer)
                if plain_status == theirs_status == 200:
                    (work / f"{kind}--touching.plain.json").write_text(json.dumps(answer))
                    (work / f"{kind}--touching.vllm.json").write_text(json.dumps(theirs))
                    pair = [str(work / f"{kind}--touching.plain.json"), str(work / f"{kind}--touching.vllm.json")]
                    manifest[f"{kind}: touching images, without vLLM"] = pair
            if kind == "gemma3":
                found["gemma unrenderable"] = {
                    name: (
                        mmprep.post(CHAT, body),
                        vllm.post(CHAT, body),
                        mmprep.post(CHAT, cases(kind, media_server)["one image"][1]),
                    )
                    for name, body in _gemma_unrenderable().items()
                }
            if kind in AUDIO_FAMILIES:
                found["corrupt audio"][kind] = (mmprep.post(CHAT, CORRUPT_AUDIO), vllm.post(CHAT, CORRUPT_AUDIO))
                found["after corrupt audio"][kind] = mmprep.post(CHAT, cases(kind, media_server)["one audio clip"][1])[0]
        finally:
            if plain is not None:
                plain.stop()
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


def _media_chats(kinds: Any) -> list[tuple[str, str]]:
    """(family, case) of each chat render with images or audio and no video, for ``kinds`` in this run."""
    return [
        (kind, name)
        for kind in FAMILIES
        if kind in kinds
        for name, (path, body) in cases(kind, "http://unused").items()
        if path == CHAT
        and any(part in json.dumps(body) for part in ("image_url", "input_audio", "audio_url"))
        and "video_url" not in json.dumps(body)
    ]


#: The cases a native family renders on its own pool.
NATIVE_IMAGE_CASES = _media_chats(NATIVE_FAMILIES)
WITHOUT_VLLM_CASES = _media_chats(WITHOUT_VLLM)
#: The families without vLLM that take images (two of them touch in one case).
TOUCHING_WITHOUT_VLLM: Final = [kind for kind in WITHOUT_VLLM if kind in FAMILIES and families.FAMILIES[kind].chat.image]
#: Two images with nothing between them, without vLLM and at vLLM: Gemma 3's image sequences then
#: overlap where newlines merge, which vLLM refuses; LLaVA-OneVision's runs of image tokens join
#: into one, which only vLLM's code tells apart (by each image's token count): without vLLM, a 400
#: that says so. The others render them.
TOUCHING_STATUSES: Final = {"gemma3": (400, 400), "llava-onevision": (400, 200)}


@pytest.mark.parametrize(("kind", "case"), WITHOUT_VLLM_CASES, ids=[f"{k}: {c}" for k, c in WITHOUT_VLLM_CASES])
def test_the_image_without_vllm_renders_what_vllm_renders(compared: dict[str, Any], kind: str, case: str) -> None:
    plain_status, theirs_status, answer = compared["without vLLM"][(kind, case)]
    assert plain_status == theirs_status == 200, answer
    result = compared["results"][f"{kind}: {case}, without vLLM"]
    assert result["ok"], "\n".join(result["problems"])


@pytest.mark.parametrize("kind", TOUCHING_WITHOUT_VLLM)
def test_touching_images_without_vllm_are_answered_as_vllm_answers_them(compared: dict[str, Any], kind: str) -> None:
    plain_status, theirs_status, answer = compared["touching without vLLM"][kind]
    assert (plain_status, theirs_status) == TOUCHING_STATUSES.get(kind, (200, 200)), answer
    if kind == "llava-onevision":
        # Its error says which code renders them (the image without vLLM has none to hand them to).
        assert "rendered by vLLM's code" in answer["error"]["message"], answer
    if plain_status == 200:
        result = compared["results"][f"{kind}: touching images, without vLLM"]
        assert result["ok"], "\n".join(result["problems"])


@pytest.mark.parametrize(("kind", "case"), NATIVE_IMAGE_CASES, ids=[f"{k}: {c}" for k, c in NATIVE_IMAGE_CASES])
def test_a_native_familys_images_are_rendered_on_its_own_pool(compared: dict[str, Any], kind: str, case: str) -> None:
    # The answer above is vLLM's either way; this says the native path gave it: its pool's jobs
    # (the processing, and a fetch where the image is a URL) counted, where its fallback counts none.
    assert compared["native renders"][(kind, case)] >= 1


@pytest.mark.parametrize("case", token_routes.CASES)
@pytest.mark.parametrize("kind", FAMILIES)
def test_tokenize_detokenize_and_derender_answer_what_vllm_answers(compared: dict[str, Any], kind: str, case: str) -> None:
    calls = compared["token routes"][kind][case]
    token_routes.assert_each_call_answered_alike(calls)


@pytest.mark.parametrize("kind", FAMILIES)
def test_a_native_family_tokenizes_and_derenders_on_its_own_pool_and_a_general_one_at_vllm(
    compared: dict[str, Any], kind: str
) -> None:
    # The answers above are vLLM's either way; this says which code gave them: a tokenize, a
    # detokenize, a completion derender and a chat derender, the last one vLLM's where a parser
    # is configured (it parses every chat).
    native = 4 - (kind in PARSERS) if kind in NATIVE_FAMILIES else 0
    assert compared["native token jobs"][kind] == native


def test_a_derendered_stream_joins_to_the_whole_answer(compared: dict[str, Any]) -> None:
    for kind, routes in compared["token routes"].items():
        token_routes.assert_stream_joins_to_the_whole_answer(routes, kind)


PARSED_CASES = [
    (kind, case)
    for kind in PARSERS
    if kind in FAMILIES
    for case in ("derender a tool call", "derender a tool call, streamed")
    + (("derender a reasoning block", "derender a reasoning block, streamed") if "--reasoning-parser" in PARSERS[kind] else ())
]


@pytest.mark.parametrize(("kind", "case"), PARSED_CASES, ids=[f"{k}: {c}" for k, c in PARSED_CASES])
def test_parsed_derenders_answer_what_vllm_answers(compared: dict[str, Any], kind: str, case: str) -> None:
    calls = compared["token routes"][kind][case]
    token_routes.assert_each_call_answered_alike(calls)
    if not case.endswith("streamed"):
        # The parser did parse: the comparison above would pass two servers that both did not.
        message = calls[0][1][1]["choices"][0]["message"]
        if "tool call" in case:
            assert message["tool_calls"][0]["function"]["name"] == "get_weather", message
            assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}, message
        else:
            assert (message.get("reasoning") or message.get("reasoning_content")) == "The fox is quick.", message


@pytest.mark.parametrize("case", token_routes.BAD_BODY_CASES)
@pytest.mark.parametrize("kind", FAMILIES)
def test_a_bad_token_route_body_gets_vllms_status_and_error_shape(compared: dict[str, Any], kind: str, case: str) -> None:
    token_routes.assert_answered_with_vllms_error(compared["token routes"][kind][case])


def test_a_wrong_answer_is_caught(compared: dict[str, Any]) -> None:
    result = compared["results"]["control: one token changed"]
    assert not result["ok"] and any("token_ids" in p for p in result["problems"]), result


#: The probes and the model list of vLLM's render server.
PROBES: Final = ("/health", "/version", "/v1/models")
TOKENIZER_INFO: Final = "/tokenizer_info"
#: Families whose servers both get ``--enable-tokenizer-info-endpoint`` (a native one and a general
#: one); the others' answer it 404, as vLLM's server does without the flag.
TOKENIZER_INFO_FAMILIES: Final = ("qwen2.5-vl", "qwen2-audio")


def _options(kind: str) -> list[str]:
    """vLLM's options for both servers of ``kind``."""
    return [*PARSERS.get(kind, []), *(["--enable-tokenizer-info-endpoint"] if kind in TOKENIZER_INFO_FAMILIES else [])]


def _card(models: Any) -> Any:
    """A model list without what is made when a server starts (its times, the permission's id)."""
    return [
        {
            **{k: v for k, v in card.items() if k not in ("created", "permission")},
            "permission": [{k: v for k, v in p.items() if k not in ("created", "id")} for p in card["permission"]],
        }
        for card in models["data"]
    ]


@pytest.mark.parametrize("kind", FAMILIES)
def test_the_probes_and_the_model_list_answer_as_vllms_render_server_does(compared: dict[str, Any], kind: str) -> None:
    probes = compared["probes"][kind]
    for path in PROBES:
        (ours_status, _), (theirs_status, _) = probes[path]
        assert ours_status == theirs_status == 200, (path, probes[path])
    (_, health), (_, their_health) = probes["/health"]
    assert health is None and their_health is None, "an empty body, as vLLM's"
    (_, version), (_, their_version) = probes["/version"]
    # mmprep adds its own version beside vLLM's; vLLM's field is the same.
    assert version["version"] == their_version["version"] and set(version) - set(their_version) == {"mmprep_version"}
    (_, models), (_, their_models) = probes["/v1/models"]
    assert models["object"] == their_models["object"] == "list"
    assert _card(models) == _card(their_models)


@pytest.mark.parametrize("kind", FAMILIES)
def test_tokenizer_info_answers_as_vllms_under_the_same_flag(compared: dict[str, Any], kind: str) -> None:
    (ours_status, ours), (theirs_status, theirs) = compared["probes"][kind][TOKENIZER_INFO]
    if kind not in TOKENIZER_INFO_FAMILIES:
        assert ours_status == theirs_status == 404, (ours, theirs)
        return
    assert ours_status == theirs_status == 200, (ours, theirs)
    assert ours == theirs and ours["tokenizer_class"], (ours, theirs)


@pytest.mark.parametrize("kind", FAMILIES)
def test_info_says_which_path_serves_the_model_and_why(compared: dict[str, Any], kind: str) -> None:
    render = compared["info"][kind]["vllm_render"]
    assert render["vllm_version"] == compared["info"][kind]["versions"]["vllm"]
    if kind in NATIVE_FAMILIES:
        assert (render["path"], render["general_fallback"]) == ("native", True), render
        assert "native fast path" in render["path_reason"]
    else:
        assert (render["path"], render["general_fallback"]) == ("general", False), render
        # A native class given an option its path does not implement (a reasoning parser) says so.
        reason = "does not implement --reasoning-parser" if kind in SENT_TO_VLLM else "no native fast path"
        assert reason in render["path_reason"], render
        assert render["general"]["processes"] == 1 and render["general"]["ready_processes"] == 1


@pytest.mark.parametrize("kind", FAMILIES)
def test_a_refused_request_gets_vllms_error(compared: dict[str, Any], kind: str) -> None:
    (ours_status, ours), (theirs_status, theirs) = compared["errors"][kind]
    assert ours_status == theirs_status == 400, (ours, theirs)
    assert set(ours["error"]) == set(theirs["error"]) and ours["error"]["code"] == theirs["error"]["code"], (ours, theirs)


@pytest.mark.skipif("gemma3" not in FAMILIES, reason="MMPREP_COMPAT_FAMILIES leaves Gemma 3 out")
@pytest.mark.parametrize("case", sorted(GEMMA_UNRENDERABLE))
def test_a_gemma_body_vllm_cannot_render_gets_a_4xx_and_the_pool_serves_on(compared: dict[str, Any], case: str) -> None:
    (ours_status, ours), (theirs_status, theirs), (after, _) = compared["gemma unrenderable"][case]
    assert (theirs_status, ours_status) == GEMMA_UNRENDERABLE[case], (ours, theirs)
    assert set(ours["error"]) == set(theirs["error"]), (ours, theirs)
    assert after == 200


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
