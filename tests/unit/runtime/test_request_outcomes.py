"""The request histogram by outcome class: served answers apart from refusals and errors, so a
flood of fast 429s cannot hide the latency of what was served (the PrometheusRule's p95 uses ok)."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import threading
import time

import pytest

from mmprep_runtime import errors
from mmprep_runtime.settings import Load, ModelSettings, ServeSettings
from mmprep_runtime.sizing import Device
from mmprep_runtime.synthetic import models
from mmprep_runtime.synthetic.media import jpeg

TIMEOUT = 60


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        ("ok", "ok"),
        (errors.Overloaded.code, "rejected"),
        (errors.NotReady.code, "rejected"),
        (errors.BadMedia.code, "client_error"),
        (errors.MediaTooLarge.code, "client_error"),
        (errors.CLIENT_GONE, "client_error"),
        (errors.DeadlineExceeded.code, "server_error"),
        (errors.InternalError.code, "server_error"),
        ("a-code-nobody-defined", "server_error"),
    ],
)
def test_each_answer_code_falls_in_one_outcome_class(code: str, outcome: str) -> None:
    assert errors.outcome_class(code) == outcome
    assert outcome in errors.OUTCOME_CLASSES


def test_an_error_class_defined_after_the_first_answer_still_has_its_class() -> None:
    # fetching defines its own errors: a table built at the first answer must not miss them.
    script = (
        "from mmprep_runtime import errors; assert errors.outcome_class('bad_media') == 'client_error'; "
        "from mmprep_runtime.httpio import fetching; "
        "print(errors.outcome_class(fetching.FetchRefused.code), errors.outcome_class(fetching.FetchTimedOut.code))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT, check=True)
    assert done.stdout.split() == ["client_error", "client_error"], done.stdout


@pytest.mark.parametrize(
    ("raised", "answer", "fragment"),
    [
        (ValueError("Image features and image tokens do not match"), errors.Unprocessable, "ValueError: Image features"),
        (KeyError("pixel_values"), errors.Unprocessable, "KeyError"),
        (RuntimeError("CUDA error: device-side assert"), errors.ProcessorFailed, "RuntimeError: CUDA error"),
        # A check between two processor steps keeps its own answer, not the processor-bug one.
        (errors.Unprocessable("2 image placeholder(s) for 1 image(s)"), errors.Unprocessable, "placeholder"),
        (errors.MediaTooLarge("too many pixels"), errors.MediaTooLarge, "too many pixels"),
    ],
)
def test_what_a_processor_raises_becomes_the_request_s_answer(
    raised: Exception, answer: type[errors.RequestError], fragment: str
) -> None:
    with pytest.raises(errors.RequestError) as caught, errors.processor_call():
        raise raised
    assert type(caught.value) is answer and fragment in caught.value.message


def sample(metrics: str, name: str, outcome: str) -> float:
    prefix = f'{name}{{outcome="{outcome}"}} '
    line = next(line for line in metrics.splitlines() if line.startswith(prefix))
    return float(line[len(prefix) :])


async def test_rejections_and_bad_input_do_not_land_in_the_served_latency(qwen_dir, serve) -> None:
    settings = ServeSettings(
        model=ModelSettings(str(qwen_dir), device=Device.CPU),
        host="127.0.0.1",
        port=0,
        processor_workers=1,
        io_workers=1,
        load=Load(queue_size=0),
    )
    served = await serve(settings)
    state, url = served.state, served.url
    good = json.dumps({"text": f"a {models.QWEN_IMAGE_PLACEHOLDER}", "images": [base64.b64encode(jpeg(56, 56)).decode()]})
    release = threading.Event()
    client = served.client
    try:

        async def post(body: str) -> int:
            async with client.post(f"{url}/v1/preprocess", data=body, headers={"Content-Type": "application/json"}) as r:
                await r.read()
                return r.status

        blocker = state.engine.pool.submit(lambda processor: release.wait(TIMEOUT))
        first = asyncio.create_task(post(good))
        deadline = time.monotonic() + TIMEOUT
        while state.admission.in_flight != 1:
            assert time.monotonic() < deadline, "the first request never took its slot"
            await asyncio.sleep(0.01)
        assert await post(good) == 429
        release.set()
        blocker.result(TIMEOUT)
        assert await first == 200
        assert await post("{not json") == 400
        assert await post(good) == 200
        async with client.get(f"{url}/metrics") as response:
            metrics = await response.text()
    finally:
        release.set()
    count = "mmprep_request_seconds_count"
    assert [sample(metrics, count, o) for o in errors.OUTCOME_CLASSES] == [2.0, 1.0, 1.0, 0.0]
    # The served latency includes the wait behind the blocker; the refusal was immediate.
    assert sample(metrics, "mmprep_request_seconds_sum", "ok") > sample(metrics, "mmprep_request_seconds_sum", "rejected")
    assert sample(metrics, "mmprep_requests_total", "overloaded") == 1.0
