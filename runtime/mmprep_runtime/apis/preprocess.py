"""mmprep's own API, ``POST /v1/preprocess``: parse the HTTP request, hand the body to the engine.

The body's JSON goes to ``Engine.serve`` with ``pipeline.PreprocessApi`` (the stages; where each
runs is the engine's decision). This module reads only what HTTP carries beside the body: the
answer's format (``?format=`` or ``Accept``: JSON, or the tensors as safetensors) and the pixel
hand-off (``?pixels=uint8``, which the processor's facts allow or refuse). Errors are mmprep's
JSON (``error_response``).
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from mmprep_runtime import errors
from mmprep_runtime.apis.routing import Route, Serving
from mmprep_runtime.engine import core, loading, pipeline
from mmprep_runtime.httpio.messages import JSON_TYPE, OCTET_STREAM, Answer, answer_response, read_json_body


def error_response(error: errors.RequestError) -> web.Response:
    return web.json_response(error.as_json(), status=error.status, headers=error.headers)


def wants_safetensors(request: web.Request) -> bool:
    fmt = request.query.get("format")
    if fmt is not None:
        if fmt not in ("json", "safetensors"):
            raise errors.BadRequest(f"format must be 'json' or 'safetensors', got {fmt!r}")
        return fmt == "safetensors"
    accept = request.headers.get("Accept", "")
    if not accept:
        return False
    kinds = [part.split(";")[0].strip().lower() for part in accept.split(",")]
    if OCTET_STREAM in kinds and JSON_TYPE not in kinds:
        return True
    if not {JSON_TYPE, OCTET_STREAM, "*/*", "application/*"} & set(kinds):
        raise errors.NotAcceptable(f"cannot answer with {accept!r}; use {JSON_TYPE} or {OCTET_STREAM}")
    return False


def wants_uint8(request: web.Request, engine: core.Engine) -> bool:
    pixels = request.query.get("pixels", "normalized")
    if pixels not in ("normalized", "uint8"):
        raise errors.BadRequest(f"pixels must be 'normalized' or 'uint8', got {pixels!r}")
    if pixels == "uint8" and not engine.facts.normalizes_on_device:
        raise errors.BadRequest(
            f"pixels=uint8: this processor ({engine.facts.processor_class}) cannot leave normalization to the GPU"
        )
    return pixels == "uint8"


async def preprocess(request: web.Request, serving: Serving) -> Answer:
    engine, limits = serving.engine, serving.limits
    binary = wants_safetensors(request)
    uint8 = wants_uint8(request, engine)
    body = await read_json_body(request, limits)
    api = pipeline.PreprocessApi(engine.facts, limits, binary, dict(loading.DEVICE_NORMALIZE_KWARGS) if uint8 else {})
    served = await engine.serve(api, body)
    return Answer(answer_response(served.payload, OCTET_STREAM if binary else JSON_TYPE), served.decode_seconds)


ROUTES: Final = (Route("POST", "/v1/preprocess", preprocess, error_response),)
