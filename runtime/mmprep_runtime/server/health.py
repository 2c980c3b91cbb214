"""What the server says about itself: liveness, readiness, ``/v1/info`` and ``/metrics``.

``/healthz`` is liveness (200 unless the start failed, and while draining too: a draining pod
must not be restarted), ``/readyz`` and vLLM's ``/health`` are readiness, all from
``state.not_ready_reason`` so they never say ready while requests are refused.
``/v1/info`` reports the engine (model, path, workers and why, probe facts) and the server's
limits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from typing import Any

from aiohttp import web

from mmprep_runtime import versions
from mmprep_runtime.engine import planar
from mmprep_runtime.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from mmprep_runtime.server.state import STATE, not_ready_reason


async def handle_health(request: web.Request) -> web.Response:
    """vLLM's liveness-and-readiness probe: 200 with an empty body while serving."""
    return web.Response(status=503 if not_ready_reason(request.app[STATE]) else 200)


async def handle_healthz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.startup_error is not None:
        return web.json_response({"status": "failed", "error": str(state.startup_error)}, status=500)
    return web.json_response({"status": "ok"})


async def handle_readyz(request: web.Request) -> web.Response:
    reason = not_ready_reason(request.app[STATE])
    if reason is not None:
        return web.json_response({"ready": False, "reason": reason}, status=503)
    return web.json_response({"ready": True})


def event_loop_name(loop: asyncio.AbstractEventLoop) -> str:
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


async def handle_info(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.engine is None:
        body: dict[str, Any] = {"model": state.settings.model.model, "ready": False}
        if state.startup_error is not None:
            body["error"] = str(state.startup_error)
        return web.json_response(body, status=503)
    info = state.engine.info()
    info["ready"] = not_ready_reason(state) is None
    info["drain"] = state.drain.phase.value
    info["queue_capacity"] = state.admission.capacity if state.admission else None
    info["limits"] = dataclasses.asdict(state.settings.limits)
    info["deadline_s"] = state.settings.load.deadline_s
    info["event_loop"] = event_loop_name(asyncio.get_running_loop())
    info["channel_split"] = "opencv" if planar.opencv_split_available() else "numpy"
    if state.engines is not None:
        info["engines"] = state.engines.info()
    if state.serving is not None:
        model = state.serving.model
        info["vllm_render"] = {
            "served_model_name": model.served_name,
            "max_model_len": model.max_model_len,
            "pixels": "uint8" if model.device_normalize else "normalized",
            "fetch_allowed_networks": [str(n) for n in state.settings.render.fetch.allowed_networks],
            **_render_path(request),
        }
    return web.json_response(info, dumps=functools.partial(json.dumps, indent=2))


def _render_path(request: web.Request) -> dict[str, Any]:
    """Which path renders (and why), and the general path's processes when they run."""
    state = request.app[STATE]
    path = state.render_path
    out: dict[str, Any] = {"vllm_version": versions.vllm_version()}
    if path is not None:
        out["path"] = path.primary
        out["general_fallback"] = path.general_fallback
        out["path_reason"] = path.reason
    if state.serving is not None:
        out.update(state.serving.renderer.info())
    return out


async def handle_version(request: web.Request) -> web.Response:
    """vLLM's ``/version`` (the vLLM version this tier renders as, null without vLLM), and mmprep's."""
    return web.json_response({"version": versions.vllm_version(), "mmprep_version": versions.version_of("mmprep")})


async def handle_metrics(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})
