"""Calibration Jobs: measure a pool's worker count on one of its own nodes.

The decision's path rules are defaults learned on other machines (a second worker gained 36% on
one GPU's CPU path and halved throughput on another's GPU path). A calibration Job runs
``mmprep-runtime calibrate`` on one node of a pool, with the runtime pods' image, model, backend,
device, resources and placement, and reports a measured curve and the count it chose through its
termination message (the format is ``mmprep_runtime.calibration_report.Report``, shared with the
runtime). The count enters the decision as ``Measured``: below cloneability, explicit counts and
overrides, above the path rules.

A measurement depends on the GPU product, the image, the model (and revision), backend, device,
the pods' resources and the policy's measuring settings; their hash names the Job, so pools
that share all of them (within a namespace) share one run, and any change measures again. The
annotation ``mmprep.dev/recalibrate`` (any value) joins the hash, to measure again on request.

Serving never waits for a calibration: pools start with the rule's count, and the pods roll only
when the measured count differs. A failed, timed-out or impossible calibration leaves the rule's
count in place with a reason in the pool's status.

For the vLLM render API's general path (vLLM's own processing), the Job measures vLLM render
processes instead of worker threads (``measures``): the chosen count reaches the pods as
``MMPREP_RENDER_PROCESSES`` and the pool's status as ``renderProcesses``.

Pure: the reconciler does the I/O.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from mmprep_operator import api
from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.logic import identity, jobs, naming, pod_parts
from mmprep_operator.logic.conditions import Reason
from mmprep_operator.logic.pools import Pool
from mmprep_runtime import calibration_report
from mmprep_runtime.sizing import WorkerDecision, WorkerReason

LABEL_COMPONENT_CALIBRATION: Final = "calibration"
LABEL_CALIBRATION_HASH: Final = "mmprep.dev/calibration-hash"
ANNOTATION_RECALIBRATE: Final = "mmprep.dev/recalibrate"
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"


def wanted(spec: api.MultimodalPreprocessorSpec, policy: OperatorPolicy) -> bool:
    """The resource's own ``workers.calibrate`` wins; unset, the policy's mode decides."""
    if spec.workers.calibrate is not None:
        return spec.workers.calibrate
    return policy.calibration.mode == "auto"


def cpu_cores(quantity: api.Quantity | None) -> float | None:
    """A CPU quantity ("2", 2, "1500m", "0.5") in cores; None when absent or unreadable."""
    if quantity is None:
        return None
    text = str(quantity).strip()
    try:
        return float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
        return None


def max_workers(spec: api.MultimodalPreprocessorSpec, policy: OperatorPolicy) -> int:
    """N: the pod's whole CPUs (limit, else request), capped by the policy.

    Without either the runtime caps N by the CPUs it finds on the node. Fractions round down: a
    worker is one thread that wants a whole core.
    """
    cap = policy.calibration.max_workers
    cores = cpu_cores(spec.resources.limits.get("cpu"))
    if cores is None:
        cores = cpu_cores(spec.resources.requests.get("cpu"))
    if cores is None:
        return cap
    return max(1, min(cap, math.floor(cores)))


def measures(spec: api.MultimodalPreprocessorSpec, probe: api.ProbeResult) -> calibration_report.Dimension:
    """What a calibration of this resource's pools measures (``calibration_report.DIMENSIONS``).

    The vLLM render API's general path (vLLM's own processing) scales with render processes, one
    thread each; every other pool with processor worker threads. The path is the resource's
    ``serving.renderPath``, or under auto the one the probe found for the model in its image.
    """
    if spec.api != "vllm-render":
        return calibration_report.PROCESSOR_WORKERS
    setting = spec.serving.render_path or "auto"
    path = probe.render_path if setting == "auto" else setting
    return calibration_report.RENDER_PROCESSES if path == "general" else calibration_report.PROCESSOR_WORKERS


def _render_args(spec: api.MultimodalPreprocessorSpec) -> list[str]:
    """vllm-render: the flags that choose the path and configure vLLM, as the pods get them."""
    if spec.api != "vllm-render":
        return []
    args = ["--render-path", spec.serving.render_path or "auto"]
    if spec.serving.vllm_args is not None:
        args.append(pod_parts.vllm_args_flag(spec.serving.vllm_args))
    return args


def calibration_inputs(
    spec: api.MultimodalPreprocessorSpec, policy: OperatorPolicy, pool: Pool, recalibrate: str | None = None
) -> dict[str, Any]:
    settings = policy.calibration
    gpu = pool.gpu
    # Only vllm-render resources carry the render flags: other resources' hashes (and Job names) stay.
    render = {"render": _render_args(spec)} if spec.api == "vllm-render" else {}
    return {
        **render,
        "gpu": gpu.product if gpu is not None else None,
        "pool": pool.key,
        "image": pod_parts.image_of(spec, policy),
        "args": pod_parts.model_args(spec),
        "device": spec.device.value,
        "resources": spec.resources.wire(),
        "env": pod_parts.model_env(spec),
        "measure": [
            settings.tolerance,
            max_workers(spec, policy),
            settings.seconds_per_count,
            spec.workers.calibration_samples or settings.image_sizes,
        ],
        "recalibrate": recalibrate,
    }


def calibration_hash(
    spec: api.MultimodalPreprocessorSpec, policy: OperatorPolicy, pool: Pool, recalibrate: str | None = None
) -> str:
    canonical = json.dumps(calibration_inputs(spec, policy, pool, recalibrate), sort_keys=True, separators=(",", ":"))
    return naming.short_hash(canonical, 16)


def job_name(hash_: str) -> str:
    return f"mmprep-calibrate-{hash_}"


def node_for(pool: Pool) -> str | None:
    """The node the Job measures on: the first by name, so every pass picks the same one."""
    return min(pool.nodes) if pool.nodes else None


def command(spec: api.MultimodalPreprocessorSpec, policy: OperatorPolicy) -> list[str]:
    settings = policy.calibration
    args = ["mmprep-runtime", "calibrate", *pod_parts.model_args(spec)]
    if spec.device.value != "auto":
        args += ["--device", spec.device.value]
    inputs = (
        ["--samples", spec.workers.calibration_samples]
        if spec.workers.calibration_samples
        else ["--image", ",".join(settings.image_sizes)]
    )
    return [
        *args,
        *_render_args(spec),
        "--max-workers", str(max_workers(spec, policy)),
        "--duration", f"{settings.seconds_per_count:g}",
        *inputs,
        "--tolerance", f"{settings.tolerance:g}",
        "--termination-log", pod_parts.TERMINATION_LOG,
    ]  # fmt: skip


def job_manifest(
    owner: identity.Owner, spec: api.MultimodalPreprocessorSpec, policy: OperatorPolicy, pool: Pool, node: str, hash_: str
) -> dict[str, Any]:
    """The calibration Job: the runtime pod's container and placement, pinned to ``node``."""
    labels = {
        LABEL_CALIBRATION_HASH: hash_,
        identity.LABEL_POOL: pool.name,
    }
    # The pool's own constraints plus the one node: the scheduler still checks resources and
    # taints, so a node that cannot take the pod leaves the Job pending until its deadline.
    placement: dict[str, Any] = {"nodeSelector": {**spec.node_selector, **pool.node_selector, HOSTNAME_LABEL: node}}
    if spec.tolerations:
        placement["tolerations"] = list(spec.tolerations)
    settings = policy.calibration
    return jobs.answering_job_manifest(
        owner,
        spec,
        policy,
        name=job_name(hash_),
        component=LABEL_COMPONENT_CALIBRATION,
        labels=labels,
        container_name="calibrate",
        command=command(spec, policy),
        # The pods' own resources: the measurement is only true for what a pod gets.
        resources=spec.resources.wire(),
        placement=placement,
        # A measurement that failed once would fail (or mislead) again: fall back at once.
        backoff_limit=0,
        deadline_seconds=settings.timeout_seconds,
        ttl_seconds=settings.ttl_seconds_after_finished,
    )


