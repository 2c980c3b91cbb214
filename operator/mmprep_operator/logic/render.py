"""Render the objects a resource needs: the Service, and per pool a PodDisruptionBudget and a
runtime Deployment.

Pure functions of (resource identity, spec, decisions, replica counts, policy): no I/O, so the
``render`` CLI, the golden tests and the reconciler produce the same objects byte for byte. The
pod pieces shared with the probe Job (security context, model volumes, cache env) live here too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final

from mmprep_operator import api
from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.logic import naming
from mmprep_operator.logic.decide import PoolDecision
from mmprep_operator.logic.pools import ARCH_LABEL, ARM64, Pool, pool_arch
from mmprep_runtime.contract import PoolDecisionEnv

MANAGED_BY: Final = "mmprep-operator"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_RESOURCE: Final = "mmprep.dev/resource"
LABEL_POOL: Final = "mmprep.dev/pool"
COMPONENT_RUNTIME: Final = "preprocessor"
ANNOTATION_DECISION: Final = "mmprep.dev/decision"

RUNTIME_PORT: Final = 8080
TERMINATION_LOG: Final = "/dev/termination-log"  # Kubernetes' default terminationMessagePath
#: vLLM's render server listens on 8000 by default: a drop-in keeps the port its clients use.
VLLM_RENDER_PORT: Final = 8000
PORT_NAME: Final = "http"
CONTAINER_NAME: Final = "runtime"
CACHE_MOUNT: Final = "/var/cache/mmprep/huggingface"
TMP_VOLUME: Final = "mmprep-tmp"
# A fixed non-root uid: runAsNonRoot cannot verify a named USER, and the runtime image's user is 65532.
RUN_AS: Final = 65532


@dataclasses.dataclass(frozen=True)
class Owner:
    """The resource that owns the rendered objects."""

    name: str
    namespace: str
    uid: str | None = None

    def reference(self, *, controller: bool = True) -> dict[str, Any]:
        return {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": controller,
            "blockOwnerDeletion": True,
        }

    def metadata(self, name: str, labels: Mapping[str, str], annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": self.namespace, "labels": dict(labels)}
        if annotations:
            meta["annotations"] = dict(annotations)
        if self.uid:
            # Without a uid (a render preview of a resource not yet created) there is nothing to own by.
            meta["ownerReferences"] = [self.reference()]
        return meta


def resource_labels(owner: Owner) -> dict[str, str]:
    return {
        LABEL_NAME: "mmprep-runtime",
        LABEL_INSTANCE: naming.label_value(owner.name),
        LABEL_COMPONENT: COMPONENT_RUNTIME,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_RESOURCE: naming.label_value(owner.name),
    }


def selector_labels(owner: Owner) -> dict[str, str]:
    """Labels every runtime pod of the resource carries (Service selector, scale selector)."""
    return {LABEL_RESOURCE: naming.label_value(owner.name), LABEL_MANAGED_BY: MANAGED_BY}


def label_selector(labels: Mapping[str, str]) -> str:
    """Labels as the API's ``labelSelector`` query: every one must match."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def selector_string(owner: Owner) -> str:
    return label_selector(selector_labels(owner))


def pool_labels(owner: Owner, pool: str) -> dict[str, str]:
    return {**resource_labels(owner), LABEL_POOL: naming.label_value(pool)}


def deployment_name(owner: Owner, pool: str) -> str:
    return naming.dns_label(owner.name, pool)


def service_name(owner: Owner) -> str:
    return naming.dns_label(owner.name)


def image_of(spec: api.MultimodalPreprocessorSpec, policy: OperatorPolicy) -> str:
    return spec.image or policy.default_image


def pull_policy_of(spec: api.MultimodalPreprocessorSpec, policy: OperatorPolicy) -> str | None:
    return spec.image_pull_policy or policy.image_pull_policy


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    # restricted Pod Security Standard, plus a read-only root: caches go to mounted volumes.
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def model_args(spec: api.MultimodalPreprocessorSpec) -> list[str]:
    """``--model ...`` and the flags that change what loads; shared by serve and probe (and so
    part of the probe hash). The device is not among them: it is the decision, passed as env."""
    model = spec.model
    args = ["--model", model.path if model.path is not None else str(model.id)]
    if model.revision:
        args += ["--revision", model.revision]
    if model.trust_remote_code:
        args.append("--trust-remote-code")
    if spec.backend.value != "auto":
        # The backend changes which image processor loads, so the probe must see it too.
        args += ["--backend", spec.backend.value]
    return args


