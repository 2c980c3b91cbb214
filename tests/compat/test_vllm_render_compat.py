"""mmprep's vLLM render API against vLLM's own render server: same folder, same requests, same answers.

vLLM (``hack/vllm/venv.sh``: its own cached virtualenv, it pins its own torch and transformers)
serves ``vllm launch render`` on a processor folder from ``mmprep-runtime make-model --kind
qwen2-vl``; ``mmprep-runtime serve`` serves the same folder. Each case sends one body to both; vLLM's
own ``GenerateRequest`` model and kwargs decoder, run in vLLM's virtualenv
(``support/vllm_check.py``), validate mmprep's answer and compare it with vLLM's: token ids,
placeholders, mm_hashes, sampling params, parse context and every decoded tensor (request_id
aside). Both pixel hand-offs: uint8 (vLLM's default ``mm_device_do_normalize``) and normalized
(``--no-mm-device-do-normalize`` / ``--normalized-pixels``).
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import pytest
from support import token_routes
from support.render_servers import Server, data_uri, rgba_png, vllm_check
from support.servers import free_port, runtime_command, vllm_render_command, vllm_render_env

from mmprep_runtime.synthetic import media, models

# The first test also pays for vLLM's virtualenv when it is not cached yet (`make test` installs it
# before pytest starts) and for starting both servers.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


@pytest.fixture(scope="session")
def render_model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return models.make_model("qwen2-vl", tmp_path_factory.mktemp("models") / "qwen2-vl")


def start_vllm(venv: pathlib.Path, model: pathlib.Path, normalized: bool, logs: pathlib.Path) -> Server:
    command = vllm_render_command(venv, model, free_port(), normalized=normalized)
    return Server("vLLM render", command, vllm_render_env(), "/health", logs / f"vllm-{normalized}.log")


def start_mmprep(model: pathlib.Path, normalized: bool, logs: pathlib.Path) -> Server:
    command = [*runtime_command(), "serve", "--model", str(model), "--host", "127.0.0.1", "--port", str(free_port())]
    command += ["--fetch-allowed-networks", "127.0.0.1/32"]
    if normalized:
        command.append("--normalized-pixels")
    return Server("mmprep", command, dict(os.environ), "/health", logs / f"mmprep-{normalized}.log")


def cases(image_url: str) -> dict[str, tuple[str, dict[str, Any]]]:
    one = data_uri(media.jpeg(640, 480, seed=1), "image/jpeg")
    three = [
        data_uri(media.jpeg(320, 240, seed=2), "image/jpeg"),
        data_uri(rgba_png(200, 300), "image/png"),
        data_uri(media.jpeg(500, 375, seed=4), "image/jpeg"),
    ]
    chat = "/v1/chat/completions/render"

    def image(url: str) -> dict[str, Any]:
        return {"type": "image_url", "image_url": {"url": url}}

    return {
        "one image": (
            chat,
            {
                "messages": [
                    {"role": "user", "content": [image(one), {"type": "text", "text": "Describe this picture in one sentence."}]}
                ]
            },
        ),
        "three images of different sizes": (
            chat,
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "How many people are in the image?"}, *[image(u) for u in three]],
                    }
                ],
                "max_tokens": 64,
            },
        ),
        "text only": (chat, {"messages": [{"role": "user", "content": "The quick brown fox jumps over the lazy dog."}]}),
        "an image URL": (
            chat,
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [image(f"{image_url}/photo.jpg"), {"type": "text", "text": "What is written on the page?"}],
                    }
                ]
            },
        ),
        "a system prompt and sampling fields": (
            chat,
            {
                "messages": [
                    {"role": "system", "content": "A cat is sitting on a red mat."},
                    {"role": "user", "content": [image(one), {"type": "text", "text": "Describe this picture."}]},
                    {"role": "assistant", "content": "A cat."},
                    {"role": "user", "content": "Transcribe the audio and summarise it."},
                ],
                "max_tokens": 32,
                "temperature": 0.2,
                "top_p": 0.9,
                "seed": 7,
                "stop": ["\n"],
            },
        ),
        "a completion prompt": ("/v1/completions/render", {"prompt": "The quick brown fox", "max_tokens": 5}),
        "logprobs and several choices": (
            chat,
            {
                "messages": [{"role": "user", "content": [image(one), {"type": "text", "text": "Describe it."}]}],
                "logprobs": True,
                "top_logprobs": 2,
                "n": 2,
                "seed": 3,
                "stream": True,
            },
        ),
        "a completion with logprobs": ("/v1/completions/render", {"prompt": "The quick brown fox", "logprobs": 3, "n": 3}),
    }


def _judged(
    mmprep: Server, vllm: Server, chosen: dict[str, tuple[str, dict[str, Any]]], venv: pathlib.Path, work: pathlib.Path
) -> tuple[dict[str, tuple[int, int]], dict[str, Any]]:
    """Each case sent to both servers: the statuses, and vLLM's checker's verdict on each pair both
    answered (run once over all of them)."""
    manifest: dict[str, list[str]] = {}
    statuses: dict[str, tuple[int, int]] = {}
    for name, (path, body) in chosen.items():
        ours_status, ours = mmprep.post(path, body)
        theirs_status, theirs = vllm.post(path, body)
        statuses[name] = (ours_status, theirs_status)
        slug = name.replace(" ", "-")
        (work / f"{slug}.ours.json").write_text(json.dumps(ours))
        (work / f"{slug}.vllm.json").write_text(json.dumps(theirs))
        if ours_status == theirs_status == 200:
            manifest[name] = [str(work / f"{slug}.ours.json"), str(work / f"{slug}.vllm.json")]
    (work / "manifest.json").write_text(json.dumps(manifest))
    return statuses, vllm_check(venv, work / "manifest.json")


@pytest.fixture(scope="module", params=[False, True], ids=["uint8", "normalized"])
def compared(request: pytest.FixtureRequest, vllm_venv, render_model, media_server, tmp_path_factory) -> dict[str, Any]:
    """Both servers up on one folder; every case sent to both; vLLM's checker run once over all."""
    normalized = request.param
    work = tmp_path_factory.mktemp("compat-normalized" if normalized else "compat-uint8")
    vllm = start_vllm(vllm_venv, render_model, normalized, work)
    mmprep = start_mmprep(render_model, normalized, work)
    try:
        mmprep.wait()
        vllm.wait()
        statuses, results = _judged(mmprep, vllm, cases(media_server), vllm_venv, work)
        models = (mmprep.get("/v1/models"), vllm.get("/v1/models"))
        error_body = {"messages": [{"role": "user", "content": [{"type": "video_frame", "x": 1}]}]}
        errors = (mmprep.post("/v1/chat/completions/render", error_body), vllm.post("/v1/chat/completions/render", error_body))
        refused = {
            name: (mmprep.post("/v1/chat/completions/render", body), vllm.post("/v1/chat/completions/render", body))
            for name, body in (
                ("top_logprobs without logprobs", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}),
                (
                    "more logprobs than allowed",
                    {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21},
                ),
                ("no choice", {"messages": [{"role": "user", "content": "hi"}], "n": 0}),
            )
        }
        return {
            "refused": refused,
            "token routes": token_routes.exchanges(mmprep, vllm, image=True),
            "statuses": statuses,
            "results": results,
            "models": models,
            "errors": errors,
            "work": work,
            "logs": (mmprep.tail(), vllm.tail()),
        }
    finally:
        mmprep.stop()
        vllm.stop()


