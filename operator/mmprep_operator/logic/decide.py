"""Per-pool decisions: feed the shared decision function (``mmprep_runtime.sizing``) the facts.

This module does not decide anything itself. It answers the questions the shared function asks:
is a GPU available to the pod in this pool, and which per-GPU override (if any) applies. Override
matching, most specific first:

1. the resource's own ``spec.workers.overrides`` before the operator policy's;
2. within each: exact product label, then the product without MIG/SHARED suffix, then the short
   model name (``H200``), then the family (``blackwell``);
3. at the same level, an override that names the pool's path before one that names none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from mmprep_operator.api import MultimodalPreprocessorSpec, ProbeResult, WorkerOverride
from mmprep_operator.logic.pools import Pool
from mmprep_runtime.sizing import ComputePath, Device, WorkerDecision, WorkerReason, decide_path, decide_workers, is_worker_count


@dataclasses.dataclass(frozen=True)
class PoolDecision:
    pool: Pool
    decision: WorkerDecision
    #: Where the override came from, e.g. "spec: gpuFamily=blackwell, path=gpu"; None if none applied.
    override_source: str | None
    #: vLLM render processes per pod of the general render path: spec.serving.renderProcesses, else
    #: the calibration's count; None: neither (the runtime starts one per usable CPU).
    render_processes: int | None = None


def _specificity(override: WorkerOverride, pool: Pool, path: ComputePath) -> int | None:
    """Lower is more specific; None when the override does not match the pool."""
    if override.path is not None and override.path != path.value:
        return None
    path_bonus = 0 if override.path is not None else 1
    gpu = pool.gpu
    if gpu is None:
        return None
    if override.gpu_product is not None:
        wanted = override.gpu_product.lower()
        for level, candidate in enumerate((gpu.product, gpu.base_product, gpu.model)):
            if candidate is not None and candidate.lower() == wanted:
                return level * 2 + path_bonus
        return None
    if override.gpu_family is not None and gpu.family is not None and override.gpu_family.lower() == gpu.family.lower():
        return 3 * 2 + path_bonus
    return None


def describe(override: WorkerOverride) -> str:
    target = f"gpuProduct={override.gpu_product}" if override.gpu_product else f"gpuFamily={override.gpu_family}"
    return target + (f", path={override.path}" if override.path else "")


def matching_override(
    pool: Pool, path: ComputePath, spec_overrides: Sequence[WorkerOverride], policy_overrides: Sequence[WorkerOverride]
) -> tuple[WorkerOverride, str] | None:
    for source, overrides in (("spec", spec_overrides), ("policy", policy_overrides)):
        ranked = [(rank, i, o) for i, o in enumerate(overrides) if (rank := _specificity(o, pool, path)) is not None]
        if ranked:
            _, _, best = min(ranked, key=lambda t: (t[0], t[1]))
            return best, f"{source}: {describe(best)}"
    return None


def gpu_available(spec: MultimodalPreprocessorSpec, pool: Pool) -> bool:
    """The pool has GPUs and the pod is given one (a GPU resource, or device: cuda)."""
    return pool.has_gpu and (spec.requests_gpu() or spec.device is Device.CUDA)


def _usable_declared(declared: int | None) -> int | None:
    # A model config can say anything; a number outside the bounds is ignored rather than fatal.
    return declared if is_worker_count(declared) else None


def decide_pool(
    spec: MultimodalPreprocessorSpec,
    probe: ProbeResult,
    pool: Pool,
    policy_overrides: Sequence[WorkerOverride],
    measured: int | None = None,
    measured_render_processes: int | None = None,
) -> PoolDecision:
    """``measured``: the worker count a calibration run chose for this pool, when one succeeded;
    ``measured_render_processes``: the render process count one chose (the general render path)."""
    path = decide_path(
        gpu_available=gpu_available(spec, pool),
        device=spec.device,
        backend=spec.backend,
        fast_image_processor=probe.fast_image_processor,
    )
    match = matching_override(pool, path, spec.workers.overrides, policy_overrides)
    decision = decide_workers(
        path=path,
        cloneable=probe.cloneable,
        explicit=spec.workers.processor,
        override=match[0].processor if match else None,
        declared=_usable_declared(probe.declared_workers),
        explicit_io=spec.workers.io,
        cloneable_error=probe.error,
        measured=measured,
        thread_safe=probe.thread_safe,
        declared_io=_usable_declared(probe.declared_io_workers),
    )
    source = match[1] if match and decision.reason is WorkerReason.OVERRIDE else None
    return PoolDecision(pool, decision, source, spec.serving.render_processes or measured_render_processes)


def sentence(d: PoolDecision) -> str:
    """The decision in one line, for status and Events, e.g.
    "pool nvidia-h200: gpu path, 1 worker, GPUPathCap: the model declares 2, capped because ..."."""
    text = f"pool {d.pool.name}: {d.decision.describe()}"
    if d.override_source:
        text += f" ({d.override_source})"
    return text
