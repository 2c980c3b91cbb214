"""Start-up on the device, the parts that run on any machine: a pod asked to run on CUDA where
there is none fails its start with the reason in its termination message, and the host-side
conversions of the GPU path give the processor what it would get from the images themselves.
What needs a GPU is in tests/gpu (run by hack/gpu-check.sh)."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch
from PIL import Image
from support.servers import free_port, runtime_command

from mmprep_runtime.commands import measuring, serve
from mmprep_runtime.engine import cuda, loading, patches
from mmprep_runtime.settings import ModelSettings

# A deadline: on a loaded machine (the kind bring-up beside) importing torch alone can take minutes.
TIMEOUT = 420
pytestmark = pytest.mark.timeout(2 * TIMEOUT)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the failure path is not reachable")
def test_serve_on_cuda_without_a_gpu_exits_non_zero_with_the_reason_in_the_termination_log(qwen_dir, tmp_path) -> None:
    log = tmp_path / "termination-log"
    env = {**os.environ, "MMPREP_DEVICE": "cuda"}
    done = subprocess.run(
        [
            *runtime_command(),
            "serve",
            "--model",
            str(qwen_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "--termination-log",
            str(log),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == serve.EXIT_DEVICE_FAILED, done.stderr[-2000:]
    message = log.read_text()
    assert message.startswith("device cuda: CUDA is not available"), message
    assert "visible device(s)" in message and len(message.encode()) <= 4096
    assert "could not be started" in done.stderr


def test_a_bad_device_index_is_a_failed_start_not_a_guess() -> None:
    assert cuda.device_index({}) == 0
    assert cuda.device_index({cuda.ENV_DEVICE_INDEX: "1"}) == 1
    for bad in ("gpu0", "-1"):
        with pytest.raises(cuda.CudaUnavailable, match=cuda.ENV_DEVICE_INDEX):
            cuda.device_index({cuda.ENV_DEVICE_INDEX: bad})


def test_the_allocator_default_yields_to_the_pods_own_setting() -> None:
    env: dict[str, str] = {}
    assert cuda.configure_allocator(env) == "expandable_segments:True" == env[cuda.ENV_ALLOC_CONF]
    assert cuda.configure_allocator({cuda.ENV_ALLOC_CONF: "max_split_size_mb:256"}) == "max_split_size_mb:256"
    assert (
        cuda.configure_allocator({cuda.ENV_ALLOC_CONF_NEW: "garbage_collection_threshold:0.6"})
        == "garbage_collection_threshold:0.6"
    )


def test_uploaded_images_are_the_tensors_the_processor_makes_of_the_images(qwen_dir) -> None:
    # On the CPU the upload is the conversion alone; the processor must answer the same for both.
    rgb = Image.effect_noise((70, 50), 40).convert("RGB")
    rgba = Image.new("RGBA", (32, 32), (1, 2, 3, 4))
    decoded = torch.zeros(3, 8, 8, dtype=torch.uint8)  # what JPEG decoding gives a fast processor
    converted = cuda.upload_images([rgb, rgba, decoded], "cpu")
    assert converted[1] is rgba  # modes the processor converts itself are left to it
    assert converted[2] is decoded  # already the tensor the processor takes; on CUDA it is uploaded
    assert converted[0].dtype == torch.uint8 and tuple(converted[0].shape) == (3, 50, 70)
    processor, _ = loading.load_processor(ModelSettings(str(qwen_dir)))
    from_images = processor.image_processor(images=[rgb], return_tensors="pt")["pixel_values"]
    from_tensors = processor.image_processor(images=[converted[0]], return_tensors="pt")["pixel_values"]
    assert torch.equal(from_images, from_tensors)


def test_an_input_transform_is_bound_to_each_clone_and_applies_to_lists_only(qwen_dir) -> None:
    import copy

    processor, _ = loading.load_processor(ModelSettings(str(qwen_dir)))
    seen: list[object] = []
    patches.bind_input_transform(processor.image_processor, "preprocess", "images", _record, seen)
    clone = copy.deepcopy(processor)
    image = Image.new("RGB", (56, 56))
    clone.image_processor(images=[image], return_tensors="pt")
    clone.image_processor.preprocess(image, return_tensors="pt")  # a single image: passed as it is
    assert clone.image_processor.preprocess.__self__ is clone.image_processor
    # The extra arguments are the clone's own copies, like the rest of its state.
    seen_by_clone = clone.image_processor._mmprep_input_transforms["preprocess"][2][0]
    assert seen == [] and seen_by_clone == [image]


def _record(images: list[object], seen: list[object]) -> list[object]:
    seen.append(images[0])
    return images


def test_the_bench_baseline_follows_the_pools_device_and_refuses_a_mix(qwen_dir) -> None:
    from types import SimpleNamespace

    from mmprep_runtime.commands import bench

    processor, _ = loading.load_processor(ModelSettings(str(qwen_dir)))
    cpu = SimpleNamespace(device="cpu")
    assert bench.bind_baseline_device(processor, {1: cpu, 2: cpu}) == "cpu"  # type: ignore[dict-item]
    assert not hasattr(processor.image_processor, "_mmprep_default_kwargs")  # nothing bound on the CPU
    with pytest.raises(measuring.MeasureError, match="different devices"):
        bench.bind_baseline_device(processor, {1: cpu, 2: SimpleNamespace(device="cuda:0")})  # type: ignore[dict-item]


def test_a_bad_device_index_fails_the_start_even_on_the_cpu_path(qwen_dir, tmp_path) -> None:
    log = tmp_path / "termination-log"
    done = subprocess.run(
        [*runtime_command(), "serve", "--model", str(qwen_dir), "--port", str(free_port()), "--termination-log", str(log)],
        env={**os.environ, "MMPREP_DEVICE": "cpu", cuda.ENV_DEVICE_INDEX: "gpu0"},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == serve.EXIT_DEVICE_FAILED, done.stderr[-2000:]
    assert log.read_text() == "MMPREP_CUDA_DEVICE must be a device index (0, 1, ...), got 'gpu0'"
