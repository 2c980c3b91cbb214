"""The vLLM render API's HTTP endpoints: same paths, bodies, answers and error shape as vLLM's
render server (``POST /v1/chat/completions/render``, ``POST /v1/completions/render``,
``GET /v1/models``).

A render request's body goes to ``Engine.serve`` with ``vllm_render.RenderApi`` (the stages);
the model card is built from ``vllm_model.ModelFacts``. Errors are vLLM's JSON
(``error_response``, from ``vllm_format.error_body``).
"""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web

from mmprep_runtime import errors
from mmprep_runtime.apis import fetching, vllm_format, vllm_general, vllm_model, vllm_render
from mmprep_runtime.apis.http import JSON_TYPE, Answer, answer_response, read_json_body
from mmprep_runtime.engine import core
from mmprep_runtime.settings import Limits


def error_response(error: errors.RequestError) -> web.Response:
    return web.json_response(
        vllm_format.error_body(error.message, error.status, getattr(error, "param", None)),
        status=error.status,
        headers=error.headers,
    )


async def read_body(request: web.Request, limits: Limits) -> bytes:
    """The render request's body, read once: the native path may hand it on to the general one."""
    return await read_json_body(request, limits)


async def render(
    request: web.Request,
    body: bytes,
    engine: core.Engine,
    model: vllm_model.ModelFacts,
    limits: Limits,
    fetcher: fetching.Fetcher,
    *,
    chat: bool,
) -> Answer:
    api = vllm_render.RenderApi(engine.facts, model, limits, fetcher, chat, request_id=request.headers.get("X-Request-Id"))
    served = await engine.serve(api, body)
    return Answer(answer_response(served.payload, JSON_TYPE), served.decode_seconds)


#: Request headers handed on to vLLM's render process (its request id comes from X-Request-Id).
_FORWARDED_HEADERS: Final = ("X-Request-Id", "Content-Type")


async def render_general(request: web.Request, body: bytes, general: vllm_general.GeneralRenderer) -> Answer:
    """vLLM's own answer, from one of the general path's processes (``vllm_general``)."""
    headers = {name: value for name in _FORWARDED_HEADERS if (value := request.headers.get(name)) is not None}
    return Answer(await general.render(request, body, headers), 0.0)


def model_list(model: vllm_model.ModelFacts, started: int) -> dict[str, Any]:
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
