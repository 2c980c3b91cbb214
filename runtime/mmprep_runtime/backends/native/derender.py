"""The OpenAI front's derender without vLLM: an engine's token ids turned into OpenAI's answer with
the model's own tokenizer, for the requests whose answer is the decoded text alone.

That is a chat or completion without tool calls or reasoning to parse (the native path serves no
parsers: ``choice.NATIVE_CHANGING_OPTIONS``), without logprobs and without ``echo``. Anything
else is ``errors.BeyondFastPath``: vLLM's derender answers it where vLLM is installed (the
fallback), a 400 naming the field where it is not.

The text is what vLLM's engine writes for the same ids: the stop token (its EOS, or one of
``stop_token_ids``) left out, the request's ``skip_special_tokens`` and
``spaces_between_special_tokens`` honoured, the text cut where a stop string begins. Whole or
streamed, the text is decoded incrementally, token by token, as vLLM's detokenizer does: the text
of the ids since a prefix offset, less the text of the ids up to the last read offset, held back
while it ends in an incomplete character (U+FFFD), so bytes of a character the answer never
completes are never written. The state (offsets and the ids so far) is this server's own and
never leaves it (the front carries it from one call to the next).

Bodies and answers are those of vLLM's ``/v1/chat/completions/derender`` and
``/v1/completions/derender``, so the front treats both derenders alike; the routes themselves stay
vLLM's (``errors.NeedsVllm`` without it): this answers only the front's own calls.
"""

from __future__ import annotations

import time
from typing import Any, Final

from mmprep_runtime import errors

#: Request fields whose answer needs more than the decoded text (vLLM's derender has them).
_BEYOND: Final = ("logprobs", "top_logprobs", "echo", "prompt_logprobs", "tools", "return_tokens_as_token_ids")


def _asked(value: Any) -> bool:
    """Whether a request field asks for something: a completion's ``logprobs: 0`` does (the
    sampled token's), ``false``, ``null`` and an empty list do not."""
    return value is not None and value is not False and value != []


def check(request: Any) -> None:
    """``errors.BeyondFastPath`` for a request whose answer needs vLLM's derender."""
    if not isinstance(request, dict):
        return
    for field in _BEYOND:
        if _asked(request.get(field)):
            raise errors.BeyondFastPath(f"`{field}` is derendered by vLLM's code, which this server does not have")


def _decode_options(request: dict[str, Any]) -> dict[str, bool]:
    return {
        "skip_special_tokens": request.get("skip_special_tokens", True) is not False,
        "spaces_between_special_tokens": request.get("spaces_between_special_tokens", True) is not False,
    }


def _decode(tokenizer: Any, ids: list[int], options: dict[str, bool]) -> str:
    text: str = tokenizer.decode(
        ids,
        skip_special_tokens=options["skip_special_tokens"],
        spaces_between_special_tokens=options["spaces_between_special_tokens"],
    )
    return text


def _output_ids(choice: dict[str, Any]) -> list[int]:
    """The ids whose text is written: all but a stop token that ended the choice."""
    ids = list(choice.get("token_ids") or ())
    if ids and choice.get("finish_reason") == "stop" and not isinstance(choice.get("stop_reason"), str):
        ids = ids[:-1]
    return ids


def _cut(text: str, choice: dict[str, Any], request: dict[str, Any]) -> str:
    stop = choice.get("stop_reason")
    if choice.get("finish_reason") == "stop" and isinstance(stop, str) and stop and not request.get("include_stop_str_in_output"):
        at = text.find(stop)
        if at >= 0:
            return text[:at]
    return text


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


