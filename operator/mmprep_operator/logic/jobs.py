"""The Jobs that answer through a termination message: building them, and reading a finished one.

The probe and calibration Jobs both run one runtime container with the resource's model, volumes
and security context, and answer through its termination message (the kubelet keeps up to 4 KiB
of it in the pod's status), so building and reading them is the same. Pure: the callers fetch
the Job and its pods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from mmprep_operator import api
from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.logic import identity, pod_parts

#: The Job controller's reason when a Job ran past its activeDeadlineSeconds.
DEADLINE_EXCEEDED: Final = "DeadlineExceeded"
_MESSAGE_TAIL: Final = 600


def answering_job_manifest(
    owner: identity.Owner,
    spec: api.MultimodalPreprocessorSpec,
    policy: OperatorPolicy,
    *,
    name: str,
    component: str,
    labels: Mapping[str, str],
    container_name: str,
    command: list[str],
    resources: Mapping[str, Any],
    placement: Mapping[str, Any],
    backoff_limit: int,
    deadline_seconds: int,
    ttl_seconds: int,
) -> dict[str, Any]:
    """A one-container Job in the runtime image that answers in its termination message.

    Owned (not controlled) by ``owner``: resources that share the Job add themselves as owners.
    ``labels`` are added to the runtime's name, ``component`` and the manager's label.
    """
    labels = {
        identity.LABEL_NAME: "mmprep-runtime",
        identity.LABEL_COMPONENT: component,
        identity.LABEL_MANAGED_BY: identity.MANAGED_BY,
        **labels,
    }
    volumes, mounts = pod_parts.model_volumes(spec)
    container: dict[str, Any] = {
        "name": container_name,
        "image": pod_parts.image_of(spec, policy),
        "command": command,
        "env": pod_parts.model_env(spec),
        "resources": resources,
        "volumeMounts": mounts,
        "securityContext": pod_parts.container_security_context(spec),
        "terminationMessagePath": pod_parts.TERMINATION_LOG,
        # When the run dies before writing its JSON, the log tail is the best explanation there is.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if env_from := pod_parts.env_from(spec):
        container["envFrom"] = env_from
    if (pull := pod_parts.pull_policy_of(spec, policy)) is not None:
        container["imagePullPolicy"] = pull
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        **pod_parts.pod_identity(spec),
        "containers": [container],
        "volumes": volumes,
        **placement,
    }
    meta: dict[str, Any] = {"name": name, "namespace": owner.namespace, "labels": dict(labels)}
    if owner.uid:
        meta["ownerReferences"] = [owner.reference(controller=False)]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": backoff_limit,
            "activeDeadlineSeconds": deadline_seconds,
            "ttlSecondsAfterFinished": ttl_seconds,
            "template": {"metadata": pod_parts.pod_metadata(spec, labels), "spec": pod_spec},
        },
    }


def condition(job: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    conditions: Sequence[Mapping[str, Any]] = (job.get("status") or {}).get("conditions") or ()
    for c in conditions:
        if c.get("type") == type_ and c.get("status") == "True":
            return c
    return None


def succeeded(job: Mapping[str, Any]) -> bool:
    # SuccessCriteriaMet/FailureTarget come first on Kubernetes >= 1.31; Complete/Failed follow.
    return condition(job, "Complete") is not None or condition(job, "SuccessCriteriaMet") is not None


def failed(job: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return condition(job, "Failed") or condition(job, "FailureTarget")


def finished(job: Mapping[str, Any]) -> bool:
    return succeeded(job) or failed(job) is not None


def terminated_messages(pods: Sequence[Mapping[str, Any]], phase: str) -> list[str]:
    """Termination messages of the pods in ``phase``, newest pod first."""
    chosen = [p for p in pods if (p.get("status") or {}).get("phase") == phase]
    chosen.sort(key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "", reverse=True)
    out = []
    for pod in chosen:
        for cs in (pod.get("status") or {}).get("containerStatuses") or ():
            terminated = (cs.get("state") or {}).get("terminated") or {}
            if terminated.get("message"):
                out.append(str(terminated["message"]))
    return out


def tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _MESSAGE_TAIL else "..." + text[-_MESSAGE_TAIL:]
