"""The decision table: one implementation, shared by the operator and the runtime."""

import subprocess
import sys

import pytest

from mmprep_runtime.sizing import Backend, ComputePath, Device, WorkerReason, decide_path, decide_workers


@pytest.mark.parametrize(
    ("gpu", "device", "backend", "fast", "expected"),
    [
        (False, "auto", "auto", True, ComputePath.CPU),  # CPU-only pool
        (True, "auto", "auto", True, ComputePath.GPU),
        (True, "cuda", "torchvision", True, ComputePath.GPU),
        (True, "cpu", "auto", True, ComputePath.CPU),  # device pinned to CPU
        (True, "auto", "pil", True, ComputePath.CPU),  # PIL backend is CPU only
        (True, "auto", "auto", False, ComputePath.CPU),  # no fast processor (e.g. audio)
    ],
)
def test_path_is_gpu_only_when_every_condition_holds(gpu, device, backend, fast, expected):
    assert decide_path(gpu_available=gpu, device=device, backend=backend, fast_image_processor=fast) is expected


def path_for(device: str, backend: str = "auto") -> ComputePath:
    return decide_path(gpu_available=device == "cuda", device=device, backend=backend, fast_image_processor=True)


@pytest.mark.parametrize(
    ("device", "backend", "declared", "explicit", "workers", "reason"),
    [
        ("cpu", "auto", None, None, 2, WorkerReason.CPU_PATH_DEFAULT),
        ("cuda", "auto", None, None, 1, WorkerReason.GPU_PATH_CAP),
        ("cuda", "pil", None, None, 2, WorkerReason.CPU_PATH_DEFAULT),
        ("cpu", "auto", 5, None, 5, WorkerReason.MODEL_DECLARED),
        ("cuda", "auto", 5, None, 1, WorkerReason.GPU_PATH_CAP),
        ("cuda", "auto", 5, 3, 3, WorkerReason.EXPLICIT),
        ("cpu", "auto", 5, 1, 1, WorkerReason.EXPLICIT),
    ],
)
def test_decision_table(device, backend, declared, explicit, workers, reason):
    decision = decide_workers(path=path_for(device, backend), cloneable=True, declared=declared, explicit=explicit)
    assert (decision.processor_workers, decision.reason) == (workers, reason)
    assert decision.io_workers == 4


def test_not_cloneable_caps_even_an_explicit_count_and_says_so():
    decision = decide_workers(path=ComputePath.CPU, cloneable=False, explicit=8, cloneable_error="TypeError: cannot pickle")
    assert decision.processor_workers == 1
    assert decision.reason is WorkerReason.NOT_CLONEABLE
    assert decision.explicit_not_honoured == 8
    assert "8 workers were asked for" in decision.detail and "cannot pickle" in decision.detail


def test_override_beats_path_but_not_explicit():
    assert decide_workers(path=ComputePath.GPU, cloneable=True, override=2, declared=5).processor_workers == 2
    assert decide_workers(path=ComputePath.GPU, cloneable=True, override=2).reason is WorkerReason.OVERRIDE
    assert decide_workers(path=ComputePath.GPU, cloneable=True, override=2, explicit=3).reason is WorkerReason.EXPLICIT


def test_gpu_cap_message_names_the_declared_number():
    assert "declares 2" in decide_workers(path=ComputePath.GPU, cloneable=True, declared=2).detail


def test_explicit_io_workers_replace_the_default():
    assert decide_workers(path=ComputePath.CPU, cloneable=True, explicit_io=16).io_workers == 16


@pytest.mark.parametrize("bad", [0, 65, -1])
def test_counts_out_of_bounds_are_refused(bad):
    with pytest.raises(ValueError, match="between 1 and 64"):
        decide_workers(path=ComputePath.CPU, cloneable=True, explicit=bad)


def test_unknown_device_is_refused():
    with pytest.raises(ValueError):
        decide_path(gpu_available=True, device="tpu", fast_image_processor=True)
    assert Device("cuda") is Device.CUDA and Backend("pil") is Backend.PIL


@pytest.mark.parametrize("module", ["mmprep_runtime.sizing", "mmprep_runtime.cli"])
def test_sizing_and_the_command_line_import_without_heavy_libraries(module: str) -> None:
    # The CLI answers --help and argument errors before any command imports its libraries.
    code = (
        f"import sys, {module}\n"
        "heavy = {'torch', 'transformers', 'torchvision', 'PIL', 'pydantic'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
