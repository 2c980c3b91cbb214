"""The HTTP API end to end on a real port: real processors, real sockets, a real client.

Every bad input gets its 4xx JSON error naming the problem, and a good request right after it
succeeds: the pool keeps serving.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import struct
import threading
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from conftest import Served

from mmprep_runtime import cli, testing_models
from mmprep_runtime.contract import PoolDecisionEnv
from mmprep_runtime.engine import core as engine_module
from mmprep_runtime.engine import pipeline
from mmprep_runtime.settings import Limits, Load, ModelSettings, ServeSettings, serve_settings_from_args
from mmprep_runtime.sizing import Backend, Device, Path, Reason
from mmprep_runtime.testing_media import jpeg as jpeg_bytes
from mmprep_runtime.testing_media import png as png_bytes
from mmprep_runtime.testing_media import wav as wav_bytes

TIMEOUT = 60
QWEN_TEXT = f"Describe {testing_models.QWEN_IMAGE_PLACEHOLDER} please"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Running(Served):
    async def post(self, payload: Any = None, *, data: bytes | None = None, headers=None, query: str = ""):
        if data is None:
            data = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", **(headers or {})}
        async with self.client.post(f"{self.url}/v1/preprocess{query}", data=data, headers=headers) as response:
            body = await response.read()
            return response.status, dict(response.headers), body

    async def json(self, path: str) -> tuple[int, Any]:
        async with self.client.get(f"{self.url}{path}") as response:
            return response.status, await response.json()


Starter = Callable[..., Awaitable[Running]]


def _serve_args(folder) -> argparse.Namespace:
    return cli.build_parser().parse_args(["serve", "--model", str(folder)])


@pytest.fixture
def start_server(serve: Callable[[ServeSettings], Awaitable[Served]]) -> Starter:
    async def start(
        folder,
        *,
        workers: int | None = 1,
        limits: Limits = Limits(),
        load: Load = Load(),
        trust_remote_code: bool = False,
        backend: Backend = Backend.AUTO,
        environ: dict[str, str] | None = None,
    ) -> Running:
        """``environ``: the pod's env as the operator renders it; it replaces ``workers``."""
        decided = serve_settings_from_args(_serve_args(folder), environ) if environ is not None else None
        if decided is not None:
            workers = decided.processor_workers
        settings = ServeSettings(
            model=ModelSettings(str(folder), trust_remote_code=trust_remote_code, backend=backend, device=Device.CPU),
            host="127.0.0.1",
            port=0,
            processor_workers=workers,
            io_workers=2,
            limits=limits,
            load=load,
            operator_decision=decided.operator_decision if decided is not None else None,
        )
        served = await serve(settings)
        return Running(served.url, served.app, served.client)

    return start


async def test_qwen_end_to_end_json_and_safetensors(start_server, qwen_dir):
    from safetensors.torch import load

    running = await start_server(qwen_dir, workers=2)
    assert await running.json("/healthz") == (200, {"status": "ok"})
    assert await running.json("/readyz") == (200, {"ready": True})
    payload = {"text": QWEN_TEXT, "images": [b64(jpeg_bytes(112, 84))]}
    status, headers, body = await running.post(payload)
    assert status == 200, body
    answer = json.loads(body)
    tensors = answer["tensors"]
    assert tensors["pixel_values"]["dtype"] == "float32" and tensors["pixel_values"]["shape"][1] == 1176
    assert tensors["image_grid_thw"]["shape"] == [1, 3]
    assert len(answer["input_ids"][0]) == tensors["input_ids"]["shape"][1]

    status, headers, body = await running.post(payload, query="?format=safetensors")
    assert status == 200 and headers["Content-Type"] == "application/octet-stream"
    loaded = load(body)
    assert list(loaded["pixel_values"].shape) == tensors["pixel_values"]["shape"]
    status, headers, body = await running.post(payload, headers={"Accept": "application/octet-stream"})
    assert status == 200 and load(body)["input_ids"].tolist() == answer["input_ids"]

    status, info = await running.json("/v1/info")
    assert status == 200
    assert info["processor_class"] == "Qwen2VLProcessor" and info["path"] == "cpu"
    assert info["workers"]["processor"] == 2 and info["workers"]["reason"] == "Explicit"
    assert info["cloneable"] is True and info["clone_seconds"] >= 0

    async with running.client.get(f"{running.url}/metrics") as response:
        metrics = await response.text()
    assert 'mmprep_requests_total{outcome="ok"} 3.0' in metrics
    assert "mmprep_processor_workers 2.0" in metrics
    assert "mmprep_processing_seconds_count" in metrics and "mmprep_queue_wait_seconds_bucket" in metrics
    assert "mmprep_clone_seconds " in metrics and "mmprep_workers_busy_fraction" in metrics


