"""The processor pool: worker threads that each own a deep copy of the processor.

Hugging Face processors and tokenizers carry mutable state and are not thread-safe (sharing one
tokenizer across 16 threads failed 3988 of 4000 calls in transformers #47085), so no processor
object is ever used by two threads: each worker thread makes its own ``copy.deepcopy`` and keeps
it for its life.

- The pool gets a *resolver* callable, not the object: whoever customizes the processor after
  construction (a backend swap, a device patch) must be done before the first clone, and the
  clone copies what the resolver returns at that moment.
- Clones are made one at a time under a lock: deepcopy reads the shared original, and cloning a
  large tokenizer is slow (2.4 s in transformers #44894) and memory-hungry.
- ``warm()`` makes every worker clone before the server reports ready, so no request pays for a
  clone; without it each worker clones lazily on its first job.
- ``try_clone`` deep-copies once at startup. When that fails the pool runs one worker that uses
  the original object (the only thread that ever touches it) and reports why.
- A clone can still fail later, inside one worker (memory runs out, a lazily loaded file went
  away). That worker retires instead of failing every job it picks: its job goes back to the
  queue for the others, and ``retired``/``live_workers`` say so. Only when no worker is left do
  jobs fail, with ``NoWorkersLeft``; readiness follows ``live_workers``.

Jobs are ``concurrent.futures.Future``\\s so the asyncio side can await them and cancel ones whose
deadline passed before a worker picked them up. Admission (how many may wait) is the caller's
business: see ``admission``.
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

logger = logging.getLogger(__name__)

P = TypeVar("P")
R = TypeVar("R")


@dataclasses.dataclass(frozen=True)
class CloneTrial:
    cloneable: bool
    error: str | None
    seconds: float


def try_clone(resolve: Callable[[], Any]) -> CloneTrial:
    """Deep-copy the processor once; any exception means it cannot be cloned, and says why."""
    started = time.perf_counter()
    try:
        copy.deepcopy(resolve())
    except Exception as exc:  # noqa: BLE001 - any failure of deepcopy is the answer
        return CloneTrial(False, f"{type(exc).__name__}: {exc}", time.perf_counter() - started)
    return CloneTrial(True, None, time.perf_counter() - started)


class PoolObserver(Protocol):
    """What the pool reports; metrics implement it, tests may too."""

    def queue_wait(self, seconds: float) -> None: ...

    def processing(self, seconds: float) -> None: ...

    def cloned(self, seconds: float) -> None: ...

    def retired(self, live_workers: int) -> None: ...


class _NullObserver:
    def queue_wait(self, seconds: float) -> None:
        pass

    def processing(self, seconds: float) -> None:
        pass

    def cloned(self, seconds: float) -> None:
        pass

    def retired(self, live_workers: int) -> None:
        pass


@dataclasses.dataclass
class _Job:
    function: Callable[..., Any]
    args: tuple[Any, ...]
    future: concurrent.futures.Future[Any]
    enqueued: float


_STOP = object()


class PoolClosed(RuntimeError):
    pass


class NoWorkersLeft(RuntimeError):
    """Every worker retired because its processor clone failed; the pool cannot serve."""


@dataclasses.dataclass(frozen=True)
class RetiredWorker:
    thread: str
    error: str


class ProcessorPool(Generic[P]):
    """``workers`` threads, each calling ``function(processor_clone, *args)`` for its jobs."""

    def __init__(
        self,
        resolve: Callable[[], P],
        workers: int,
        *,
        cloneable: bool = True,
        thread_init: Callable[[], None] | None = None,
        observer: PoolObserver | None = None,
        name: str = "mmprep-processor",
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        if not cloneable and workers != 1:
            # The decision (sizing.decide_workers) already caps this; refusing here keeps the
            # invariant local: an uncloneable processor is never shared between threads.
            raise ValueError("a processor that cannot be cloned can only have 1 worker")
        self._resolve = resolve
        self._cloneable = cloneable
        self._thread_init = thread_init
        self._observer: PoolObserver = observer or _NullObserver()
        self._clone_lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job | object] = queue.SimpleQueue()
        self._state_lock = threading.Lock()
        self._waiting = 0
        self._busy = 0
        self._busy_seconds = 0.0
        self._clone_seconds: list[float] = []
        self._retired: list[RetiredWorker] = []
        self._warm_barrier: threading.Barrier | None = None
        self._closed = False
        self._local = threading.local()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{index}", daemon=True) for index in range(workers)]
        for thread in self._threads:
            thread.start()

    # -- introspection -------------------------------------------------------------------------

    @property
    def workers(self) -> int:
        return len(self._threads)

    @property
    def waiting(self) -> int:
        """Jobs submitted and not yet picked up by a worker (the queue depth)."""
        return self._waiting

    @property
    def busy(self) -> int:
        return self._busy

    @property
    def busy_seconds(self) -> float:
        """Total seconds workers spent running jobs (for a rate: busy fraction = rate / workers)."""
        with self._state_lock:
            return self._busy_seconds

    @property
    def clone_seconds(self) -> tuple[float, ...]:
        with self._state_lock:
            return tuple(self._clone_seconds)

    @property
    def retired(self) -> tuple[RetiredWorker, ...]:
        """Workers that stopped because cloning the processor failed in them, with why."""
        with self._state_lock:
            return tuple(self._retired)

    @property
    def live_workers(self) -> int:
        with self._state_lock:
            return len(self._threads) - len(self._retired)

    @property
    def no_workers_reason(self) -> str | None:
        """Why no job can be taken (every worker retired), or None while a worker is live."""
        with self._state_lock:
            return self._no_workers_message() if len(self._retired) == len(self._threads) else None

    # -- use -----------------------------------------------------------------------------------

    def warm(self, timeout: float | None = None) -> None:
        """Make every worker hold its processor now. Returns when all have one.

        One job per worker, each waiting at a barrier until all are running: that forces the jobs
        onto distinct threads, so each thread clones exactly once here.
        """
        while True:
            live = self.live_workers
            if live == 0:
                raise NoWorkersLeft(self._no_workers_message())
            barrier = self._warm_barrier = threading.Barrier(live)

            def hold(_processor: P, barrier: threading.Barrier = barrier) -> None:
                barrier.wait(timeout)

            futures = [self.submit(hold) for _ in range(live)]
            broken = False
            for future in futures:
                try:
                    future.result(timeout)
                except threading.BrokenBarrierError:
                    broken = True  # a worker retired meanwhile: warm the ones left
            if not broken:
                return

    def submit(self, function: Callable[..., R], *args: Any) -> concurrent.futures.Future[R]:
        """Queue ``function(processor, *args)``; cancel the future to drop it before it starts."""
        future: concurrent.futures.Future[R] = concurrent.futures.Future()
        with self._state_lock:
            if self._closed:
                raise PoolClosed("the processor pool is shut down")
            if len(self._retired) == len(self._threads):
                raise NoWorkersLeft(self._no_workers_message())
            self._waiting += 1
            # Queued under the lock: the last worker to retire drains the queue after it took the
            # lock, so a job is either drained (and failed) or refused here, never left queued.
            self._jobs.put(_Job(function, args, future, time.perf_counter()))
        return future

    def shutdown(self, *, wait: bool = True, timeout: float | None = None) -> None:
        """Stop taking jobs; workers finish what is queued, then exit."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        for _ in self._threads:
            self._jobs.put(_STOP)
        if wait:
            deadline = None if timeout is None else time.monotonic() + timeout
            for thread in self._threads:
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    # -- workers -------------------------------------------------------------------------------

    def _processor(self) -> P:
        processor: P | None = getattr(self._local, "processor", None)
        if processor is None:
            if self._cloneable:
                with self._clone_lock:
                    started = time.perf_counter()
                    processor = copy.deepcopy(self._resolve())
                    seconds = time.perf_counter() - started
                with self._state_lock:
                    self._clone_seconds.append(seconds)
                self._observer.cloned(seconds)
                logger.debug("%s cloned the processor in %.3f s", threading.current_thread().name, seconds)
            else:
                # The single worker of an uncloneable processor: the only thread that uses it.
                processor = self._resolve()
            self._local.processor = processor
        return processor

    def _no_workers_message(self) -> str:
        last = self._retired[-1].error if self._retired else "unknown"
        return f"no processor worker left: cloning the processor failed in all {len(self._threads)} ({last})"

    def _retire(self, job: _Job, error: BaseException) -> None:
        """This worker cannot have a processor: hand its job on and stop taking jobs."""
        name = threading.current_thread().name
        with self._state_lock:
            self._retired.append(RetiredWorker(name, f"{type(error).__name__}: {error}"))
            live = len(self._threads) - len(self._retired)
            if live > 0:
                self._waiting += 1
        logger.error("%s retired: cloning the processor failed (%s); %d worker(s) left", name, error, live)
        self._observer.retired(live)
        if self._warm_barrier is not None:
            self._warm_barrier.abort()  # warm() waits for every worker; it warms the rest again
        if live > 0:
            self._jobs.put(job)  # another worker serves it
            return
        # The last one: nobody will ever take the queued jobs, so fail them all now.
        failure = NoWorkersLeft(self._no_workers_message())
        pending = [job]
        with self._state_lock:
            while True:
                try:
                    item = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, _Job):
                    pending.append(item)
                    self._waiting -= 1
        for item in pending:
            if item.future.set_running_or_notify_cancel():
                item.future.set_exception(failure)

    def _work(self) -> None:
        if self._thread_init is not None:
            self._thread_init()
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            assert isinstance(job, _Job)
            with self._state_lock:
                self._waiting -= 1
            if job.future.cancelled():
                continue  # its deadline passed while it waited: nobody wants the answer
            try:
                processor = self._processor()
            except Exception as exc:  # noqa: BLE001 - any clone failure retires this worker
                self._retire(job, exc)
                return
            if not job.future.set_running_or_notify_cancel():
                continue
            started = time.perf_counter()
            self._observer.queue_wait(started - job.enqueued)
            with self._state_lock:
                self._busy += 1
            outcome: tuple[bool, Any]
            try:
                outcome = (True, job.function(processor, *job.args))
            except BaseException as exc:  # noqa: BLE001 - the job fails, never the worker
                outcome = (False, exc)
            # Account before resolving the future: whoever awaits it may read the stats next.
            elapsed = time.perf_counter() - started
            with self._state_lock:
                self._busy -= 1
                self._busy_seconds += elapsed
            self._observer.processing(elapsed)
            succeeded, value = outcome
            if succeeded:
                job.future.set_result(value)
            else:
                job.future.set_exception(value)
