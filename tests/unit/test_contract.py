"""The operator-runtime contract: the decision env and the probe answer, read back as written."""

from __future__ import annotations

import json

import pytest

from mmprep_runtime import contract
from mmprep_runtime.contract import ContractError, PoolDecisionEnv, ProbeAnswer
from mmprep_runtime.sizing import MAX_WORKERS, ComputePath, WorkerCountError, WorkerReason, check_worker_count


def _environ(decision: PoolDecisionEnv) -> dict[str, str]:
    return {e["name"]: e["value"] for e in decision.to_env()}


@pytest.mark.parametrize("path", list(ComputePath))
@pytest.mark.parametrize("reason", [WorkerReason.GPU_PATH_CAP, WorkerReason.MEASURED, WorkerReason.CPU_PATH_DEFAULT])
def test_the_decision_env_reads_back_as_written(path: ComputePath, reason: WorkerReason) -> None:
    decision = PoolDecisionEnv("nvidia-h200", path, 3, 4, reason)
    assert PoolDecisionEnv.from_environ(_environ(decision)) == decision


def test_a_pod_started_by_hand_has_no_operator_decision() -> None:
    assert PoolDecisionEnv.from_environ({contract.ENV_PROCESSOR_WORKERS: "3"}) is None


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({contract.ENV_DECISION_REASON: "Because"}, contract.ENV_DECISION_REASON),
        ({contract.ENV_PROCESSOR_WORKERS: "two"}, contract.ENV_PROCESSOR_WORKERS),
        ({contract.ENV_IO_WORKERS: str(MAX_WORKERS + 1)}, contract.ENV_IO_WORKERS),
        ({contract.ENV_DEVICE: "tpu"}, contract.ENV_DEVICE),
        ({contract.ENV_POOL: ""}, contract.ENV_POOL),
    ],
)
def test_a_malformed_decision_env_is_refused_naming_the_variable(change: dict[str, str], named: str) -> None:
    environ = _environ(PoolDecisionEnv("cpu", ComputePath.CPU, 2, 4, WorkerReason.CPU_PATH_DEFAULT)) | change
    with pytest.raises(ContractError, match=named):
        PoolDecisionEnv.from_environ(environ)


@pytest.mark.parametrize("value", [0, MAX_WORKERS + 1, True, 2.0, "2"])
def test_one_bounds_check_refuses_what_is_not_a_worker_count(value: object) -> None:
    with pytest.raises(WorkerCountError, match="processor workers"):
        check_worker_count("processor workers", value)
    assert check_worker_count("processor workers", MAX_WORKERS) == MAX_WORKERS


def test_the_probe_answer_reads_back_as_written_and_always_fits() -> None:
    answer = ProbeAnswer(model="m", cloneable=True, fast_image_processor=True, declared_workers=2, path_if_gpu=ComputePath.GPU)
    assert ProbeAnswer.from_message(answer.to_message()) == answer
    huge = ProbeAnswer(model="m" * 10_000, cloneable=False, error="x" * 10_000)
    message = huge.to_message()
    assert len(message.encode()) <= contract.PROBE_ANSWER_MAX_BYTES
    assert ProbeAnswer.from_message(message).error == "x" * 500


def test_an_older_operator_reads_a_newer_runtimes_answer() -> None:
    assert ProbeAnswer.from_message(json.dumps({"cloneable": True, "added_later": 1})).cloneable is True


@pytest.mark.parametrize(
    ("message", "says"),
    [
        ("nope", "not JSON"),
        ("[1]", "not a JSON object"),
        ("{}", "cloneable"),
        ('{"cloneable": true, "path_if_gpu": "tpu"}', "path_if_gpu"),
    ],
)
def test_a_garbled_probe_answer_says_what_is_wrong(message: str, says: str) -> None:
    with pytest.raises(ContractError, match=says):
        ProbeAnswer.from_message(message)
