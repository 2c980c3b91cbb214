"""vLLM's token routes, sent alike to mmprep and to vLLM's render server: ``/tokenize``,
``/detokenize`` and both derenders, whole and streamed (each server's ``stream_state`` carried
between its own calls as a client carries it, and one stream carried from vLLM to mmprep
mid-way), with logprobs, several choices and stop strings, and bad bodies. The general path's
suite sends them for every family (in vLLM's virtualenv), the native path's without vLLM."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mmprep_runtime.synthetic import media
from support.render_servers import Server, data_uri

SYSTEM = {"role": "system", "content": [{"type": "text", "text": "Answer in one sentence."}]}


#: The engine's words, as a generate response carries them: what derender turns back into text.
ANSWER_TEXT = "A cat is sitting on a red mat next to the window."
#: Volatile fields of an answer (a timestamp): left out of the comparison.
_VOLATILE = ("created",)


def steady(answer: Any) -> Any:
    """``answer`` without what differs between any two servers' answers: timestamps, and the
    random ids vLLM gives tool calls (``chatcmpl-tool-<random>``)."""
    if isinstance(answer, dict):
        return {k: steady(v) for k, v in answer.items() if k not in _VOLATILE}
    if isinstance(answer, list):
        return [steady(v) for v in answer]
    if isinstance(answer, str) and answer.startswith("chatcmpl-tool-"):
        return "chatcmpl-tool-<random>"  # in the answer and in the stream state alike
    return answer


def differences(ours: Any, theirs: Any, where: str = "") -> list[str]:
    """Where two answers differ, and how: a test's message that names the field."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return [
            d for k in sorted(set(ours) | set(theirs), key=str) for d in differences(ours.get(k), theirs.get(k), f"{where}.{k}")
        ]
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        return [d for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) for d in differences(a, b, f"{where}[{i}]")]
    return [] if ours == theirs else [f"{where or 'the answer'}: ours {str(ours)[:300]}, vLLM's {str(theirs)[:300]}"]


DERENDER = "/v1/chat/completions/derender"


def event_body(
    chunk: list[int], last: bool, state: Any, prompt_ids: list[int], chat: dict[str, Any], request_id: str
) -> dict[str, Any]:
    """One streamed derender call: one engine event of ``chunk``, the state of the call before."""
    choice = {"index": 0, "token_ids": chunk, "finish_reason": "stop" if last else None}
    return {
        "stream": True,
        "generate_chunk": {"request_id": request_id, "choices": [choice]},
        "stream_state": state,
        "prompt_tokens": len(prompt_ids),
        "prompt_token_ids": prompt_ids,
        "chat_request": {**chat, "stream": True},
    }


def stream_to_both(
    mmprep: Server, vllm: Server, calls: int, body: Callable[[int, Any], dict[str, Any]], path: str = DERENDER
) -> list[Any]:
    """``calls`` streamed derender calls to each server, ``body(i, state)`` each, every server's
    state carried to its own next call as a client carries it: each call's (ours, theirs)."""
    answers, ours_state, theirs_state = [], None, None
    for i in range(calls):
        ours, theirs = mmprep.post(path, body(i, ours_state)), vllm.post(path, body(i, theirs_state))
        answers.append((ours, theirs))
        ours_state, theirs_state = (ours[1] or {}).get("stream_state"), (theirs[1] or {}).get("stream_state")
    return answers


