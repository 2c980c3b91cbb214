"""The OpenAI front for real: ``serve --engine URL`` in front of vLLM's CPU engine answers each
request as the engine's own ``/v1/chat/completions`` and ``/v1/completions`` answer it.

One engine (``vllm serve --enable-scale-out``, dummy weights, the Hermes tool parser and the Qwen3
reasoning parser) and one tier (the general path, the same parsers, from the engine's virtualenv
so both run one vLLM) serve the module. The tier is also given a second engine URL where nothing
listens: every request must still be answered (that engine skipped, and shown down).

With dummy weights every logit is equal, so what the engine generates is chosen by the request:
greedy decoding repeats one token, a seed fixes what sampling draws, and a structured-output
regex makes the engine write a given text (a tool call, a reasoning block), which is what
exercises the parsers (the engine applies regexes inside reasoning too, or the reasoning
parser would leave every token unconstrained until a ``</think>`` that never comes). Each
request goes to the engine's own API and then through the tier, and
the two answers are compared field by field: everything but the id, the creation time, vLLM's
``system_fingerprint`` and the cache counts (the second of two equal prompts hits the cache the
first filled: the tier's count is checked for that instead). Streams are compared as an OpenAI
client reads them: each choice's joined content, reasoning and tool calls, its finish reason, and
the usage; the tier's events carry one id, and ``[DONE]`` ends them.
"""

from __future__ import annotations

import base64
import http.client
import json
import pathlib
import re
import shlex
import subprocess
from collections.abc import Iterator
from typing import Any, Final

import pytest
from support import openai_answers
from support.kube import REPO, wait_for
from support.render_servers import Server
from support.servers import cpu_engine_env, free_port
from support.tools import WEATHER_TOOL

from mmprep_runtime.synthetic import media, models

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

PARSERS: Final = ["--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--reasoning-parser", "qwen3"]
#: The engine's context: shorter than the model's (32768, which the tier checks prompts against),
#: so a long prompt passes the tier's render and is refused by the engine itself.
ENGINE_CONTEXT: Final = 2048
CPU_ENGINE_ARGS: Final = ["--load-format", "dummy", "--enforce-eager", "--max-model-len", str(ENGINE_CONTEXT)]
#: The reasoning parser reads everything before ``</think>`` as reasoning: the call comes after it.
TOOL_CALL_TEXT: Final = '</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
REASONING_TEXT: Final = "<think>\nThe sky is clear.\n</think>\n\nParis is sunny."


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    # Qwen2.5-VL's tiny folder carries the parsers' tokens (<tool_call>, <think>) in its vocabulary.
    return models.make_model("qwen2.5-vl", tmp_path_factory.mktemp("front-model") / "qwen2.5-vl")


@pytest.fixture(scope="module")
def servers(
    cpu_engine_venv: pathlib.Path, model: pathlib.Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Server, str]]:
    work = tmp_path_factory.mktemp("front")
    engine_port, tier_port, nobody = free_port(), free_port(), free_port()
    engine_command = [str(cpu_engine_venv / "bin" / "vllm"), "serve", str(model), "--enable-scale-out"]
    engine_command += ["--host", "127.0.0.1", "--port", str(engine_port), *CPU_ENGINE_ARGS, "--enable-prompt-tokens-details"]
    # The regexes that make the engine write a reasoning block hold inside it too.
    engine_command += [*PARSERS, "--structured-outputs-config", '{"enable_in_reasoning": true}']
    dead_engine = f"http://127.0.0.1:{nobody}"
    tier_command = [str(cpu_engine_venv / "bin" / "python"), "-m", "mmprep_runtime.cli", "serve", "--model", str(model)]
    tier_command += ["--host", "127.0.0.1", "--port", str(tier_port), "--render-path", "general", "--render-processes", "1"]
    tier_command += ["--engine", dead_engine, "--engine", f"http://127.0.0.1:{engine_port}", "--vllm-args", shlex.join(PARSERS)]
    engine_env = cpu_engine_env(cpu_engine_venv)
    engine = Server("vLLM engine", engine_command, engine_env, "/health", work / "engine.log")
    tier_env = {**cpu_engine_env(cpu_engine_venv), "PYTHONPATH": str(REPO / "runtime")}
    tier = Server("mmprep", tier_command, tier_env, "/health", work / "tier.log")
    try:
        engine.wait()
        tier.wait()
        yield engine, tier, dead_engine
    finally:
        tier.stop()
        engine.stop()


