"""The native derender (``backends.native.derender``) with a real tokenizer: the tiny Qwen2-VL
folder's, loaded by transformers. Its answers are compared with vLLM's render server, byte for
byte, in the compatibility suite (``tests/compat/test_vllm_render_compat.py`` without vLLM,
``test_general_path_compat.py`` beside it); here, what it must hold on its own: a stream's deltas
join to the whole answer's text (characters split across tokens held back, never broken), the stop
token's text left out, stop strings cut, logprobs in each endpoint's shape, vLLM's stream state
carried, and bad bodies refused with vLLM's status."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import orjson
import pytest
from transformers import AutoTokenizer

from mmprep_runtime import errors
from mmprep_runtime.backends import choice, model_facts
from mmprep_runtime.backends.model_facts import ModelFacts
from mmprep_runtime.backends.native import derender
from mmprep_runtime.backends.native.backend import NativeBackend
from mmprep_runtime.backends.protocol import Operation

TEXT = "Paris is sunny, café ☕ 日本語 ok."


@pytest.fixture(scope="module")
def tokenizer(qwen_dir: pathlib.Path) -> Any:
    return AutoTokenizer.from_pretrained(qwen_dir)


#: The model as derender reads it: its served name, its context length, its generation EOS ids.
MODEL = ModelFacts("m", "m", max_model_len=4096, dtype=None, image_token_id=None, device_normalize=False)


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _eos(tokenizer: Any) -> int:
    """The tokenizer's EOS: the engine reports no stop reason for it, and derender drops it."""
    return int(tokenizer.eos_token_id)


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
    answer = derender.chat(tokenizer, _whole(ids), MODEL)
    [choice] = answer["choices"]
    assert choice["message"]["content"] == TEXT and choice["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == len(ids) and answer["usage"]["prompt_tokens"] == 7
    # Kept special tokens still leave the stop token out: the engine never writes its text.
    kept = derender.chat(tokenizer, _whole(ids, skip_special_tokens=False), MODEL)
    assert kept["choices"][0]["message"]["content"] == TEXT


def test_a_stop_string_is_cut_where_it_begins_unless_asked_to_stay(tokenizer: Any) -> None:
    body = _whole(_ids(tokenizer, TEXT))
    body["generate_response"]["choices"][0]["stop_reason"] = "sunny"
    assert derender.chat(tokenizer, body, MODEL)["choices"][0]["message"]["content"] == "Paris is "
    body["chat_request"]["include_stop_str_in_output"] = True
    # Kept, it ends the text: the engine stopped there.
    assert derender.chat(tokenizer, body, MODEL)["choices"][0]["message"]["content"] == "Paris is sunny"


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
        answer = derender.chat_stream(tokenizer, {**body, "chat_request": request}, MODEL)
        state = answer["stream_state"]
        [out] = answer["chunk"]["choices"]
        assert "\ufffd" not in (out["delta"]["content"] or ""), "a character split across tokens is held back, not broken"
        assert (out["delta"]["role"] == "assistant") == (start == 0)
        deltas.append(out["delta"]["content"] or "")
    assert "".join(deltas) == TEXT
    assert out["finish_reason"] == "stop"


def test_a_streamed_completion_carries_text_and_the_usage_event(tokenizer: Any) -> None:
    ids = _ids(tokenizer, TEXT)
    first = derender.completion_stream(
        tokenizer, {"stream": True, "generate_chunk": {"request_id": "r", "choices": [{"index": 0, "token_ids": ids}]}}, MODEL
    )
    assert first["chunk"]["choices"][0]["text"] == TEXT and first["chunk"]["object"] == "text_completion"
    usage_event = {"request_id": "r", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": len(ids)}}
    last = derender.completion_stream(
        tokenizer, {"stream": True, "generate_chunk": usage_event, "stream_state": first["stream_state"]}, MODEL
    )
    assert last["chunk"]["choices"] == [] and last["chunk"]["usage"]["total_tokens"] == 3 + len(ids)


def _logprobs(ids: list[int]) -> dict[str, Any]:
    """The engine's integer-id logprobs: the sampled token first, then two others."""

    def candidate(token: int, rank: int) -> dict[str, Any]:
        return {"token_id": token, "logprob": -1.0 * rank, "rank": rank}

    return {
        "content": [
            {**candidate(t, 1), "top_logprobs": [candidate(t, 1), candidate(ids[0], 2), candidate(ids[-1], 3)]} for t in ids
        ]
    }


def test_chat_logprobs_are_strings_and_bytes_cut_to_top_logprobs(tokenizer: Any) -> None:
    ids = _ids(tokenizer, TEXT)
    body = _whole(ids, logprobs=True, top_logprobs=1)
    body["generate_response"]["choices"][0]["logprobs"] = _logprobs(ids)
    content = derender.chat(tokenizer, body, MODEL)["choices"][0]["logprobs"]["content"]
    assert len(content) == len(ids) and all(len(entry["top_logprobs"]) == 1 for entry in content)
    # Each token's text, a split character finished from the tokens before it: they join to the text.
    assert "".join(entry["token"] for entry in content) == TEXT
    assert all(bytes(entry["bytes"]).decode() == entry["token"] for entry in content)


def test_completion_logprobs_keep_logprobs_plus_one_and_absolute_offsets_across_a_stream(tokenizer: Any) -> None:
    ids = _ids(tokenizer, TEXT)
    state, tokens, offsets = None, [], []
    for start in range(0, len(ids), 3):
        chunk = ids[start : start + 3]
        choice = {"index": 0, "token_ids": chunk, "logprobs": _logprobs(chunk)}
        body = {"stream": True, "generate_chunk": {"request_id": "r", "choices": [choice]}, "stream_state": state}
        answer = derender.completion_stream(tokenizer, {**body, "completion_request": {"prompt": "x", "logprobs": 1}}, MODEL)
        state = answer["stream_state"]
        logprobs = answer["chunk"]["choices"][0]["logprobs"]
        assert all(len(top) <= 2 for top in logprobs["top_logprobs"])
        tokens += logprobs["tokens"]
        offsets += logprobs["text_offset"]
    assert offsets == [len("".join(tokens[:i])) for i in range(len(tokens))]
    assert state["logprob_text_offset"] == len(TEXT) and len(state["logprob_context_token_ids"]) == 4


def test_the_stream_state_is_vllms_and_a_stream_goes_on_from_any_carried_state(tokenizer: Any) -> None:
    ids = _ids(tokenizer, TEXT)
    request = {"messages": [{"role": "user", "content": "hi"}]}

    def call(chunk: list[int], state: Any) -> dict[str, Any]:
        body = {"stream": True, "generate_chunk": {"request_id": "r", "choices": [{"index": 0, "token_ids": chunk}]}}
        return derender.chat_stream(tokenizer, {**body, "stream_state": state, "chat_request": request}, MODEL)

    first = call(ids[:5], None)
    assert list(first["stream_state"]) == [
        "prev_tokens",
        "prefix_offset",
        "read_offset",
        "role_sent",
        "logprob_context_token_ids",
        "logprob_text_offset",
        "output_token_ids",
        "output_chunk_lens",
        "tools_streamed",
        "last_tool_call_ids",
    ]
    # The window stays a few tokens long: the state does not grow with the answer.
    assert len(first["stream_state"]["prev_tokens"]) <= 5
    # A state sent through JSON (as a client carries it) goes on to the same text.
    carried = orjson.loads(orjson.dumps(first["stream_state"]))
    rest = call(ids[5:], carried)
    assert (first["chunk"]["choices"][0]["delta"]["content"] or "") + (
        rest["chunk"]["choices"][0]["delta"]["content"] or ""
    ) == TEXT


def test_a_stop_token_id_is_left_out_and_reported_and_min_tokens_shields_a_stop_string(tokenizer: Any) -> None:
    ids = _ids(tokenizer, TEXT)
    body = _whole(ids, stop_token_ids=[ids[-1]])
    [choice] = derender.chat(tokenizer, body, MODEL)["choices"]
    assert choice["stop_reason"] == ids[-1] and choice["message"]["content"] == tokenizer.decode(ids[:-1])
    # A stop string the host did not report is found in the text, but only past min_tokens.
    body = _whole(ids, stop=["Paris"])
    assert derender.chat(tokenizer, body, MODEL)["choices"][0]["message"]["content"] == ""
    body = _whole(ids, stop=["Paris"], min_tokens=len(ids))
    assert derender.chat(tokenizer, body, MODEL)["choices"][0]["message"]["content"] == TEXT


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"generate_response": "nope"}, 400),
        ({"generate_response": {"request_id": "r", "choices": [{"index": 0, "token_ids": []}]}}, 400),
        ({"generate_response": {"request_id": "r", "choices": [{"index": 0, "token_ids": [1]}]}, "model": "other"}, 404),
        ({"generate_response": {"request_id": "r", "choices": [{"index": 0, "token_ids": [1] * 5000}]}}, 400),
        ({"stream": True, "generate_chunk": {"request_id": "r", "choices": []}, "stream_state": {"prefix_offset": -1}}, 400),
        (
            {"stream": True, "generate_chunk": {"request_id": "r", "choices": []}, "chat_request": {"messages": [], "stop": "x"}},
            400,
        ),
        ({"stream": "yes", "generate_chunk": {"request_id": "r", "choices": []}}, 400),
    ],
)
def test_a_bad_body_gets_vllms_status(tokenizer: Any, body: dict[str, Any], status: int) -> None:
    with pytest.raises(errors.RequestError) as refused:
        derender.chat_any(tokenizer, body, MODEL)
    assert refused.value.status == status and not isinstance(refused.value, errors.BeyondFastPath)


