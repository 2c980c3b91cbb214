"""The native ``RenderBackend``: vLLM's render API answered by mmprep's own stages
(``stages.RenderApi``) on the clone-per-thread engine, the pool that also serves
``/v1/preprocess``.

A request it does not render exactly (a video, a tool list, a chat-template argument) raises
``errors.BeyondFastPath``: a 4xx on its own, or the general backend's turn behind ``fallback``.
``/tokenize`` and ``/detokenize`` are answered here too (``tokens``), on the same pool. The other
routes of vLLM's render server (derender, tokenizer_info, the Anthropic and Responses renders)
need vLLM's own code (its detokenizer's stream state, its parsers, its request conversions): they
raise ``errors.NeedsVllm``, the general backend's turn where vLLM is installed, a 501 naming the
image that serves them where it is not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import orjson
from aiohttp import web

from mmprep_runtime import errors
from mmprep_runtime.backends.model_facts import ModelFacts
from mmprep_runtime.backends.native import derender, stages, tokens
from mmprep_runtime.backends.protocol import Operation, Reply
from mmprep_runtime.engine import core, patches, pipeline
from mmprep_runtime.httpio import fetching
from mmprep_runtime.httpio.messages import JSON_TYPE, Answer, answer_response
from mmprep_runtime.settings import Limits


def _whole_or_streamed(
    whole: Callable[[Any, dict[str, Any], str], dict[str, Any]], streamed: Callable[[Any, dict[str, Any], str], dict[str, Any]]
) -> Callable[[Any, dict[str, Any], str], dict[str, Any]]:
    def derender_body(tokenizer: Any, body: dict[str, Any], model: str) -> dict[str, Any]:
        return (streamed if body.get("stream") else whole)(tokenizer, body, model)

    return derender_body


#: The derenders the OpenAI front asks of this backend (``call``); the routes stay vLLM's.
_DERENDERS: Final = {
    Operation.CHAT_DERENDER: _whole_or_streamed(derender.chat, derender.chat_stream),
    Operation.COMPLETION_DERENDER: _whole_or_streamed(derender.completion, derender.completion_stream),
}


class NativeBackend:
    def __init__(self, engine: core.Engine, model: ModelFacts, limits: Limits, fetcher: fetching.Fetcher) -> None:
        self.engine = engine
        self.model = model
        self.limits = limits
        self.fetcher = fetcher

    @property
    def workers(self) -> int:
        return self.engine.decision.processor_workers

    @property
    def busy(self) -> int:
        return self.engine.pool.busy

    @property
    def busy_seconds(self) -> float:
        return self.engine.pool.busy_seconds

    def queued(self, in_flight: int) -> int:
        # The engine's own queue: requests waiting for a worker thread, of every API alike.
        return self.engine.pool.waiting

    @property
    def no_workers_reason(self) -> str | None:
        return self.engine.pool.no_workers_reason

    def _api(self, operation: Operation, request_id: str | None) -> pipeline.Api[Any, Any]:
        if operation is Operation.TOKENIZE:
            return tokens.TokenizeApi(self._render_api(Operation.CHAT_RENDER, request_id))
        if operation is Operation.DETOKENIZE:
            return tokens.DetokenizeApi(self._render_api(Operation.CHAT_RENDER, request_id))
        return self._render_api(operation, request_id)

    def _render_api(self, operation: Operation, request_id: str | None) -> stages.RenderApi:
        if operation not in (Operation.CHAT_RENDER, Operation.COMPLETION_RENDER):
            raise errors.NeedsVllm(
                f"{operation.value} is answered by vLLM's own code, which this server does not have: "
                "serve the model from the mmprep-runtime-vllm image (mmprep[vllm]), which answers every "
                "route of vLLM's render server"
            )
        chat = operation is Operation.CHAT_RENDER
        return stages.RenderApi(self.engine.facts, self.model, self.limits, self.fetcher, chat, request_id=request_id)

    async def answer(self, request: web.Request, body: bytes, operation: Operation) -> Answer:
        api = self._api(operation, request.headers.get("X-Request-Id"))
        served = await self.engine.serve(api, body)
        return Answer(answer_response(served.payload, JSON_TYPE), served.decode_seconds)

    async def call(self, operation: Operation, body: bytes, request_id: str | None) -> Reply:
        derender_body = _DERENDERS.get(operation)
        if derender_body is not None:
            return Reply(200, orjson.dumps(self._derender(derender_body, body)))
        api = self._render_api(operation, request_id)
        # The front renders to generate and then derender: a request whose answer this backend
        # cannot derender goes to vLLM's render (the fallback) before any token is generated.
        try:
            derender.check(orjson.loads(body))
        except orjson.JSONDecodeError:
            pass  # the render answers it
        served = await self.engine.serve(api, body)
        payload = served.payload
        return Reply(200, payload if isinstance(payload, bytes) else payload.joined())

    def _derender(self, derender: Callable[[Any, dict[str, Any], str], dict[str, Any]], body: bytes) -> dict[str, Any]:
        # The OpenAI front's own call, on the event loop: decoding an event's few ids takes
        # microseconds, a whole answer's thousand a fraction of a millisecond.
        parsed = orjson.loads(body)
        if parsed.get("stream") and not isinstance(parsed.get("stream_state"), (dict, type(None))):
            raise errors.BadRequest("stream_state must be an object")
        return derender(patches.tokenizer_of(self.engine.processor), parsed, self.model.served_name)

    def info(self) -> dict[str, Any]:
        return {}

    async def close(self, timeout: float) -> None:
        # The engine is the server's (it serves /v1/preprocess too): the server closes it.
        return None