CASE_NAMES = [
    "one image",
    "three images of different sizes",
    "text only",
    "an image URL",
    "a system prompt and sampling fields",
    "a completion prompt",
    "logprobs and several choices",
    "a completion with logprobs",
]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_vllm_accepts_and_equals_what_mmprep_renders(compared, case):
    ours_status, theirs_status = compared["statuses"][case]
    assert theirs_status == 200, f"vLLM answered {theirs_status}; see {compared['work']}"
    assert ours_status == 200, f"mmprep answered {ours_status}; see {compared['work']}"
    result = compared["results"][case]
    assert result["ok"], "\n".join(result["problems"])
    print(case, result["summary"])


def test_the_pixel_hand_off_is_uint8_by_default_and_normalized_on_request(compared, request):
    normalized = "normalized" in request.node.callspec.id
    dtypes = {
        summary["pixel_dtype"]
        for result in compared["results"].values()
        for summary in result["summary"].values()
        if summary.get("pixel_dtype")
    }
    assert dtypes == ({"torch.bfloat16"} if normalized else {"torch.uint8"}), dtypes


def test_models_list_the_same_model(compared):
    (ours_status, ours), (theirs_status, theirs) = compared["models"]
    assert ours_status == theirs_status == 200
    assert [m["id"] for m in ours["data"]] == [m["id"] for m in theirs["data"]]
    assert ours["data"][0]["max_model_len"] == theirs["data"][0]["max_model_len"]


def test_errors_have_vllms_shape(compared):
    (ours_status, ours), (theirs_status, theirs) = compared["errors"]
    assert ours_status == theirs_status == 400, (ours, theirs)
    assert set(ours["error"]) == set(theirs["error"]) and ours["error"]["code"] == theirs["error"]["code"]
    assert "video_frame" in ours["error"]["message"]


@pytest.mark.parametrize("case", token_routes.CASES)
def test_tokenize_detokenize_and_derender_answer_what_vllm_answers_without_vllm(compared, case):
    # This server has no vLLM: its tokenizer and detokenizer answer, in vLLM's stream state.
    token_routes.assert_each_call_answered_alike(compared["token routes"][case])


def test_a_derendered_stream_joins_to_the_whole_answer_without_vllm(compared):
    token_routes.assert_stream_joins_to_the_whole_answer(compared["token routes"], "qwen2-vl")


@pytest.mark.parametrize("case", token_routes.BAD_BODY_CASES)
def test_a_bad_token_route_body_gets_vllms_status_and_error_shape_without_vllm(compared, case):
    token_routes.assert_answered_with_vllms_error(compared["token routes"][case])


@pytest.mark.parametrize("case", ["top_logprobs without logprobs", "no choice"])
def test_sampling_fields_vllm_refuses_are_refused_alike(compared, case):
    (ours_status, ours), (theirs_status, theirs) = compared["refused"][case]
    assert 400 <= theirs_status < 500, (theirs_status, theirs)
    assert ours_status == theirs_status and set(ours["error"]) == set(theirs["error"]), (ours, theirs)
