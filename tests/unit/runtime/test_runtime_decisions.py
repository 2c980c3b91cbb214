"""The runtime's own decision on real processors, the decision table, settings precedence, CPUs."""

from __future__ import annotations

import argparse

import pytest

from mmprep_runtime import cli, settings, sizing
from mmprep_runtime.engine import core as engine
from mmprep_runtime.engine import cpus, cuda, loading
from mmprep_runtime.exits import ModelLoadError
from mmprep_runtime.settings import ModelSettings
from mmprep_runtime.sizing import Backend, ComputePath, Device, WorkerReason


def test_a_cpu_processor_without_declaration_gets_the_cpu_default(started, llava_dir):
    running = started(llava_dir)
    assert (running.decision.path, running.decision.processor_workers) == (ComputePath.CPU, 2)
    assert running.decision.reason is WorkerReason.CPU_PATH_DEFAULT
    assert running.pool.workers == 2 and len(running.pool.clone_seconds) == 2, "warm before ready"


def test_a_declared_count_is_used_on_the_cpu_path(started, model_factory):
    running = started(model_factory("llava", declared_workers=5))
    assert running.decision.processor_workers == 5
    assert running.decision.reason is WorkerReason.MODEL_DECLARED
    assert running.intra_op_threads == max(1, cpus.usable_cpus() // 5)


def test_an_explicit_count_wins_over_the_declaration(started, model_factory):
    running = started(model_factory("llava", declared_workers=5), processor_workers=3, io_workers=2)
    assert (running.decision.processor_workers, running.decision.reason) == (3, WorkerReason.EXPLICIT)
    assert running.decision.io_workers == 2


def test_an_uncloneable_processor_falls_back_to_one_worker_and_says_why(started, uncloneable_dir):
    running = started(uncloneable_dir, trust_remote_code=True, processor_workers=4)
    info = running.info()
    assert running.pool.workers == 1
    assert info["workers"]["reason"] == "NotCloneable"
    assert info["workers"]["explicit_not_honoured"] == 4
    assert info["cloneable"] is False
    assert "cannot be copied" in info["clone_error"]
    assert "4 workers were asked for" in info["workers"]["message"]


def test_remote_code_is_refused_without_trust(started, uncloneable_dir):
    with pytest.raises(ModelLoadError, match="trust_remote_code"):
        started(uncloneable_dir)


def test_the_backend_flag_swaps_the_image_processor_and_the_info_says_so(started, qwen_dir):
    running = started(qwen_dir, backend=Backend.PIL)
    assert running.facts.image_processor_class == "Qwen2VLImageProcessorPil"
    assert running.facts.fast_image_processor is False
    assert running.info()["backend"] == "pil"


def test_a_folder_built_for_pil_loads_the_pil_backend(model_factory):
    _, facts = loading.load_processor(ModelSettings(str(model_factory("qwen2-vl", backend="pil"))))
    assert facts.backend == "pil"


def test_a_missing_folder_is_a_clear_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        loading.load_processor(ModelSettings(str(tmp_path / "nope")))


def test_asking_for_cuda_without_cuda_is_an_error(monkeypatch):
    monkeypatch.setattr(loading, "cuda_available", lambda: False)
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        engine.resolve_device(Device.CUDA)
    assert engine.resolve_device(Device.AUTO) == ("cpu", False)


# -- the decision table, as the runtime uses it (path from the processor's facts) ------------------


def _decide(*, gpu: bool, backend: str = "torchvision", fast: bool = True, declared=None, explicit=None, cloneable: bool = True):
    path = sizing.decide_path(gpu_available=gpu, backend=backend, fast_image_processor=fast)
    return sizing.decide_workers(path=path, cloneable=cloneable, explicit=explicit, declared=declared)


@pytest.mark.parametrize(
    ("case", "kwargs", "workers", "reason"),
    [
        ("CPU, nothing declared", {"gpu": False}, 2, WorkerReason.CPU_PATH_DEFAULT),
        ("CUDA, nothing declared", {"gpu": True}, 1, WorkerReason.GPU_PATH_CAP),
        ("CUDA but PIL backend", {"gpu": True, "backend": "pil", "fast": False}, 2, WorkerReason.CPU_PATH_DEFAULT),
        ("CUDA, audio processor", {"gpu": True, "backend": "auto", "fast": False}, 2, WorkerReason.CPU_PATH_DEFAULT),
        ("CPU, declared 5", {"gpu": False, "declared": 5}, 5, WorkerReason.MODEL_DECLARED),
        ("CUDA, declared 5", {"gpu": True, "declared": 5}, 1, WorkerReason.GPU_PATH_CAP),
        ("explicit beats the GPU path", {"gpu": True, "declared": 5, "explicit": 3}, 3, WorkerReason.EXPLICIT),
        ("explicit beats a declaration", {"gpu": False, "declared": 5, "explicit": 3}, 3, WorkerReason.EXPLICIT),
        ("not cloneable caps explicit", {"gpu": False, "explicit": 3, "cloneable": False}, 1, WorkerReason.NOT_CLONEABLE),
    ],
)
def test_decision_table(case, kwargs, workers, reason):
    decision = _decide(**kwargs)
    assert (decision.processor_workers, decision.reason) == (workers, reason), case


# -- settings precedence: flag > env > own decision --------------------------------------------------


def _serve_args(*extra: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["serve", "--model", "m", *extra])


def test_env_sets_workers_and_device_and_flags_override_env():
    env = {"MMPREP_PROCESSOR_WORKERS": "3", "MMPREP_IO_WORKERS": "6", "MMPREP_DEVICE": "cpu"}
    from_env = settings.serve_settings_from_args(_serve_args(), env)
    assert (from_env.processor_workers, from_env.io_workers, from_env.model.device) == (3, 6, Device.CPU)
    flagged = settings.serve_settings_from_args(
        _serve_args("--processor-workers", "5", "--io-workers", "2", "--device", "auto"), env
    )
    assert (flagged.processor_workers, flagged.io_workers, flagged.model.device) == (5, 2, Device.AUTO)
    assert settings.serve_settings_from_args(_serve_args(), {}).processor_workers is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MMPREP_PROCESSOR_WORKERS": "two"}, "must be an integer"),
        ({"MMPREP_IO_WORKERS": "0"}, "between 1 and 64"),
        ({"MMPREP_DEVICE": "tpu"}, "auto, cpu, cuda"),
    ],
)
def test_bad_env_values_are_clear_errors(env, message):
    with pytest.raises(settings.SettingsError, match=message):
        settings.serve_settings_from_args(_serve_args(), env)