def test_what_only_vllms_code_passes_on_is_beyond_the_native_path(tokenizer: Any) -> None:
    body = _whole(_ids(tokenizer, "ok"))
    body["generate_response"]["prompt_logprobs"] = [None, {"5": {"logprob": -1.0}}]
    with pytest.raises(errors.BeyondFastPath, match="prompt_logprobs"):
        derender.chat(tokenizer, body, MODEL)


@pytest.mark.parametrize(
    ("vllm_args", "parses"),
    [
        ([], False),
        (["--tool-call-parser", "hermes"], True),
        (["--reasoning-parser=qwen3"], True),
        (["--chat-template", "x"], False),
    ],
)
def test_with_a_parser_configured_a_chat_derender_is_vllms(vllm_args: list[str], parses: bool) -> None:
    # vLLM's chat derender parses every chat when a parser is configured: the native backend then
    # hands chat derenders on (the fallback, or a 501 naming the vLLM image); completions stay.
    assert choice.parses_chats(vllm_args) is parses
    native = NativeBackend(None, MODEL, None, None, parses_chats=choice.parses_chats(vllm_args))  # type: ignore[arg-type]
    assert native._derender_of(Operation.COMPLETION_DERENDER) is derender.completion_any
    if parses:
        with pytest.raises(errors.NeedsVllm, match="parser"):
            native._derender_of(Operation.CHAT_DERENDER)
    else:
        assert native._derender_of(Operation.CHAT_DERENDER) is derender.chat_any


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"generation_config.json": {"eos_token_id": [7, 9]}, "config.json": {"eos_token_id": 2}}, {7, 9}),
        ({"config.json": {"eos_token_id": 2, "text_config": {"eos_token_id": 3}}}, {3}),
        ({"config.json": {"eos_token_id": 2}}, {2}),
        ({}, set()),
    ],
)
def test_the_models_stop_ids_come_from_its_generation_config_or_else_its_config(
    tmp_path: pathlib.Path, files: dict[str, Any], expected: set[int]
) -> None:
    # vLLM reads generation_config.json, or derives one from config.json without it.
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))
    config = json.loads((tmp_path / "config.json").read_text()) if "config.json" in files else {}
    assert model_facts._generation_eos(str(tmp_path), config) == expected
