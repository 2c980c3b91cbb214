"""The HTTP API under load and failure: a full queue, a deadline, a client that leaves, a bug, a
processor that cannot be cloned or loaded, workers whose clones fail; and the pod reporting the
operator's decision. Real processors, real sockets, a real client, as in ``test_http_api``.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable

import aiohttp
import pytest
from conftest import QWEN_TEXT, TIMEOUT, b64

from mmprep_runtime.contract import PoolDecisionEnv
from mmprep_runtime.engine import pipeline
from mmprep_runtime.settings import Load
from mmprep_runtime.sizing import ComputePath, WorkerReason
from mmprep_runtime.synthetic.media import jpeg as jpeg_bytes


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


async def _metrics_once_the_blocker_ends(running, release: threading.Event, blocker, good: dict) -> str:
    """Let the job that holds the only worker finish, check the pool serves again, read the metrics."""
    release.set()
    blocker.result(TIMEOUT)
    assert (await running.post(good))[0] == 200
    async with running.client.get(f"{running.url}/metrics") as response:
        return await response.text()


async def test_a_request_past_its_deadline_answers_504_and_its_job_is_dropped(start_server, qwen_dir):
    running = await start_server(qwen_dir, workers=1, load=Load(deadline_s=0.5))
    engine = running.state.engine
    release = threading.Event()
    blocker = engine.pool.submit(lambda processor: release.wait(TIMEOUT))
    good = {"text": QWEN_TEXT, "images": [b64(jpeg_bytes(56, 56))]}
    status, _, body = await running.post(good)
    assert status == 504 and b"deadline" in body
    metrics = await _metrics_once_the_blocker_ends(running, release, blocker, good)
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
    metrics = await _metrics_once_the_blocker_ends(running, release, blocker, good)
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


def _operator_env(pool: str, workers: int, reason: WorkerReason) -> dict[str, str]:
    """The env the operator writes into a pool's pods (its own rendering of the decision)."""
    carried = PoolDecisionEnv(pool, ComputePath.CPU, workers, 2, reason)
    return {e["name"]: e["value"] for e in carried.to_env()}


async def test_the_pod_reports_the_operators_pool_and_reason(start_server, qwen_dir):
    """A pod the operator started says what the resource's status says: the pool's reason, not
    ``Explicit`` for the count it was handed."""
    running = await start_server(qwen_dir, environ=_operator_env("nvidia-h200", 2, WorkerReason.MEASURED))
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
        uncloneable_dir, trust_remote_code=True, environ=_operator_env("cpu", 2, WorkerReason.CPU_PATH_DEFAULT)
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
