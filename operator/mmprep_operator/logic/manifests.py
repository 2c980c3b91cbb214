"""The manifests of the objects a resource serves with: the Service, and per pool a
PodDisruptionBudget and a runtime Deployment (and its autoscaler, ``autoscaling.manifest``).

Pure functions of (resource identity, spec, decisions, replica counts, policy): no I/O, so the
``render`` CLI, the golden tests and the reconciler produce the same objects byte for byte.

Neighbours: ``identity`` (owner, labels, names), ``pod_parts`` (the pod pieces shared with the
probe and calibration Jobs), ``plan`` (which calls ``children``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final

from mmprep_operator import api
from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.logic import autoscaling
from mmprep_operator.logic.decide import PoolDecision
from mmprep_operator.logic.identity import (
    ANNOTATION_DECISION,
    Owner,
    deployment_name,
    disruption_budget_name,
    pool_labels,
    pool_selector,
    resource_labels,
    selector_labels,
    service_name,
)
from mmprep_operator.logic.pod_parts import (
    CONTAINER_NAME,
    TERMINATION_LOG,
    container_security_context,
    env_from,
    image_of,
    model_args,
    model_env,
    model_volumes,
    pod_identity,
    pod_metadata,
    pull_policy_of,
    vllm_args_flag,
)
from mmprep_operator.logic.pools import ARCH_LABEL, ARM64, Pool, pool_arch
from mmprep_runtime.contract import ENV_RENDER_PROCESSES, PoolDecisionEnv

RUNTIME_PORT: Final = 8080
#: vLLM's render server listens on 8000 by default: a drop-in keeps the port its clients use.
VLLM_RENDER_PORT: Final = 8000
PORT_NAME: Final = "http"


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
    env = carried.to_env()
    if d.render_processes is not None and spec.serving.render_processes is None:
        # The measured count. An explicit one is already a flag (runtime_flags), which wins over env.
        env.append({"name": ENV_RENDER_PROCESSES, "value": str(d.render_processes)})
    return env


@dataclasses.dataclass(frozen=True)
class Serving:
    """Port and probe paths of what a runtime pod serves (``spec.api``)."""

    port: int
    ready_path: str
    extra_args: tuple[str, ...] = ()


def serving_of(spec: api.MultimodalPreprocessorSpec | None) -> Serving:
    if spec is None:
        return Serving(RUNTIME_PORT, "/readyz")
    limits = tuple(runtime_flags(spec.serving))
    if spec.api == "mmprep":
        return Serving(RUNTIME_PORT, "/readyz", limits)
    # vLLM's own readiness path, so probes and load balancers configured for vLLM keep working.
    return Serving(VLLM_RENDER_PORT, "/health", (*(("--normalized-pixels",) if spec.normalized_pixels else ()), *limits))


def runtime_flags(serving: api.ServingSpec) -> list[str]:
    """``spec.serving`` as ``mmprep-runtime serve`` flags: only the fields set, so that an unset one
    keeps the runtime's default (one definition of it: the runtime's settings)."""
    flags = {
        "--served-model-name": serving.served_model_name,
        "--max-model-len": serving.max_model_len,
        "--deadline": None if serving.request_deadline_seconds is None else f"{serving.request_deadline_seconds:g}",
        "--queue-size": serving.queue_size,
        "--max-images": serving.max_images_per_request,
        "--max-body-bytes": serving.max_body_bytes,
        "--fetch-allowed-networks": None if serving.fetch_allowed_networks is None else ",".join(serving.fetch_allowed_networks),
        "--render-path": serving.render_path,
        "--render-processes": serving.render_processes,
    }
    out: list[str] = []
    for flag, value in flags.items():
        if value is not None:
            out += [flag, str(value)]
    if serving.vllm_args is not None:
        out.append(vllm_args_flag(serving.vllm_args))
    return out


def engine_flags(owner: Owner, spec: api.MultimodalPreprocessorSpec) -> list[str]:
    """``--engine URL`` for a resource with ``spec.engine`` (its OpenAI front's engine), else nothing."""
    if spec.engine is None:
        return []
    return ["--engine", spec.engine.base_url(owner.namespace)]


def deployment(
    owner: Owner, spec: api.MultimodalPreprocessorSpec, d: PoolDecision, replicas: int | None, policy: OperatorPolicy
) -> dict[str, Any]:
    """The pool's Deployment; ``replicas`` None leaves them out: an autoscaler owns them."""
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
            *engine_flags(owner, spec),
            "--termination-log",
            TERMINATION_LOG,
        ],
        # The operator's env after the user's: it must win over anything set under the same name.
        "env": [*model_env(spec), *spec.drain.runtime_env().to_env(), *decision_env(spec, d)],
        "ports": [{"name": PORT_NAME, "containerPort": serving.port, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": serving.ready_path, "port": PORT_NAME}, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": PORT_NAME}, "periodSeconds": 10, "failureThreshold": 3},
        # Loading a processor can take minutes (a cold cache): allow 10 minutes before liveness counts.
        "startupProbe": {"httpGet": {"path": "/healthz", "port": PORT_NAME}, "periodSeconds": 5, "failureThreshold": 120},
        "resources": spec.resources.wire(),
        "volumeMounts": mounts,
        "securityContext": container_security_context(spec),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if envs_from := env_from(spec):
        container["envFrom"] = envs_from
    if pre_stop := spec.drain.runtime_env().pre_stop():
        container["lifecycle"] = {"preStop": pre_stop}
    if (pull := pull_policy_of(spec, policy)) is not None:
        container["imagePullPolicy"] = pull
    pod_spec: dict[str, Any] = {
        # The hook's window, then the runtime's stop, all within this (``api.drain``; the hook and
        # why it signals rather than sleeps: ``contract.DrainEnv.pre_stop``).
        "terminationGracePeriodSeconds": spec.drain.grace_period_seconds,
        **pod_identity(spec),
        "containers": [container],
        "volumes": volumes,
        **_placement(spec, d.pool),
    }
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
            # Absent for an autoscaled pool: a field in an apply is a field owned, and the
            # operator must never own what the autoscaler writes (see control.applier).
            **({"replicas": replicas} if replicas is not None else {}),
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": selector},
            "template": {"metadata": pod_metadata(spec, labels), "spec": pod_spec},
        },
    }


