"""A de-duplicating work queue with delayed re-adds and per-key exponential backoff.

Watch events only say "look at this resource again"; many events for one resource while it waits
or is being reconciled collapse into one more reconcile. A key is never processed by two workers
at once: one added while it is processed is parked and re-queued when that reconcile ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._pending: set[K] = set()
        self._processing: set[K] = set()
        self._dirty: set[K] = set()
        self._timers: dict[K, asyncio.TimerHandle] = {}

    def add(self, key: K) -> None:
        if key in self._processing:
            self._dirty.add(key)
        elif key not in self._pending:
            self._pending.add(key)
            self._queue.put_nowait(key)

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

    async def get(self) -> K:
        key = await self._queue.get()
        self._pending.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

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
        return self._queue.qsize()


class Backoff(Generic[K]):
    """Exponential delays per key: base, 2*base, ... up to cap; reset on success."""

    def __init__(self, base: float = 1.0, cap: float = 300.0) -> None:
        self.base, self.cap = base, cap
        self._failures: dict[K, int] = {}

    def next(self, key: K) -> float:
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        return min(self.cap, self.base * 2**n)

    def reset(self, key: K) -> None:
        self._failures.pop(key, None)
