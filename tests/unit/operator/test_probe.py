"""The probe: what its hash depends on, and how its Job's state and termination message are read."""

from __future__ import annotations

import json

from conftest import DATA, gpu_spec, make_spec

from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.logic import probe

POLICY = OperatorPolicy()


def test_hash_ignores_what_the_probe_does_not_depend_on() -> None:
    base = probe.probe_hash(make_spec(), POLICY)
    same = [
        make_spec(replicas=9),
        make_spec(workers={"processor": 3, "io": 2}),
        make_spec(nodeSelector={"zone": "a"}, tolerations=[{"operator": "Exists"}]),
        make_spec(probe={"timeoutSeconds": 60, "nodeSelector": {"x": "y"}}),
        make_spec(device="cpu"),
        gpu_spec(),
    ]
    assert {probe.probe_hash(s, POLICY) for s in same} == {base}


def test_hash_changes_with_what_loads() -> None:
    base = probe.probe_hash(make_spec(), POLICY)
    different = [
        make_spec(model={"path": "/models/other"}),
        make_spec(model={"path": "/models/m", "revision": "v2"}),
        make_spec(model={"path": "/models/m", "trustRemoteCode": True}),
        make_spec(backend="pil"),
        make_spec(image="other:1"),
        make_spec(volumes=[{"name": "m", "emptyDir": {}}], volumeMounts=[{"name": "m", "mountPath": "/models"}]),
        make_spec(env=[{"name": "HF_HUB_OFFLINE", "value": "1"}]),
    ]
    hashes = {probe.probe_hash(s, POLICY) for s in different}
    assert base not in hashes and len(hashes) == len(different)
    assert probe.probe_hash(make_spec(), POLICY, reprobe="1") != base
    assert probe.probe_hash(make_spec(), OperatorPolicy(defaultImage="site/runtime:2")) != base


def job(*conditions: tuple[str, str], active: int = 0, deadline: int = 300) -> dict:
    return {
        "spec": {"activeDeadlineSeconds": deadline},
        "status": {"active": active, "conditions": [{"type": t, "status": "True", "reason": r} for t, r in conditions]},
    }


def pod(phase: str, message: str | None, created: str = "2026-01-01T00:00:00Z") -> dict:
    terminated = {"exitCode": 0 if phase == "Succeeded" else 1}
    if message is not None:
        terminated["message"] = message
    return {
        "metadata": {"creationTimestamp": created},
        "status": {"phase": phase, "containerStatuses": [{"name": "probe", "state": {"terminated": terminated}}]},
    }


def test_running_and_pending_jobs() -> None:
    assert probe.read_outcome(None, []).state == "Pending"
    assert probe.read_outcome(job(), []).state == "Pending"
    assert probe.read_outcome(job(active=1), []).state == "Running"


def test_a_completed_job_yields_the_parsed_result() -> None:
    message = (DATA / "probe.json").read_text()
    outcome = probe.read_outcome(job(("Complete", "")), [pod("Succeeded", message)])
    assert outcome.state == "Succeeded"
    assert outcome.result is not None
    assert (outcome.result.cloneable, outcome.result.fast_image_processor, outcome.result.declared_workers) == (True, True, 2)
    assert outcome.result.processor_class == "Qwen2VLProcessor"


def test_unreadable_output_is_a_failure_with_the_text() -> None:
    outcome = probe.read_outcome(job(("Complete", "")), [pod("Succeeded", "Segmentation fault")])
    assert (outcome.state, outcome.reason) == ("Failed", "ProbeOutputUnreadable")
    assert "Segmentation fault" in (outcome.message or "")
    outcome = probe.read_outcome(job(("Complete", "")), [pod("Succeeded", None)])
    assert outcome.reason == "ProbeOutputUnreadable"


def test_a_model_that_does_not_load_reports_the_probes_error() -> None:
    failing = json.dumps({"cloneable": False, "error": "OSError: /models/m is not a processor folder"})
    outcome = probe.read_outcome(
        job(("Failed", "BackoffLimitExceeded")),
        [pod("Failed", "older", "2026-01-01T00:00:00Z"), pod("Failed", failing, "2026-01-01T00:01:00Z")],
    )
    assert (outcome.state, outcome.reason) == ("Failed", "ProbeFailed")
    assert outcome.message == "the model did not load: OSError: /models/m is not a processor folder"


def test_a_deadline_is_a_timeout_and_log_tails_are_cut() -> None:
    outcome = probe.read_outcome(job(("Failed", "DeadlineExceeded"), deadline=60), [pod("Failed", "x" * 5000)])
    assert (outcome.state, outcome.reason) == ("Failed", "ProbeTimedOut")
    assert "within 60s" in (outcome.message or "") and len(outcome.message or "") < 800


def test_parse_result_reads_the_wire_names_and_rejects_garbage() -> None:
    result = probe.parse_result('{"cloneable": true, "fast_image_processor": true, "path_if_gpu": "gpu"}')
    assert (result.fast_image_processor, result.path_if_gpu) == (True, "gpu")
    assert result.wire()["fastImageProcessor"] is True  # kept in status under the API's names
    for bad in (
        "[]",
        "{}",
        "nope",
        '{"cloneable": true, "path_if_gpu": "tpu"}',
        '{"cloneable": true, "declared_workers": "two"}',
    ):
        try:
            probe.parse_result(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was accepted")


def test_the_runtimes_own_answers_parse() -> None:
    """Contract with ``mmprep-runtime probe``: its failure answer (built by the runtime's own code)
    and a recorded success answer (captured from it on a qwen2-vl folder) both parse."""
    from mmprep_runtime.commands import probe as runtime_probe

    failed = runtime_probe.failure("/models/m", "model folder '/models/m' does not exist").to_message()
    outcome = probe.read_outcome(job(("Failed", "BackoffLimitExceeded")), [pod("Failed", failed)])
    assert outcome.message == "the model did not load: model folder '/models/m' does not exist"

    recorded = (DATA / "probe-runtime-qwen2-vl.json").read_text()
    result = probe.parse_result(recorded)
    assert (result.cloneable, result.fast_image_processor, result.declared_workers, result.path_if_gpu) == (True, True, 2, "gpu")
    assert result.versions["transformers"]
