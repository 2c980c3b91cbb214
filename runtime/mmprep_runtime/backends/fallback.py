"""A backend with a second one behind it: what the first does not render exactly
(``errors.BeyondFastPath``) the second renders, so a native family keeps vLLM's answers for
videos, tool lists and chat-template arguments while its images take the fast path.

Everything the server reads (workers, load, readiness) is the first backend's: it serves the
requests; the second serves the few the first hands on.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from mmprep_runtime import errors
from mmprep_runtime.backends.protocol import RenderBackend
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

    async def render(self, request: web.Request, body: bytes, *, chat: bool) -> Answer:
        try:
            return await self.primary.render(request, body, chat=chat)
        except errors.BeyondFastPath:
            return await self.fallback.render(request, body, chat=chat)

    def info(self) -> dict[str, Any]:
        return {**self.primary.info(), **self.fallback.info()}

    async def close(self, timeout: float) -> None:
        await self.fallback.close(timeout)
        await self.primary.close(timeout)
