"""The runtime's core, assembled: processor, decision, processor pool and IO pool.

``start_engine`` is the order that matters: load and customize the processor (backend, device
patch), *then* try cloning exactly that object, decide the workers with the shared rule
(``sizing``), size torch intra-op threads against the usable CPUs, start the pool, and warm it.
``serve`` and ``bench`` both start engines, so what is benchmarked is what is served.

``Engine.serve(api, body)`` is the one served path for every HTTP API (``pipeline.Api``): the
engine places each stage (``decode_on_worker``, ``encodes_on_worker``), the adapter only parses
the HTTP request and writes the answer. ``bench --api`` drives the same method.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import time
from typing import Any

from mmprep_runtime import contract, sizing, versions
from mmprep_runtime.engine import cpus, cuda, executor, loading, pipeline
from mmprep_runtime.settings import ModelSettings

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Served:
    """An answer's bytes and how long decoding its request took (for the decode histogram)."""

    payload: pipeline.AnswerBody
    decode_seconds: float


@dataclasses.dataclass(frozen=True)
class _FirstJob:
    """What the first worker job hands back: the decoded request, still to fetch; or, once
    ``processed``, what ``_process_then`` would have returned."""

    value: Any
    decode_seconds: float
    processed: bool


def _decode_first(processor: Any, api: pipeline.Api[Any, Any], body: bytes, encode_here: bool) -> _FirstJob:
    """Decode, and when nothing remains to fetch, process (and encode) in the same job."""
    started = time.perf_counter()
    request = api.decode(body)
    decoded = time.perf_counter() - started
    if api.needs_fetch(request):
        return _FirstJob(request, decoded, processed=False)
    return _FirstJob(_process_then(processor, api, request, encode_here), decoded, processed=True)


def _process_then(processor: Any, api: pipeline.Api[Any, Any], request: Any, encode_here: bool) -> Any:
    outputs = api.process(processor, request)
    return api.encode(outputs) if encode_here else outputs


