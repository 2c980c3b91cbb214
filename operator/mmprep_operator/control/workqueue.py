"""A de-duplicating work queue with delayed re-adds and per-key exponential backoff.

Watch events only say "look at this resource again"; many events for one resource while it waits
or is being reconciled collapse into one more reconcile. A key is never processed by two workers
at once: one added while it is processed is parked and re-queued when that reconcile ends.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


#: Priorities: a lower number is taken first (FIFO within one priority).
URGENT = 0
NORMAL = 1


class WorkQueue(Generic[K]):
    """Each key is queued at most once, at the most urgent priority it was added with.

    Priorities let a node change (the affected resources must react within seconds) overtake the
    reconciles that the previous change's own Deployment updates queued. Re-adding a pending key
    with a more urgent priority moves it forward; the entry it leaves behind is skipped when taken.

    Takers may also ask for urgent keys only (``get(urgent_only=True)``, after
    ``serve_urgent_only``): urgent entries are then also kept in a second queue, and whichever
    taker comes first takes the key; the other skips its entry like any stale one.
    """

    def __init__(self) -> None:
        self._queue: asyncio.PriorityQueue[tuple[int, int, K]] = asyncio.PriorityQueue()
        self._seq = itertools.count()
        self._pending: dict[K, int] = {}  # key -> priority of its live entry
        self._processing: set[K] = set()
        self._dirty: dict[K, int] = {}  # added while processed -> priority to re-add it with
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._urgent: asyncio.Queue[tuple[int, int, K]] | None = None  # urgent entries again

    def serve_urgent_only(self) -> None:
        """Keep urgent entries for ``get(urgent_only=True)`` too (only useful with such takers)."""
        if self._urgent is None:
            self._urgent = asyncio.Queue()

    def add(self, key: K, priority: int = NORMAL) -> None:
        if key in self._processing:
            self._dirty[key] = min(priority, self._dirty.get(key, priority))
            return
        queued = self._pending.get(key)
        if queued is None or priority < queued:
            self._pending[key] = priority
            entry = (priority, next(self._seq), key)
            self._queue.put_nowait(entry)
            if priority == URGENT and self._urgent is not None:
                self._urgent.put_nowait(entry)

    def add_after(self, key: K, delay: float) -> None:
        """Add later; an earlier pending timer for the key wins (the sooner look is what matters)."""
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        timer = self._timers.get(key)
        if timer is not None and not timer.cancelled() and timer.when() <= when:
            return
        if timer is not None:
            timer.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self, *, urgent_only: bool = False) -> K:
        if urgent_only and self._urgent is None:
            raise RuntimeError("serve_urgent_only() first")
        source = self._urgent if urgent_only and self._urgent is not None else self._queue
        while True:
            priority, _, key = await source.get()
            if self._pending.get(key) == priority:
                return self._take(key)
            # else a stale entry: the key moved forward, or was taken already

    def get_nowait(self) -> K:
        """Like ``get``, without waiting; raises ``asyncio.QueueEmpty`` when nothing is pending."""
        while True:
            priority, _, key = self._queue.get_nowait()
            if self._pending.get(key) == priority:
                return self._take(key)

    def _take(self, key: K) -> K:
        del self._pending[key]
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        priority = self._dirty.pop(key, None)
        if priority is not None:
            self.add(key, priority)

    def forget(self, key: K) -> None:
        """Drop a delayed re-add (the resource is gone)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def __len__(self) -> int:
        return len(self._pending)


class Backoff(Generic[K]):
    """Exponential delays per key: base, 2*base, ... up to cap; reset on success."""

    def __init__(self, base: float = 1.0, cap: float = 300.0) -> None:
        self.base, self.cap = base, cap
        self._failures: dict[K, int] = {}

    def next(self, key: K) -> float:
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        return min(self.cap, self.base * 2.0**n)

    def reset(self, key: K) -> None:
        self._failures.pop(key, None)