# -- CPUs the process may use ----------------------------------------------------------------------


def test_cgroup_v2_quota_is_read(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cpus.cgroup_quota_cpus(tmp_path / "cpu.max", tmp_path / "none", tmp_path / "none") == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpus.cgroup_quota_cpus(tmp_path / "cpu.max", tmp_path / "none", tmp_path / "none") is None


def test_cgroup_v1_quota_is_read(tmp_path):
    (tmp_path / "quota").write_text("300000\n")
    (tmp_path / "period").write_text("100000\n")
    assert cpus.cgroup_quota_cpus(tmp_path / "none", tmp_path / "quota", tmp_path / "period") == 3.0
    (tmp_path / "quota").write_text("-1\n")
    assert cpus.cgroup_quota_cpus(tmp_path / "none", tmp_path / "quota", tmp_path / "period") is None


def test_usable_cpus_is_the_smaller_of_affinity_and_quota(monkeypatch):
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 8)
    monkeypatch.setattr(cpus, "cgroup_quota_cpus", lambda: 2.5)
    assert cpus.usable_cpus() == 2
    monkeypatch.setattr(cpus, "cgroup_quota_cpus", lambda: 0.5)
    assert cpus.usable_cpus() == 1
    monkeypatch.setattr(cpus, "cgroup_quota_cpus", lambda: None)
    assert cpus.usable_cpus() == 8


@pytest.mark.parametrize(("workers", "cpu_count", "threads"), [(1, 2, 2), (2, 2, 1), (4, 2, 1), (2, 8, 4), (3, 8, 2)])
def test_workers_times_threads_never_exceeds_the_cpus(workers, cpu_count, threads):
    assert cpus.intra_op_threads(workers, cpu_count) == threads
    assert workers * threads <= max(cpu_count, workers)


