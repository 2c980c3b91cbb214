"""Per-tier wall-clock times, printed at the end of pytest's report (CI's time budget reads them).

A tier is the first folder under ``tests/`` (unit, integration, e2e, compat, gpu). A tier's time is
the sum of the stretches during which its tests ran (the kind tests run last, apart from the rest
of e2e), fixtures included: the cluster's start lands in the first tier that asks for it, which is
where a reader of the budget should see it.
"""

from __future__ import annotations

import time

import pytest


class TierTimes:
    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.current: tuple[str, float] | None = None  # the tier running now, since when

    @staticmethod
    def tier_of(nodeid: str) -> str:
        parts = nodeid.split("/")
        return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]

    def _close(self, now: float) -> None:
        if self.current is not None:
            tier, since = self.current
            self.totals[tier] = self.totals.get(tier, 0.0) + now - since
            self.current = None

    @pytest.hookimpl
    def pytest_runtest_logstart(self, nodeid: str) -> None:
        tier, now = self.tier_of(nodeid), time.monotonic()
        if self.current is None or self.current[0] != tier:
            self._close(now)
            self.current = (tier, now)

    @pytest.hookimpl
    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        tier = self.tier_of(nodeid)
        self.counts[tier] = self.counts.get(tier, 0) + 1

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        self._close(time.monotonic())
        if not self.totals:
            return
        terminalreporter.section("tier times")
        for tier, total in self.totals.items():
            terminalreporter.write_line(f"{tier:<12} {total:7.0f} s  ({self.counts.get(tier, 0)} tests)")
