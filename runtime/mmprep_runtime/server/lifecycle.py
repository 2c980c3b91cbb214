"""The engine's life in the server: started in the background once the socket is open, installed
into the state when ready (admission sized by the render backend's workers, live metrics bound),
its start-up failure kept for ``/healthz`` and ``serve``'s exit status.

The load runs off the event loop (``asyncio.to_thread``), so ``/healthz`` answers while the
model loads and ``/readyz`` turns 200 once the pool is warm.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from mmprep_runtime.apis.routing import Serving
from mmprep_runtime.backends import assembly, choice, model_facts
from mmprep_runtime.engine import core as engine_module
from mmprep_runtime.engine import patches
from mmprep_runtime.generation.chain import Chain
from mmprep_runtime.server.admission import Admission
from mmprep_runtime.server.state import ServerState

logger = logging.getLogger(__name__)

EngineFactory = Callable[..., engine_module.Engine]


def install_engine(
    state: ServerState, engine: engine_module.Engine, rendering: assembly.Rendering, model: model_facts.ModelFacts
) -> None:
    renderer = rendering.backend
    queue = state.settings.load.queue_size
    # Whatever renders does the work: requests are admitted by its workers (threads or processes).
    workers = renderer.workers
    admission = state.admission = Admission(workers + (4 * workers if queue is None else queue))
    state.metrics.bind_live(
        in_flight=lambda: admission.in_flight,
        queue_depth=lambda: renderer.queued(admission.in_flight),
        busy=lambda: renderer.busy,
        workers=workers,
        busy_seconds=lambda: renderer.busy_seconds,
    )
    state.metrics.describe_engine(engine.info())
    state.render_path = rendering.path
    state.engine = engine
    front = None
    if state.engines is not None:
        counts_reasoning = choice.gives_reasoning_parser(state.settings.render.vllm_args)
        front = Chain(renderer, state.engines, patches.tokenizer_of(engine.processor), counts_reasoning=counts_reasoning)
        state.generations = Admission(state.settings.engines.max_in_flight)
    state.serving = Serving(
        engine,
        renderer,
        model,
        state.settings.limits,
        state.started,
        state.settings.render.api_key,
        deadline_s=state.settings.load.deadline_s,
        render_slots=admission,
        chain=front,
    )
    state.metrics.ready.set(1)


async def start_engine(state: ServerState, factory: EngineFactory) -> None:
    settings = state.settings

    def start() -> tuple[engine_module.Engine, assembly.Rendering, model_facts.ModelFacts]:
        # Off the event loop, like the load: the render API's model facts read the model's config
        # (a file, or the hub for a model id), and the general path's processes start.
        engine = factory(
            settings.model,
            processor_workers=settings.processor_workers,
            io_workers=settings.io_workers,
            intra_op_threads=settings.intra_op_threads,
            observer=state.metrics,
            operator_decision=settings.operator_decision,
        )
        try:
            facts = model_facts.model_facts(engine.processor, engine.facts, settings.render)
            return engine, assembly.start(settings, engine, facts, state.fetcher), facts
        except BaseException:
            engine.close()
            raise

    try:
        engine, rendering, model = await asyncio.to_thread(start)
    except Exception as exc:  # noqa: BLE001 - reported by /healthz and by serve's exit status
        logger.error("the processor could not be started: %s", exc)
        state.startup_error = exc
    else:
        install_engine(state, engine, rendering, model)
    finally:
        state.settled.set()