def chat(tokenizer: Any, body: dict[str, Any], model: str) -> dict[str, Any]:
    """``/v1/chat/completions/derender``'s answer to a whole generate response."""
    request = body.get("chat_request") or {}
    check(request)
    generated = body["generate_response"]
    options = _decode_options(request)
    choices = []
    for choice in generated.get("choices") or ():
        text = _cut(_text(tokenizer, _output_ids(choice), options), choice, request)
        choices.append(
            {
                "index": choice.get("index", 0),
                "message": {"role": "assistant", "content": text, "reasoning": None, "tool_calls": []},
                "logprobs": None,
                "finish_reason": choice.get("finish_reason"),
                "stop_reason": choice.get("stop_reason"),
            }
        )
    completion = sum(len(c.get("token_ids") or ()) for c in generated.get("choices") or ())
    return {
        "id": generated.get("request_id"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or model,
        "choices": choices,
        "usage": _usage(int(body.get("prompt_tokens") or 0), completion),
    }


def completion(tokenizer: Any, body: dict[str, Any], model: str) -> dict[str, Any]:
    """``/v1/completions/derender``'s answer to the whole generate responses of its prompts."""
    request = body.get("completion_request") or {}
    check(request)
    options = _decode_options(request)
    choices = []
    completion_tokens = 0
    responses = body["generate_responses"]
    n = int(request.get("n") or 1)
    for prompt_index, generated in enumerate(responses):
        for choice in generated.get("choices") or ():
            completion_tokens += len(choice.get("token_ids") or ())
            choices.append(
                {
                    "index": prompt_index * n + int(choice.get("index", 0)),
                    "text": _cut(_text(tokenizer, _output_ids(choice), options), choice, request),
                    "logprobs": None,
                    "finish_reason": choice.get("finish_reason"),
                    "stop_reason": choice.get("stop_reason"),
                }
            )
    prompt_tokens = sum(int(p) for p in body.get("prompt_tokens") or ())
    return {
        "id": responses[0].get("request_id") if responses else None,
        "object": "text_completion",
        "created": int(time.time()),
        "model": body.get("model") or model,
        "choices": choices,
        "usage": _usage(prompt_tokens, completion_tokens),
    }


def _new_state() -> dict[str, Any]:
    return {"ids": [], "prefix_offset": 0, "read_offset": 0, "role_sent": False}


def _delta(tokenizer: Any, state: dict[str, Any], new_ids: list[int], options: dict[str, bool]) -> str:
    """The text ``new_ids`` add after the ids in ``state`` (updated in place), one token at a
    time as the engine's detokenizer takes them: a token that leaves an incomplete character
    (U+FFFD at the end) adds nothing until a later one completes it, and one never completed is
    never written."""
    ids = state["ids"]
    out = []
    for token in new_ids:
        ids.append(token)
        prefix, read = state["prefix_offset"], state["read_offset"]
        before = _decode(tokenizer, ids[prefix:read], options)
        after = _decode(tokenizer, ids[prefix:], options)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            state["prefix_offset"], state["read_offset"] = read, len(ids)
            out.append(after[len(before) :])
    return "".join(out)


def _text(tokenizer: Any, ids: list[int], options: dict[str, bool]) -> str:
    """The whole text of ``ids``, as the engine's detokenizer writes it token by token."""
    return _delta(tokenizer, _new_state(), ids, options)


def _stream(tokenizer: Any, body: dict[str, Any], model: str, *, chat_kind: bool) -> dict[str, Any]:
    request = body.get("chat_request" if chat_kind else "completion_request") or {}
    check(request)
    options = _decode_options(request)
    state = body.get("stream_state") or _new_state()
    event = body["generate_chunk"]
    choices = []
    for choice in event.get("choices") or ():
        text = _delta(tokenizer, state, list(choice.get("token_ids") or ()), options)
        finish = choice.get("finish_reason")
        if chat_kind:
            delta: dict[str, Any] = {"content": text}
            if not state["role_sent"]:
                delta = {"role": "assistant", **delta}
                state["role_sent"] = True
            choices.append({"index": choice.get("index", 0), "delta": delta, "logprobs": None, "finish_reason": finish})
        else:
            choices.append({"index": choice.get("index", 0), "text": text, "logprobs": None, "finish_reason": finish})
        if finish is not None:
            choices[-1]["stop_reason"] = choice.get("stop_reason")
    chunk: dict[str, Any] = {
        "id": event.get("request_id"),
        "object": "chat.completion.chunk" if chat_kind else "text_completion",
        "created": int(time.time()),
        "model": body.get("model") or model,
        "choices": choices,
    }
    if event.get("usage"):
        usage = event["usage"]
        chunk["usage"] = _usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
    return {"chunk": chunk, "stream_state": state}


def chat_stream(tokenizer: Any, body: dict[str, Any], model: str) -> dict[str, Any]:
    """One streamed event of ``/v1/chat/completions/derender``: ``{chunk, stream_state}``."""
    return _stream(tokenizer, body, model, chat_kind=True)


def completion_stream(tokenizer: Any, body: dict[str, Any], model: str) -> dict[str, Any]:
    """One streamed event of ``/v1/completions/derender``: ``{chunk, stream_state}``."""
    return _stream(tokenizer, body, model, chat_kind=False)
