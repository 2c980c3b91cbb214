"""The processor pool: one clone per thread, never shared; lazy resolution; patches; fallback."""

from __future__ import annotations

import copy
import threading
import time
import types
from typing import Any

import pytest

from mmprep_runtime.engine import executor, patches

TIMEOUT = 30


class ConcurrencyDetector:
    """A stand-in processor that records any moment two threads are inside it at once.

    The check is real: each call holds a non-blocking lock for a while; a second thread entering
    the same object while the first is inside fails to take the lock and records a violation.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.customized = "no"

    def __deepcopy__(self, memo: dict[int, Any]) -> ConcurrencyDetector:
        clone = ConcurrencyDetector()
        clone.customized = self.customized
        return clone

    def __call__(self, hold: float) -> tuple[int, int]:
        lock = _LOCKS.setdefault(id(self), threading.Lock())
        if not lock.acquire(blocking=False):
            _VIOLATIONS.append(id(self))
            return id(self), threading.get_ident()
        try:
            self.calls += 1
            time.sleep(hold)  # stay inside long enough for another thread to collide
        finally:
            lock.release()
        return id(self), threading.get_ident()


_LOCKS: dict[int, threading.Lock] = {}
_VIOLATIONS: list[int] = []


def _run(processor: ConcurrencyDetector, hold: float) -> tuple[int, int]:
    return processor(hold)


def test_no_processor_object_is_ever_used_by_two_threads_at_once():
    _VIOLATIONS.clear()
    original = ConcurrencyDetector()
    pool = executor.ProcessorPool(lambda: original, 4)
    try:
        futures = [pool.submit(_run, 0.002) for _ in range(200)]
        results = [future.result(TIMEOUT) for future in futures]
    finally:
        pool.shutdown()
    assert _VIOLATIONS == []
    objects_by_thread: dict[int, set[int]] = {}
    for object_id, thread_id in results:
        objects_by_thread.setdefault(thread_id, set()).add(object_id)
    # Without this the checks below would hold for a pool that ran everything on one thread.
    assert len(objects_by_thread) > 1, "only one worker thread did any work"
    # each thread used exactly one object, no two threads the same one, and never the original
    assert all(len(objects) == 1 for objects in objects_by_thread.values())
    used = [next(iter(objects)) for objects in objects_by_thread.values()]
    assert len(set(used)) == len(used)
    assert id(original) not in used
    assert original.calls == 0


def test_the_detector_does_see_sharing_when_one_object_is_shared():
    # The control for the test above: the same load on one shared object is caught.
    _VIOLATIONS.clear()
    shared = ConcurrencyDetector()
    threads = [threading.Thread(target=lambda: [shared(0.002) for _ in range(20)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    assert _VIOLATIONS


def test_the_pool_clones_what_the_resolver_returns_at_first_use_not_at_construction():
    holder = {"processor": ConcurrencyDetector()}
    pool = executor.ProcessorPool(lambda: holder["processor"], 1)
    try:
        # Replaced after the pool exists (as a backend swap does): a pool that had taken the object
        # at construction would clone the old one, which an in-place change could not reveal.
        replacement = ConcurrencyDetector()
        replacement.customized = "yes"
        holder["processor"] = replacement
        seen = pool.submit(lambda processor: processor.customized).result(TIMEOUT)
    finally:
        pool.shutdown()
    assert seen == "yes"


def test_warm_makes_one_clone_per_worker_before_any_job():
    copies: list[int] = []

    class Counting:
        def __deepcopy__(self, memo):
            copies.append(threading.get_ident())
            return Counting()

    pool = executor.ProcessorPool(Counting, 3)
    try:
        pool.warm(TIMEOUT)
        assert len(copies) == 3 and len(set(copies)) == 3
        for _ in range(30):
            pool.submit(lambda processor: None).result(TIMEOUT)
        assert len(copies) == 3, "no job paid for a clone after warming"
        assert len(pool.clone_seconds) == 3
    finally:
        pool.shutdown()


def test_clones_are_made_one_at_a_time():
    inside = []
    overlaps = []
    lock = threading.Lock()

    class SlowToCopy:
        def __deepcopy__(self, memo):
            with lock:
                inside.append(1)
                if len(inside) > 1:
                    overlaps.append(len(inside))
            time.sleep(0.02)
            with lock:
                inside.pop()
            return SlowToCopy()

    pool = executor.ProcessorPool(SlowToCopy, 4)
    try:
        pool.warm(TIMEOUT)
    finally:
        pool.shutdown()
    assert overlaps == []


def test_a_failing_job_fails_its_future_and_the_worker_keeps_serving():
    pool = executor.ProcessorPool(ConcurrencyDetector, 1)

    def boom(processor):
        raise RuntimeError("bad input")

    try:
        with pytest.raises(RuntimeError, match="bad input"):
            pool.submit(boom).result(TIMEOUT)
        assert pool.submit(lambda processor: "still here").result(TIMEOUT) == "still here"
    finally:
        pool.shutdown()


def test_a_job_cancelled_while_waiting_never_runs():
    release = threading.Event()
    ran = []
    pool = executor.ProcessorPool(ConcurrencyDetector, 1)
    try:
        blocker = pool.submit(lambda processor: release.wait(TIMEOUT))
        waiting = pool.submit(lambda processor: ran.append(1))
        assert waiting.cancel()
        release.set()
        blocker.result(TIMEOUT)
        pool.submit(lambda processor: None).result(TIMEOUT)  # the queue has moved past it
    finally:
        pool.shutdown()
    assert ran == []
    assert pool.waiting == 0


def test_shutdown_finishes_queued_jobs_then_refuses_new_ones():
    pool = executor.ProcessorPool(ConcurrencyDetector, 2)
    futures = [pool.submit(_run, 0.001) for _ in range(10)]
    pool.shutdown(wait=True, timeout=TIMEOUT)
    assert all(future.done() and future.exception() is None for future in futures)
    with pytest.raises(executor.PoolClosed):
        pool.submit(_run, 0.0)


def test_the_clone_probe_reports_why_a_processor_cannot_be_copied():
    class Handle:
        def __init__(self):
            self.lock = threading.Lock()  # a native handle: deepcopy cannot pickle it

    probe = executor.try_clone(Handle)
    assert not probe.cloneable
    assert "lock" in probe.error
    assert executor.try_clone(ConcurrencyDetector).cloneable


def test_an_uncloneable_processor_gets_one_worker_that_uses_the_original():
    class Uncloneable:
        def __deepcopy__(self, memo):
            raise TypeError("no copies")

    original = Uncloneable()
    with pytest.raises(ValueError, match="only have 1 worker"):
        executor.ProcessorPool(lambda: original, 2, cloneable=False)
    pool = executor.ProcessorPool(lambda: original, 1, cloneable=False)
    try:
        pool.warm(TIMEOUT)
        assert pool.submit(lambda processor: processor is original).result(TIMEOUT)
    finally:
        pool.shutdown()


# -- patches ---------------------------------------------------------------------------------------


class Preprocessor:
    def __init__(self, name: str) -> None:
        self.name = name

    def preprocess(self, images, device="cpu", scale=1):
        return (self.name, device, scale)


def test_a_methodtype_patch_rebinds_to_the_clone_after_deepcopy():
    original = Preprocessor("original")
    patches.bind_default_kwargs(original, "preprocess", device="cuda")
    clone = copy.deepcopy(original)
    clone.name = "clone"
    assert isinstance(clone.preprocess, types.MethodType)
    assert clone.preprocess.__self__ is clone
    assert clone.preprocess(None) == ("clone", "cuda", 1)
    assert original.preprocess(None) == ("original", "cuda", 1)
    assert clone.preprocess(None, device="cpu") == ("clone", "cpu", 1), "explicit arguments win"


def test_a_closure_patch_would_keep_calling_the_original_which_is_why_patches_are_bound():
    # The pitfall the binding avoids, shown on the same class: a closure over `original`
    # survives deepcopy but still routes every clone's call to the original object.
    original = Preprocessor("original")
    unpatched = original.preprocess
    original.preprocess = lambda images, **kw: unpatched(images, device="cuda", **kw)
    clone = copy.deepcopy(original)
    clone.name = "clone"
    assert clone.preprocess(None)[0] == "original"


def test_patch_defaults_of_a_clone_are_its_own():
    original = Preprocessor("original")
    patches.bind_default_kwargs(original, "preprocess", device="cuda")
    clone = copy.deepcopy(original)
    patches.bind_default_kwargs(clone, "preprocess", scale=2)
    assert clone.preprocess(None) == ("original", "cuda", 2)
    assert original.preprocess(None) == ("original", "cuda", 1)


def test_patching_a_missing_method_is_refused():
    with pytest.raises(AttributeError, match="no method 'postprocess'"):
        patches.bind_default_kwargs(Preprocessor("x"), "postprocess", device="cuda")


def test_the_tokenizer_lookup_treats_a_bare_tokenizer_as_its_own(qwen_dir, tokenizer_dir):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(qwen_dir))
    bare = AutoProcessor.from_pretrained(str(tokenizer_dir))
    assert patches.tokenizer_of(processor) is processor.tokenizer
    assert patches.tokenizer_of(bare) is bare
    clone = copy.deepcopy(processor)
    assert patches.tokenizer_of(clone) is clone.tokenizer
    assert patches.tokenizer_of(clone) is not patches.tokenizer_of(processor)


class FailsToCloneAfter:
    """Deep-copies ``good`` times, then every further copy fails (memory ran out, a file vanished)."""

    def __init__(self, good: int) -> None:
        self.left = [good]  # shared by the clones' originals: counts copies of the original

    def __deepcopy__(self, memo: dict[int, Any]) -> FailsToCloneAfter:
        if self.left[0] <= 0:
            raise MemoryError("cannot allocate the tokenizer's tables")
        self.left[0] -= 1
        clone = FailsToCloneAfter.__new__(FailsToCloneAfter)
        clone.left = [0]
        return clone

    def __call__(self, value: int) -> tuple[int, int]:
        return value * 2, threading.get_ident()


def test_a_worker_whose_clone_fails_retires_and_the_others_keep_serving():
    original = FailsToCloneAfter(good=1)
    retired: list[int] = []

    class Observer:
        def queue_wait(self, seconds: float) -> None: ...
        def processing(self, seconds: float) -> None: ...
        def cloned(self, seconds: float) -> None: ...
        def retired(self, live_workers: int) -> None:
            retired.append(live_workers)

    pool = executor.ProcessorPool(lambda: original, 3, observer=Observer())
    try:
        pool.warm(TIMEOUT)  # one clone succeeds, two fail: warm() settles on the one left
        assert pool.live_workers == 1 and len(pool.retired) == 2
        assert all("MemoryError: cannot allocate" in r.error for r in pool.retired)
        assert sorted(retired) == [1, 2]
        answers = [pool.submit(lambda p, v: p(v), v).result(TIMEOUT) for v in range(20)]
        assert [a for a, _ in answers] == [v * 2 for v in range(20)]  # no request failed
        assert len({thread for _, thread in answers}) == 1  # served by the one worker left
    finally:
        pool.shutdown()


def test_jobs_fail_clearly_when_no_worker_is_left():
    pool = executor.ProcessorPool(lambda: FailsToCloneAfter(good=0), 2)
    try:
        futures = [pool.submit(lambda p: p(1)) for _ in range(3)]
        for future in futures:
            with pytest.raises(executor.NoWorkersLeft, match="cloning the processor failed in all 2"):
                future.result(TIMEOUT)
        assert pool.live_workers == 0
        assert pool.waiting == 0  # the failed jobs left the queue-depth gauge too
        with pytest.raises(executor.NoWorkersLeft):
            pool.submit(lambda p: p(1))
        with pytest.raises(executor.NoWorkersLeft):
            pool.warm(TIMEOUT)
    finally:
        pool.shutdown()
