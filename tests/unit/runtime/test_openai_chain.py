"""The OpenAI front's chain (``generation.chain``): a request rendered by the render backend,
generated at an engine, derendered by the render backend; whole and streamed, with the refusals
passed on as their makers wrote them and an engine that dies mid-answer.

The render backend is a fake (``FakeRenderer``: canned render answers, derender answers made from
what it is sent, every call recorded); the engine is a real HTTP server on 127.0.0.1
(``support.fake_vllm_engine``) answering as vLLM's ``/inference/v1/generate`` does, behind a real
``EnginePool``.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from support.fake_vllm_engine import (
    DONE,
    FakeEngine,
    answer_events,
    answer_events_then_close,
    answer_json,
    answer_text,
    answer_until_client_leaves,
    generate_response,
)
from transformers import AutoTokenizer

from mmprep_runtime.backends.protocol import Operation, Reply
from mmprep_runtime.generation import chain
from mmprep_runtime.generation.chain import CHAT, COMPLETION, Chain, Passed, without_media
from mmprep_runtime.generation.engines import EnginePool
from mmprep_runtime.settings import EngineSettings

WAIT_S = 5.0
CLIENT_REQUEST_ID = "client-req-1"
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
CHAT_REQUEST: dict[str, Any] = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "What is this?"}, IMAGE, AUDIO, {"type": "text", "text": "And this?"}],
        },
    ],
    "max_tokens": 3,
    "temperature": 0,
}
RENDERED: dict[str, Any] = {
    "request_id": "chatcmpl-abc123",
    "token_ids": [101, 102, 103, 104, 105],
    "sampling_params": {"max_tokens": 3, "temperature": 0.0},
    "stream": False,
    "features": {"mm_hashes": {"image": ["h1"]}},
}
ENGINE_USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8, "prompt_tokens_details": {"cached_tokens": 4}}
VLLM_TOO_LONG = {
    "error": {
        "message": "This model's maximum context length is 32 tokens. However, you requested 40 tokens.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
}
RENDER_REFUSAL = {
    "error": {
        "message": "At most 1 image(s) may be provided in one prompt.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
}


class FakeRenderer:
    """The render backend's ``call``: the render answers ``render_reply``; a derender answers
    what vLLM's would, made from the generate answer it is sent (``stream_state`` counting the
    events of each choice). Every call is recorded, its body parsed."""

    def __init__(self, rendered: Any = RENDERED) -> None:
        self.render_reply = Reply(200, json.dumps(rendered).encode())
        self.calls: list[tuple[Operation, dict[str, Any], str | None]] = []
        #: What the reasoning count was asked for.
        self.counted: list[list[list[int]]] = []
        #: The derender call (counted from 1) that is refused, and how.
        self.refuse_derender: tuple[int, Reply] | None = None

    async def reasoning_tokens(self, chat_request: dict[str, Any], token_ids: list[list[int]]) -> list[int] | None:
        """A stand-in parser: the ids below 8 are reasoning."""
        self.counted.append(token_ids)
        return [sum(1 for t in ids if t < 8) for ids in token_ids]

    def derenders(self) -> list[dict[str, Any]]:
        return [
            body for operation, body, _ in self.calls if operation in (Operation.CHAT_DERENDER, Operation.COMPLETION_DERENDER)
        ]

    async def call(self, operation: Operation, body: bytes, request_id: str | None) -> Reply:
        parsed = json.loads(body)
        self.calls.append((operation, parsed, request_id))
        if operation in (Operation.CHAT_RENDER, Operation.COMPLETION_RENDER):
            return self.render_reply
        if self.refuse_derender is not None and self.refuse_derender[0] == len(self.derenders()):
            return self.refuse_derender[1]
        if parsed["stream"]:
            return Reply(200, json.dumps(_derendered_event(parsed)).encode())
        return Reply(200, json.dumps(_derendered_whole(parsed)).encode())


def _text(token_ids: list[int]) -> str:
    return "".join(f"<{t}>" for t in token_ids)


def _derendered_whole(body: dict[str, Any]) -> dict[str, Any]:
    answers = body["generate_responses"] if "generate_responses" in body else [body["generate_response"]]
    choices = [
        {"index": i, "text": _text(a["choices"][0]["token_ids"]), "finish_reason": "length"} for i, a in enumerate(answers)
    ]
    prompt = body["prompt_tokens"] if isinstance(body["prompt_tokens"], int) else sum(body["prompt_tokens"])
    completion = sum(len(a["choices"][0]["token_ids"]) for a in answers)
    return {
        "id": "generate-tokens-internal",
        "object": "chat.completion",
        "model": body["model"],
        "choices": choices,
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def _derendered_event(body: dict[str, Any]) -> dict[str, Any]:
    event = body["generate_chunk"]
    state = body["stream_state"]
    chunk: dict[str, Any] = {"id": "generate-tokens-internal", "object": "chat.completion.chunk", "model": body["model"]}
    if event["choices"]:
        choice = event["choices"][0]
        index, tokens = choice["index"], choice["token_ids"]
        chunk["choices"] = [{"index": index, "delta": {"content": _text(tokens)}, "finish_reason": choice["finish_reason"]}]
        state = {"index": index, "seen": [*(state["seen"] if state else []), *tokens]}
    else:
        chunk["choices"] = []
    if "usage" in event:
        usage = event["usage"]
        chunk["usage"] = {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    return {"chunk": chunk, "stream_state": state}


class Setup:
    def __init__(self, engine: FakeEngine, pool: EnginePool, registry: CollectorRegistry) -> None:
        self.engine = engine
        self.pool = pool
        self.registry = registry
        self.renderer = FakeRenderer()
        self.chain = Chain(self.renderer, pool)  # type: ignore[arg-type]

    async def render(self, original: dict[str, Any] = CHAT_REQUEST, kind: chain.Kind = CHAT) -> chain.Rendered:
        return await self.chain.render(kind, json.dumps(original).encode(), original, CLIENT_REQUEST_ID)

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, {"engine": self.engine.url, **labels})


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    engine = await FakeEngine().start()
    registry = CollectorRegistry()
    pool = EnginePool(EngineSettings(urls=(engine.url,), health_interval_s=3600), registry)
    await pool.start()
    try:
        yield Setup(engine, pool, registry)
    finally:
        await pool.close()
        await engine.close()


def _events(streamed: bytes) -> list[Any]:
    """The server-sent events of ``streamed``: each one's JSON, ``[DONE]`` as the string."""
    assert streamed.endswith(b"\n\n"), streamed
    payloads = []
    for event in streamed[:-2].split(b"\n\n"):
        assert event.startswith(b"data: "), event
        data = event[len(b"data: ") :]
        payloads.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return payloads