async def test_pil_backend_serves_the_same_shapes(start_server, qwen_dir):
    running = await start_server(qwen_dir, backend=Backend.PIL)
    status, _, body = await running.post({"text": QWEN_TEXT, "images": [b64(png_bytes(112, 84))]})
    assert status == 200, body
    assert (await running.json("/v1/info"))[1]["image_processor_class"] == "Qwen2VLImageProcessorPil"


async def test_llava_whisper_and_a_bare_tokenizer_are_served(start_server, llava_dir, whisper_dir, tokenizer_dir):
    llava = await start_server(llava_dir)
    status, _, body = await llava.post({"text": "what is <image>?", "images": [b64(jpeg_bytes())]})
    assert status == 200, body
    assert json.loads(body)["tensors"]["pixel_values"]["shape"] == [1, 3, 224, 224]

    whisper = await start_server(whisper_dir)
    status, _, body = await whisper.post({"text": "hello", "audio": [b64(wav_bytes(rate=8000))]})
    assert status == 200, body
    assert json.loads(body)["tensors"]["input_features"]["shape"] == [1, 80, 3000]

    bare = await start_server(tokenizer_dir)
    status, _, body = await bare.post({"text": "a cat on a mat"})
    assert status == 200, body
    assert json.loads(body)["input_ids"]
    status, _, body = await bare.post({"text": "x", "images": [b64(jpeg_bytes())]})
    assert status == 422 and b"takes no images" in body