def not_needed_reason(decision: WorkerDecision, spec: api.MultimodalPreprocessorSpec, probe: api.ProbeResult) -> str | None:
    """Why a measurement could not change this pool's count: a rule above Measured decided it."""
    if measures(spec, probe) == calibration_report.RENDER_PROCESSES:
        if spec.serving.render_processes is not None:
            return (
                f"spec.serving.renderProcesses asks for {spec.serving.render_processes} render process(es), "
                "which wins over a measurement"
            )
        return None
    if decision.reason is WorkerReason.NOT_CLONEABLE:
        return "the processor cannot be deep-copied, so 1 worker serves whatever a measurement says"
    if decision.reason is WorkerReason.NOT_THREAD_SAFE:
        return "the model declares its processor not thread-safe, so 1 worker serves whatever a measurement says"
    if decision.reason is WorkerReason.EXPLICIT:
        return f"spec.workers.processor asks for {decision.processor_workers} worker(s), which wins over a measurement"
    if decision.reason is WorkerReason.OVERRIDE:
        return "a per-GPU override decides this pool, and it wins over a measurement"
    return None


def unavailable_reason(spec: api.MultimodalPreprocessorSpec, policy: OperatorPolicy, pool: Pool) -> str | None:
    """Why no measurement can be made here at all."""
    if not pool.nodes:
        return "the pool has no node to measure on"
    if max_workers(spec, policy) < 2:
        return "each pod gets less than 2 CPUs (resources.limits/requests.cpu), so there is no worker count to compare with 1"
    return None