async def _stream(setup: Setup, original: dict[str, Any]) -> list[Any]:
    return await _stream_kind(setup, original, CHAT)


async def _stream_kind(setup: Setup, original: dict[str, Any], kind: chain.Kind) -> list[Any]:
    events = await setup.chain.open_stream(await setup.render(original, kind))
    return _events(b"".join([event async for event in events]))


def _without_media_parts(request: dict[str, Any]) -> dict[str, Any]:
    expected = copy.deepcopy(request)
    expected["messages"][1]["content"] = [{"type": "text", "text": "What is this?"}, {"type": "text", "text": "And this?"}]
    return expected


# Whole answers.


async def test_a_whole_chat_answer_is_rendered_generated_and_derendered(setup: Setup) -> None:
    engine_answer = generate_response("generate-tokens-internal", [7, 8, 9], usage=ENGINE_USAGE)
    setup.engine.answer = answer_json(engine_answer)
    original = copy.deepcopy(CHAT_REQUEST)
    rendered = await setup.render(original)
    answer = json.loads(await setup.chain.whole(rendered))

    assert setup.engine.generated == [RENDERED]  # the render's GenerateRequest, as it came
    assert answer["id"] == "chatcmpl-abc123"  # the render's request id, not the derender's
    assert answer["usage"] == {**ENGINE_USAGE, "prompt_tokens_details": {"cached_tokens": 4}}
    assert answer["choices"][0]["text"] == "<7><8><9>"

    (render_op, render_body, render_id), (derender_op, derender, derender_id) = setup.renderer.calls
    assert (render_op, render_body, render_id) == (Operation.CHAT_RENDER, CHAT_REQUEST, CLIENT_REQUEST_ID)
    assert (derender_op, derender_id) == (Operation.CHAT_DERENDER, CLIENT_REQUEST_ID)
    assert derender == {
        "model": "m",
        "chat_request": _without_media_parts(CHAT_REQUEST),
        "stream": False,
        "generate_response": engine_answer,
        "prompt_tokens": 5,
        "prompt_token_ids": RENDERED["token_ids"],
    }
    assert original == CHAT_REQUEST  # the client's request itself is not changed
    assert setup.sample("mmprep_engine_requests_total", outcome="ok") == 1