def test_on_a_cuda_device_the_fast_processor_takes_the_gpu_path_capped_at_one_worker(monkeypatch, qwen_dir):
    # No GPU here: CUDA is declared available so the decision and the device patch can be checked;
    # no request is processed.
    monkeypatch.setattr(loading, "cuda_available", lambda: True)
    # Stand-ins for the device calls (the real ones run in tests/gpu): record what start-up asked.
    calls: list[str] = []
    monkeypatch.setattr(cuda, "start", lambda: calls.append("start") or "cuda:0")
    monkeypatch.setattr(cuda, "worker_init", lambda device: calls.append(f"stream {device}"))
    monkeypatch.setattr(cuda, "warm_up", lambda processor, device: calls.append(f"warm-up {device}") or {"warmed": True})
    monkeypatch.setattr(cuda, "describe", lambda device: {"device": device})
    model = ModelSettings(str(qwen_dir), device=Device.AUTO)
    running = engine.start_engine(model)
    try:
        info = running.info()
        assert (info["path"], info["device"], info["cuda"]) == ("gpu", "cuda:0", {"device": "cuda:0"})
        # CUDA first, each worker's stream, then the warm-up request on the device before start-up ends.
        assert calls == ["start", "stream cuda:0", "warm-up cuda:0"]
        assert info["workers"]["processor"] == 1 and info["workers"]["reason"] == "GPUPathCap"
        assert "declares 2" in info["workers"]["message"]  # the Qwen2-VL table entry, capped
        clone = running.pool.submit(lambda processor: processor).result(30)
        bound = clone.image_processor.preprocess
        assert bound.__self__ is clone.image_processor, "the device patch rebinds to the worker's clone"
        assert clone.image_processor._mmprep_default_kwargs == {"preprocess": {"device": "cuda:0"}}
        assert clone.image_processor._mmprep_input_transforms["preprocess"][1] is cuda.upload_images
    finally:
        running.close(timeout=30)
    pil = engine.start_engine(ModelSettings(str(qwen_dir), device=Device.AUTO, backend=Backend.PIL))
    try:
        assert (pil.decision.path, pil.decision.processor_workers) == (ComputePath.CPU, 2)
    finally:
        pil.close(timeout=30)


def test_a_warm_up_that_fails_on_the_device_fails_the_start_and_stops_the_workers(monkeypatch, qwen_dir):
    monkeypatch.setattr(loading, "cuda_available", lambda: True)
    monkeypatch.setattr(cuda, "start", lambda: "cuda:0")
    monkeypatch.setattr(cuda, "worker_init", lambda device: None)
    pools: list[object] = []
    real_pool = engine.executor.ProcessorPool

    def recording_pool(*args, **kwargs):
        pools.append(real_pool(*args, **kwargs))
        return pools[-1]

    def failing_warm_up(processor, device):
        raise cuda.CudaUnavailable(f"device cuda: the warm-up request failed on {device}: RuntimeError: CUDA error")

    monkeypatch.setattr(engine.executor, "ProcessorPool", recording_pool)
    monkeypatch.setattr(cuda, "warm_up", failing_warm_up)
    with pytest.raises(cuda.CudaUnavailable, match="warm-up request failed on cuda:0"):
        engine.start_engine(ModelSettings(str(qwen_dir), device=Device.CUDA))
    (pool,) = pools
    with pytest.raises(Exception, match="shut down"):
        pool.submit(lambda processor: None)


def test_a_device_patch_on_a_real_image_processor_survives_cloning_and_reaches_the_processing(qwen_dir, monkeypatch):
    import copy

    import torch

    processor, _ = loading.load_processor(ModelSettings(str(qwen_dir)))
    # Watch what the image processor's own preprocess receives when the whole processor runs:
    # the binding is only real if the device reaches it, on the clone, through the normal call path.
    image_processor_class = type(processor.image_processor)
    library_preprocess = image_processor_class.preprocess
    seen: list[tuple[object, object]] = []

    def watched(self, *args, **kwargs):
        seen.append((self, kwargs.get("device")))
        return library_preprocess(self, *args, **kwargs)

    monkeypatch.setattr(image_processor_class, "preprocess", watched)
    loading.bind_device(processor, "cpu")
    clone = copy.deepcopy(processor)
    assert clone.image_processor.preprocess.__self__ is clone.image_processor
    out = clone(text="<|image_pad|>", images=[torch.zeros(3, 56, 56, dtype=torch.uint8)], return_tensors="pt")
    assert out["pixel_values"].shape == (16, 1176)
    assert seen == [(clone.image_processor, "cpu")]  # the clone's own processor, with the bound device


def test_a_model_declared_not_thread_safe_serves_with_one_worker_and_its_declared_io_workers(started, tmp_path):
    from mmprep_runtime.synthetic import models

    folder = models.make_model("llava", tmp_path / "m", declared_workers=4, declared_io_workers=3, thread_safe=False)
    running = started(folder, processor_workers=2)
    assert (running.decision.processor_workers, running.decision.reason) == (1, WorkerReason.NOT_THREAD_SAFE)
    assert running.decision.explicit_not_honoured == 2 and running.pool.workers == 1
    assert running.decision.io_workers == 3
    assert running.info()["thread_safe"] is False
