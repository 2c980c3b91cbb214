"""Per-pool decisions go through the shared policy function; overrides match most specific first."""

from __future__ import annotations

import pytest
from conftest import GB300, H100_MIG, H200, gpu_spec, make_node, make_spec, probe_result

from mmprep_operator.api import WorkerOverride
from mmprep_operator.logic import decide, pools
from mmprep_runtime.sizing import ComputePath, WorkerReason


def pool_of(labels=None, gpus=8, spec=None):
    spec = spec or gpu_spec()
    node = make_node("n", labels, gpus=gpus)
    (pool,) = pools.group([node], spec).pools
    return pool


@pytest.mark.parametrize(
    ("spec_fields", "probe_fields", "labels", "path", "workers", "reason"),
    [
        # GPU given, fast processor: the GPU path caps what the model declares.
        (
            {"resources": {"limits": {"nvidia.com/gpu": 1}}},
            {"declared_workers": 2},
            H200,
            ComputePath.GPU,
            1,
            WorkerReason.GPU_PATH_CAP,
        ),
        # No GPU given to the pod: CPU path even on a GPU node; the model's number counts there.
        ({}, {"declared_workers": 3}, H200, ComputePath.CPU, 3, WorkerReason.MODEL_DECLARED),
        ({}, {}, None, ComputePath.CPU, 2, WorkerReason.CPU_PATH_DEFAULT),
        # PIL backend or device cpu: CPU path although a GPU is given.
        (
            {"backend": "pil", "resources": {"limits": {"nvidia.com/gpu": 1}}},
            {},
            H200,
            ComputePath.CPU,
            2,
            WorkerReason.CPU_PATH_DEFAULT,
        ),
        (
            {"device": "cpu", "resources": {"limits": {"nvidia.com/gpu": 1}}},
            {},
            H200,
            ComputePath.CPU,
            2,
            WorkerReason.CPU_PATH_DEFAULT,
        ),
        # No fast image processor (e.g. audio): CPU path.
        (
            {"resources": {"limits": {"nvidia.com/gpu": 1}}},
            {"fast_image_processor": False},
            H200,
            ComputePath.CPU,
            2,
            WorkerReason.CPU_PATH_DEFAULT,
        ),
        # Explicit wins over the GPU cap...
        (
            {"resources": {"limits": {"nvidia.com/gpu": 1}}, "workers": {"processor": 3}},
            {},
            H200,
            ComputePath.GPU,
            3,
            WorkerReason.EXPLICIT,
        ),
        # ...but not over cloneability.
        (
            {"workers": {"processor": 4}},
            {"cloneable": False, "error": "boom"},
            None,
            ComputePath.CPU,
            1,
            WorkerReason.NOT_CLONEABLE,
        ),
    ],
)
def test_decision_table_through_the_shared_policy(spec_fields, probe_fields, labels, path, workers, reason) -> None:
    spec = make_spec(**spec_fields)
    pool = pool_of(labels, gpus=8 if labels else 0, spec=spec)
    d = decide.decide_pool(spec, probe_result(**probe_fields), pool, [])
    assert (d.decision.path, d.decision.processor_workers, d.decision.reason) == (path, workers, reason)


def test_not_cloneable_with_explicit_workers_records_what_was_not_honoured() -> None:
    spec = make_spec(workers={"processor": 4})
    d = decide.decide_pool(spec, probe_result(cloneable=False), pool_of(None, 0, spec), [])
    assert d.decision.explicit_not_honoured == 4


def test_io_workers_explicit_else_four() -> None:
    spec = make_spec(workers={"io": 9})
    assert decide.decide_pool(spec, probe_result(), pool_of(None, 0, spec), []).decision.io_workers == 9
    spec = make_spec()
    assert decide.decide_pool(spec, probe_result(), pool_of(None, 0, spec), []).decision.io_workers == 4


def test_out_of_range_declared_workers_are_ignored_not_fatal() -> None:
    spec = make_spec()
    d = decide.decide_pool(spec, probe_result(declared_workers=0), pool_of(None, 0, spec), [])
    assert d.decision.reason is WorkerReason.CPU_PATH_DEFAULT


