"""Two operator replicas on one leader Lease: one reconciles, the other takes over when it dies.

Both are real `mmprep-operator run --leader-election` processes against the real API server. The
leader is SIGKILLed while resources change (no release: the standby waits the lease out), then the
new leader is stopped with SIGTERM (it releases the lease: the standby takes it at its next try).
Each takeover is measured from the loss of the leader to the first reconcile of a resource
created right after it, and no resource ever has two Deployments for one pool.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client
from support.kube import Cluster, Kube, condition_is, wait_for
from support.operator_process import OperatorProcess
from support.specs import CPU_POOL, make_spec

pytestmark = pytest.mark.cluster

LEASE_SECONDS = 6
LEADER_METRIC = re.compile(r"^mmprep_operator_leader (\d+(?:\.\d+)?)$", re.M)


def is_leader(op: OperatorProcess) -> bool:
    found = LEADER_METRIC.search(op.metrics())
    return bool(found and float(found.group(1)) == 1.0)


@pytest.fixture
def replicas(
    cluster: Cluster, crd: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[OperatorProcess]]:
    lease = f"mmprep-failover-{uuid.uuid4().hex[:6]}"
    args = ["--leader-election", "--leader-election-namespace", namespace, "--leader-election-id", lease]
    args += ["--lease-seconds", str(LEASE_SECONDS)]
    ops = [
        OperatorProcess(cluster, log_dir=tmp_path_factory.mktemp(f"replica{i}"), namespaces=[namespace], extra_args=args)
        for i in range(2)
    ]
    for op in ops:
        op.start()  # healthy as a standby too: its liveness endpoint answers before it leads
    yield ops
    for op in ops:
        op.stop()


def lease_holder(kube: Kube, namespace: str) -> tuple[str | None, int]:
    (lease,) = client.CoordinationV1Api(kube.api).list_namespaced_lease(namespace).items
    return lease.spec.holder_identity, lease.spec.lease_transitions or 0


def one_leader(ops: list[OperatorProcess]) -> OperatorProcess | None:
    leaders = [op for op in ops if op.process is not None and op.process.poll() is None and is_leader(op)]
    assert len(leaders) <= 1, "two replicas reconcile at once"
    return leaders[0] if leaders else None


def deployments_per_pool(kube: Kube, namespace: str) -> Counter[tuple[str, str]]:
    return Counter(
        (d.metadata.labels.get("mmprep.dev/resource", ""), d.metadata.labels.get("mmprep.dev/pool", ""))
        for d in kube.deployments(namespace)
    )


def test_the_standby_takes_over_when_the_leader_dies_or_stops_with_no_duplicate_children(
    kube: Kube, namespace: str, replicas: list[OperatorProcess], model_dir: Callable[..., Path]
) -> None:
    spec = make_spec(model_dir("llava"), nodeSelector=CPU_POOL)
    leader = wait_for(lambda: one_leader(replicas), 60, what="one leader", describe=lambda: replicas[0].tail())
    standby = next(op for op in replicas if op is not leader)
    assert not is_leader(standby)
    kube.create_mmp(namespace, "before", spec)
    kube.wait_mmp(namespace, "before", lambda o: condition_is(o, "Ready", "True"), 180, what="Ready under the first leader")
    first_holder, transitions = lease_holder(kube, namespace)
    assert first_holder is not None

    # 1. The leader dies without a word while a resource changes and another is created.
    kube.patch_mmp(namespace, "before", {"spec": {"replicas": 2}})
    leader.kill()
    lost = time.monotonic()
    kube.create_mmp(namespace, "after-kill", spec)
    wait_for(
        lambda: kube.deployments(namespace) and _reconciled(kube, namespace, "after-kill"),
        120,
        what="a reconcile by the standby",
        describe=standby.tail,
    )
    takeover_kill = time.monotonic() - lost
    assert is_leader(standby)
    holder, after = lease_holder(kube, namespace)
    assert holder != first_holder and after == transitions + 1
    kube.wait_mmp(namespace, "before", lambda o: o["status"].get("replicas") == 2, 60, what="the change made during the kill")

    # 2. The new leader stops cleanly: it releases the lease, and the restarted replica takes it.
    leader.start()
    assert not is_leader(leader)
    standby.stop()
    stopped = time.monotonic()
    kube.create_mmp(namespace, "after-stop", spec)
    wait_for(
        lambda: _reconciled(kube, namespace, "after-stop"), 120, what="a reconcile by the restarted replica", describe=leader.tail
    )
    takeover_stop = time.monotonic() - stopped
    assert is_leader(leader)
    assert "released the leader Lease" in standby.log_path.read_text()
    print(f"takeover after SIGKILL: {takeover_kill:.1f} s (lease {LEASE_SECONDS} s); after SIGTERM: {takeover_stop:.1f} s")

    for name in ("before", "after-kill", "after-stop"):
        kube.wait_mmp(namespace, name, lambda o: condition_is(o, "Ready", "True"), 180, what=f"{name} Ready")
    per_pool = deployments_per_pool(kube, namespace)
    assert per_pool and all(n == 1 for n in per_pool.values()), per_pool
    assert {resource for resource, _ in per_pool} == {"before", "after-kill", "after-stop"}


def _reconciled(kube: Kube, namespace: str, name: str) -> bool:
    """The resource's status has been written by an operator (its first reconcile happened)."""
    return bool(kube.get_mmp(namespace, name).get("status", {}).get("observedGeneration"))


def test_a_leader_that_cannot_renew_its_lease_stops_before_another_may_take_over(
    kube: Kube, namespace: str, replicas: list[OperatorProcess]
) -> None:
    leader = wait_for(lambda: one_leader(replicas), 60, what="one leader", describe=lambda: replicas[0].tail())
    for op in replicas:
        if op is not leader:
            op.stop()
    leases = client.CoordinationV1Api(kube.api)

    def hijack() -> bool:
        """Someone else's record, as if a partition had let another replica take it: the leader's
        renewals now fail, and it must give up within its renew deadline (before that record
        expires). A renewal between our read and our write makes the write a 409, which
        ``wait_for`` counts as "not yet": it reads again."""
        (lease,) = leases.list_namespaced_lease(namespace).items
        lease.spec.holder_identity = "intruder"
        leases.replace_namespaced_lease(lease.metadata.name, namespace, lease)
        return True

    wait_for(hijack, 30, what="the lease taken over by an intruder")
    hijacked = time.monotonic()
    assert leader.process is not None
    code = leader.process.wait(timeout=60)
    gave_up = time.monotonic() - hijacked
    assert code == 1, leader.tail()
    assert "lost the leader Lease" in leader.log_path.read_text()
    print(f"the leader stopped {gave_up:.1f} s after losing its lease (lease {LEASE_SECONDS} s)")