def _png_bomb(side: int = 30000) -> bytes:
    """A real decompression bomb: a 30000x30000 1-bit PNG of about 100 KB."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" * (1 + side // 8)
    compressor = zlib.compressobj(9)
    data = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def _medium_png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (3000, 2000), (1, 2, 3)).save(buffer, format="PNG")
    return buffer.getvalue()


BAD_INPUTS = [
    ("invalid JSON", {"data": b'{"text": "x",'}, 400, "not valid JSON"),
    ("JSON that is not UTF-8", {"data": b'{"text": "\xff"}'}, 400, "not valid JSON"),
    ("not an object", {"payload": ["text"]}, 400, "must be a JSON object"),
    ("missing text", {"payload": {"images": []}}, 400, "missing 'text'"),
    ("text of the wrong type", {"payload": {"text": 5}}, 400, "'text' must be a string"),
    ("images of the wrong type", {"payload": {"text": "x", "images": 7}}, 400, "must be a list"),
    ("image item of the wrong type", {"payload": {"text": QWEN_TEXT, "images": [1]}}, 400, "images[0]"),
    ("unknown field", {"payload": {"text": "x", "imgs": []}}, 400, "unknown field(s) imgs"),
    ("base64 that is not base64", {"payload": {"text": QWEN_TEXT, "images": ["%%%"]}}, 400, "not valid base64"),
    ("base64 that is not an image", {"payload": {"text": QWEN_TEXT, "images": [b64(b"hello world")]}}, 400, "not an image"),
    (
        "a truncated image",
        {"payload": {"text": QWEN_TEXT, "images": [b64(jpeg_bytes(200, 150)[:700])]}},
        400,
        "could not be decoded",
    ),
    ("a decompression bomb", {"payload": {"text": QWEN_TEXT, "images": [b64(_png_bomb())]}}, 413, "too large"),
    (
        "an image over the pixel cap",
        {"payload": {"text": QWEN_TEXT, "images": [b64(_medium_png())]}},
        413,
        "over the limit of 5000000",
    ),
    (
        "more images than placeholders",
        {"payload": {"text": QWEN_TEXT, "images": [b64(jpeg_bytes()), b64(jpeg_bytes())]}},
        422,
        "1 image placeholder(s)",
    ),
    (
        "more placeholders than images",
        {"payload": {"text": QWEN_TEXT + QWEN_TEXT, "images": [b64(jpeg_bytes())]}},
        422,
        "2 image placeholder(s)",
    ),
    ("audio to an image processor", {"payload": {"text": "x", "audio": [b64(wav_bytes())]}}, 422, "takes no audio"),
    (
        "an image the processor rejects",
        {"payload": {"text": QWEN_TEXT, "images": [b64(png_bytes(2, 600))]}},
        422,
        "processor rejected the input",
    ),
    ("a body over the size limit", {"data": b'{"text": "' + b"x" * 300_000 + b'"}'}, 413, "over the limit"),
    (
        "an unsupported content type",
        {"data": b"text=x", "headers": {"Content-Type": "text/plain"}},
        415,
        "Content-Type must be application/json",
    ),
    ("an unknown answer format", {"payload": {"text": "x"}, "query": "?format=xml"}, 400, "format must be"),
    ("an unacceptable Accept", {"payload": {"text": "x"}, "headers": {"Accept": "image/png"}}, 406, "cannot answer"),
]


@pytest.fixture(params=[True, False], ids=["decode-on-worker", "decode-on-io-pool"])
def decode_on_worker(request, monkeypatch) -> bool:
    """Both places a request can be decoded, whatever this machine's CPU count would choose."""
    monkeypatch.setattr(engine_module, "should_decode_on_worker", lambda *args: request.param)
    return request.param


async def test_both_decoding_places_give_the_same_answers(start_server, qwen_dir, decode_on_worker):
    from safetensors.torch import load

    running = await start_server(qwen_dir, workers=2)
    assert (await running.json("/v1/info"))[1]["decode_on_worker"] is decode_on_worker
    payload = {"text": QWEN_TEXT, "images": [b64(jpeg_bytes(112, 84))]}
    status, _, body = await running.post(payload)
    assert status == 200, body
    answer = json.loads(body)
    assert answer["tensors"]["pixel_values"]["shape"] == [48, 1176]  # 112x84 -> 8x6 patches of 14
    status, _, body = await running.post(payload, query="?format=safetensors")
    assert status == 200 and load(body)["input_ids"].tolist() == answer["input_ids"]
    async with running.client.get(f"{running.url}/metrics") as response:
        assert "mmprep_decode_seconds_count 2.0" in await response.text()


async def test_every_bad_input_gets_a_clear_4xx_and_the_pool_keeps_serving(start_server, qwen_dir, decode_on_worker):
    running = await start_server(qwen_dir, limits=Limits(max_body_bytes=200_000, max_image_pixels=5_000_000))
    assert running.state.engine is not None and running.state.engine.decode_on_worker is decode_on_worker
    good = {"text": QWEN_TEXT, "images": [b64(jpeg_bytes(56, 56))]}
    for case, request, expected_status, fragment in BAD_INPUTS:
        status, _headers, body = await running.post(
            request.get("payload"),
            data=request.get("data"),
            headers=request.get("headers"),
            query=request.get("query", ""),
        )
        assert status == expected_status, (case, body)
        error = json.loads(body)["error"]
        assert fragment in error["message"], (case, error)
        assert error["status"] == expected_status
        good_status, _, good_body = await running.post(good)
        assert good_status == 200, (f"after {case}", good_body)
    status, _ = await running.json("/readyz")
    assert status == 200