@dataclasses.dataclass
class Engine:
    facts: loading.ProcessorFacts
    clone_trial: executor.CloneTrial
    decision: sizing.WorkerDecision
    device: str
    usable_cpus: int
    intra_op_threads: int
    pool: executor.ProcessorPool[Any]
    io_pool: concurrent.futures.ThreadPoolExecutor
    #: Decode each request on the processor worker that processes it, not on the IO pool
    #: (``should_decode_on_worker``).
    decode_on_worker: bool = False
    #: The CUDA device as started and warmed (``cuda.describe``), on the GPU path.
    cuda: dict[str, Any] | None = None
    #: The loaded processor the workers clone; read-only here (chat template, token ids, config).
    processor: Any = None
    #: The operator's pool this pod serves (``contract.ENV_POOL``); None when started by hand.
    pool_name: str | None = None

    def info(self) -> dict[str, Any]:
        facts = self.facts
        return {
            "model": facts.model,
            **facts.reported(),
            "pool": self.pool_name,
            "path": self.decision.path.value,
            "device": self.device,
            "workers": {
                "processor": self.decision.processor_workers,
                "io": self.decision.io_workers,
                "reason": self.decision.reason.value,
                "detail": self.decision.detail,
                "message": self.decision.describe(),
                "explicit_not_honoured": self.decision.explicit_not_honoured,
                # A worker whose clone failed after start-up retires; the others keep serving.
                "live": self.pool.live_workers,
                "retired": [{"thread": r.thread, "error": r.error} for r in self.pool.retired],
            },
            "cloneable": self.clone_trial.cloneable,
            "clone_error": self.clone_trial.error,
            "clone_seconds": round(self.clone_trial.seconds, 6),
            "worker_clone_seconds": [round(s, 6) for s in self.pool.clone_seconds],
            "usable_cpus": self.usable_cpus,
            "intra_op_threads": self.intra_op_threads,
            "decode_on_worker": self.decode_on_worker,
            "cuda": self.cuda,
            "fast_paths": list(facts.fast_paths),
            "versions": versions.versions(),
        }

    def encodes_on_worker(self, api: pipeline.Api[Any, Any]) -> bool:
        """Small answers are encoded by the worker right after processing (a fraction of a
        millisecond, and no round trip through the loop). Large ones (megabytes of copying) go to
        the IO pool, so the worker is free for the next request, unless the workers alone fill the
        CPUs (``decode_on_worker``): then the hop buys no parallelism, only hand-offs."""
        return not api.large_answer or self.decode_on_worker

    async def serve(self, api: pipeline.Api[Any, Any], body: bytes) -> Served:
        """One request through ``api``'s stages, each where this engine places it.

        - decode: on the processor worker when the workers alone fill the CPUs
          (``decode_on_worker``; then decode, process and encode are one job), else on the IO pool
          so a worker never waits for it;
        - fetch (remote media only): on the event loop, asynchronously, between two jobs;
        - process: on a worker's own clone;
        - encode: see ``encodes_on_worker``.
        """
        loop = asyncio.get_running_loop()
        encode_here = self.encodes_on_worker(api)
        if self.decode_on_worker:
            first = await asyncio.wrap_future(self.pool.submit(_decode_first, api, body, encode_here))
            decode_seconds = first.decode_seconds
            if first.processed:
                return await self._answer(api, first.value, encode_here, decode_seconds)
            request = first.value
        else:
            started = time.perf_counter()
            request = await loop.run_in_executor(self.io_pool, api.decode, body)
            decode_seconds = time.perf_counter() - started
        del body  # the decoded request is what we keep; the raw body can go
        if api.needs_fetch(request):
            request = await api.fetch(request)
        result = await asyncio.wrap_future(self.pool.submit(_process_then, api, request, encode_here))
        return await self._answer(api, result, encode_here, decode_seconds)

    async def _answer(self, api: pipeline.Api[Any, Any], result: Any, encoded: bool, decode_seconds: float) -> Served:
        """``_process_then``'s result as the answer: encoded there already, or now on the IO pool."""
        if not encoded:
            result = await asyncio.get_running_loop().run_in_executor(self.io_pool, api.encode, result)
        return Served(result, decode_seconds)

    def close(self, timeout: float | None = None) -> None:
        self.pool.shutdown(wait=True, timeout=timeout)
        self.io_pool.shutdown(wait=True, cancel_futures=True)


def resolve_device(requested: sizing.Device) -> tuple[str, bool]:
    """(device name, whether a GPU is usable). Asking for cuda without a working one is an error
    (``cuda.CudaUnavailable``, with the reason): CUDA starts here, before anything is served."""
    if requested is sizing.Device.CPU:
        return "cpu", False
    if requested is sizing.Device.CUDA or loading.cuda_available():
        return cuda.start(), True
    return "cpu", False


def _set_torch_threads(threads: int) -> None:
    import torch

    # Per thread: OpenMP keeps the thread count per calling thread, so each worker sets its own.
    torch.set_num_threads(threads)


def _init_worker(threads: int, device: str) -> None:
    _set_torch_threads(threads)
    if device != "cpu":
        cuda.worker_init(device)  # this worker's own stream


def should_decode_on_worker(path: sizing.ComputePath, processor_workers: int, usable_cpus: int) -> bool:
    """Whether each request is decoded by the processor worker that processes it.

    When the processor workers alone can keep every usable CPU busy (CPU path, at least one
    worker per CPU), decoding on the IO pool buys no parallelism, only costs: two more thread
    hand-offs per request (IO thread -> event loop -> worker) and four more threads competing for
    the GIL with the workers. Measured at 2 workers on 2 CPUs through HTTP: about 0.5 ms less CPU
    per request. With fewer workers than CPUs (or the GPU path's single worker), the IO pool
    decodes the next request while the worker processes, which is worth more.
    """
    return path is sizing.ComputePath.CPU and processor_workers >= usable_cpus


