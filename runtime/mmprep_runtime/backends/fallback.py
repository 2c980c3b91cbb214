"""A backend with a second one behind it: what the first does not answer exactly
(``errors.BeyondFastPath``, ``errors.NeedsVllm``) the second answers, so a native family keeps
vLLM's answers for videos, tool lists, chat-template arguments and the routes the native path
does not serve (derender, tokenize, ...) while its images take the fast path.

Everything the server reads (workers, load, readiness) is the first backend's: it serves the
requests; the second serves the few the first hands on.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from mmprep_runtime import errors
from mmprep_runtime.backends.protocol import Operation, RenderBackend, Reply
from mmprep_runtime.httpio.messages import Answer


class WithFallback:
    def __init__(self, primary: RenderBackend, fallback: RenderBackend) -> None:
        self.primary = primary
        self.fallback = fallback

    @property
    def workers(self) -> int:
        return self.primary.workers

    @property
    def busy(self) -> int:
        return self.primary.busy

    @property
    def busy_seconds(self) -> float:
        return self.primary.busy_seconds

    def queued(self, in_flight: int) -> int:
        return self.primary.queued(in_flight)

    @property
    def no_workers_reason(self) -> str | None:
        return self.primary.no_workers_reason

    async def answer(self, request: web.Request, body: bytes, operation: Operation) -> Answer:
        try:
            return await self.primary.answer(request, body, operation)
        except (errors.BeyondFastPath, errors.NeedsVllm):
            return await self.fallback.answer(request, body, operation)

    async def call(self, operation: Operation, body: bytes, request_id: str | None) -> Reply:
        try:
            return await self.primary.call(operation, body, request_id)
        except (errors.BeyondFastPath, errors.NeedsVllm):
            return await self.fallback.call(operation, body, request_id)

    async def reasoning_tokens(self, chat_request: dict[str, Any], token_ids: list[list[int]]) -> list[int] | None:
        return await self.fallback.reasoning_tokens(chat_request, token_ids)

    def info(self) -> dict[str, Any]:
        return {**self.primary.info(), **self.fallback.info()}

    async def close(self, timeout: float) -> None:
        await self.fallback.close(timeout)
        await self.primary.close(timeout)
