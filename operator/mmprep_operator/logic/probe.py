"""The cloneability probe: which fields it depends on, its Job, and reading its answer.

The probe loads the processor once in the runtime image and reports (as JSON in the container's
termination message) whether it can be deep-copied and which path it takes. Its answer depends
only on what loads: image, model source, revision, trustRemoteCode, volumes, mounts, env and envFrom. The
hash of exactly those fields names the Job, so resources in a namespace that serve the same model
share one probe, and changing replicas, workers or placement never re-probes. The annotation
``mmprep.dev/reprobe`` (any value) joins the hash, so a user can ask for a fresh probe after
fixing something the spec cannot see (e.g. files put into a volume).

Pure: the reconciler does the I/O.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from mmprep_operator import api
from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.logic import identity, jobs, naming, pod_parts, podstates
from mmprep_operator.logic.conditions import Reason
from mmprep_runtime.contract import ContractError, json_object

LABEL_COMPONENT_PROBE: Final = "probe"
LABEL_PROBE_HASH: Final = "mmprep.dev/probe-hash"
ANNOTATION_REPROBE: Final = "mmprep.dev/reprobe"
PROBE_CONTAINER: Final = "probe"


def probe_inputs(spec: api.MultimodalPreprocessorSpec, policy: OperatorPolicy, reprobe: str | None = None) -> dict[str, Any]:
    volumes, mounts = pod_parts.model_volumes(spec)
    inputs: dict[str, Any] = {
        "image": pod_parts.image_of(spec, policy),
        "args": pod_parts.model_args(spec),
        "env": pod_parts.model_env(spec),
        "volumes": volumes,
        "mounts": mounts,
        "reprobe": reprobe,
    }
    if spec.env_from:
        # Only when set: the hashes of resources without it stay what they were (no re-probe).
        inputs["envFrom"] = pod_parts.env_from(spec)
    return inputs


def probe_hash(spec: api.MultimodalPreprocessorSpec, policy: OperatorPolicy, reprobe: str | None = None) -> str:
    canonical = json.dumps(probe_inputs(spec, policy, reprobe), sort_keys=True, separators=(",", ":"))
    return naming.short_hash(canonical, 16)


def job_name(hash_: str) -> str:
    return f"mmprep-probe-{hash_}"


def job_manifest(
    owner: identity.Owner, spec: api.MultimodalPreprocessorSpec, policy: OperatorPolicy, hash_: str
) -> dict[str, Any]:
    """The probe Job. Owned (not controlled) by the first resource; others add themselves as owners."""
    return jobs.answering_job_manifest(
        owner,
        spec,
        policy,
        name=job_name(hash_),
        component=LABEL_COMPONENT_PROBE,
        labels={LABEL_PROBE_HASH: hash_},
        container_name=PROBE_CONTAINER,
        command=["mmprep-runtime", "probe", *pod_parts.model_args(spec), "--termination-log", pod_parts.TERMINATION_LOG],
        resources=policy.probe.resources,
        placement=placement(spec),
        backoff_limit=policy.probe.backoff_limit,
        deadline_seconds=spec.probe.timeout_seconds or policy.probe.timeout_seconds,
        ttl_seconds=policy.probe.ttl_seconds_after_finished,
    )


def placement(spec: api.MultimodalPreprocessorSpec) -> dict[str, Any]:
    """spec.probe's nodeSelector/tolerations when given, else the runtime's placement.

    The spec's affinity follows only when the probe's nodeSelector is not overridden: an override
    says "run it there", which the runtime's affinity might forbid.
    """
    out: dict[str, Any] = {}
    selector = spec.probe.node_selector if spec.probe.node_selector is not None else spec.node_selector
    if selector:
        out["nodeSelector"] = dict(selector)
    tolerations = spec.probe.tolerations if spec.probe.tolerations is not None else spec.tolerations
    if tolerations:
        out["tolerations"] = list(tolerations)
    if spec.probe.node_selector is None and spec.affinity:
        out["affinity"] = dict(spec.affinity)
    return out


@dataclasses.dataclass(frozen=True)
class ProbeOutcome:
    state: api.ProbeState
    result: api.ProbeResult | None = None
    #: Failed: ProbeFailed, ProbeTimedOut, ProbeOutputUnreadable; Pending or Running: why its pod
    #: cannot start (SecretNotFound, Unschedulable, ...), when it cannot.
    reason: str | None = None
    message: str | None = None


def parse_result(message: str) -> api.ProbeResult:
    """The probe's answer from its termination message. Raises ``ContractError``."""
    return api.ProbeResult.from_message(message)


def _failure_detail(messages: Sequence[str]) -> str:
    """Prefer the probe's own JSON error; fall back to the (log) message."""
    for message in messages:
        try:
            data = json_object(message, "probe output")
        except ContractError:
            continue
        if data.get("error"):
            return jobs.tail(str(data["error"]))
    return jobs.tail(messages[0]) if messages else "no termination message"


def read_outcome(job: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]) -> ProbeOutcome:
    """Where the probe Job stands, from the Job and its pods (pure)."""
    if job is None:
        return ProbeOutcome("Pending")
    failed = jobs.failed(job)
    if jobs.succeeded(job):
        messages = jobs.terminated_messages(pods, "Succeeded")
        if not messages:
            return ProbeOutcome(
                "Failed", reason=Reason.PROBE_OUTPUT_UNREADABLE, message="the probe pod left no termination message"
            )
        try:
            return ProbeOutcome("Succeeded", result=parse_result(messages[0]))
        except ContractError as e:
            return ProbeOutcome("Failed", reason=Reason.PROBE_OUTPUT_UNREADABLE, message=f"{e}: {jobs.tail(messages[0])}")
    if failed is not None:
        detail = _failure_detail(jobs.terminated_messages(pods, "Failed"))
        if failed.get("reason") == jobs.DEADLINE_EXCEEDED:
            deadline = (job.get("spec") or {}).get("activeDeadlineSeconds")
            return ProbeOutcome(
                "Failed", reason=Reason.PROBE_TIMED_OUT, message=f"the probe did not finish within {deadline}s ({detail})"
            )
        return ProbeOutcome("Failed", reason=Reason.PROBE_FAILED, message=f"the model did not load: {detail}")
    active = (job.get("status") or {}).get("active") or 0
    state: api.ProbeState = "Running" if active else "Pending"
    # A probe pod that names a missing Secret, ConfigMap or claim says so: the probe then waits
    # with that reason instead of a silent Pending until its deadline. (Other waits, an image
    # being pulled or a node being found, resolve on their own and stay plain Pending.)
    problems = (podstates.pod_problem(pod, PROBE_CONTAINER) for pod in pods)
    stuck = next((p for p in problems if p is not None and p[0] in podstates.MISSING_OBJECT_REASONS), None)
    if stuck is not None:
        return ProbeOutcome(state, reason=stuck[0], message=f"the probe pod cannot start: {stuck[1]}")
    return ProbeOutcome(state)
