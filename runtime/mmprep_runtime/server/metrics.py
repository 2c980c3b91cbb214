"""Prometheus metrics of one server, in their own registry (one app, one registry: tests can run
several servers in a process without the global registry's duplicate-name errors).

The pool reports through the ``executor.PoolObserver`` methods; gauges that are a view of live
state (queue depth, busy workers, in-flight) read it at scrape time instead of being kept in step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.core import CounterMetricFamily

from mmprep_runtime import errors
from mmprep_runtime.telemetry import add_process_collectors

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

# Preprocessing a large image takes 10-200 ms on a core; queue waits range to the deadline.
_LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _BusySecondsCollector:
    """A counter read from the pool at scrape time: rate(...) / workers is the busy fraction."""

    def __init__(self, read: Callable[[], float]) -> None:
        self._read = read

    def collect(self) -> Any:
        yield CounterMetricFamily("mmprep_worker_busy_seconds", "Seconds processor workers spent on jobs", value=self._read())


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        add_process_collectors(r)
        self.requests = Counter("mmprep_requests", "Preprocess requests by outcome", ["outcome"], registry=r)
        self.request_seconds = Histogram(
            "mmprep_request_seconds",
            "Time from arrival to answer, by outcome class (ok, rejected, client_error, server_error)",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        for outcome in errors.OUTCOME_CLASSES:
            self.request_seconds.labels(outcome)  # every class exported from the start, at 0
        self.decode_seconds = Histogram(
            "mmprep_decode_seconds", "Parsing and media decoding time (IO pool)", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.queue_wait_seconds = Histogram(
            "mmprep_queue_wait_seconds",
            "Time a job waited for a processor worker",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.processing_seconds = Histogram(
            "mmprep_processing_seconds",
            "Time a processor worker spent on a job",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.clone_seconds = Gauge(
            "mmprep_clone_seconds", "Seconds the start-up clone trial's deep copy of the processor took", registry=r
        )
        self.worker_clone_seconds = Histogram(
            "mmprep_worker_clone_seconds",
            "Seconds each worker's deep copy took",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.cloneable = Gauge("mmprep_processor_cloneable", "1 if the processor can be deep-copied", registry=r)
        self.processor_workers = Gauge("mmprep_processor_workers", "Processor worker threads", registry=r)
        self.live_workers = Gauge(
            "mmprep_processor_workers_live",
            "Processor workers still serving (a worker whose clone failed retires)",
            registry=r,
        )
        self.retired_workers = Counter(
            "mmprep_processor_workers_retired", "Processor workers retired because their clone failed", registry=r
        )
        self.io_workers = Gauge("mmprep_io_workers", "IO (decode) threads", registry=r)
        self.intra_op_threads = Gauge("mmprep_intra_op_threads", "torch intra-op threads per worker", registry=r)
        self.in_flight = Gauge("mmprep_requests_in_flight", "Requests admitted and not yet answered", registry=r)
        self.queue_depth = Gauge("mmprep_queue_depth", "Jobs waiting for a processor worker", registry=r)
        self.busy_workers = Gauge("mmprep_workers_busy", "Processor workers running a job now", registry=r)
        self.busy_fraction = Gauge("mmprep_workers_busy_fraction", "Busy processor workers / processor workers, now", registry=r)
        self.ready = Gauge("mmprep_ready", "1 once the processor is loaded and the pool warm", registry=r)
        self.draining = Gauge(
            "mmprep_draining", "1 from SIGTERM on: not ready, still serving until the listener closes", registry=r
        )
        self.drain_answers = Counter(
            "mmprep_drain_requests",
            "API requests answered since SIGTERM: served, or refused (503 shutting_down) after the drain window",
            ["outcome"],
            registry=r,
        )
        for outcome in ("served", "refused"):
            self.drain_answers.labels(outcome)
        self.info = Info("mmprep_runtime", "Model, path and the worker decision", registry=r)

    def answered(self, code: str, seconds: float) -> None:
        """One preprocess request answered: ``code`` is its outcome (``ok`` or the error's code)."""
        self.requests.labels(code).inc()
        self.request_seconds.labels(errors.outcome_class(code)).observe(seconds)

    def answered_while_draining(self, refused: bool) -> None:
        self.drain_answers.labels("refused" if refused else "served").inc()

    # PoolObserver
    def queue_wait(self, seconds: float) -> None:
        self.queue_wait_seconds.observe(seconds)

    def processing(self, seconds: float) -> None:
        self.processing_seconds.observe(seconds)

    def cloned(self, seconds: float) -> None:
        self.worker_clone_seconds.observe(seconds)

    def retired(self, live_workers: int) -> None:
        self.retired_workers.inc()
        self.live_workers.set(live_workers)

    def bind_live(
        self,
        *,
        in_flight: Callable[[], float],
        queue_depth: Callable[[], float],
        busy: Callable[[], float],
        workers: int,
        busy_seconds: Callable[[], float],
    ) -> None:
        self.in_flight.set_function(in_flight)
        self.queue_depth.set_function(queue_depth)
        self.busy_workers.set_function(busy)
        self.busy_fraction.set_function(lambda: busy() / workers)
        self.registry.register(_BusySecondsCollector(busy_seconds))

    def describe_engine(self, info: dict[str, Any]) -> None:
        workers = info["workers"]
        self.clone_seconds.set(info["clone_seconds"])
        self.cloneable.set(1 if info["cloneable"] else 0)
        self.processor_workers.set(workers["processor"])
        self.live_workers.set(workers.get("live", workers["processor"]))
        self.io_workers.set(workers["io"])
        self.intra_op_threads.set(info["intra_op_threads"])
        self.info.info(
            {
                "model": str(info["model"]),
                "pool": str(info.get("pool") or ""),
                "processor_class": str(info["processor_class"]),
                "path": str(info["path"]),
                "reason": str(workers["reason"]),
                "device": str(info["device"]),
                "cloneable": str(info["cloneable"]).lower(),
            }
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