def o(**kw) -> WorkerOverride:
    return WorkerOverride.model_validate(kw)


def test_policy_override_encodes_a_measurement_per_family_and_path() -> None:
    blackwell_gpu = o(gpuFamily="blackwell", path="gpu", processor=1)
    h200_cpu = o(gpuProduct="H200", path="cpu", processor=4)
    gb300 = pool_of(GB300)
    spec = gpu_spec()
    d = decide.decide_pool(spec, probe_result(), gb300, [h200_cpu, blackwell_gpu])
    assert (d.decision.reason, d.decision.processor_workers) == (WorkerReason.OVERRIDE, 1)
    assert d.override_source == "policy: gpuFamily=blackwell, path=gpu"
    # The H200 override names the cpu path: on the GPU path it does not apply.
    d = decide.decide_pool(spec, probe_result(), pool_of(H200), [h200_cpu, blackwell_gpu])
    assert d.decision.reason is WorkerReason.GPU_PATH_CAP and d.override_source is None
    cpu_spec = make_spec()
    d = decide.decide_pool(cpu_spec, probe_result(), pool_of(H200, spec=cpu_spec), [h200_cpu])
    assert (d.decision.reason, d.decision.processor_workers) == (WorkerReason.OVERRIDE, 4)


def test_most_specific_override_wins_and_spec_beats_policy() -> None:
    pool = pool_of(H200)
    spec = gpu_spec(workers={"overrides": [{"gpuFamily": "hopper", "processor": 5}]})
    policy = [o(gpuProduct="NVIDIA-H200-141GB-HBM3e", processor=7)]
    # The spec's (less specific) override still beats the policy's exact product.
    assert decide.decide_pool(spec, probe_result(), pool, policy).decision.processor_workers == 5
    ranked = [
        o(gpuFamily="hopper", processor=2),
        o(gpuProduct="h200", processor=3),  # short model, case-insensitive
        o(gpuProduct="NVIDIA-H200-141GB-HBM3e", processor=4),  # exact label
    ]
    assert decide.decide_pool(gpu_spec(), probe_result(), pool, ranked).decision.processor_workers == 4
    assert decide.decide_pool(gpu_spec(), probe_result(), pool, ranked[:2]).decision.processor_workers == 3


def test_mig_pool_matches_its_base_product_override() -> None:
    pool = pool_of(H100_MIG)
    policy = [o(gpuProduct="NVIDIA-H100-80GB-HBM3", processor=6)]
    assert decide.decide_pool(gpu_spec(), probe_result(), pool, policy).decision.processor_workers == 6


def test_cpu_pool_matches_no_gpu_override() -> None:
    spec = make_spec()
    pool = pool_of(None, 0, spec)
    assert (
        decide.decide_pool(spec, probe_result(), pool, [o(gpuFamily="hopper", processor=9)]).decision.reason
        is WorkerReason.CPU_PATH_DEFAULT
    )


def test_decision_sentence_names_pool_path_workers_reason_and_why_once() -> None:
    d = decide.decide_pool(gpu_spec(), probe_result(declared_workers=2), pool_of(H200), [])
    assert decide.sentence(d) == (
        "pool nvidia-h200-141gb-hbm3e: gpu path, 1 worker, GPUPathCap: "
        "the model declares 2, capped because a second worker contends for the device"
    )
    d = decide.decide_pool(gpu_spec(), probe_result(), pool_of(H200), [])
    assert decide.sentence(d) == "pool nvidia-h200-141gb-hbm3e: gpu path, 1 worker, GPUPathCap"
    spec = make_spec()
    d = decide.decide_pool(spec, probe_result(), pool_of(None, 0, spec), [])
    assert decide.sentence(d) == "pool cpu: cpu path, 2 workers, CPUPathDefault: the CPU path's default"
    d = decide.decide_pool(gpu_spec(), probe_result(), pool_of(GB300), [o(gpuFamily="blackwell", processor=2)])
    assert decide.sentence(d).endswith("2 workers, Override: from a per-GPU override (policy: gpuFamily=blackwell)")