def model_env(spec: api.MultimodalPreprocessorSpec) -> list[dict[str, Any]]:
    """User env first, then the cache location: later entries win in Kubernetes."""
    env = [e.wire() for e in spec.env]
    if spec.model.cache_volume:
        env.append({"name": "HF_HOME", "value": CACHE_MOUNT})
    return env


def model_volumes(spec: api.MultimodalPreprocessorSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container mounts): the user's, the cache mount, and a writable /tmp."""
    volumes = [v.wire() for v in spec.volumes] + [{"name": TMP_VOLUME, "emptyDir": {}}]
    mounts = [m.wire() for m in spec.volume_mounts] + [{"name": TMP_VOLUME, "mountPath": "/tmp"}]
    if spec.model.cache_volume:
        mounts.append({"name": spec.model.cache_volume, "mountPath": CACHE_MOUNT})
    return volumes, mounts


def pool_selector(owner: Owner, pool: str) -> dict[str, str]:
    """The labels that select exactly one pool's pods (Deployment, PodDisruptionBudget, spread)."""
    labels = pool_labels(owner, pool)
    return {LABEL_RESOURCE: labels[LABEL_RESOURCE], LABEL_POOL: labels[LABEL_POOL]}


def _placement(spec: api.MultimodalPreprocessorSpec, pool: Pool) -> dict[str, Any]:
    """nodeSelector and affinity pinning the pods to the pool's nodes, on top of the user's."""
    node_selector = {**spec.node_selector, **pool.node_selector}
    if pool_arch(pool) == ARM64:
        # The product label already picks the nodes; the arch pin keeps a pod of an image built
        # for another architecture from ever starting there should the labels drift. x86 is
        # every cluster's default and stays unpinned.
        node_selector[ARCH_LABEL] = ARM64
    out: dict[str, Any] = {"nodeSelector": node_selector}
    affinity = dict(spec.affinity or {})
    if pool.match_expressions:
        node_affinity = dict(affinity.get("nodeAffinity") or {})
        required = dict(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
        terms = list(required.get("nodeSelectorTerms") or ()) or [{}]
        # Terms are ORed, expressions within a term ANDed: add the pool's constraints to every term.
        required["nodeSelectorTerms"] = [
            {**term, "matchExpressions": [*(term.get("matchExpressions") or ()), *pool.match_expressions]} for term in terms
        ]
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
        affinity["nodeAffinity"] = node_affinity
    if affinity:
        out["affinity"] = affinity
    if spec.tolerations:
        out["tolerations"] = list(spec.tolerations)
    return out


def decision_env(spec: api.MultimodalPreprocessorSpec, d: PoolDecision) -> list[dict[str, Any]]:
    w = d.decision
    carried = PoolDecisionEnv(d.pool.name, w.path, w.processor_workers, w.io_workers, w.reason)
    return carried.to_env()


@dataclasses.dataclass(frozen=True)
class Serving:
    """Port and probe paths of what a runtime pod serves (``spec.api``)."""

    port: int
    ready_path: str
    extra_args: tuple[str, ...] = ()


def serving_of(spec: api.MultimodalPreprocessorSpec | None) -> Serving:
    if spec is None or spec.api == "mmprep":
        return Serving(RUNTIME_PORT, "/readyz")
    # vLLM's own readiness path, so probes and load balancers configured for vLLM keep working.
    return Serving(VLLM_RENDER_PORT, "/health", ("--normalized-pixels",) if spec.normalized_pixels else ())


def render_deployment(
    owner: Owner, spec: api.MultimodalPreprocessorSpec, d: PoolDecision, replicas: int, policy: OperatorPolicy
) -> dict[str, Any]:
    labels = pool_labels(owner, d.pool.name)
    volumes, mounts = model_volumes(spec)
    serving = serving_of(spec)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image_of(spec, policy),
        # A failed start (no processor, no CUDA device) leaves its reason in the termination
        # message, which the operator reports per pool.
        "command": [
            "mmprep-runtime",
            "serve",
            *model_args(spec),
            "--port",
            str(serving.port),
            *serving.extra_args,
            "--termination-log",
            TERMINATION_LOG,
        ],
        # Decision env last: it must win over anything the user set under the same name.
        "env": [*model_env(spec), *decision_env(spec, d)],
        "ports": [{"name": PORT_NAME, "containerPort": serving.port, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": serving.ready_path, "port": PORT_NAME}, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": PORT_NAME}, "periodSeconds": 10, "failureThreshold": 3},
        # Loading a processor can take minutes (a cold cache): allow 10 minutes before liveness counts.
        "startupProbe": {"httpGet": {"path": "/healthz", "port": PORT_NAME}, "periodSeconds": 5, "failureThreshold": 120},
        "resources": spec.resources.wire(),
        "volumeMounts": mounts,
        "securityContext": container_security_context(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if (pull := pull_policy_of(spec, policy)) is not None:
        container["imagePullPolicy"] = pull
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": volumes,
        **_placement(spec, d.pool),
    }
    if spec.service_account_name:
        pod_spec["serviceAccountName"] = spec.service_account_name
    if spec.runtime_class_name:
        pod_spec["runtimeClassName"] = spec.runtime_class_name
    if spec.priority_class_name:
        pod_spec["priorityClassName"] = spec.priority_class_name
    selector = pool_selector(owner, d.pool.name)
    if spec.topology_spread.enabled:
        spread = spec.topology_spread
        # Across the pool's nodes only: the pool's own pods are counted, and only nodes the pod
        # could land on are domains (nodeAffinityPolicy Honor, the default, says so).
        pod_spec["topologySpreadConstraints"] = [
            {
                "maxSkew": spread.max_skew,
                "topologyKey": spread.topology_key,
                "whenUnsatisfiable": spread.when_unsatisfiable,
                "labelSelector": {"matchLabels": dict(selector)},
            }
        ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": owner.metadata(deployment_name(owner, d.pool.name), labels, {ANNOTATION_DECISION: d.decision.reason.value}),
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def render_service(owner: Owner, spec: api.MultimodalPreprocessorSpec | None = None) -> dict[str, Any]:
    port = serving_of(spec).port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owner.metadata(service_name(owner), resource_labels(owner)),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner),
            "ports": [{"name": PORT_NAME, "port": port, "targetPort": PORT_NAME, "protocol": "TCP"}],
        },
    }