async def test_a_chunked_body_is_read_whole_and_held_to_the_size_limit(start_server, qwen_dir):
    """Without a Content-Length the body is read by aiohttp's own reader, which enforces the limit."""
    running = await start_server(qwen_dir, limits=Limits(max_body_bytes=200_000))
    good = json.dumps({"text": QWEN_TEXT, "images": [b64(jpeg_bytes(56, 56))]}).encode()

    def chunked(data: bytes):
        async def pieces():
            for start in range(0, len(data), 1000):
                yield data[start : start + 1000]

        return pieces()

    sized = await running.post(data=good)
    status, _headers, body = await running.post(data=chunked(good))
    assert status == 200, body
    assert body == sized[2]
    status, _, body = await running.post(data=chunked(b'{"text": "' + b"x" * 300_000 + b'"}'))
    assert status == 413 and b"body is over the limit of 200000 bytes" in body, body  # the chunked branch
    assert (await running.post(data=good))[0] == 200


async def test_a_full_queue_answers_429_with_retry_after(start_server, qwen_dir):
    running = await start_server(qwen_dir, workers=1, load=Load(queue_size=0, retry_after_s=3))
    engine = running.state.engine
    release = threading.Event()
    blocker = engine.pool.submit(lambda processor: release.wait(TIMEOUT))  # the only worker is busy
    good = {"text": QWEN_TEXT, "images": [b64(jpeg_bytes(56, 56))]}
    first = asyncio.create_task(running.post(good))
    await _until(lambda: running.state.admission.in_flight == 1)
    status, headers, body = await running.post(good)
    assert status == 429 and headers["Retry-After"] == "3", body
    assert b"request slots are taken" in body
    release.set()
    blocker.result(TIMEOUT)
    assert (await first)[0] == 200
    assert (await running.post(good))[0] == 200


async def test_a_request_past_its_deadline_answers_504_and_its_job_is_dropped(start_server, qwen_dir):
    running = await start_server(qwen_dir, workers=1, load=Load(deadline_s=0.5))
    engine = running.state.engine
    release = threading.Event()
    blocker = engine.pool.submit(lambda processor: release.wait(TIMEOUT))
    good = {"text": QWEN_TEXT, "images": [b64(jpeg_bytes(56, 56))]}
    status, _, body = await running.post(good)
    assert status == 504 and b"deadline" in body
    release.set()
    blocker.result(TIMEOUT)
    assert (await running.post(good))[0] == 200
    async with running.client.get(f"{running.url}/metrics") as response:
        metrics = await response.text()
    assert 'mmprep_requests_total{outcome="deadline_exceeded"} 1.0' in metrics
    # the dropped job never ran: only the warm-up job, the blocker and the good request did
    assert "mmprep_processing_seconds_count 3.0" in metrics


async def test_a_client_that_goes_away_frees_its_slot_and_its_queued_job_is_dropped(start_server, qwen_dir):
    running = await start_server(qwen_dir, workers=1)
    engine = running.state.engine
    release = threading.Event()
    blocker = engine.pool.submit(lambda processor: release.wait(TIMEOUT))
    good = {"text": QWEN_TEXT, "images": [b64(jpeg_bytes(56, 56))]}
    impatient = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5))
    try:
        with pytest.raises(asyncio.TimeoutError):
            await impatient.post(f"{running.url}/v1/preprocess", json=good)
    finally:
        await impatient.close()
    await _until(lambda: running.state.admission.in_flight == 0)
    release.set()
    blocker.result(TIMEOUT)
    assert (await running.post(good))[0] == 200
    async with running.client.get(f"{running.url}/metrics") as response:
        metrics = await response.text()
    assert 'mmprep_requests_total{outcome="client_gone"} 1.0' in metrics
    assert "mmprep_processing_seconds_count 3.0" in metrics  # warm-up, blocker, the good one


async def test_an_unexpected_failure_is_a_json_500_and_counted(start_server, tokenizer_dir, monkeypatch):
    running = await start_server(tokenizer_dir)

    def broken(*args, **kwargs):
        raise AssertionError("a bug")

    monkeypatch.setattr(pipeline, "decode_request", broken)
    status, _, body = await running.post({"text": "x"})
    assert status == 500 and json.loads(body)["error"]["code"] == "internal_error"
    async with running.client.get(f"{running.url}/metrics") as response:
        assert 'mmprep_requests_total{outcome="internal_error"} 1.0' in await response.text()


