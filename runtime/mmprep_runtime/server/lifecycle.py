"""The engine's life in the server: started in the background once the socket is open, installed
into the state when ready (admission sized by its workers, live metrics bound), its start-up
failure kept for ``/healthz`` and ``serve``'s exit status.

The load runs off the event loop (``asyncio.to_thread``), so ``/healthz`` answers while the
model loads and ``/readyz`` turns 200 once the pool is warm.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from mmprep_runtime import versions
from mmprep_runtime.apis import render_paths, vllm_general, vllm_model
from mmprep_runtime.engine import core as engine_module
from mmprep_runtime.engine import cpus, vllm_pool
from mmprep_runtime.server.admission import Admission
from mmprep_runtime.server.state import ServerState
from mmprep_runtime.settings import ServeSettings

logger = logging.getLogger(__name__)

EngineFactory = Callable[..., engine_module.Engine]


def install_engine(
    state: ServerState,
    engine: engine_module.Engine,
    render_model: vllm_model.ModelFacts,
    general: GeneralStart | None = None,
) -> None:
    if general is not None:
        state.render_path, pool = general.path, general.pool
        if pool is not None:
            state.general = vllm_general.GeneralRenderer(pool, state.fetcher)
    queue = state.settings.load.queue_size
    general_serves = state.general is not None and general is not None and general.path.primary == render_paths.GENERAL
    if general_serves:
        # The general path's processes do the work: requests are admitted by their count.
        assert state.general is not None
        pool = state.general.pool
        workers = pool.processes
        admission = state.admission = Admission(workers + (4 * workers if queue is None else queue))
        state.metrics.bind_live(
            in_flight=lambda: admission.in_flight,
            queue_depth=lambda: max(0, admission.in_flight - pool.busy),
            busy=lambda: pool.busy,
            workers=workers,
            busy_seconds=lambda: pool.busy_seconds,
        )
    else:
        workers = engine.decision.processor_workers
        admission = state.admission = Admission(workers + (4 * workers if queue is None else queue))
        state.metrics.bind_live(
            in_flight=lambda: admission.in_flight,
            queue_depth=lambda: engine.pool.waiting,
            busy=lambda: engine.pool.busy,
            workers=workers,
            busy_seconds=lambda: engine.pool.busy_seconds,
        )
    state.metrics.describe_engine(engine.info())
    state.render_model = render_model
    state.engine = engine
    state.metrics.ready.set(1)


@dataclasses.dataclass(frozen=True)
class GeneralStart:
    """The render path chosen at start-up, and the general path's pool when it runs."""

    path: render_paths.RenderPath
    pool: vllm_pool.VllmWorkerPool | None


def start_general(settings: ServeSettings, processor_class: str) -> GeneralStart:
    """Choose the render path and start the general path's processes when it needs them (blocking)."""
    path = render_paths.choose(settings.render.path, processor_class, versions.vllm_version())
    if not path.needs_general:
        return GeneralStart(path, None)
    processes = settings.render.processes or (cpus.usable_cpus() if path.primary == render_paths.GENERAL else 1)
    pool = vllm_pool.VllmWorkerPool(settings.model.model, processes, vllm_pool.vllm_options(settings.render))
    try:
        pool.start(vllm_pool.START_TIMEOUT_S)
    except vllm_pool.GeneralPathUnavailable as exc:
        if path.primary == render_paths.GENERAL:
            raise
        # Only the fallback failed: the native path serves what it renders, and says the rest.
        logger.error("the general render path (the native path's fallback) did not start: %s", exc)
        reason = f"{path.reason}; the fallback did not start: {str(exc).splitlines()[0]}"
        return GeneralStart(dataclasses.replace(path, general_fallback=False, reason=reason), None)
    return GeneralStart(path, pool)


async def start_engine(state: ServerState, factory: EngineFactory) -> None:
    settings = state.settings

    def start() -> tuple[engine_module.Engine, vllm_model.ModelFacts, GeneralStart]:
        # Off the event loop, like the load: the render API's model facts read the model's config
        # (a file, or the hub for a model id).
        engine = factory(
            settings.model,
            processor_workers=settings.processor_workers,
            io_workers=settings.io_workers,
            intra_op_threads=settings.intra_op_threads,
            observer=state.metrics,
            operator_decision=settings.operator_decision,
        )
        try:
            facts = vllm_model.model_facts(engine.processor, engine.facts, settings.render)
            return engine, facts, start_general(settings, engine.facts.processor_class)
        except BaseException:
            engine.close()
            raise

    try:
        engine, render_model, general = await asyncio.to_thread(start)
    except Exception as exc:  # noqa: BLE001 - reported by /healthz and by serve's exit status
        logger.error("the processor could not be started: %s", exc)
        state.startup_error = exc
    else:
        install_engine(state, engine, render_model, general)
    finally:
        state.settled.set()