async def test_a_whole_answer_without_cached_token_counts_keeps_the_derenders_usage(setup: Setup) -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
    setup.engine.answer = answer_json(generate_response("g", [7], usage=usage))
    answer = json.loads(await setup.chain.whole(await setup.render()))
    assert answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}


async def test_a_completion_of_several_prompts_is_one_answer_under_the_base_id(setup: Setup) -> None:
    rendered = [
        {"request_id": "cmpl-xyz-0", "token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 1}, "stream": False},
        {"request_id": "cmpl-xyz-1", "token_ids": [4], "sampling_params": {"max_tokens": 1}, "stream": False},
    ]
    setup.renderer = FakeRenderer(rendered)
    setup.chain = Chain(setup.renderer, setup.pool)  # type: ignore[arg-type]

    async def echo(engine: FakeEngine, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        n = len(body["token_ids"])
        usage = {
            "prompt_tokens": n,
            "completion_tokens": 1,
            "total_tokens": n + 1,
            "prompt_tokens_details": {"cached_tokens": n - 1},
        }
        return web.json_response(generate_response("generate-" + body["request_id"], [n * 10], usage=usage))

    setup.engine.answer = echo
    original = {"model": "m", "prompt": ["one two three", "four"], "max_tokens": 1}
    answer = json.loads(await setup.chain.whole(await setup.render(original, COMPLETION)))

    assert sorted(r["request_id"] for r in setup.engine.generated) == ["cmpl-xyz-0", "cmpl-xyz-1"]
    assert answer["id"] == "cmpl-xyz"
    assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}  # 2 + 0: summed over the prompts
    (derender,) = setup.renderer.derenders()
    assert setup.renderer.calls[-1][0] is Operation.COMPLETION_DERENDER
    assert derender["completion_request"] == original
    assert [r["request_id"] for r in derender["generate_responses"]] == ["generate-cmpl-xyz-0", "generate-cmpl-xyz-1"]
    assert derender["prompt_token_ids"] == [[1, 2, 3], [4]] and derender["prompt_tokens"] == [3, 1]


async def test_a_render_refusal_is_passed_on_and_nothing_is_generated(setup: Setup) -> None:
    refusal = Reply(400, json.dumps(RENDER_REFUSAL).encode())
    setup.renderer.render_reply = refusal
    with pytest.raises(Passed) as passed:
        await setup.render()
    assert passed.value.reply == refusal
    assert setup.engine.generated == []
    assert [operation for operation, _, _ in setup.renderer.calls] == [Operation.CHAT_RENDER]


async def test_an_engine_refusal_is_passed_on_with_its_status_and_body(setup: Setup) -> None:
    setup.engine.answer = answer_json(VLLM_TOO_LONG, status=400)
    rendered = await setup.render()
    with pytest.raises(Passed) as passed:
        await setup.chain.whole(rendered)
    assert passed.value.reply.status == 400
    assert json.loads(passed.value.reply.body) == VLLM_TOO_LONG
    assert len(setup.engine.generated) == 1 and setup.renderer.derenders() == []
    assert setup.pool.info()[0]["in_flight"] == 0


async def test_an_engine_error_that_is_not_json_is_passed_on_as_openai_error_json(setup: Setup) -> None:
    setup.engine.answer = answer_text("Internal Server Error", status=500)
    with pytest.raises(Passed) as passed:
        await setup.chain.whole(await setup.render())
    assert passed.value.reply.status == 500
    error = json.loads(passed.value.reply.body)["error"]
    assert error["message"] == "Internal Server Error" and error["code"] == 500


async def test_an_engine_refusal_of_a_stream_is_passed_on_before_any_event(setup: Setup) -> None:
    setup.engine.answer = answer_json(VLLM_TOO_LONG, status=400)
    with pytest.raises(Passed) as passed:
        await setup.chain.open_stream(await setup.render({**CHAT_REQUEST, "stream": True}))
    assert passed.value.reply.status == 400 and json.loads(passed.value.reply.body) == VLLM_TOO_LONG
    assert setup.pool.info()[0]["in_flight"] == 0


# Streamed answers.


def _event(index: int, tokens: list[int], finish: str | None = None) -> dict[str, Any]:
    return generate_response("generate-tokens-internal", tokens, index=index, finish_reason=finish)


async def test_a_stream_is_derendered_event_by_event_with_a_state_per_choice(setup: Setup) -> None:
    usage_event = {"request_id": "generate-tokens-internal", "choices": [], "usage": ENGINE_USAGE}
    engine_events = [_event(0, [1, 2]), _event(1, [3]), _event(0, [4], "length"), _event(1, [5, 6], "length"), usage_event]
    setup.engine.answer = answer_events(engine_events)
    original = {**CHAT_REQUEST, "stream": True, "n": 2, "stream_options": {"include_usage": True}}
    events = await _stream(setup, original)

    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    chunks = events[:-1]
    assert [chunk["id"] for chunk in chunks] == ["chatcmpl-abc123"] * 5
    assert [(c["choices"][0]["index"], c["choices"][0]["delta"]["content"]) for c in chunks[:4]] == [
        (0, "<1><2>"),
        (1, "<3>"),
        (0, "<4>"),
        (1, "<5><6>"),
    ]
    assert chunks[4]["choices"] == []
    assert chunks[4]["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}  # from the engine's usage

    derenders = setup.renderer.derenders()
    assert [d["generate_chunk"] for d in derenders] == engine_events  # in order, one call each
    assert [d["stream_state"] for d in derenders] == [
        None,
        None,
        {"index": 0, "seen": [1, 2]},  # choice 0's state, not choice 1's (the previous call's)
        {"index": 1, "seen": [3]},
        {"index": 1, "seen": [3, 5, 6]},  # no choice: the last choice's state
    ]
    for derender in derenders:
        assert derender["stream"] is True and derender["model"] == "m"
        assert derender["prompt_token_ids"] == RENDERED["token_ids"] and derender["prompt_tokens"] == 5
        assert derender["chat_request"] == _without_media_parts(original)
    assert {op for op, _, request_id in setup.renderer.calls[1:]} == {Operation.CHAT_DERENDER}
    assert {request_id for _, _, request_id in setup.renderer.calls} == {CLIENT_REQUEST_ID}
    assert setup.pool.info()[0]["in_flight"] == 0


async def test_an_engine_dying_mid_stream_ends_it_with_an_error_event_then_done(setup: Setup) -> None:
    setup.engine.answer = answer_events_then_close([_event(0, [1]), _event(0, [2])])
    events = await _stream(setup, {**CHAT_REQUEST, "stream": True})

    assert [e["choices"][0]["delta"]["content"] for e in events[:2]] == ["<1>", "<2>"]
    assert len(events) == 4 and events[3] == "[DONE]"
    error = events[2]["error"]
    assert error["code"] == 502 and error["type"] == "ServiceUnavailableError"
    assert setup.engine.url in error["message"]
    assert len(setup.renderer.derenders()) == 2
    assert setup.pool.info()[0]["in_flight"] == 0 and setup.pool.info()[0]["failures"] == 1
    assert setup.sample("mmprep_engine_requests_total", outcome="failed") == 1


async def test_an_engine_error_event_is_passed_on_as_the_engine_wrote_it(setup: Setup) -> None:
    engine_error = {
        "error": {"message": "the engine ran out of KV cache", "type": "InternalServerError", "param": None, "code": 500}
    }
    setup.engine.answer = answer_events([_event(0, [1]), engine_error])
    events = await _stream(setup, {**CHAT_REQUEST, "stream": True})
    assert events[1:] == [engine_error, "[DONE]"]
    assert len(setup.renderer.derenders()) == 1  # the error event is not derendered


async def test_a_derender_refusal_mid_stream_ends_it_and_the_engines_stream(setup: Setup) -> None:
    setup.engine.answer = answer_until_client_leaves(_event(0, [1]))
    refusal = {"error": {"message": "bad stream state", "type": "BadRequestError", "param": None, "code": 400}}
    setup.renderer.refuse_derender = (2, Reply(400, json.dumps(refusal).encode()))
    events = await _stream(setup, {**CHAT_REQUEST, "stream": True})
    assert events[1:] == [refusal, "[DONE]"]
    await asyncio.wait_for(setup.engine.client_left.wait(), WAIT_S)  # the engine stops generating
    assert setup.pool.info()[0]["in_flight"] == 0


async def test_closing_the_events_early_closes_the_engines_stream(setup: Setup) -> None:
    setup.engine.answer = answer_until_client_leaves(_event(0, [1]))
    events = await setup.chain.open_stream(await setup.render({**CHAT_REQUEST, "stream": True}))
    first = await anext(events)
    assert json.loads(first[len(b"data: ") :])["choices"][0]["delta"]["content"] == "<1>"
    assert setup.pool.info()[0]["in_flight"] == 1
    await events.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(setup.engine.client_left.wait(), WAIT_S)
    assert setup.pool.info()[0]["in_flight"] == 0
    assert setup.sample("mmprep_engine_requests_total", outcome="abandoned") == 1


# What cannot be streamed.


async def test_a_streamed_completion_of_several_prompts_streams_each_with_the_engines_numbering(setup: Setup) -> None:
    rendered = [
        {**RENDERED, "request_id": "cmpl-1-0", "token_ids": [1, 2, 3]},
        {**RENDERED, "request_id": "cmpl-1-1", "token_ids": [4, 5]},
    ]
    setup.renderer.render_reply = Reply(200, json.dumps(rendered).encode())

    async def per_prompt(engine: FakeEngine, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        first = body["token_ids"][0] * 10  # prompt 0 answers 10, 11; prompt 1 answers 40, 41 (n = 2: two choices)
        usage = {"prompt_tokens": len(body["token_ids"]), "completion_tokens": 2, "total_tokens": len(body["token_ids"]) + 2}
        usage["prompt_tokens_details"] = {"cached_tokens": 1}
        events = [_event(0, [first]), _event(1, [first + 1], "length"), _event(0, [first + 2], "length")]
        events.append({"request_id": "g", "choices": [], "usage": usage})
        return await answer_events(events)(engine, request, body)

    setup.engine.answer = per_prompt
    original = {"model": "m", "prompt": ["a", "b"], "stream": True, "n": 2, "stream_options": {"include_usage": True}}
    events = await _stream_kind(setup, original, COMPLETION)

    assert sorted(r["request_id"] for r in setup.engine.generated) == ["cmpl-1-0", "cmpl-1-1"]
    chunks = events[:-1]
    assert events[-1] == "[DONE]" and {c["id"] for c in chunks} == {"cmpl-1"}
    joined: dict[int, str] = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        joined[choice["index"]] = joined.get(choice["index"], "") + choice["delta"]["content"]
    # The engine's API numbers prompt p's choice i as p * n + i.
    assert joined == {0: "<10><12>", 1: "<11>", 2: "<40><42>", 3: "<41>"}
    # One usage chunk, last: both prompts' counts summed, as the engine's own stream writes it.
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 4,
        "total_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    # Each event is derendered with its own prompt's ids.
    prompts = {tuple(d["prompt_token_ids"]) for d in setup.renderer.derenders()}
    assert prompts == {(1, 2, 3), (4, 5)}


async def test_a_prompt_the_engine_refuses_closes_the_others_before_anything_is_sent(setup: Setup) -> None:
    rendered = [{**RENDERED, "request_id": "cmpl-2-0"}, {**RENDERED, "request_id": "cmpl-2-1", "token_ids": [9] * 40}]
    setup.renderer.render_reply = Reply(200, json.dumps(rendered).encode())

    async def refuse_long(engine: FakeEngine, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if len(body["token_ids"]) > 32:
            return await answer_json(VLLM_TOO_LONG, 400)(engine, request, body)
        return await answer_events([_event(0, [1], "length")])(engine, request, body)

    setup.engine.answer = refuse_long
    with pytest.raises(Passed) as passed:
        await setup.chain.open_stream(await setup.render({"model": "m", "prompt": ["a", "b"], "stream": True}, COMPLETION))
    assert passed.value.reply.status == 400 and json.loads(passed.value.reply.body) == VLLM_TOO_LONG
    assert setup.pool.info()[0]["in_flight"] == 0, "the stream already open was closed"


# Stop strings in a stream: held back and cut here, as the engine's own stream writes them.


def _stopped(index: int, tokens: list[int], stop: str) -> dict[str, Any]:
    event = _event(index, tokens, "stop")
    event["choices"][0]["stop_reason"] = stop
    return event


def _contents(chunks: list[Any], index: int = 0) -> list[str | None]:
    return [c["choices"][0]["delta"].get("content") for c in chunks if c.get("choices") and c["choices"][0]["index"] == index]


async def test_a_stream_with_stop_strings_holds_back_their_length_and_cuts_where_the_engine_stopped(setup: Setup) -> None:
    # The fake derender writes token 3 as "<3>"; the engine stopped on it, the string "<3>".
    setup.engine.answer = answer_events([_event(0, [1]), _event(0, [2]), _stopped(0, [3], "<3>")])
    events = await _stream(setup, {**CHAT_REQUEST, "stream": True, "stop": ["<3>", "x"]})

    contents = _contents(events[:-1])
    # Two characters held back at each event (the longest string less one), the rest at the end.
    assert contents == ["<", "1><", "2>"] and "".join(contents) == "<1><2>"
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert all("stop" not in d["chat_request"] for d in setup.renderer.derenders()), "vLLM's streamed derender refuses them"
    assert setup.engine.generated[0]["sampling_params"] == RENDERED["sampling_params"]  # the engine stops on them itself


async def test_a_stream_that_ends_otherwise_writes_everything_held_back(setup: Setup) -> None:
    setup.engine.answer = answer_events([_event(0, [1, 2]), _event(1, [5]), _event(0, [3], "length"), _event(1, [6], "length")])
    events = await _stream(setup, {**CHAT_REQUEST, "stream": True, "n": 2, "stop": "<9>"})
    assert "".join(_contents(events[:-1], 0)) == "<1><2><3>" and _contents(events[:-1], 0)[0] == "<1><"
    assert "".join(_contents(events[:-1], 1)) == "<5><6>", "each choice holds back its own text"


async def test_include_stop_str_in_output_holds_nothing_back_and_cuts_after_the_string(setup: Setup) -> None:
    setup.engine.answer = answer_events([_event(0, [1]), _stopped(0, [2], "2")])
    events = await _stream(setup, {**CHAT_REQUEST, "stream": True, "stop": ["2"], "include_stop_str_in_output": True})
    assert _contents(events[:-1]) == ["<1>", "<2"]


def test_the_holdback_cuts_a_completions_text_and_leaves_other_deltas_alone() -> None:
    holdback = chain.StopHoldback(["sunny"], include=False)
    first = {"index": 0, "text": "Paris is sun"}
    holdback.apply(first, {"finish_reason": None})
    last = {"index": 0, "text": "ny today"}
    holdback.apply(last, {"finish_reason": "stop", "stop_reason": "sunny"})
    assert (first["text"], last["text"]) == ("Paris is", " ")
    reasoning = chain.StopHoldback(["sunny"], include=False)
    choice: dict[str, Any] = {"index": 0, "delta": {"reasoning": "thinking"}}
    reasoning.apply(choice, {"finish_reason": None})
    assert choice == {"index": 0, "delta": {"reasoning": "thinking"}}, "no content given, none written"
    assert chain.stop_strings({"stop": "a"}) == ["a"] and chain.stop_strings({"stop": ["", "b", 3]}) == ["b"]


# The request the derender is given.


def test_without_media_leaves_out_media_parts_only() -> None:
    request = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "plain text"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, IMAGE, {"type": "video_url", "video_url": {"url": "v"}}]},
            {"role": "user", "content": [{"type": "audio_url", "audio_url": {"url": "a"}}, {"type": "image_embeds"}, AUDIO]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "t"}]},
        ],
        "tools": [{"type": "function"}],
    }
    before = copy.deepcopy(request)
    stripped = without_media(request)
    assert [m["content"] for m in stripped["messages"]] == ["plain text", [{"type": "text", "text": "a"}], [], None]
    assert stripped["messages"][3]["tool_calls"] == [{"id": "t"}] and stripped["tools"] == request["tools"]
    assert request == before
    assert without_media({"prompt": "p"}) == {"prompt": "p"}


