"""The leader election of the operator's replicas: wait for the Lease, hold it, give it up.

``run_operator_with_lease`` (called by ``mmprep-operator run --leader-election``) is the whole
life of one replica:

1. standby: answer the liveness probe (kopf's endpoint only starts with kopf) and try to take the
   Lease every retry period until it is free or expired (rules: ``logic.leadership``);
2. leader: start kopf, and renew the Lease from a thread of its own, so a busy event loop cannot
   delay a renewal; a renewal that keeps failing until the renew deadline stops kopf (the process
   then exits non-zero and comes back as a standby), before any standby may take over;
3. on SIGTERM: kopf stops, then the Lease is released, so a standby takes over at its next try
   rather than after the lease runs out.

Reconciles are idempotent server-side applies, so the only harm two leaders could do is racing
on the same writes; the deadline above keeps them from overlapping at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import http.server
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from prometheus_client import Counter, Gauge

from mmprep_operator.kube import ApiError, Conflict, RestKubeApi
from mmprep_operator.logic import leadership
from mmprep_operator.logic.leadership import LeaseRecord, LeaseTerms, Observation

log = logging.getLogger("mmprep.operator.leadership")


class LeaseApi(Protocol):
    async def get_object(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def write_lease(self, lease: dict[str, Any]) -> dict[str, Any]: ...


class LeaderMetrics:
    def __init__(self, registry: Any) -> None:
        self.leader = Gauge(
            "mmprep_operator_leader", "1 while this replica holds the leader Lease and reconciles.", registry=registry
        )
        self.transitions = Counter(
            "mmprep_operator_leader_acquisitions", "Times this replica took the leader Lease.", registry=registry
        )


class Elector:
    """One replica's side of the election over one Lease."""

    def __init__(self, namespace: str, name: str, identity: str, terms: LeaseTerms) -> None:
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.terms = terms
        self._observed: Observation | None = None
        self._resource_version: str | None = None

    def _lease(self, record: LeaseRecord) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if self._resource_version:
            meta["resourceVersion"] = self._resource_version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": record.spec()}

    async def try_hold(self, kube: LeaseApi) -> bool:
        """One attempt to take or renew the Lease; True when this replica holds it afterwards."""
        current = await kube.get_object("coordination.k8s.io/v1", "Lease", self.namespace, self.name)
        record = LeaseRecord.from_lease(current) if current else None
        self._resource_version = (current or {}).get("metadata", {}).get("resourceVersion")
        now = time.monotonic()
        if record is not None:
            self._observed = leadership.observe(self._observed, record, now)
            if leadership.held_by_other(self._observed, self.identity, now):
                return False
        claimed = leadership.claim(record, self.identity, self.terms, datetime.datetime.now(datetime.UTC))
        try:
            written = await kube.write_lease(self._lease(claimed))
        except Conflict:
            return False  # another replica wrote it first; look again next period
        self._resource_version = written.get("metadata", {}).get("resourceVersion")
        self._observed = Observation(LeaseRecord.from_lease(written), time.monotonic())
        return True

    async def release(self, kube: LeaseApi) -> None:
        current = await kube.get_object("coordination.k8s.io/v1", "Lease", self.namespace, self.name)
        if not current:
            return
        released = leadership.release(LeaseRecord.from_lease(current), self.identity)
        if released is None:
            return
        self._resource_version = current["metadata"].get("resourceVersion")
        with contextlib.suppress(Conflict):
            await kube.write_lease(self._lease(released))


async def _connected(kubeconfig: str | None, context: str | None) -> RestKubeApi:
    return await RestKubeApi.connect(kubeconfig, context)


async def wait_for_lease(elector: Elector, stop: threading.Event, kubeconfig: str | None, context: str | None) -> bool:
    """Standby: True once this replica holds the Lease, False when ``stop`` is set first."""
    kube = await _connected(kubeconfig, context)
    try:
        announced = False
        while not stop.is_set():
            try:
                if await elector.try_hold(kube):
                    return True
                if not announced:
                    log.info("standby: another replica holds the leader Lease", extra={"lease": elector.name})
                    announced = True
            except ApiError as e:
                log.warning("cannot read or write the leader Lease", extra={"error": str(e)})
            await asyncio.to_thread(stop.wait, elector.terms.retry_period)
        return False
    finally:
        await kube.close()


async def keep_lease(
    elector: Elector, on_lost: Callable[[], None], done: threading.Event, kubeconfig: str | None, context: str | None
) -> None:
    """Leader: renew every retry period; call ``on_lost`` when renewing failed for the renew deadline."""
    kube = await _connected(kubeconfig, context)
    try:
        last_renewal = time.monotonic()
        while not done.is_set():
            await asyncio.to_thread(done.wait, elector.terms.retry_period)
            if done.is_set():
                break
            try:
                if await elector.try_hold(kube):
                    last_renewal = time.monotonic()
                    continue
                reason = "another replica holds the leader Lease"
            except ApiError as e:
                reason = str(e)
            if time.monotonic() - last_renewal >= elector.terms.renew_deadline:
                log.error("lost the leader Lease: stopping", extra={"reason": reason})
                on_lost()
                return
        with contextlib.suppress(ApiError):
            await elector.release(kube)
            log.info("released the leader Lease")
    finally:
        await kube.close()


@contextlib.contextmanager
def standby_liveness(host: str, port: int) -> Iterator[None]:
    """/healthz while standing by: kopf's own endpoint on the same port starts only with kopf."""
    if not port:
        yield
        return

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            ok = self.path.split("?")[0] == "/healthz"
            body = json.dumps({"leader": False} if ok else {"error": "not found"}).encode()
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            return

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    thread = threading.Thread(target=server.serve_forever, name="standby-liveness", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def run_operator_with_lease(
    elector: Elector,
    run_kopf: Callable[[asyncio.AbstractEventLoop, asyncio.Future[None]], None],
    *,
    metrics: LeaderMetrics,
    kubeconfig: str | None,
    context: str | None,
    liveness: tuple[str, int],
) -> int:
    """Stand by, lead, release: the exit code of the replica (1 when it lost the Lease).

    kopf runs in a loop made here, with an asyncio future as its stop flag: kopf waits on a
    threading.Event from an executor thread that nothing would wake on a normal stop, and the
    loop's shutdown would then hang on that thread.
    """
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with standby_liveness(*liveness):
            leader = asyncio.run(wait_for_lease(elector, stop, kubeconfig, context))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if not leader:
        log.info("stopped while standing by")
        return 0
    log.info("took the leader Lease: reconciling", extra={"lease": elector.name, "identity": elector.identity})
    metrics.leader.set(1)
    metrics.transitions.inc()
    loop = asyncio.new_event_loop()
    stopping: asyncio.Future[None] = loop.create_future()
    lost, done = threading.Event(), threading.Event()

    def stop_kopf() -> None:
        if not stopping.done():
            stopping.set_result(None)

    def on_lost() -> None:
        lost.set()
        loop.call_soon_threadsafe(stop_kopf)

    keeper = threading.Thread(
        target=lambda: asyncio.run(keep_lease(elector, on_lost, done, kubeconfig, context)), name="lease-keeper", daemon=True
    )
    keeper.start()
    try:
        run_kopf(loop, stopping)  # returns on SIGTERM/SIGINT, or once the Lease is lost
    finally:
        metrics.leader.set(0)
        done.set()
        keeper.join(timeout=elector.terms.renew_deadline)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
    return 1 if lost.is_set() else 0
