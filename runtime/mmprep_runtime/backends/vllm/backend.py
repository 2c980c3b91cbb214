"""The vLLM ``RenderBackend``: requests answered by vLLM's own render server in worker processes
(``worker_pool``), reached through ``forwarding``. It answers every route of that server
(render, derender, tokenize, the Anthropic and Responses renders) for every model the installed
vLLM renders, exactly as that vLLM answers.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import orjson
from aiohttp import web

from mmprep_runtime.backends.protocol import Operation, Reply
from mmprep_runtime.backends.vllm import forwarding, reasoning_count, worker_pool
from mmprep_runtime.httpio import fetching
from mmprep_runtime.httpio.messages import Answer
from mmprep_runtime.settings import RenderSettings

#: Request headers handed on to vLLM's render process (its request id comes from X-Request-Id).
_FORWARDED_HEADERS: Final = ("X-Request-Id", "Content-Type")

#: The backend's own start-up failure: the general path cannot run here.
Unavailable = worker_pool.GeneralPathUnavailable


class VllmBackend:
    def __init__(self, pool: worker_pool.VllmWorkerPool, fetcher: fetching.Fetcher) -> None:
        self.pool = pool
        self.forwarder = forwarding.GeneralRenderer(pool, fetcher)

    @classmethod
    def start(cls, model: str, processes: int, render: RenderSettings, fetcher: fetching.Fetcher) -> VllmBackend:
        """``processes`` of vLLM's render server for ``model``, started and healthy (blocking);
        raises ``Unavailable`` when they cannot start."""
        pool = worker_pool.VllmWorkerPool(model, processes, worker_pool.vllm_options(render))
        pool.start(worker_pool.START_TIMEOUT_S)
        return cls(pool, fetcher)

    @property
    def workers(self) -> int:
        return self.pool.processes

    @property
    def busy(self) -> int:
        return self.pool.busy

    @property
    def busy_seconds(self) -> float:
        return self.pool.busy_seconds

    def queued(self, in_flight: int) -> int:
        # The processes queue nothing of ours: whatever is admitted and not in a process waits.
        return max(0, in_flight - self.pool.busy)

    @property
    def no_workers_reason(self) -> str | None:
        return self.pool.no_workers_reason

    async def answer(self, request: web.Request, body: bytes, operation: Operation) -> Answer:
        # Every route is vLLM's own: the request goes to a render process as it came.
        headers = {name: value for name in _FORWARDED_HEADERS if (value := request.headers.get(name)) is not None}
        return Answer(await self.forwarder.forward(request, body, headers), 0.0)

    async def call(self, operation: Operation, body: bytes, request_id: str | None) -> Reply:
        headers = {"Content-Type": "application/json"}
        if request_id is not None:
            headers["X-Request-Id"] = request_id
        method = "GET" if operation is Operation.TOKENIZER_INFO else "POST"
        return await self.forwarder.call(method, operation.value, body, headers)

    async def reasoning_tokens(self, chat_request: dict[str, Any], token_ids: list[list[int]]) -> list[int] | None:
        body = orjson.dumps({"chat_request": chat_request, "token_ids": token_ids})
        reply = await self.forwarder.call("POST", reasoning_count.ROUTE, body, {"Content-Type": "application/json"})
        if reply.status != 200:
            return None
        found = orjson.loads(reply.body).get("reasoning_tokens")
        return [int(n) for n in found] if isinstance(found, list) else None

    def info(self) -> dict[str, Any]:
        return {"general": self.pool.info()}

    async def close(self, timeout: float) -> None:
        await self.forwarder.close()
        await asyncio.to_thread(self.pool.close, timeout)