def adopt_operator_reason(decision: sizing.WorkerDecision, operator: contract.PoolDecisionEnv) -> sizing.WorkerDecision:
    """The runtime's decision, reported with the operator's reason when it kept the operator's count.

    The operator's count reaches the runtime as an explicit number, which the runtime's own rule
    would call ``Explicit``; the pod would then contradict the resource's status (``GPUPathCap``,
    ``Measured``, ...). A count the runtime had to lower (NotCloneable, NotThreadSafe) or a flag
    that differs from the operator's count keeps the runtime's own reason: it is what this pod does.
    """
    if decision.reason is not sizing.WorkerReason.EXPLICIT or decision.processor_workers != operator.processor_workers:
        return decision
    return dataclasses.replace(decision, reason=operator.reason, detail=f"the operator's decision for pool {operator.pool}")


def start_engine(
    model: ModelSettings,
    *,
    processor_workers: int | None = None,
    io_workers: int | None = None,
    intra_op_threads: int | None = None,
    observer: executor.PoolObserver | None = None,
    decode_on_worker: bool | None = None,
    operator_decision: contract.PoolDecisionEnv | None = None,
    warm: bool = True,
    warm_timeout: float | None = 600.0,
) -> Engine:
    processor, facts = loading.load_processor(model)
    device, gpu_available = resolve_device(model.device)
    path = facts.path(gpu_available=gpu_available, device=model.device)
    if path is sizing.ComputePath.GPU:
        loading.bind_device(processor, device)
    else:
        device = "cpu"

    # The resolver hands over whatever the processor is when a worker clones: all customization
    # above is done by then, and a later customization of `holder` would be seen too.
    holder = {"processor": processor}

    def resolve() -> Any:
        return holder["processor"]

    trial = executor.try_clone(resolve)
    decision = sizing.decide_workers(
        path=path,
        cloneable=trial.cloneable,
        explicit=processor_workers,
        declared=facts.declared_workers,
        explicit_io=io_workers,
        thread_safe=facts.thread_safe,
        declared_io=facts.declared_io_workers,
        cloneable_error=trial.error,
    )
    if operator_decision is not None:
        decision = adopt_operator_reason(decision, operator_decision)
    if decision.explicit_not_honoured is not None:
        logger.warning("workers: %s", decision.describe())
    elif not trial.cloneable:
        logger.warning("workers: falling back to one worker: %s", decision.describe())
    else:
        logger.info("workers: %s", decision.describe())
    usable = cpus.usable_cpus()
    threads = intra_op_threads or cpus.intra_op_threads(decision.processor_workers, usable)
    _set_torch_threads(threads)
    pool: executor.ProcessorPool[Any] = executor.ProcessorPool(
        resolve,
        decision.processor_workers,
        cloneable=trial.cloneable,
        thread_init=lambda: _init_worker(threads, device),
        observer=observer,
    )
    io_pool = concurrent.futures.ThreadPoolExecutor(decision.io_workers, thread_name_prefix="mmprep-io")
    if decode_on_worker is None:
        decode_on_worker = should_decode_on_worker(path, decision.processor_workers, usable)
    engine = Engine(
        facts,
        trial,
        decision,
        device,
        usable,
        threads,
        pool,
        io_pool,
        decode_on_worker,
        processor=processor,
        pool_name=operator_decision.pool if operator_decision is not None else None,
    )
    if warm:
        pool.warm(warm_timeout)
        if device != "cpu":
            # One request's image work on the device before readiness (see ``cuda.warm_up``).
            try:
                pool.submit(cuda.warm_up, device).result(warm_timeout)
                engine.cuda = cuda.describe(device)
            except BaseException:
                engine.close(timeout=warm_timeout)  # a failed start leaves no workers behind
                raise
    logger.info(
        "engine ready: %s on %s path, %d processor worker(s) x %d intra-op thread(s) of %d usable CPU(s)",
        facts.processor_class,
        path.value,
        decision.processor_workers,
        threads,
        usable,
    )
    return engine
