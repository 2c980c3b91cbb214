"""The native ``RenderBackend``: vLLM's render API answered by mmprep's own stages
(``stages.RenderApi``) on the clone-per-thread engine, the pool that also serves
``/v1/preprocess``.

A request it does not render exactly (a video, a tool list, a chat-template argument) raises
``errors.BeyondFastPath``: a 4xx on its own, or the general backend's turn behind ``fallback``.
``/tokenize``, ``/detokenize`` (``tokens``) and both derenders (``derender``) are answered here
too, on the same pool, exactly as vLLM answers them without a parser. A chat derender when a
tool or reasoning parser is configured, the Anthropic and Responses renders and
``/tokenizer_info`` need vLLM's own code (its parsers, its request conversions): they raise
``errors.NeedsVllm``, the general backend's turn where vLLM is installed, a 501 naming the image
that serves them where it is not.
"""

from __future__ import annotations

import dataclasses
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

#: The derenders answered here, by the body's ``stream`` whole or streamed.
_DERENDERS: Final[dict[Operation, derender.Derender]] = {
    Operation.CHAT_DERENDER: derender.chat_any,
    Operation.COMPLETION_DERENDER: derender.completion_any,
}


@dataclasses.dataclass(frozen=True)
class DerenderApi:
    """A derender route on the engine: each worker decodes with its own tokenizer (a whole answer
    with logprobs decodes thousands of tokens: off the event loop)."""

    derender: derender.Derender
    model: ModelFacts
    large_answer: bool = False

    def decode(self, body: bytes) -> dict[str, Any]:
        return pipeline.json_object(body)

    def needs_fetch(self, request: dict[str, Any]) -> bool:
        return False

    async def fetch(self, request: dict[str, Any]) -> dict[str, Any]:
        return request

    def process(self, processor: Any, request: dict[str, Any]) -> dict[str, Any]:
        return self.derender(patches.tokenizer_of(processor), request, self.model)

    def encode(self, answer: dict[str, Any]) -> bytes:
        return orjson.dumps(answer)


class NativeBackend:
    def __init__(
        self, engine: core.Engine, model: ModelFacts, limits: Limits, fetcher: fetching.Fetcher, *, parses_chats: bool = False
    ) -> None:
        self.engine = engine
        self.model = model
        self.limits = limits
        self.fetcher = fetcher
        #: A tool or reasoning parser is configured: vLLM's derender parses every chat with it.
        self.parses_chats = parses_chats

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
        derender_body = self._derender_of(operation)
        if derender_body is not None:
            return DerenderApi(derender_body, self.model)
        if operation is Operation.TOKENIZE:
            return tokens.TokenizeApi(self._render_api(Operation.CHAT_RENDER, request_id))
        if operation is Operation.DETOKENIZE:
            return tokens.DetokenizeApi(self._render_api(Operation.CHAT_RENDER, request_id))
        return self._render_api(operation, request_id)

    def _derender_of(self, operation: Operation) -> derender.Derender | None:
        if operation is Operation.CHAT_DERENDER and self.parses_chats:
            raise errors.NeedsVllm(
                "a chat derender with a tool or reasoning parser configured is parsed by vLLM's own code, which this "
                "server does not have: serve the model from the mmprep-runtime-vllm image (mmprep[vllm])"
            )
        return _DERENDERS.get(operation)

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
        derender_body = self._derender_of(operation)
        if derender_body is not None:
            parsed = pipeline.json_object(body)
            if parsed.get("stream") is True:
                # One call per engine event, on the event loop: an event's few ids decode in
                # microseconds, and a hop to a worker thread would cost more. A whole answer
                # (thousands of ids, logprobs) takes the engine's pool, as the route does.
                tokenizer = patches.tokenizer_of(self.engine.processor)
                return Reply(200, orjson.dumps(derender_body(tokenizer, parsed, self.model)))
        api = self._api(operation, request_id)
        served = await self.engine.serve(api, body)
        payload = served.payload
        return Reply(200, payload if isinstance(payload, bytes) else payload.joined())

    async def reasoning_tokens(self, chat_request: dict[str, Any], token_ids: list[list[int]]) -> list[int] | None:
        return None  # no reasoning parser here: vLLM's (the fallback, where installed) counts them

    def info(self) -> dict[str, Any]:
        return {}

    async def close(self, timeout: float) -> None:
        # The engine is the server's (it serves /v1/preprocess too): the server closes it.
        return None
