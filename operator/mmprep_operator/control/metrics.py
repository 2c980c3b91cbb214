"""Prometheus metrics of the operator, in a registry of their own (kept in the kopf memo)."""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from mmprep_operator.logic.conditions import CONDITION_TYPES
from mmprep_runtime.telemetry import add_process_collectors

OUTCOMES: Final = ("done", "decided", "waiting", "invalid", "gone", "error")
STATUSES: Final = ("True", "False", "Unknown")


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        add_process_collectors(self.registry)
        self.reconciles = Counter(
            "mmprep_operator_reconciles",
            "Reconciles of MultimodalPreprocessor resources, by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "mmprep_operator_reconcile_duration_seconds",
            "Time one reconcile took.",
            registry=self.registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.resources = Gauge(
            "mmprep_operator_resources",
            "MultimodalPreprocessor resources by condition and status.",
            ["condition", "status"],
            registry=self.registry,
        )
        self.probe_jobs = Counter("mmprep_operator_probe_jobs_created", "Probe Jobs created.", registry=self.registry)
        self.reads = Counter(
            "mmprep_operator_resource_reads",
            "Reconcile passes by where they read their resource: the watch's copy, or the API (a GET).",
            ["source"],
            registry=self.registry,
        )
        self.queue_depth = Gauge("mmprep_operator_queue_depth", "Resources waiting for a reconcile.", registry=self.registry)
        for outcome in OUTCOMES:
            self.reconciles.labels(outcome)  # export zeros, so rates exist before the first event
        for source in ("watch", "api"):
            self.reads.labels(source)
        self._conditions: dict[tuple[str, str], dict[str, str]] = {}
        # Kept in step with _conditions: every reconcile records its resource, so recounting all
        # resources each time would cost O(resources) per reconcile.
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._publish()

    def set_conditions(self, key: tuple[str, str], conditions: Mapping[str, str] | None) -> None:
        """Record one resource's condition statuses (None: the resource is gone)."""
        old = self._conditions.pop(key, None) or {}
        new = dict(conditions) if conditions is not None else {}
        if conditions is not None:
            self._conditions[key] = new
        if old == new:
            return
        self._counts.subtract((c, s) for c, s in old.items())
        self._counts.update((c, s) for c, s in new.items())
        self._publish()

    def _publish(self) -> None:
        for condition in CONDITION_TYPES:
            for status in STATUSES:
                self.resources.labels(condition, status).set(self._counts[(condition, status)])

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        start_http_server(port, addr=address, registry=self.registry)
