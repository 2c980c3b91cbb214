"""The backend seam: what the server asks of whatever renders vLLM render-API requests.

The server admits requests by ``workers``, reports ``busy``, ``busy_seconds`` and ``queued`` as
metrics, refuses requests while ``no_workers_reason`` says so, hands each request's body to
``render`` and closes the backend at shutdown. It never learns which engine answers: a native
backend and vLLM's processes look the same from here.
"""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from mmprep_runtime.httpio.messages import Answer


class RenderBackend(Protocol):
    @property
    def workers(self) -> int:
        """How many requests it renders at once: the server admits a queue on top of these."""
        ...

    @property
    def busy(self) -> int:
        """Requests being rendered now."""
        ...

    @property
    def busy_seconds(self) -> float:
        """Seconds spent rendering, summed over its workers, since it started."""
        ...

    def queued(self, in_flight: int) -> int:
        """Of ``in_flight`` admitted requests, how many wait for a worker."""
        ...

    @property
    def no_workers_reason(self) -> str | None:
        """Why it can render nothing now (every worker lost), or None."""
        ...

    async def render(self, request: web.Request, body: bytes, *, chat: bool) -> Answer:
        """The answer to one render request (a chat, or a completion), its body read already."""
        ...

    def info(self) -> dict[str, Any]:
        """What ``/v1/info`` shows of it beside the path chosen."""
        ...

    async def close(self, timeout: float) -> None:
        """Stop, within ``timeout`` seconds; the requests it held are done or cut off already."""
        ...
