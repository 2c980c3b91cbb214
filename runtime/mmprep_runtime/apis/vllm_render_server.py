"""vLLM's render server over HTTP: the same routes, bodies, answers and error shape as
``vllm launch render`` (every ``protocol.Operation``: the chat, completion, Anthropic Messages and
Responses renders, the chat and completion derenders, ``/tokenize``, ``/detokenize``,
``/tokenizer_info``; and ``GET /v1/models``).

Each request's body goes to the server's ``RenderBackend`` with its operation (native, vLLM's
processes, or the one with the other behind it: the backend's business, not this adapter's); the
model card is built from ``model_facts.ModelFacts``. Errors are vLLM's JSON (``error_response``,
``error_body``). With an API key (``--api-key``, or ``VLLM_API_KEY`` as vLLM reads it), the
paths vLLM guards (``/v1``, ``/v2``, ``/inference``, ``/cohere``) answer vLLM's 401 without it.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, Final

from aiohttp import web

from mmprep_runtime import errors
from mmprep_runtime.apis.routing import Handler, Route, Serving
from mmprep_runtime.backends import model_facts
from mmprep_runtime.backends.protocol import Operation
from mmprep_runtime.httpio.messages import Answer, read_json_body

_ERROR_TYPES: Final = {
    400: "BadRequestError",
    404: "NotFoundError",
    408: "BadRequestError",
    413: "BadRequestError",
    415: "BadRequestError",
    422: "BadRequestError",
    429: "TooManyRequestsError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
    504: "TimeoutError",
}


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """vLLM's error answer: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": _ERROR_TYPES.get(status, "BadRequestError"), "param": param, "code": status}}


def error_response(error: errors.RequestError) -> web.Response:
    return web.json_response(
        error_body(error.message, error.status, getattr(error, "param", None)),
        status=error.status,
        headers=error.headers,
    )


#: The path prefixes vLLM's API key guards; the others (``/tokenize``, ``/health``) stay open.
GUARDED_PREFIXES: Final = ("/v1", "/v2", "/inference", "/cohere")


def authorized(request: web.Request, api_key: str | None) -> bool:
    """Whether ``request`` may be answered: as vLLM's authentication middleware decides (a
    ``Bearer`` token equal to the key, compared in constant time, on the guarded paths)."""
    if api_key is None or request.method == "OPTIONS" or not request.path.startswith(GUARDED_PREFIXES):
        return True
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(hashlib.sha256(token.encode()).digest(), hashlib.sha256(api_key.encode()).digest())


def _guarded(handler: Handler) -> Handler:
    """``handler`` behind the API key: vLLM's 401 without it, on the paths vLLM guards."""

    async def handle(request: web.Request, serving: Serving) -> Answer:
        if not authorized(request, serving.api_key):
            return Answer(web.json_response({"error": "Unauthorized"}, status=401), 0.0)
        return await handler(request, serving)

    return handle


def _handler(operation: Operation) -> Handler:
    async def handle(request: web.Request, serving: Serving) -> Answer:
        # The body is read once, here: a native backend may hand it on to the general one.
        body = await read_json_body(request, serving.limits) if request.method == "POST" else b""
        return await serving.renderer.answer(request, body, operation)

    handle.__name__ = f"handle_{operation.name.lower()}"
    return _guarded(handle)


async def models(request: web.Request, serving: Serving) -> Answer:
    return Answer(web.json_response(model_list(serving.model, serving.started)), 0.0)


def model_list(model: model_facts.ModelFacts, started: int) -> dict[str, Any]:
    """``GET /v1/models``' answer: the one served model's card, as vLLM writes it."""
    permission = {
        "id": f"modelperm-{started:x}",
        "object": "model_permission",
        "created": started,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": model.served_name,
        "object": "model",
        "created": started,
        "owned_by": "vllm",
        "root": model.model_id,
        "parent": None,
        "max_model_len": model.max_model_len,
        "permission": [permission],
    }
    return {"object": "list", "data": [card]}


ROUTES: Final = (
    *(Route("POST", op.value, _handler(op), error_response) for op in Operation if op is not Operation.TOKENIZER_INFO),
    Route("GET", Operation.TOKENIZER_INFO.value, _handler(Operation.TOKENIZER_INFO), error_response, admitted=False),
    Route("GET", "/v1/models", _guarded(models), error_response, admitted=False),
)
