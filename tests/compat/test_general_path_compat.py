"""The render tier against vLLM's own render server, for every family ``make-model`` builds.

For each family (``mmprep_runtime.testing_families``: weight-less folders with real processor
classes, small tokenizers and the published image sizes), both servers start once on the same
folder, from vLLM's virtualenv (``hack/vllm/venv.sh``; mmprep's general path runs vLLM's own
processing, so it runs there too):
- ``vllm launch render``, its processor cache off;
- ``mmprep-runtime serve --render-path auto``: Qwen2.5-VL and Qwen3-VL on mmprep's native fast path
  with the general path beside it for what the fast path does not render (their video), every
  other family on the general path (vLLM's render server in mmprep's worker processes).

Every case goes to both: one image, images of different sizes and formats, text only, an image
URL (mmprep fetches it under its own rules and hands vLLM the bytes; vLLM fetches it itself), a
video of JPEG frames for the families that take video, a completion prompt. vLLM's own models and
kwargs decoder (``support/vllm_check.py``, run once in vLLM's virtualenv over every answer) judge
each pair: token ids, placeholders, mm_hashes, sampling params and every decoded tensor equal
(request ids aside). A control pair with one token changed must be caught.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
from support.kube import REPO
from support.render_servers import Server, data_uri, rgba_png, vllm_check
from support.servers import free_port, vllm_render_command, vllm_render_env

from mmprep_runtime import testing_families, testing_media, testing_models

# Two servers start per family on a 2-core machine (vLLM's import and warm-up: 15-50 s each).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

FAMILIES = list(testing_families.FAMILIES)
VIDEO_FAMILIES = [kind for kind, family in testing_families.FAMILIES.items() if family.chat.video]
CHAT = "/v1/chat/completions/render"
SYSTEM = {"role": "system", "content": [{"type": "text", "text": "Answer in one sentence."}]}
#: The families whose processor class has mmprep's native fast path (and the general one beside it).
NATIVE_FAMILIES = {"qwen2.5-vl", "qwen3-vl"}


def _image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def cases(kind: str, image_url: str) -> dict[str, tuple[str, dict[str, Any]]]:
    one = data_uri(testing_media.jpeg(640, 480, seed=1), "image/jpeg")
    mixed = [data_uri(testing_media.jpeg(320, 240, seed=2), "image/jpeg"), data_uri(rgba_png(200, 300), "image/png")]
    out: dict[str, tuple[str, dict[str, Any]]] = {
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
        "text only": (CHAT, {"messages": [SYSTEM, {"role": "user", "content": "The quick brown fox jumps."}]}),
        "an image URL": (
            CHAT,
            {"messages": [{"role": "user", "content": [_image(f"{image_url}/photo.jpg"), {"type": "text", "text": "Read it."}]}]},
        ),
        "a completion prompt": ("/v1/completions/render", {"prompt": "The quick brown fox", "max_tokens": 5}),
    }
    if kind in VIDEO_FAMILIES:
        frames = ",".join(data_uri(testing_media.jpeg(320, 240, seed=s), "x").split(",", 1)[1] for s in range(8))
        video = {"type": "video_url", "video_url": {"url": f"data:video/jpeg;base64,{frames}"}}
        out["a video of JPEG frames"] = (
            CHAT,
            {"messages": [{"role": "user", "content": [video, {"type": "text", "text": "What happens?"}]}], "max_tokens": 8},
        )
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
def compared(vllm_venv: pathlib.Path, image_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Per family: both servers started once, every case sent to both, the answers kept; then
    vLLM's checker run once over all of them (importing vLLM takes seconds)."""
    work = tmp_path_factory.mktemp("general-compat")
    manifest: dict[str, list[str]] = {}
    found: dict[str, Any] = {"statuses": {}, "info": {}, "errors": {}, "work": work}
    for kind in FAMILIES:
        folder = testing_models.make_model(kind, work / kind)
        vllm, mmprep = (
            _vllm(vllm_venv, folder, work / f"{kind}.vllm.log"),
            _mmprep(vllm_venv, folder, work / f"{kind}.mmprep.log"),
        )
        try:
            vllm.wait()
            mmprep.wait()
            found["info"][kind] = mmprep.get("/v1/info")[1]
            for name, (path, body) in cases(kind, image_server).items():
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


CASES = [
    (kind, name)
    for kind in FAMILIES
    for name in ["one image", "images of different sizes and formats", "text only", "an image URL", "a completion prompt"]
    + (["a video of JPEG frames"] if kind in VIDEO_FAMILIES else [])
]


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