def service(owner: Owner, spec: api.MultimodalPreprocessorSpec | None = None) -> dict[str, Any]:
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


def disruption_budget(owner: Owner, spec: api.MultimodalPreprocessorSpec, d: PoolDecision) -> dict[str, Any]:
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


def children(
    owner: Owner,
    spec: api.MultimodalPreprocessorSpec,
    decisions: Sequence[PoolDecision],
    replicas: Mapping[str, int],
    policy: OperatorPolicy,
    scaling: Mapping[str, autoscaling.PoolScaling] | None = None,
) -> list[dict[str, Any]]:
    """Every object the resource needs, in apply order: the Service first (a name taken by someone
    else's Service stops the apply before anything is created), then per pool (by name) its
    PodDisruptionBudget, its Deployment (the budget covers the pods from their start) and, for an
    autoscaled pool, its HPA or ScaledObject (after the Deployment it targets)."""
    scaling = scaling or {}
    out = [service(owner, spec)]
    for d in decisions:
        if spec.disruption.enabled:
            out.append(disruption_budget(owner, spec, d))
        pool_scaling = scaling.get(d.pool.name)
        fixed = replicas.get(d.pool.name, 0) if pool_scaling is None else None
        out.append(deployment(owner, spec, d, fixed, policy))
        scaler = autoscaling.manifest(owner, spec.autoscaling, pool_scaling) if pool_scaling and spec.autoscaling else None
        if scaler is not None:
            out.append(scaler)
    return out