async def test_an_uncloneable_processor_serves_on_one_worker_and_reports_it(start_server, uncloneable_dir):
    running = await start_server(uncloneable_dir, workers=3, trust_remote_code=True)
    status, _, body = await running.post({"text": "what is <image>?", "images": [b64(jpeg_bytes())]})
    assert status == 200, body
    status, info = await running.json("/v1/info")
    assert info["workers"]["processor"] == 1 and info["workers"]["reason"] == "NotCloneable"
    assert info["workers"]["explicit_not_honoured"] == 3 and info["cloneable"] is False
    async with running.client.get(f"{running.url}/metrics") as response:
        metrics = await response.text()
    assert "mmprep_processor_cloneable 0.0" in metrics and 'reason="NotCloneable"' in metrics


def _operator_env(pool: str, workers: int, reason: Reason) -> dict[str, str]:
    """The env the operator writes into a pool's pods (its own rendering of the decision)."""
    carried = PoolDecisionEnv(pool, Path.CPU, workers, 2, reason)
    return {e["name"]: e["value"] for e in carried.to_env()}


async def test_the_pod_reports_the_operators_pool_and_reason(start_server, qwen_dir):
    """A pod the operator started says what the resource's status says: the pool's reason, not
    ``Explicit`` for the count it was handed."""
    running = await start_server(qwen_dir, environ=_operator_env("nvidia-h200", 2, Reason.MEASURED))
    status, info = await running.json("/v1/info")
    assert status == 200
    assert info["pool"] == "nvidia-h200"
    assert (info["workers"]["processor"], info["workers"]["reason"]) == (2, "Measured"), info["workers"]
    assert "pool nvidia-h200" in info["workers"]["message"]
    async with running.client.get(f"{running.url}/metrics") as response:
        metrics = await response.text()
    assert 'pool="nvidia-h200"' in metrics and 'reason="Measured"' in metrics


async def test_a_cap_the_pod_finds_itself_beats_the_operators_reason(start_server, uncloneable_dir):
    running = await start_server(
        uncloneable_dir, trust_remote_code=True, environ=_operator_env("cpu", 2, Reason.CPU_PATH_DEFAULT)
    )
    _status, info = await running.json("/v1/info")
    assert (info["pool"], info["workers"]["processor"], info["workers"]["reason"]) == ("cpu", 1, "NotCloneable")


async def test_a_processor_that_cannot_load_reports_unhealthy(start_server, uncloneable_dir):
    running = await start_server(uncloneable_dir)  # remote code, not trusted
    status, body = await running.json("/healthz")
    assert status == 500 and "trust_remote_code" in body["error"]
    assert (await running.json("/readyz"))[0] == 503
    status, _, body = await running.post({"text": "x"})
    assert status == 503 and b"not ready" in body