# ----------------------------------------------------------------------------------- comparing

#: Fields that differ by design: made per answer, or vLLM's build, or counted from the cache.
_PER_ANSWER: Final = frozenset({"id", "created", "system_fingerprint", "prompt_tokens_details"})


def _read(events: list[Any]) -> dict[str, Any]:
    return openai_answers.read_stream(events, leave_out=_PER_ANSWER)


def _comparable(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: _comparable(v) for k, v in value.items() if k not in _PER_ANSWER}
        if isinstance(out.get("tool_calls"), list):
            out["tool_calls"] = [{k: v for k, v in call.items() if k != "id"} for call in out["tool_calls"]]
        return out
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


def _both(engine: Server, tier: Server, path: str, body: dict[str, Any]) -> tuple[tuple[int, Any], tuple[int, Any]]:
    """The engine's own answer to ``body``, then the tier's (parsed: JSON, or a stream's events)."""
    answers = []
    for server in (engine, tier):
        status, raw = openai_answers.post(server, path, body)
        answers.append((status, openai_answers.events(raw) if body.get("stream") and status == 200 else json.loads(raw)))
    return answers[0], answers[1]


def _cached_tokens(answer: dict[str, Any]) -> int:
    return int((answer["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def _image_chat(folder: pathlib.Path, image_seed: int, **fields: Any) -> dict[str, Any]:
    image = "data:image/jpeg;base64," + base64.b64encode(media.jpeg(320, 240, seed=image_seed)).decode()
    content = [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "Describe this image."}]
    return {"model": str(folder), "messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0, **fields}


def _forced(model: pathlib.Path, text: str, **fields: Any) -> dict[str, Any]:
    """A chat whose answer the engine is made to write: ``text``, by a structured-output regex."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced = {"structured_outputs": {"regex": re.escape(text)}}
    return {"model": str(model), "messages": messages, "max_tokens": 256, "temperature": 0, **forced, **fields}


#: An OpenAI SDK client (the ``openai`` package vLLM depends on, so in the engine's virtualenv):
#: one request, whole or streamed, written out as the client's typed objects read it.
_SDK_CLIENT: Final = """
import json, sys
from openai import OpenAI

base_url, kind, body = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
create = client.chat.completions.create if kind == "chat" else client.completions.create
if not body.get("stream"):
    print(json.dumps(create(**body).model_dump(exclude_none=True)))
    raise SystemExit
choices, usage = {}, None
for chunk in create(**body):
    usage = chunk.usage.model_dump(exclude_none=True) if chunk.usage else usage
    for choice in chunk.choices:
        read = choices.setdefault(str(choice.index), {"text": "", "finish_reason": None})
        read["text"] += (choice.delta.content or "") if kind == "chat" else choice.text
        read["finish_reason"] = choice.finish_reason or read["finish_reason"]
print(json.dumps({"choices": choices, "usage": usage}))
"""


def _through_the_sdk(python: pathlib.Path, server: Server, kind: str, body: dict[str, Any]) -> Any:
    done = subprocess.run(
        [str(python), "-c", _SDK_CLIENT, server.url + "/v1", kind, json.dumps(body)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


# ---------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_openai_sdk_client_gets_the_engines_answers_through_the_tier(servers, model, cpu_engine_venv, stream):
    engine, tier, _ = servers
    python = cpu_engine_venv / "bin" / "python"
    requests = [
        ("chat", _image_chat(model, image_seed=26, stream=stream)),
        ("completion", {"model": str(model), "prompt": "The weather:", "max_tokens": 6, "temperature": 0, "stream": stream}),
    ]
    if stream:
        requests = [(kind, {**body, "stream_options": {"include_usage": True}}) for kind, body in requests]
    for kind, body in requests:
        own, ours = (_through_the_sdk(python, server, kind, body) for server in (engine, tier))
        assert _comparable(ours) == _comparable(own), kind
        assert ours["usage"]["completion_tokens"] == body["max_tokens"], ours
        if not stream:
            assert ours["object"] == ("chat.completion" if kind == "chat" else "text_completion")


def test_an_image_chat_is_answered_as_the_engine_answers_it_and_hits_the_cache_the_engines_own_filled(servers, model):
    engine, tier, _ = servers
    (own_status, own), (status, ours) = _both(engine, tier, "/v1/chat/completions", _image_chat(model, image_seed=21))
    assert (status, own_status) == (200, 200), (own, ours)
    assert _comparable(ours) == _comparable(own)
    assert ours["id"].startswith("chatcmpl-") and ours["object"] == "chat.completion"
    # The engine's own request filled its prefix cache; the tier's render of the same image hits it.
    assert _cached_tokens(ours) > 0, ours["usage"]


def test_a_streamed_image_chat_joins_to_the_engines_own_stream_with_usage_and_done(servers, model):
    engine, tier, _ = servers
    body = _image_chat(model, image_seed=22, stream=True, stream_options={"include_usage": True})
    (own_status, own), (status, ours) = _both(engine, tier, "/v1/chat/completions", body)
    assert (status, own_status) == (200, 200)
    read_own, read_ours = _read(own), _read(ours)
    assert (read_ours["choices"], read_ours["usage"]) == (read_own["choices"], read_own["usage"])
    assert read_ours["usage"]["completion_tokens"] == 8
    assert len(read_ours["ids"]) == 1 and next(iter(read_ours["ids"])).startswith("chatcmpl-")


def test_a_completion_with_logprobs_and_a_stop_string_is_answered_as_the_engine_answers_it(servers, model):
    engine, tier, _ = servers
    prompt = {"model": str(model), "prompt": "The weather:", "max_tokens": 32, "temperature": 0, "logprobs": 2}
    body = {**prompt, "structured_outputs": {"regex": "Paris is sunny today"}}
    (own_status, own), (status, ours) = _both(engine, tier, "/v1/completions", body)
    assert (status, own_status) == (200, 200), (own, ours)
    assert _comparable(ours) == _comparable(own)
    assert ours["choices"][0]["text"] == "Paris is sunny today" and ours["choices"][0]["logprobs"]["tokens"]
    # Cut where the stop string begins, as the engine's own API cuts it.
    (_, own), (_, ours) = _both(engine, tier, "/v1/completions", {**body, "stop": [" sunny"]})
    assert _comparable(ours) == _comparable(own)
    assert (ours["choices"][0]["text"], ours["choices"][0]["finish_reason"]) == ("Paris is", "stop")


def test_streams_with_a_stop_string_are_cut_where_the_engines_own_stream_cuts_them(servers, model):
    """The engine stops on the string; vLLM's streamed derender refuses stop strings, so the tier
    holds the text back and cuts it itself: the same text, finish reason and usage as the engine's
    own stream, for a completion and for a chat (its answer after the reasoning block)."""
    engine, tier, _ = servers
    completion = {"model": str(model), "prompt": "The weather:", "max_tokens": 32, "temperature": 0, "stream": True}
    completion |= {"structured_outputs": {"regex": "Paris is sunny today"}, "stop": [" sunny", "zz"]}
    chat = _forced(model, "</think>\n\nParis is sunny today.", stream=True, stop=[" sunny"])
    for path, body in (("/v1/completions", completion), ("/v1/chat/completions", chat)):
        body = {**body, "stream_options": {"include_usage": True}}
        (own_status, own), (status, ours) = _both(engine, tier, path, body)
        assert (status, own_status) == (200, 200), (own, ours)
        read_own, read_ours = _read(own), _read(ours)
        assert (read_ours["choices"], read_ours["usage"]) == (read_own["choices"], read_own["usage"]), path
        assert read_ours["choices"][0]["text"].endswith("Paris is") and read_ours["choices"][0]["finish"] == "stop", path


def test_a_chats_logprobs_are_answered_as_the_engine_answers_them(servers, model):
    """Whole: the tokens, their logprobs and the top candidates; streamed, the same joined."""
    engine, tier, _ = servers
    chat = _image_chat(model, image_seed=24, logprobs=True, top_logprobs=2, max_tokens=4)
    (_, own), (status, ours) = _both(engine, tier, "/v1/chat/completions", chat)
    assert status == 200 and _comparable(ours) == _comparable(own)
    assert len(ours["choices"][0]["logprobs"]["content"]) == 4
    (_, own), (status, ours) = _both(engine, tier, "/v1/chat/completions", {**chat, "stream": True})
    assert status == 200
    assert _read(ours)["choices"] == _read(own)["choices"]
    assert len(_read(ours)["choices"][0]["logprobs"]) == 4


def test_a_streamed_completion_and_n_sampled_choices_are_answered_as_the_engine_answers_them(servers, model):
    engine, tier, _ = servers
    body = {"model": str(model), "prompt": "Once", "max_tokens": 6, "temperature": 0, "stream": True}
    (_, own), (status, ours) = _both(engine, tier, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    assert status == 200 and _read(ours)["choices"] == _read(own)["choices"]
    # n > 1 samples; a seed makes the engine draw the same choices for both requests.
    sampled = _image_chat(model, image_seed=23, n=2, temperature=1.0, seed=7)
    (_, own), (status, ours) = _both(engine, tier, "/v1/chat/completions", sampled)
    assert status == 200 and len(ours["choices"]) == 2
    assert _comparable(ours) == _comparable(own)
    (_, own), (status, ours) = _both(engine, tier, "/v1/chat/completions", {**sampled, "stream": True})
    assert status == 200 and set(_read(ours)["choices"]) == {0, 1}
    assert _read(ours)["choices"] == _read(own)["choices"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_call_is_parsed_as_the_engine_parses_it(servers, model, stream):
    engine, tier, _ = servers
    body = _forced(model, TOOL_CALL_TEXT, tools=[WEATHER_TOOL], tool_choice="auto", stream=stream)
    (own_status, own), (status, ours) = _both(engine, tier, "/v1/chat/completions", body)
    assert (status, own_status) == (200, 200), (own, ours)
    if not stream:
        assert _comparable(ours) == _comparable(own)
        [call] = ours["choices"][0]["message"]["tool_calls"]
        assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("get_weather", {"city": "Paris"})
        assert ours["choices"][0]["finish_reason"] == "tool_calls"
        return
    read_own, read_ours = _read(own), _read(ours)
    assert read_ours["choices"] == read_own["choices"]
    assert read_ours["choices"][0]["tools"][0]["name"] == "get_weather"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_reasoning_models_answer_is_split_as_the_engine_splits_it(servers, model, stream):
    engine, tier, _ = servers
    usage = {"stream_options": {"include_usage": True}} if stream else {}
    body = _forced(model, REASONING_TEXT, stream=stream, **usage)
    (own_status, own), (status, ours) = _both(engine, tier, "/v1/chat/completions", body)
    assert (status, own_status) == (200, 200), (own, ours)
    if not stream:
        assert _comparable(ours) == _comparable(own)
        message = ours["choices"][0]["message"]
        assert "The sky is clear." in message["reasoning"] and message["content"].strip() == "Paris is sunny."
        # The reasoning tokens, counted by the render process's parser as the engine's by its own.
        assert ours["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0, ours["usage"]
        return
    read_own, read_ours = _read(own), _read(ours)
    assert read_ours["choices"] == read_own["choices"] and read_ours["usage"] == read_own["usage"]
    assert "The sky is clear." in read_ours["choices"][0]["reasoning"]
    assert read_ours["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0, read_ours["usage"]


def test_an_engines_refusal_is_passed_on_and_a_render_refusal_never_reaches_the_engine(servers, model):
    engine, tier, _ = servers
    # Within the tier's context (the model's), beyond the engine's: the engine's own 400.
    long_prompt = {"model": str(model), "prompt": "hello " * (ENGINE_CONTEXT + 100), "max_tokens": 4}
    status, raw = openai_answers.post(tier, "/v1/completions", long_prompt)
    answer = json.loads(raw)
    assert status == 400 and answer["error"]["type"] == "BadRequestError", answer
    assert str(ENGINE_CONTEXT) in answer["error"]["message"], answer
    # A model the tier does not serve: its render refuses it as the engine's own API does, and
    # no generate request is sent.
    sent = openai_answers.metric(tier, "mmprep_engine_requests_total")
    other = _image_chat(model, image_seed=24, model="other")
    (own_status, own), (status, ours) = _both(engine, tier, "/v1/chat/completions", other)
    assert (status, ours) == (own_status, own) and status == 404, (own, ours)
    assert openai_answers.metric(tier, "mmprep_engine_requests_total") == sent


def test_the_engine_that_refuses_connections_is_skipped_and_shown_down(servers, model):
    engine, tier, dead = servers
    status, info = tier.get("/v1/info")
    assert status == 200
    by_url = {e["url"]: e for e in info["engines"]}
    assert by_url[dead]["up"] is False and by_url[engine.url]["up"] is True, info["engines"]
    assert (
        openai_answers.metric(tier, "mmprep_engine_up", engine=dead) == 0
        and openai_answers.metric(tier, "mmprep_engine_up", engine=engine.url) == 1
    )
    assert by_url[engine.url]["requests"] > 0


def test_a_client_that_leaves_mid_stream_has_the_engine_abort_its_request(servers, model):
    engine, tier, _ = servers
    generated = openai_answers.metric(engine, "vllm:generation_tokens_total")
    # ignore_eos: left alone, the engine would write all of them.
    asked = ENGINE_CONTEXT - 300
    body = _image_chat(model, image_seed=25, stream=True, max_tokens=asked, ignore_eos=True)
    connection = http.client.HTTPConnection("127.0.0.1", tier.port, timeout=120)
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    for _ in range(3):
        assert response.readline().startswith(b"data: ")
        response.readline()
    connection.close()  # the client goes, 3 events in
    wait_for(lambda: openai_answers.metric(engine, "vllm:num_requests_running") == 0, 60, what="the engine to stop generating")
    written = openai_answers.metric(engine, "vllm:generation_tokens_total") - generated
    assert 3 <= written < asked / 2, f"the engine wrote {written} of {asked} tokens: it was not aborted"


def test_a_streamed_completion_of_two_prompts_is_answered_as_the_engine_answers_it(servers, model):
    """Last in the module: vLLM's CPU build's worker has died (SIGILL) on a two-prompt batch sent
    to a freshly started engine, which would take the engine from every later test."""
    engine, tier, _ = servers
    body = {"model": str(model), "prompt": ["Once", "The weather:"], "max_tokens": 5, "temperature": 0, "stream": True}
    (_, own), (status, ours) = _both(engine, tier, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    read_own, read_ours = _read(own), _read(ours)
    assert status == 200 and (read_ours["choices"], read_ours["usage"]) == (read_own["choices"], read_own["usage"])
    # One choice per prompt, numbered as the engine numbers them (n > 1 per prompt: the unit tests).
    assert sorted(read_ours["choices"]) == [0, 1] and read_ours["usage"]["completion_tokens"] == 10
