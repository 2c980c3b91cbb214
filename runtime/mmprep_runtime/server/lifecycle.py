"""The engine's life in the server: started in the background once the socket is open, installed
into the state when ready (admission sized by its workers, live metrics bound), its start-up
failure kept for ``/healthz`` and ``serve``'s exit status.

The load runs off the event loop (``asyncio.to_thread``), so ``/healthz`` answers while the
model loads and ``/readyz`` turns 200 once the pool is warm.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from mmprep_runtime.apis import vllm_model
from mmprep_runtime.engine import core as engine_module
from mmprep_runtime.server.admission import Admission
from mmprep_runtime.server.state import ServerState

logger = logging.getLogger(__name__)

EngineFactory = Callable[..., engine_module.Engine]


def install_engine(state: ServerState, engine: engine_module.Engine, render_model: vllm_model.ModelFacts) -> None:
    queue = state.settings.load.queue_size
    if queue is None:
        queue = 4 * engine.decision.processor_workers
    state.admission = Admission(engine.decision.processor_workers + queue)
    admission = state.admission
    state.metrics.bind_live(
        in_flight=lambda: admission.in_flight,
        queue_depth=lambda: engine.pool.waiting,
        busy=lambda: engine.pool.busy,
        workers=engine.decision.processor_workers,
        busy_seconds=lambda: engine.pool.busy_seconds,
    )
    state.metrics.describe_engine(engine.info())
    state.render_model = render_model
    state.engine = engine
    state.metrics.ready.set(1)


async def start_engine(state: ServerState, factory: EngineFactory) -> None:
    settings = state.settings

    def start() -> tuple[engine_module.Engine, vllm_model.ModelFacts]:
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
            return engine, vllm_model.model_facts(engine.processor, engine.facts, settings.render)
        except BaseException:
            engine.close()
            raise

    try:
        engine, render_model = await asyncio.to_thread(start)
    except Exception as exc:  # noqa: BLE001 - reported by /healthz and by serve's exit status
        logger.error("the processor could not be started: %s", exc)
        state.startup_error = exc
    else:
        install_engine(state, engine, render_model)
    finally:
        state.settled.set()