@dataclasses.dataclass(frozen=True)
class Outcome:
    state: api.CalibrationState
    report: calibration_report.Report | None = None
    reason: str = Reason.CALIBRATION_PENDING
    message: str = ""


def read_outcome(job: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]) -> Outcome:
    """Where the calibration Job stands, from the Job and its pods (pure)."""
    if job is None:
        return Outcome("Pending", message="the calibration Job is being created")
    if jobs.succeeded(job):
        messages = jobs.terminated_messages(pods, "Succeeded")
        if not messages:
            return Outcome(
                "Failed",
                reason=Reason.CALIBRATION_FAILED,
                message="the calibration pod finished with no report in its termination message "
                "(a node that runs no containers, e.g. a simulated one, leaves none)",
            )
        try:
            report = calibration_report.Report.from_message(messages[0])
        except calibration_report.CalibrationError as e:
            return Outcome("Failed", reason=Reason.CALIBRATION_FAILED, message=f"{e}: {jobs.tail(messages[0])}")
        if report.error is not None or report.chosen is None:
            return Outcome(
                "Failed",
                report=report,
                reason=Reason.CALIBRATION_FAILED,
                message=f"the calibration could not measure: {report.error}",
            )
        return Outcome("Succeeded", report=report, reason=Reason.MEASURED)
    failed = jobs.failed(job)
    if failed is not None:
        detail = _failure_detail(jobs.terminated_messages(pods, "Failed"))
        if failed.get("reason") == jobs.DEADLINE_EXCEEDED:
            deadline = (job.get("spec") or {}).get("activeDeadlineSeconds")
            return Outcome(
                "Failed",
                reason=Reason.CALIBRATION_FAILED,
                message=f"the calibration did not finish within {deadline}s ({detail})",
            )
        return Outcome("Failed", reason=Reason.CALIBRATION_FAILED, message=f"the calibration run failed: {detail}")
    active = (job.get("status") or {}).get("active") or 0
    return Outcome("Running" if active else "Pending", message="measuring" if active else "waiting for the calibration pod")


def _failure_detail(messages: Sequence[str]) -> str:
    for message in messages:
        try:
            report = calibration_report.Report.from_message(message)
        except calibration_report.CalibrationError:
            continue
        if report.error:
            return jobs.tail(report.error)
    return jobs.tail(messages[0]) if messages else "no termination message"


def pool_calibration(
    hash_: str, outcome: Outcome, *, job: str | None, node: str | None, measured_at: str | None
) -> api.PoolCalibration:
    """The status entry for one pool's calibration."""
    report = outcome.report
    curve = [
        api.CalibrationPoint(workers=p.workers, req_per_s=p.req_per_s, p50_ms=p.p50_ms, p99_ms=p.p99_ms)
        for p in (report.curve if report is not None else ())
    ]
    message = outcome.message
    chosen = report.chosen if outcome.state == "Succeeded" and report is not None else None
    if chosen is not None and report is not None:
        best = report.best if report.best is not None else chosen
        best_rate = next((p.req_per_s for p in report.curve if p.workers == best), 0.0)
        choice = calibration_report.Choice(chosen, best, best_rate, report.tolerance, report.dimension)
        message = choice.explanation() + (f", measured on node {node}" if node else "")
    dimension = report.dimension if report is not None else None
    return api.PoolCalibration(
        hash=hash_,
        job=job,
        state=outcome.state,
        reason=outcome.reason,
        message=message,
        node=node,
        measured_at=measured_at if outcome.state in ("Succeeded", "Failed") else None,
        measures=dimension,
        curve=curve,
        chosen_workers=chosen if dimension == calibration_report.PROCESSOR_WORKERS else None,
        chosen_render_processes=chosen if dimension == calibration_report.RENDER_PROCESSES else None,
        tolerance=report.tolerance if report is not None else None,
    )


def settled(state: api.CalibrationState) -> bool:
    """A state that stays until something the hash covers changes."""
    return state in ("Succeeded", "Failed", "Unavailable", "NotNeeded")