def test_the_done_event_and_error_event_are_vllms() -> None:
    assert DONE == chain.DONE
    event = chain.error_event("gone", 503)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert json.loads(event[6:]) == {"error": {"message": "gone", "type": "ServiceUnavailableError", "param": None, "code": 503}}
    assert json.loads(chain.error_event("bad", 400)[6:])["error"]["type"] == "BadRequestError"


async def test_closing_the_events_before_the_first_closes_the_engines_stream(setup: Setup) -> None:
    # What apis.openai._stream does when the client is gone before the answer's headers went
    # (response.prepare raised, or the request was cancelled there): aclose() on events never read.
    # No line of the events' generator runs then; the engine's stream is closed when the pool's
    # generate context, left unreferenced, is finalized by the event loop (CPython frees it at once).
    setup.engine.answer = answer_until_client_leaves(_event(0, [1]))
    events = await setup.chain.open_stream(await setup.render({**CHAT_REQUEST, "stream": True}))
    assert setup.pool.info()[0]["in_flight"] == 1
    await events.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(setup.engine.client_left.wait(), WAIT_S)
    assert setup.pool.info()[0]["in_flight"] == 0


async def test_a_streamed_chats_logprobs_left_out_by_the_derender_are_resolved_from_the_engines(
    setup: Setup, qwen_dir: Any
) -> None:
    # vLLM 0.32's parsed streamed derender leaves logprobs out; the chain resolves the engine's
    # with the model's tokenizer, as vLLM 0.33's derender does. Asked with the reasoning hidden,
    # they stay out (0.33 hides them with it).
    tokenizer = AutoTokenizer.from_pretrained(qwen_dir)
    setup.chain.tokenizer = tokenizer
    ids = tokenizer("Paris is sunny", add_special_tokens=False)["input_ids"]

    def event(token: int, last: bool) -> dict[str, Any]:
        logprobs = {"content": [{"token_id": token, "logprob": -0.5, "top_logprobs": [{"token_id": token, "logprob": -0.5}]}]}
        choice = {"index": 0, "token_ids": [token], "finish_reason": "length" if last else None, "logprobs": logprobs}
        return {"request_id": "g", "choices": [choice]}

    setup.engine.answer = answer_events([event(t, i == len(ids) - 1) for i, t in enumerate(ids)])
    events = await _stream(setup, {**CHAT_REQUEST, "stream": True, "logprobs": True, "top_logprobs": 1})
    entries = [e for ev in events[:-1] for c in ev["choices"] for e in (c.get("logprobs") or {}).get("content") or ()]
    assert "".join(e["token"] for e in entries) == "Paris is sunny"
    assert all(len(e["top_logprobs"]) == 1 and bytes(e["bytes"]).decode() == e["token"] for e in entries)
    events = await _stream(setup, {**CHAT_REQUEST, "stream": True, "logprobs": True, "include_reasoning": False})
    assert all(c.get("logprobs") is None for ev in events[:-1] for c in ev["choices"])


