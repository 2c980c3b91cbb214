"""Admission control: how many requests may be inside the server at once.

A request is admitted before its body is read, so at most ``capacity`` bodies, decoded images and
results exist at any time: memory stays bounded under any load, and the excess is told to retry
(429 + Retry-After) instead of queueing without limit. Capacity = processor workers + queue size.

Used from the event loop only (no locks needed); ``drained`` lets shutdown wait for in-flight
requests to finish.
"""

from __future__ import annotations

import asyncio


class Admission:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def try_enter(self) -> bool:
        if self._in_flight >= self.capacity:
            return False
        self._in_flight += 1
        self._idle.clear()
        return True

    def leave(self) -> None:
        if self._in_flight <= 0:
            raise RuntimeError("leave() without a matching try_enter()")
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    async def drained(self, timeout: float | None) -> bool:
        """Wait until nothing is in flight; False if ``timeout`` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True
