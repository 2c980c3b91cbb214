"""Per-pool availability (RuntimeClass, PriorityClass, spread, disruption budget, arch pinning)
and a status that says why pods are missing: rendering, deciding and folding, without a cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import GB300, H200, make_node
from fake_kube import FakeKubeApi
from pydantic import ValidationError

from mmprep_operator import api
from mmprep_operator.api import crd
from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.control.children import ChildStore
from mmprep_operator.control.metrics import Metrics
from mmprep_operator.control.reconcile import Reconciler
from mmprep_operator.logic import identity, podstates
from mmprep_operator.logic.plan import make_plan

PROBE_OK = json.dumps({"cloneable": True, "fast_image_processor": True, "processor_class": "P"})
GPU = {"limits": {"nvidia.com/gpu": 1}}
NODES = [make_node("h200-a", H200, gpus=8), make_node("h200-b", H200, gpus=8), make_node("gb300-a", GB300, gpus=4)]
OWNER = identity.Owner("m", "ns", "uid-m")


def plan_for(spec: dict[str, Any], policy: OperatorPolicy | None = None):
    parsed = api.MultimodalPreprocessorSpec.model_validate({"model": {"path": "/models/m"}, "resources": GPU, **spec})
    probe = api.ProbeResult(cloneable=True, fast_image_processor=True)
    return make_plan(OWNER, parsed, NODES, probe, policy or OperatorPolicy())


def of_kind(objects, kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


# ------------------------------------------------------------------------------------ render


def test_runtime_and_priority_class_reach_every_pools_pods() -> None:
    plan = plan_for({"runtimeClassName": "nvidia", "priorityClassName": "inference-high"})
    specs = [pod_spec(d) for d in of_kind(plan.objects, "Deployment").values()]
    assert len(specs) == 2
    assert {(s["runtimeClassName"], s["priorityClassName"]) for s in specs} == {("nvidia", "inference-high")}
    assert "runtimeClassName" not in pod_spec(next(iter(of_kind(plan_for({}).objects, "Deployment").values())))


def test_each_pool_spreads_its_own_pods_over_its_nodes() -> None:
    deployments = of_kind(plan_for({}).objects, "Deployment")
    for deployment in deployments.values():
        (spread,) = pod_spec(deployment)["topologySpreadConstraints"]
        assert spread["topologyKey"] == "kubernetes.io/hostname"
        assert (spread["maxSkew"], spread["whenUnsatisfiable"]) == (1, "ScheduleAnyway")
        # Only this pool's pods count: the Deployment's own selector.
        assert spread["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    hard = plan_for({"topologySpread": {"whenUnsatisfiable": "DoNotSchedule", "maxSkew": 2}})
    (spread,) = pod_spec(next(iter(of_kind(hard.objects, "Deployment").values())))["topologySpreadConstraints"]
    assert (spread["maxSkew"], spread["whenUnsatisfiable"]) == (2, "DoNotSchedule")
    off = plan_for({"topologySpread": {"enabled": False}})
    assert all("topologySpreadConstraints" not in pod_spec(d) for d in of_kind(off.objects, "Deployment").values())


def test_every_pool_gets_a_disruption_budget_over_exactly_its_pods() -> None:
    plan = plan_for({})
    budgets, deployments = of_kind(plan.objects, "PodDisruptionBudget"), of_kind(plan.objects, "Deployment")
    assert sorted(budgets) == sorted(deployments) == ["m-nvidia-gb300", "m-nvidia-h200-141gb-hbm3e"]
    for name, budget in budgets.items():
        assert budget["apiVersion"] == "policy/v1"
        assert budget["spec"]["maxUnavailable"] == 1 and "minAvailable" not in budget["spec"]
        assert budget["spec"]["selector"]["matchLabels"] == deployments[name]["spec"]["selector"]["matchLabels"]
        assert budget["metadata"]["ownerReferences"][0]["uid"] == "uid-m"
    minimum = of_kind(plan_for({"disruption": {"minAvailable": "50%"}}).objects, "PodDisruptionBudget")
    assert {b["spec"]["minAvailable"] for b in minimum.values()} == {"50%"}
    assert not of_kind(plan_for({"disruption": {"enabled": False}}).objects, "PodDisruptionBudget")


def test_the_service_comes_first_and_each_budget_before_its_deployment() -> None:
    kinds = [(o["kind"], o["metadata"]["name"]) for o in plan_for({}).objects]
    assert kinds[0] == ("Service", "m")
    for i, (kind, name) in enumerate(kinds):
        if kind == "Deployment":
            assert kinds[i - 1] == ("PodDisruptionBudget", name)


@pytest.mark.parametrize(
    ("disruption", "message"),
    [
        ({"maxUnavailable": 1, "minAvailable": 1}, "set at most one of disruption.maxUnavailable"),
        ({"maxUnavailable": "half"}, "must be a count or a percentage"),
        ({"minAvailable": -1}, "must be >= 0"),
    ],
)
def test_a_disruption_budget_with_contradicting_or_malformed_bounds_is_refused(disruption: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        api.MultimodalPreprocessorSpec.model_validate({"model": {"path": "/m"}, "disruption": disruption})


def test_the_crd_carries_the_new_fields_and_the_cel_twin_of_the_bounds_rule() -> None:
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props = schema["properties"]
    for field in ("runtimeClassName", "priorityClassName", "topologySpread", "disruption", "imagePlatforms"):
        assert field in props, field
    rules = [r["rule"] for r in props["disruption"]["x-kubernetes-validations"]]
    assert rules == ["!(has(self.maxUnavailable) && has(self.minAvailable))"]
    assert props["disruption"]["properties"]["maxUnavailable"].get("x-kubernetes-int-or-string") is True


# ------------------------------------------------------------------------------- arch pinning


def test_grace_pools_are_pinned_to_arm64_and_x86_pools_are_left_alone() -> None:
    deployments = of_kind(plan_for({}).objects, "Deployment")
    assert pod_spec(deployments["m-nvidia-gb300"])["nodeSelector"]["kubernetes.io/arch"] == "arm64"
    assert "kubernetes.io/arch" not in pod_spec(deployments["m-nvidia-h200-141gb-hbm3e"])["nodeSelector"]


def test_a_pool_whose_arch_the_image_lacks_gets_no_pods_and_status_says_why() -> None:
    plan = plan_for({"replicas": 3}, OperatorPolicy(imagePlatforms=["linux/amd64"]))
    assert plan.replicas == {"nvidia-gb300": 0, "nvidia-h200-141gb-hbm3e": 3}
    problem = plan.pool_problems["nvidia-gb300"]
    assert problem.reason == "ImagePlatformMissing" and "linux/arm64" in problem.message
    assert plan.problem is not None and plan.problem.reason == "ImagePlatformMissing"
    assert not plan.problem.blocks_ready  # the H200 pool still serves
    # Both platforms listed (the spec's word wins over the policy's): nothing blocked.
    both = plan_for({"imagePlatforms": ["linux/amd64", "linux/arm64/v8"]}, OperatorPolicy(imagePlatforms=["linux/amd64"]))
    assert both.pool_problems == {} and both.problem is None
    # A spec image that does not say what it is built for is not checked against the policy's default image.
    own = plan_for({"image": "registry.example/runtime:1"}, OperatorPolicy(imagePlatforms=["linux/amd64"]))
    assert own.pool_problems == {}


def test_an_image_for_no_pool_blocks_readiness() -> None:
    plan = plan_for({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB300"}}, OperatorPolicy(imagePlatforms=["linux/amd64"]))
    assert plan.replicas == {"nvidia-gb300": 0}
    assert plan.problem is not None and plan.problem.blocks_ready and "every pool" in plan.problem.message


# ----------------------------------------------------------------------------- pods say why


def pending_pod(pool: str, message: str, name: str = "p") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {identity.LABEL_RESOURCE: "m", identity.LABEL_POOL: pool, identity.LABEL_MANAGED_BY: identity.MANAGED_BY},
        },
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}],
        },
    }


def crashed_pod(pool: str, message: str, code: int = 3, container: str = "runtime") -> dict[str, Any]:
    return {
        "metadata": {
            "name": "c",
            "labels": {identity.LABEL_RESOURCE: "m", identity.LABEL_POOL: pool, identity.LABEL_MANAGED_BY: identity.MANAGED_BY},
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {
                    "name": container,
                    "ready": False,
                    "restartCount": 2,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": code, "reason": "Error", "message": message}},
                }
            ],
        },
    }


def test_the_scheduler_and_the_container_say_why_a_pool_has_no_ready_pods() -> None:
    said = "0/7 nodes are available: 2 Insufficient cpu, 5 node(s) didn't match Pod's node affinity/selector."
    pods = [
        pending_pod("cpu", said, "a"),
        pending_pod("cpu", said, "b"),
        crashed_pod("gpu", "device cuda: CUDA is not available"),
    ]
    problems = podstates.pool_problems(pods, {"cpu": "cpu", "gpu": "gpu"}, identity.LABEL_POOL)
    assert (problems["cpu"].reason, problems["cpu"].message, problems["cpu"].pods) == ("Unschedulable", said, 2)
    assert problems["gpu"].reason == "DeviceFailed"  # the runtime's exit code for a device it cannot use
    assert problems["gpu"].message == "container runtime exited with code 3: device cuda: CUDA is not available"
    for code, container, reason in [
        (1, "runtime", "LoadFailed"),
        (137, "runtime", "RuntimeFailed"),
        (3, "sidecar", "RuntimeFailed"),
    ]:
        (problem,) = podstates.pool_problems(
            [crashed_pod("gpu", "x", code, container)], {"gpu": "gpu"}, identity.LABEL_POOL
        ).values()
        assert problem.reason == reason, (code, container)
    running = {
        "metadata": {"labels": {identity.LABEL_POOL: "cpu"}},
        "status": {"phase": "Running", "containerStatuses": [{"ready": True}]},
    }
    assert podstates.pool_problems([running], {"cpu": "cpu"}, identity.LABEL_POOL) == {}


class Cluster:
    def __init__(self, policy: OperatorPolicy | None = None) -> None:
        self.api = FakeKubeApi()
        self.reconciler = Reconciler(kube=self.api, policy=policy or OperatorPolicy(), nodes=lambda: NODES, metrics=Metrics())

    async def settle(self, spec: dict[str, Any]) -> None:
        self.api.add_resource("m", spec)
        await self.reconciler.reconcile("ns", "m")
        (job,) = self.api.kinds("Job")
        self.api.finish_job(job, PROBE_OK)
        await self.reconciler.reconcile("ns", "m")

    def condition(self, type_: str) -> dict[str, Any]:
        return next(c for c in self.api.resources[("ns", "m")]["status"]["conditions"] if c["type"] == type_)

    def pools(self) -> dict[str, dict[str, Any]]:
        return {p["name"]: p for p in self.api.resources[("ns", "m")]["status"]["pools"]}


async def test_pending_pods_put_the_schedulers_words_into_ready_and_pools() -> None:
    cluster = Cluster()
    await cluster.settle({"model": {"path": "/models/m"}, "resources": GPU, "replicas": 3})
    said = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    pod = pending_pod("nvidia-gb300", said)
    pod["metadata"]["namespace"] = "ns"
    cluster.reconciler.children.observe("Pod", "ADDED", pod)
    # Another resource's pending pod in the same pool is not this resource's problem.
    other = pending_pod("nvidia-h200-141gb-hbm3e", "0/3 nodes are available", name="other-p")
    other["metadata"].update(namespace="ns", labels={**other["metadata"]["labels"], identity.LABEL_RESOURCE: "other"})
    cluster.reconciler.children.observe("Pod", "ADDED", other)
    lists = cluster.api.pod_lists
    await cluster.reconciler.reconcile("ns", "m")
    assert cluster.api.pod_lists == lists  # read from the watch, not listed
    ready = cluster.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Unschedulable")
    assert f"pool nvidia-gb300: Unschedulable: {said}" in ready["message"]
    assert cluster.pools()["nvidia-gb300"]["problem"] == {"reason": "Unschedulable", "message": said, "pods": 1}
    assert "problem" not in cluster.pools()["nvidia-h200-141gb-hbm3e"]
    warnings = [e for e in cluster.api.events if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["Unschedulable"] and said in warnings[0]["message"]
    # Scheduled at last: the watch's next event clears the problem on the next pass.
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    assert cluster.reconciler.children.observe("Pod", "MODIFIED", pod)
    await cluster.reconciler.reconcile("ns", "m")
    assert "problem" not in cluster.pools()["nvidia-gb300"]


async def test_a_service_name_conflict_creates_nothing_until_it_is_resolved() -> None:
    cluster = Cluster()
    cluster.api.add_foreign("Service", "m", {"spec": {"selector": {"app": "the-users-own"}}})
    await cluster.settle({"model": {"path": "/models/m"}, "resources": GPU, "replicas": 3})
    assert cluster.api.kinds("Deployment") == {} and cluster.api.kinds("PodDisruptionBudget") == {}
    degraded = cluster.condition("Degraded")
    assert (
        degraded["reason"] == "NameConflict" and "nothing of this resource is applied until it is resolved" in degraded["message"]
    )
    assert cluster.condition("Ready")["reason"] == "NameConflict"

    del cluster.api.objects[("Service", "ns", "m")]
    cluster.api.foreign_fields.clear()
    assert (await cluster.reconciler.reconcile("ns", "m")).kind == "done"
    assert (
        sorted(cluster.api.kinds("Deployment"))
        == sorted(cluster.api.kinds("PodDisruptionBudget"))
        == [
            "m-nvidia-gb300",
            "m-nvidia-h200-141gb-hbm3e",
        ]
    )
    assert cluster.condition("Degraded")["reason"] == "AsExpected"


async def test_a_pools_budget_goes_with_its_pool_and_with_disruption_off() -> None:
    cluster = Cluster()
    await cluster.settle({"model": {"path": "/models/m"}, "resources": GPU, "replicas": 3})
    assert len(cluster.api.kinds("PodDisruptionBudget")) == 2
    cluster.api.edit_spec(
        "m", {"model": {"path": "/models/m"}, "resources": GPU, "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB300"}}
    )
    await cluster.reconciler.reconcile("ns", "m")
    assert sorted(cluster.api.kinds("PodDisruptionBudget")) == ["m-nvidia-gb300"]
    assert "PodDisruptionBudget/m-nvidia-h200-141gb-hbm3e" in cluster.api.deleted
    cluster.api.edit_spec(
        "m",
        {
            "model": {"path": "/models/m"},
            "resources": GPU,
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB300"},
            "disruption": {"enabled": False},
        },
    )
    await cluster.reconciler.reconcile("ns", "m")
    assert cluster.api.kinds("PodDisruptionBudget") == {}


async def test_a_pool_the_image_cannot_run_on_is_degraded_while_the_others_serve() -> None:
    cluster = Cluster(OperatorPolicy(imagePlatforms=["linux/amd64"]))
    await cluster.settle({"model": {"path": "/models/m"}, "resources": GPU, "replicas": 2})
    assert cluster.api.kinds("Deployment")["m-nvidia-gb300"]["spec"]["replicas"] == 0
    cluster.api.set_ready("m-nvidia-h200-141gb-hbm3e", 2)
    await cluster.reconciler.reconcile("ns", "m")
    assert cluster.condition("Degraded")["reason"] == "ImagePlatformMissing"
    assert (cluster.condition("Ready")["status"], cluster.condition("Ready")["reason"]) == ("True", "AllReplicasReady")
    assert cluster.pools()["nvidia-gb300"]["problem"]["reason"] == "ImagePlatformMissing"
    assert cluster.pools()["nvidia-gb300"]["arch"] == "arm64"


def test_a_pools_arch_comes_from_its_nodes_labels_when_the_gpu_does_not_fix_it() -> None:
    amd = {"kubernetes.io/arch": "amd64"}
    nodes = [
        make_node("h200-a", {**H200, **amd}, gpus=8),
        make_node("h200-b", {**H200, **amd}, gpus=8),
        make_node("gb300-a", GB300, gpus=4),
    ]
    parsed = api.MultimodalPreprocessorSpec.model_validate({"model": {"path": "/m"}, "resources": GPU, "replicas": 2})
    probe = api.ProbeResult(cloneable=True, fast_image_processor=True)
    arm_only = make_plan(OWNER, parsed, nodes, probe, OperatorPolicy(imagePlatforms=["linux/arm64"]))
    # An arm64-only image: the labelled x86 pool is the one blocked, the Grace pool (no arch label) serves.
    assert arm_only.replicas == {"nvidia-gb300": 2, "nvidia-h200-141gb-hbm3e": 0}
    assert "linux/amd64" in arm_only.pool_problems["nvidia-h200-141gb-hbm3e"].message
    # x86 pools are never pinned, even when their arch is known.
    h200 = of_kind(arm_only.objects, "Deployment")["m-nvidia-h200-141gb-hbm3e"]
    assert "kubernetes.io/arch" not in pod_spec(h200)["nodeSelector"]
    mixed = [make_node("h200-a", {**H200, **amd}, gpus=8), make_node("h200-b", H200, gpus=8)]
    unknown = make_plan(OWNER, parsed, mixed, probe, OperatorPolicy(imagePlatforms=["linux/arm64"]))
    assert unknown.pool_problems == {}  # nodes that disagree (or do not say): not checked


def test_the_watch_keeps_what_status_reads_of_each_runtime_pod_until_it_is_deleted() -> None:
    store = ChildStore()
    said = "0/2 nodes are available: 2 Insufficient cpu."
    pod = pending_pod("cpu", said)
    pod["metadata"].update(namespace="ns", uid="u-1", ownerReferences=[{"kind": "ReplicaSet"}])
    pod["spec"] = {"containers": [{"name": "runtime", "image": "mmprep-runtime:0.1.0"}]}
    store.observe("Pod", "ADDED", pod)
    (seen,) = store.pods("ns", {identity.LABEL_RESOURCE: "m"})
    assert "spec" not in seen and "uid" not in seen["metadata"]  # only what podstates reads is kept
    assert (
        podstates.pod_problem(seen)
        == podstates.pod_problem(pod)
        == ("Unschedulable", "0/2 nodes are available: 2 Insufficient cpu.")
    )
    assert store.pods("other", {identity.LABEL_RESOURCE: "m"}) == [] and store.pods("ns", {identity.LABEL_RESOURCE: "x"}) == []
    store.observe("Pod", "DELETED", pod)
    assert store.pods("ns", {identity.LABEL_RESOURCE: "m"}) == []
