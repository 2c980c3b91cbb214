"""The GPU path on a real CUDA device: start-up, the pod's device, streams, uploads, and outputs
that match the CPU path within the documented tolerance (docs/runtime.md, "CPU and CUDA outputs")."""

from __future__ import annotations

import asyncio
import base64
import json
import threading

import aiohttp
import torch
from aiohttp import web
from PIL import Image

from mmprep_runtime.commands import bench
from mmprep_runtime.engine import core as engine
from mmprep_runtime.engine import cuda, loading
from mmprep_runtime.server import state as server_state
from mmprep_runtime.server.app import create_app
from mmprep_runtime.settings import ModelSettings, ServeSettings
from mmprep_runtime.sizing import ComputePath, Device
from mmprep_runtime.synthetic import models
from mmprep_runtime.synthetic.media import jpeg

TIMEOUT = 120
#: Normalised pixel values (about 1/(255*0.27) = 0.015 per uint8 step): CUDA's bicubic resize may
#: round a pixel differently from the CPU kernel, by a step or two at most.
MAX_ABS_DIFF = 0.05
MEAN_ABS_DIFF = 0.005


def test_cuda_starts_on_the_pods_device_and_proves_it() -> None:
    device = cuda.start()
    assert device == "cuda:0"
    assert torch.cuda.current_device() == 0
    described = cuda.describe(device)
    assert described["memory_total_bytes"] > 0 and described["allocator_conf"]


def test_the_engine_warms_up_on_the_device_before_it_is_returned(qwen_dir) -> None:
    running = engine.start_engine(ModelSettings(str(qwen_dir), device=Device.CUDA), processor_workers=2)
    try:
        assert running.decision.path is ComputePath.GPU and running.device == "cuda:0"
        assert running.info()["cuda"]["device"] == "cuda:0"

        def stream_of(_processor: object) -> int:
            return torch.cuda.current_stream().cuda_stream

        barrier = threading.Barrier(2)

        def both(_processor: object) -> int:
            barrier.wait(TIMEOUT)  # holds each worker until both run one job
            return stream_of(_processor)

        streams = {f.result(TIMEOUT) for f in [running.pool.submit(both), running.pool.submit(both)]}
        assert len(streams) == 2 and torch.cuda.default_stream().cuda_stream not in streams
    finally:
        running.close(timeout=30)


def test_uploads_land_on_the_device_and_outputs_match_the_cpu_within_tolerance(qwen_dir) -> None:
    image = Image.effect_noise((640, 480), 60).convert("RGB")
    on_cpu, _ = loading.load_processor(ModelSettings(str(qwen_dir)))
    on_gpu, _ = loading.load_processor(ModelSettings(str(qwen_dir)))
    loading.bind_device(on_gpu, "cuda:0")
    decoded = torch.randint(0, 255, (3, 48, 64), dtype=torch.uint8)
    uploaded = cuda.upload_images([image, decoded], "cuda:0")
    assert [u.device.type for u in uploaded] == ["cuda", "cuda"]
    torch.cuda.current_stream().synchronize()
    assert torch.equal(uploaded[1].cpu(), decoded)
    text = f"look {models.QWEN_IMAGE_PLACEHOLDER}"
    cpu_out = on_cpu(text=text, images=[image], return_tensors="pt")
    gpu_out = on_gpu(text=text, images=[image], return_tensors="pt")
    assert gpu_out["pixel_values"].device.type == "cuda"
    assert torch.equal(cpu_out["input_ids"], gpu_out["input_ids"])
    diff = (cpu_out["pixel_values"] - gpu_out["pixel_values"].cpu()).abs()
    print(f"CPU vs CUDA pixel_values: max {diff.max().item():.5f}, mean {diff.mean().item():.6f}")
    assert diff.max().item() <= MAX_ABS_DIFF and diff.mean().item() <= MEAN_ABS_DIFF


async def test_readyz_turns_true_only_after_the_warm_up_and_answers_come_back_on_the_cpu(qwen_dir) -> None:
    settings = ServeSettings(
        model=ModelSettings(str(qwen_dir), device=Device.CUDA),
        host="127.0.0.1",
        port=0,
        processor_workers=2,
    )
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    state = app[server_state.STATE]
    try:
        await asyncio.wait_for(state.settled.wait(), TIMEOUT)
        assert state.startup_error is None, state.startup_error
        assert state.engine is not None and state.engine.cuda is not None  # warmed before it was installed
        async with aiohttp.ClientSession() as client:
            async with client.get(f"http://{host}:{port}/readyz") as response:
                assert response.status == 200
            body = {"text": f"a {models.QWEN_IMAGE_PLACEHOLDER}", "images": [base64.b64encode(jpeg(320, 240)).decode()]}
            async with client.post(f"http://{host}:{port}/v1/preprocess", data=json.dumps(body)) as response:
                assert response.status == 200, await response.text()
                answer = await response.json()
        assert answer["tensors"]["pixel_values"]["dtype"] == "float32"
    finally:
        await runner.cleanup()


def test_the_bench_baseline_runs_on_the_pools_device(qwen_dir) -> None:
    report = bench.run(
        ModelSettings(str(qwen_dir), device=Device.CUDA),
        [1],
        duration=1.0,
        size=(320, 240),
        warmup=0.2,
        progress=False,
        rounds=1,
    )
    assert report["device"] == "cuda:0" and report["direct"]["requests"] > 0