async def _until(condition: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    async def wait() -> None:
        while not condition():  # noqa: ASYNC110 - the condition changes on pool threads; there is no event to await
            await asyncio.sleep(0.01)

    await asyncio.wait_for(wait(), timeout)


async def test_the_clone_guard_catches_a_job_that_uses_the_original_processor(start_server, qwen_dir):
    # The control for the guard every server in these tests carries: a job closing over the
    # original instead of taking its clone fails.
    running = await start_server(qwen_dir, workers=2)
    engine = running.state.engine
    original = engine.pool._resolve()
    with pytest.raises(AssertionError, match="instead of its worker's clone"):
        engine.pool.submit(lambda _clone: original.tokenizer).result(TIMEOUT)
    assert engine.pool.submit(lambda clone: type(clone.tokenizer).__name__).result(TIMEOUT)


async def test_concurrent_requests_across_workers_answer_exactly_as_a_serial_run(start_server, qwen_dir):
    from safetensors.torch import load

    # 8 requests: within the 10 request slots of 2 workers, so all of them are in flight at once.
    payloads = [{"text": QWEN_TEXT, "images": [b64(jpeg_bytes(56 + 28 * (i % 4), 56 + 14 * (i % 3), seed=i))]}
                for i in range(8)]  # fmt: skip
    serial = await start_server(qwen_dir, workers=1)
    expected = []
    for payload in payloads:
        status, _, body = await serial.post(payload, query="?format=safetensors")
        assert status == 200, body
        expected.append(load(body))
    parallel = await start_server(qwen_dir, workers=2)
    answers = await asyncio.gather(*(parallel.post(p, query="?format=safetensors") for p in payloads))
    assert parallel.state.engine.pool.workers == 2
    for (status, _, body), want in zip(answers, expected, strict=True):
        assert status == 200, body
        got = load(body)
        assert got.keys() == want.keys()
        for name in want:
            assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
            assert (got[name] == want[name]).all(), name
    # Both workers served: the comparison covers answers made by each clone, not by one.
    assert len(parallel.state.engine.pool.clone_seconds) == 2 and parallel.state.engine.pool.busy_seconds > 0


def _worker_clones_failing_after(monkeypatch, good: int) -> None:
    """The first ``good`` processor clones made by pool workers work, later ones fail; loading,
    the start-up probe (other threads) and copies inside processing are left alone."""
    from conftest import POOL_THREAD_PREFIX
    from transformers import ProcessorMixin

    from mmprep_runtime.engine import executor

    real = executor.copy.deepcopy
    clones = [0]
    inside = threading.local()  # a processor's deepcopy may recurse into deepcopy: count the outer one

    def deepcopy(obj, memo=None):
        outer = not getattr(inside, "depth", 0)
        if outer and isinstance(obj, ProcessorMixin) and threading.current_thread().name.startswith(POOL_THREAD_PREFIX):
            clones[0] += 1
            if clones[0] > good:
                raise MemoryError("cannot allocate the processor's tables")
        inside.depth = getattr(inside, "depth", 0) + 1
        try:
            return real(obj, memo)
        finally:
            inside.depth -= 1

    monkeypatch.setattr(executor.copy, "deepcopy", deepcopy)


async def test_a_worker_whose_clone_fails_after_the_probe_retires_and_the_server_keeps_serving(
    start_server, qwen_dir, monkeypatch
):
    _worker_clones_failing_after(monkeypatch, good=1)  # one worker clones, the other cannot
    running = await start_server(qwen_dir, workers=2)
    assert await running.json("/readyz") == (200, {"ready": True})
    _status, info = await running.json("/v1/info")
    assert info["workers"]["processor"] == 2 and info["workers"]["live"] == 1
    assert "MemoryError" in info["workers"]["retired"][0]["error"]
    for seed in range(3):
        code, _, body = await running.post({"text": QWEN_TEXT, "images": [b64(jpeg_bytes(56, 56, seed=seed))]})
        assert code == 200, body
    async with running.client.get(f"{running.url}/metrics") as response:
        metrics = await response.text()
    assert "mmprep_processor_workers_live 1.0" in metrics
    assert "mmprep_processor_workers_retired_total 1.0" in metrics


async def test_with_no_worker_left_the_server_is_not_ready_and_says_why(start_server, qwen_dir, monkeypatch):
    _worker_clones_failing_after(monkeypatch, good=0)  # the start-up probe copies, no worker can
    running = await start_server(qwen_dir, workers=2)
    status, body = await running.json("/readyz")
    assert status == 503 and "no processor worker left" in body["reason"]
    # /health (the render API pods' probe) and a refused request give the same answer as /readyz.
    async with running.client.get(f"{running.url}/health") as response:
        assert response.status == 503
    models_status, models = await running.json("/v1/models")
    assert models_status == 503 and "no processor worker left" in models["error"]["message"], models
    code, _, answer = await running.post({"text": QWEN_TEXT, "images": [b64(jpeg_bytes(56, 56))]})
    assert code == 503 and "no processor worker left" in json.loads(answer)["error"]["message"], answer