async def test_a_chats_usage_carries_its_reasoning_tokens_where_a_reasoning_parser_is_configured(setup: Setup) -> None:
    # The engine's own API counts them with its parser; neither generate nor derender carries
    # them: the render backend's parser counts each choice's output ids, whole and streamed.
    setup.engine.answer = answer_json(generate_response("g", [7, 8, 9], usage=ENGINE_USAGE))
    answer = json.loads(await setup.chain.whole(await setup.render()))
    assert "completion_tokens_details" not in answer["usage"] and setup.renderer.counted == []
    setup.chain.counts_reasoning = True
    answer = json.loads(await setup.chain.whole(await setup.render()))
    assert answer["usage"]["completion_tokens_details"] == {"reasoning_tokens": 1}
    assert setup.renderer.counted == [[[7, 8, 9]]]
    events = [
        {"request_id": "g", "choices": [{"index": 0, "token_ids": [5, 6], "finish_reason": None}]},
        {"request_id": "g", "choices": [{"index": 0, "token_ids": [9], "finish_reason": "length"}]},
        {"request_id": "g", "choices": [], "usage": ENGINE_USAGE},
    ]
    setup.engine.answer = answer_events(events)
    streamed = await _stream(setup, {**CHAT_REQUEST, "stream": True, "stream_options": {"include_usage": True}})
    [usage] = [e["usage"] for e in streamed[:-1] if e.get("usage")]
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 2}
    assert setup.renderer.counted[-1] == [[5, 6, 9]]