def disruption_budget_name(owner: Owner, pool: str) -> str:
    return deployment_name(owner, pool)


def render_disruption_budget(owner: Owner, spec: api.MultimodalPreprocessorSpec, d: PoolDecision) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": owner.metadata(disruption_budget_name(owner, d.pool.name), pool_labels(owner, d.pool.name)),
        "spec": {
            **spec.disruption.budget(),
            "selector": {"matchLabels": pool_selector(owner, d.pool.name)},
            # A pod that never became ready (no GPU left, a crash loop) may always be evicted: it
            # serves nothing, and keeping it would block a drain for no one's benefit.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def render_children(
    owner: Owner,
    spec: api.MultimodalPreprocessorSpec,
    decisions: Sequence[PoolDecision],
    replicas: Mapping[str, int],
    policy: OperatorPolicy,
) -> list[dict[str, Any]]:
    """Every object the resource needs, in apply order: the Service first (a name taken by someone
    else's Service stops the apply before anything is created), then per pool (by name) its
    PodDisruptionBudget and its Deployment (the budget covers the pods from their start)."""
    out = [render_service(owner, spec)]
    for d in decisions:
        if spec.disruption.enabled:
            out.append(render_disruption_budget(owner, spec, d))
        out.append(render_deployment(owner, spec, d, replicas.get(d.pool.name, 0), policy))
    return out
