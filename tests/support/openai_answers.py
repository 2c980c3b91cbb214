"""Reading OpenAI answers in the compatibility tests: a request's raw answer, a stream's events,
what an OpenAI client makes of a stream, and a server's Prometheus samples."""

from __future__ import annotations

import http.client
import json
from collections.abc import Collection
from typing import Any

from support.render_servers import Server


def post(server: Server, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def events(raw: bytes) -> list[Any]:
    """The payloads of a server-sent event stream, ``"[DONE]"`` as itself."""
    payloads = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
    return [p if p == "[DONE]" else json.loads(p) for p in payloads]


def read_stream(events: list[Any], leave_out: Collection[str] = ()) -> dict[str, Any]:
    """What an OpenAI client makes of a stream: per choice its joined text, reasoning, tool calls
    and logprobs and its finish reason; the usage; the ids the events carried."""
    assert events and events[-1] == "[DONE]", events[-3:]
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    ids = set()
    for event in events[:-1]:
        assert "error" not in event, event
        ids.add(event["id"])
        if event.get("usage"):
            usage = {k: v for k, v in event["usage"].items() if k not in leave_out}
        for choice in event["choices"]:
            seen = choices.setdefault(choice["index"], {"text": "", "reasoning": "", "tools": {}, "finish": None, "logprobs": []})
            seen["logprobs"] += _logprob_entries(choice.get("logprobs"))
            delta = choice.get("delta") or {}
            seen["text"] += (delta.get("content") if "delta" in choice else choice.get("text")) or ""
            seen["reasoning"] += delta.get("reasoning") or ""
            for call in delta.get("tool_calls") or ():
                tool = seen["tools"].setdefault(call["index"], {"name": "", "arguments": ""})
                function = call.get("function") or {}
                tool["name"] += function.get("name") or ""
                tool["arguments"] += function.get("arguments") or ""
            seen["finish"] = choice.get("finish_reason") or seen["finish"]
    return {"choices": choices, "usage": usage, "ids": ids}


def _logprob_entries(logprobs: Any) -> list[Any]:
    """A chunk's logprobs, one entry per token: a chat's ``content``, a completion's parallel lists
    zipped."""
    if not logprobs:
        return []
    if "content" in logprobs:
        return list(logprobs["content"] or [])
    fields = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    return [dict(zip(fields, entry, strict=True)) for entry in zip(*(logprobs[f] for f in fields), strict=True)]


def metric(server: Server, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``, from ``/metrics``."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        sample, _, value = line.rpartition(" ")
        if sample.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in sample for k, v in labels.items()):
            total += float(value)
    return total
