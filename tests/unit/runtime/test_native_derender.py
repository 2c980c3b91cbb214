"""The native derender (``backends.native.derender``) with a real tokenizer: the tiny Qwen2-VL
folder's, loaded by transformers. Its answers equal to the engine's own API are checked in the
compatibility suite (``tests/compat/test_generate_server.py``); here, what it must hold on its own:
a stream's deltas join to the whole answer's text (characters split across tokens held back, never
broken), the stop token's text left out, stop strings cut, and what it cannot answer refused."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from transformers import AutoTokenizer

from mmprep_runtime import errors
from mmprep_runtime.backends.native import derender

TEXT = "Paris is sunny, café ☕ 日本語 ok."


@pytest.fixture(scope="module")
def tokenizer(qwen_dir: pathlib.Path) -> Any:
    return AutoTokenizer.from_pretrained(qwen_dir)


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _eos(tokenizer: Any) -> int:
    return int(tokenizer.convert_tokens_to_ids("<|im_end|>"))


def _whole(ids: list[int], **request: Any) -> dict[str, Any]:
    choice = {"index": 0, "token_ids": ids, "finish_reason": "stop", "stop_reason": None}
    return {
        "stream": False,
        "generate_response": {"request_id": "generate-tokens-x", "choices": [choice]},
        "prompt_tokens": 7,
        "chat_request": {"messages": [{"role": "user", "content": "hi"}], **request},
    }


def test_a_whole_answer_is_the_text_without_the_stop_token(tokenizer: Any) -> None:
    ids = [*_ids(tokenizer, TEXT), _eos(tokenizer)]
    answer = derender.chat(tokenizer, _whole(ids), "m")
    [choice] = answer["choices"]
    assert choice["message"]["content"] == TEXT and choice["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == len(ids) and answer["usage"]["prompt_tokens"] == 7
    # Kept special tokens still leave the stop token out: the engine never writes its text.
    kept = derender.chat(tokenizer, _whole(ids, skip_special_tokens=False), "m")
    assert kept["choices"][0]["message"]["content"] == TEXT


def test_a_stop_string_is_cut_where_it_begins_unless_asked_to_stay(tokenizer: Any) -> None:
    body = _whole(_ids(tokenizer, TEXT))
    body["generate_response"]["choices"][0]["stop_reason"] = "sunny"
    assert derender.chat(tokenizer, body, "m")["choices"][0]["message"]["content"] == "Paris is "
    body["chat_request"]["include_stop_str_in_output"] = True
    assert derender.chat(tokenizer, body, "m")["choices"][0]["message"]["content"] == TEXT


@pytest.mark.parametrize("per_event", [1, 2, 5])
def test_streamed_deltas_join_to_the_whole_text_and_hold_back_split_characters(tokenizer: Any, per_event: int) -> None:
    ids = [*_ids(tokenizer, TEXT), _eos(tokenizer)]
    request = {"messages": [{"role": "user", "content": "hi"}]}
    state = None
    deltas = []
    for start in range(0, len(ids), per_event):
        chunk_ids = ids[start : start + per_event]
        last = start + per_event >= len(ids)
        # The front leaves the stop token out of the last event (``chain._drop_stop_token``).
        choice = {"index": 0, "token_ids": chunk_ids[:-1] if last else chunk_ids, "finish_reason": "stop" if last else None}
        body = {"stream": True, "generate_chunk": {"request_id": "r", "choices": [choice]}, "stream_state": state}
        answer = derender.chat_stream(tokenizer, {**body, "chat_request": request}, "m")
        state = answer["stream_state"]
        [out] = answer["chunk"]["choices"]
        assert "\ufffd" not in out["delta"]["content"], "a character split across tokens is held back, not broken"
        assert ("role" in out["delta"]) == (start == 0)
        deltas.append(out["delta"]["content"])
    assert "".join(deltas) == TEXT
    assert out["finish_reason"] == "stop"


def test_a_streamed_completion_carries_text_and_the_usage_event(tokenizer: Any) -> None:
    ids = _ids(tokenizer, TEXT)
    first = derender.completion_stream(
        tokenizer, {"stream": True, "generate_chunk": {"request_id": "r", "choices": [{"index": 0, "token_ids": ids}]}}, "m"
    )
    assert first["chunk"]["choices"][0]["text"] == TEXT and first["chunk"]["object"] == "text_completion"
    usage_event = {"request_id": "r", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": len(ids)}}
    last = derender.completion_stream(
        tokenizer, {"stream": True, "generate_chunk": usage_event, "stream_state": first["stream_state"]}, "m"
    )
    assert last["chunk"]["choices"] == [] and last["chunk"]["usage"]["total_tokens"] == 3 + len(ids)


@pytest.mark.parametrize(
    ("field", "value"),
    [("logprobs", True), ("top_logprobs", 2), ("echo", True), ("prompt_logprobs", 1), ("tools", [{"type": "function"}])],
)
def test_what_only_vllms_derender_answers_is_beyond_the_native_path(tokenizer: Any, field: str, value: Any) -> None:
    with pytest.raises(errors.BeyondFastPath, match=field):
        derender.chat(tokenizer, _whole([1, 2], **{field: value}), "m")
    # A completion's logprobs: 0 asks for the sampled token's: beyond too.
    with pytest.raises(errors.BeyondFastPath):
        derender.check({"prompt": "x", "logprobs": 0})
    derender.check({"prompt": "x", "logprobs": None, "echo": False, "tools": []})
