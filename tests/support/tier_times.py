"""Per-tier wall-clock times, printed at the end of pytest's report (CI's time budget reads them).

A tier is the first folder under ``tests/`` (unit, integration, e2e, compat, gpu). pytest runs the
tiers one after the other, so a tier's time is from its first test's start to its last test's end,
fixtures included: the cluster's start lands in the first tier that asks for it, which is where a
reader of the budget should see it.
"""

from __future__ import annotations

import time

import pytest


class TierTimes:
    def __init__(self) -> None:
        self.spans: dict[str, list[float]] = {}
        self.counts: dict[str, int] = {}

    @staticmethod
    def tier_of(nodeid: str) -> str:
        parts = nodeid.split("/")
        return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]

    @pytest.hookimpl
    def pytest_runtest_logstart(self, nodeid: str) -> None:
        span = self.spans.setdefault(self.tier_of(nodeid), [time.monotonic(), time.monotonic()])
        span[1] = time.monotonic()

    @pytest.hookimpl
    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        tier = self.tier_of(nodeid)
        self.spans[tier][1] = time.monotonic()
        self.counts[tier] = self.counts.get(tier, 0) + 1

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.spans:
            return
        terminalreporter.section("tier times")
        for tier, (start, end) in sorted(self.spans.items(), key=lambda item: item[1][0]):
            terminalreporter.write_line(f"{tier:<12} {end - start:7.0f} s  ({self.counts.get(tier, 0)} tests)")
