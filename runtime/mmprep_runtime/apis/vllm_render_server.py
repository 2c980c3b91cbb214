"""The vLLM render API's HTTP endpoints: same paths, bodies, answers and error shape as vLLM's
render server (``POST /v1/chat/completions/render``, ``POST /v1/completions/render``,
``GET /v1/models``).

A render request's body goes to the server's ``RenderBackend`` (native, vLLM's processes, or
the one with the other behind it: the backend's business, not this adapter's); the model card is
built from ``model_facts.ModelFacts``. Errors are vLLM's JSON (``error_response``, ``error_body``).
"""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web

from mmprep_runtime import errors
from mmprep_runtime.apis.routing import Route, Serving
from mmprep_runtime.backends import model_facts
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


async def _render(request: web.Request, serving: Serving, *, chat: bool) -> Answer:
    # The body is read once, here: a native backend may hand it on to the general one.
    body = await read_json_body(request, serving.limits)
    return await serving.renderer.render(request, body, chat=chat)


async def render_chat(request: web.Request, serving: Serving) -> Answer:
    return await _render(request, serving, chat=True)


async def render_completion(request: web.Request, serving: Serving) -> Answer:
    return await _render(request, serving, chat=False)


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
    Route("POST", "/v1/chat/completions/render", render_chat, error_response),
    Route("POST", "/v1/completions/render", render_completion, error_response),
    Route("GET", "/v1/models", models, error_response, admitted=False),
)
