"""A streamed derender's calls go to one render process while it can take them
(``forwarding.stream_affinity``, ``VllmWorkerPool.lease``), where its parser waits
(``parsed_streams``); the least loaded process otherwise."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from mmprep_runtime.backends.vllm.forwarding import stream_affinity
from mmprep_runtime.backends.vllm.worker_pool import VllmWorkerPool

DERENDER = "/v1/chat/completions/derender"


def _call(request_id: str, **fields: object) -> dict[str, object]:
    return {"stream": True, "generate_chunk": {"request_id": request_id, "choices": []}, **fields}


@pytest.fixture
def pool() -> Iterator[VllmWorkerPool]:
    made = VllmWorkerPool("m", 3)
    for worker in made._workers:  # started and answering, as the watcher marks them
        worker.ready = True
    yield made
    made.close(0.1)


def _leased(pool: VllmWorkerPool, affinity: int | None) -> int:
    with pool.lease(affinity) as endpoint:
        return pool.socket_paths.index(endpoint.http)


def test_every_call_of_one_stream_has_one_number_and_other_calls_none() -> None:
    numbers = {stream_affinity(DERENDER, _call("r-1", stream_state={"n": i})) for i in range(5)}
    assert len(numbers) == 1 and None not in numbers
    assert stream_affinity(DERENDER, _call("r-2")) not in numbers | {None}
    assert stream_affinity(DERENDER, {"generate_response": {"request_id": "r-1"}}) is None  # whole
    assert stream_affinity("/v1/completions/derender", _call("r-1")) is None
    assert stream_affinity(DERENDER, None) is None and stream_affinity(DERENDER, _call(5)) is None  # type: ignore[arg-type]


def test_a_stream_goes_to_its_process_unless_it_is_busier_or_down(pool: VllmWorkerPool) -> None:
    assert _leased(pool, None) == 0  # the least loaded, the first of equals
    assert _leased(pool, 4) == 1 and _leased(pool, 5) == 2
    with contextlib.ExitStack() as held:
        held.enter_context(pool.lease(4))  # one request on process 1: still within one of the others
        assert _leased(pool, 4) == 1
        held.enter_context(pool.lease(4))  # two: the stream goes to the least loaded instead
        assert _leased(pool, 4) == 0
    pool._workers[1].ready = False
    assert _leased(pool, 4) == 0
