"""The render processes' answer splicing (``backends.vllm.answer_splice``): markers written by vLLM's
JSON encoder become the base64 they stand for, and nothing else changes. That vLLM's answers come
out byte for byte the same is the compatibility tests' to show, against vLLM's own server."""

from __future__ import annotations

import base64
import json

import orjson

from mmprep_runtime.backends.vllm import answer_splice


def test_each_marker_becomes_its_base64_and_the_json_reads_the_same() -> None:
    kept = answer_splice._Kept()
    items = [base64.b64encode(bytes(range(256)) * 300), base64.b64encode(b"\xff" * 90_000)]
    answer = {"features": {"kwargs_data": {"image": [kept.keep(item) for item in items]}, "mm_metadata": None}, "model": "m"}
    spliced = kept.splice(orjson.dumps(answer))
    assert spliced is not None
    expected = {"features": {"kwargs_data": {"image": [item.decode() for item in items]}, "mm_metadata": None}, "model": "m"}
    assert spliced == orjson.dumps(expected)
    assert json.loads(spliced) == expected
    assert len(kept) == 0, "a spliced item is forgotten"


def test_an_answer_without_markers_is_left_alone_and_others_markers_stay() -> None:
    kept, other = answer_splice._Kept(), answer_splice._Kept()
    assert kept.splice(b'{"token_ids":[1,2]}') is None
    foreign = other.keep(b"QUJD")
    body = orjson.dumps({"a": foreign, "b": kept.keep(b"REVG")})
    assert kept.splice(body) == orjson.dumps({"a": foreign, "b": "REVG"})
    assert len(other) == 1


def test_markers_whose_answer_never_came_are_forgotten(monkeypatch) -> None:
    kept = answer_splice._Kept()
    kept.keep(b"QUJD")  # its request failed after encoding: no answer will carry it
    now = answer_splice.time.monotonic()
    monkeypatch.setattr(answer_splice.time, "monotonic", lambda: now + answer_splice._FORGET_AFTER_S + 1)
    assert kept.splice(orjson.dumps({"x": kept.keep(b"REVG")})) == b'{"x":"REVG"}'
    assert len(kept) == 0


def test_without_vllm_nothing_is_wrapped() -> None:
    # This virtualenv has no vLLM (the render processes' does): install() declines and says so.
    assert answer_splice.install() is False