def exchanges(mmprep: Server, vllm: Server, *, image: bool) -> dict[str, list[Any]]:
    """Per case, each call's (ours, theirs): ``/tokenize``, ``/detokenize``, the derenders whole
    and streamed, and bad bodies. The token ids come from vLLM's own ``/tokenize``; a stream's
    state is each server's own, carried between its calls as a client does. A family that takes
    images tokenizes a chat with one too (its placeholders counted)."""
    both: dict[str, list[Any]] = {}

    def call(name: str, path: str, body: Any, *, to_mmprep: Any = None) -> tuple[Any, Any]:
        ours, theirs = mmprep.post(path, body if to_mmprep is None else to_mmprep), vllm.post(path, body)
        both.setdefault(name, []).append((ours, theirs))
        return ours, theirs

    chat = {"messages": [SYSTEM, {"role": "user", "content": "The quick brown fox jumps."}]}
    call("tokenize a prompt", "/tokenize", {"prompt": "The quick brown fox", "return_token_strs": True})
    call("tokenize a chat", "/tokenize", {**chat, "add_generation_prompt": True})
    if image:
        photo = {"type": "image_url", "image_url": {"url": data_uri(media.jpeg(320, 240, seed=4), "image/jpeg")}}
        pictured = {"messages": [{"role": "user", "content": [photo, {"type": "text", "text": "What is it?"}]}]}
        call("tokenize a chat", "/tokenize", {**pictured, "return_token_strs": True})
    _, (_, prompt) = call("tokenize a chat", "/tokenize", {**chat, "add_generation_prompt": True, "return_token_strs": True})
    _, (_, output) = call("tokenize the answer", "/tokenize", {"prompt": ANSWER_TEXT, "add_special_tokens": False})
    tokens, prompt_ids = output["tokens"], prompt["tokens"]
    call("detokenize", "/detokenize", {"tokens": tokens})
    call(
        "derender a chat answer",
        DERENDER,
        {
            "generate_response": {"request_id": "r-1", "choices": [{"index": 0, "token_ids": tokens, "finish_reason": "stop"}]},
            "prompt_tokens": len(prompt_ids),
            "prompt_token_ids": prompt_ids,
            "chat_request": chat,
        },
    )
    call(
        "derender a completion answer",
        "/v1/completions/derender",
        {
            "generate_responses": [
                {"request_id": "r-2", "choices": [{"index": 0, "token_ids": tokens, "finish_reason": "length"}]}
            ],
            "prompt_tokens": [4],
            "completion_request": {"prompt": "The quick brown fox", "max_tokens": len(tokens)},
        },
    )

    # What an engine adds to its answer when the request asks: logprobs (its integer-id form, the
    # sampled token first among the top ones), several choices (n), a stop string that ended it.
    def logprobs(ids: list[int]) -> dict[str, Any]:
        def candidate(token: int, rank: int, at: int) -> dict[str, Any]:
            return {"token_id": token, "logprob": -0.125 * (at % 5) - (rank - 1) * 2.5, "rank": rank}

        content = [
            {**candidate(t, 1, i), "top_logprobs": [candidate(t, 1, i), candidate(ids[(i + 1) % len(ids)], 2, i)]}
            for i, t in enumerate(ids)
        ]
        return {"content": content}

    def whole(choices: list[dict[str, Any]], request: dict[str, Any]) -> dict[str, Any]:
        return {
            "generate_response": {"request_id": "r-4", "choices": choices},
            "prompt_tokens": len(prompt_ids),
            "prompt_token_ids": prompt_ids,
            "chat_request": {**chat, **request},
        }

    stopped = {"index": 0, "token_ids": tokens, "finish_reason": "stop", "stop_reason": "red mat"}
    call(
        "derender a chat answer with logprobs",
        DERENDER,
        whole(
            [{"index": 0, "token_ids": tokens, "finish_reason": "stop", "logprobs": logprobs(tokens)}],
            {"logprobs": True, "top_logprobs": 2},
        ),
    )
    call(
        "derender a chat answer of two choices",
        DERENDER,
        whole(
            [
                {"index": 0, "token_ids": tokens, "finish_reason": "stop"},
                {"index": 1, "token_ids": tokens[: len(tokens) // 2], "finish_reason": "length"},
            ],
            {"n": 2},
        ),
    )
    call("derender a chat answer ended by a stop string", DERENDER, whole([stopped], {"stop": ["red mat"]}))
    call(
        "derender a completion answer with logprobs",
        "/v1/completions/derender",
        {
            "generate_responses": [
                {
                    "request_id": "r-5",
                    "choices": [{"index": 0, "token_ids": tokens, "finish_reason": "length", "logprobs": logprobs(tokens)}],
                }
            ],
            "prompt_tokens": [4],
            "completion_request": {"prompt": "The quick brown fox", "max_tokens": len(tokens), "logprobs": 2},
        },
    )
    # Streamed: one call per engine event of 1 to 3 tokens, the last one with its finish reason.
    chunks: list[list[int]] = []
    at = 0
    while at < len(tokens):
        size = 1 + len(chunks) % 3
        chunks.append(tokens[at : at + size])
        at += size

    def chunk_body(i: int, state: Any) -> dict[str, Any]:
        return event_body(chunks[i], i == len(chunks) - 1, state, prompt_ids, chat, "r-3")

    both["derender a chat stream, 1-3 tokens a call"] = stream_to_both(mmprep, vllm, len(chunks), chunk_body)

    def chunk_with_logprobs(i: int, state: Any) -> dict[str, Any]:
        body = event_body(
            chunks[i], i == len(chunks) - 1, state, prompt_ids, {**chat, "logprobs": True, "top_logprobs": 2}, "r-6"
        )
        body["generate_chunk"]["choices"][0]["logprobs"] = logprobs(chunks[i])
        return body

    both["derender a chat stream with logprobs"] = stream_to_both(mmprep, vllm, len(chunks), chunk_with_logprobs)
    completion = {"prompt": "The quick brown fox", "max_tokens": len(tokens), "logprobs": 1, "stream": True}

    def completion_event(i: int, state: Any) -> dict[str, Any]:
        last = i == len(chunks) - 1
        choice = {
            "index": 0,
            "token_ids": chunks[i],
            "finish_reason": "length" if last else None,
            "logprobs": logprobs(chunks[i]),
        }
        event: dict[str, Any] = {"request_id": "r-7", "choices": [choice]}
        if last:
            event["usage"] = {"prompt_tokens": 4, "completion_tokens": len(tokens)}
        return {
            "stream": True,
            "generate_chunk": event,
            "stream_state": state,
            "prompt_tokens": 4,
            "completion_request": completion,
        }

    both["derender a completion stream with logprobs"] = stream_to_both(
        mmprep, vllm, len(chunks), completion_event, "/v1/completions/derender"
    )
    call(
        "derender a completion of two prompts",
        "/v1/completions/derender",
        {
            "generate_responses": [
                {"request_id": "r-8", "choices": [{"index": 0, "token_ids": tokens, "finish_reason": "length"}]},
                {"request_id": "r-8", "choices": [{"index": 0, "token_ids": tokens[:3], "finish_reason": "length"}]},
            ],
            "prompt_tokens": [len(prompt_ids), 4],
            "prompt_token_ids": [prompt_ids, None],
            "completion_request": {"prompt": ["a", "b"], "max_tokens": len(tokens), "return_token_ids": True},
        },
    )
    # A client that switches servers mid-stream: vLLM's state, carried to mmprep, goes on alike.
    state = None
    for i in range(len(chunks)):
        target = vllm if i < len(chunks) // 2 else mmprep
        answer = target.post(DERENDER, chunk_body(i, state))
        both.setdefault("derender a stream begun at vLLM, ended here", []).append(
            (answer, both["derender a chat stream, 1-3 tokens a call"][i][1])
        )
        state = (answer[1] or {}).get("stream_state")
    for name, path, bad in (
        ("a derender of the wrong type", DERENDER, {"generate_response": "nope"}),
        ("a derender for an unknown model", DERENDER, {**chunk_body(0, None), "model": "no-such-model"}),
        ("a stream state that does not fit", DERENDER, chunk_body(1, {"prefix_offset": -1})),
        ("a tokenize of the wrong type", "/tokenize", {"prompt": 5}),
        ("a detokenize of the wrong type", "/detokenize", {"tokens": ["a"]}),
    ):
        call(name, path, bad)
    call("tokenize after the bad bodies", "/tokenize", {"prompt": "The quick brown fox"})
    return both


CASES = [
    "tokenize a prompt",
    "tokenize a chat",
    "tokenize the answer",
    "detokenize",
    "derender a chat answer",
    "derender a completion answer",
    "derender a chat stream, 1-3 tokens a call",
    "derender a stream begun at vLLM, ended here",
    "derender a chat answer with logprobs",
    "derender a chat answer of two choices",
    "derender a chat answer ended by a stop string",
    "derender a completion answer with logprobs",
    "derender a chat stream with logprobs",
    "derender a completion stream with logprobs",
    "derender a completion of two prompts",
    "tokenize after the bad bodies",
]
BAD_BODY_CASES = [
    "a derender of the wrong type",
    "a derender for an unknown model",
    "a stream state that does not fit",
    "a tokenize of the wrong type",
    "a detokenize of the wrong type",
]


def assert_each_call_answered_alike(calls: list[Any]) -> None:
    """Each call answered 200 by both servers, the answers equal but for what is volatile."""
    for i, ((ours_status, ours), (theirs_status, theirs)) in enumerate(calls):
        assert theirs_status == 200, f"call {i}: vLLM answered {theirs_status}: {theirs}"
        assert ours_status == 200, f"call {i} of {len(calls)}: mmprep answered {ours_status}: {ours}"
        assert not (differ := differences(steady(ours), steady(theirs))), f"call {i} of {len(calls)}: {differ}"


def assert_stream_joins_to_the_whole_answer(routes: dict[str, list[Any]], kind: str) -> None:
    """The comparisons would pass two servers that agree on a wrong text: mmprep's streamed
    deltas must join to the text the tokens spell, as its whole derender says it. (With a
    reasoning parser, a text with no closing marker is all reasoning: both are joined.)"""

    def text(part: dict[str, Any]) -> str:
        return (part.get("reasoning") or "") + (part.get("content") or "")

    whole = text(routes["derender a chat answer"][0][0][1]["choices"][0]["message"])
    chunks = [answer.get("chunk") or {} for (_, answer), _ in routes["derender a chat stream, 1-3 tokens a call"]]
    deltas = [text(c["choices"][0]["delta"]) for c in chunks if c.get("choices")]
    assert "".join(deltas) == whole and whole.strip() == ANSWER_TEXT, (kind, deltas, whole)


def assert_answered_with_vllms_error(calls: list[Any]) -> None:
    """One bad body: vLLM's 4xx, and mmprep's the same status in vLLM's error shape."""
    [((ours_status, ours), (theirs_status, theirs))] = calls
    assert 400 <= theirs_status < 500, (theirs_status, theirs)
    assert ours_status == theirs_status, (ours, theirs)
    assert set(ours["error"]) == set(theirs["error"]) and ours["error"]["code"] == theirs["error"]["code"], (ours, theirs)
