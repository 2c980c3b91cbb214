"""The backend seam: what the server asks of whatever answers vLLM render-server requests.

The server admits requests by ``workers``, reports ``busy``, ``busy_seconds`` and ``queued`` as
metrics, refuses requests while ``no_workers_reason`` says so, hands each request's body and its
``Operation`` to ``answer`` and closes the backend at shutdown. It never learns which engine
answers: a native backend and vLLM's processes look the same from here. The OpenAI front
(``apis.openai``) asks through ``call`` instead: it reads the answer (a render to send to an
engine, a derender to send on), where ``answer`` may hand the client's connection to the process.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Protocol

from aiohttp import web

from mmprep_runtime.httpio.messages import Answer


class Operation(enum.Enum):
    """What a request to vLLM's render server asks for; the value is its route's path."""

    CHAT_RENDER = "/v1/chat/completions/render"
    COMPLETION_RENDER = "/v1/completions/render"
    MESSAGES_RENDER = "/v1/messages/render"
    RESPONSES_RENDER = "/v1/responses/render"
    CHAT_DERENDER = "/v1/chat/completions/derender"
    COMPLETION_DERENDER = "/v1/completions/derender"
    TOKENIZE = "/tokenize"
    DETOKENIZE = "/detokenize"
    #: A GET, answered only under vLLM's ``--enable-tokenizer-info-endpoint`` (404 otherwise).
    TOKENIZER_INFO = "/tokenizer_info"


@dataclasses.dataclass(frozen=True)
class Reply:
    """An answer held whole in this process: its status and its JSON body as the route wrote it
    (vLLM's error JSON when the status is not 200)."""

    status: int
    body: bytes


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

    async def answer(self, request: web.Request, body: bytes, operation: Operation) -> Answer:
        """The answer to one request for ``operation``, its body read already (empty for a GET)."""
        ...

    async def call(self, operation: Operation, body: bytes, request_id: str | None) -> Reply:
        """The answer to a request this server makes itself (the OpenAI front's render and
        derender), held whole; a refusal of its own raises the ``errors.RequestError`` that
        ``answer`` would raise. ``request_id`` is the client's ``X-Request-Id``, as vLLM reads it."""
        ...

    async def reasoning_tokens(self, chat_request: dict[str, Any], token_ids: list[list[int]]) -> list[int] | None:
        """Each output's reasoning tokens by the configured reasoning parser (the OpenAI front's
        usage details), or None where no parser counts them."""
        ...

    def info(self) -> dict[str, Any]:
        """What ``/v1/info`` shows of it beside the path chosen."""
        ...

    async def close(self, timeout: float) -> None:
        """Stop, within ``timeout`` seconds; the requests it held are done or cut off already."""
        ...
