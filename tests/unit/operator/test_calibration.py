"""Calibration Jobs: what they run and where, how their answer is read, and how it feeds the decision."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from conftest import H200, make_node
from fake_kube import FakeKubeApi

from mmprep_operator import api
from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.control.metrics import Metrics
from mmprep_operator.control.reconcile import Reconciler
from mmprep_operator.logic import calibration, pools
from mmprep_runtime.calibration_report import PROCESSOR_WORKERS, RENDER_PROCESSES, CurvePoint, Dimension, Report

PROBE_OK = json.dumps({"cloneable": True, "fast_image_processor": True, "processor_class": "P"})
PROBE_NOT_CLONEABLE = json.dumps({"cloneable": False, "error": "boom", "fast_image_processor": True})
CPU_SPEC = {
    "model": {"path": "/models/m"},
    "replicas": 2,
    "workers": {"calibrate": True},
    "resources": {"requests": {"cpu": "4"}, "limits": {"cpu": "4", "memory": "4Gi"}},
}


def report(chosen: int, *rates: float, dimension: Dimension = PROCESSOR_WORKERS) -> str:
    points = tuple(CurvePoint(w, r, 10.0 * w, 20.0 * w) for w, r in enumerate(rates, start=1))
    best = max(points, key=lambda p: p.req_per_s).workers
    return Report(
        curve=points, chosen=chosen, best=best, tolerance=0.05, usable_cpus=4, images=("1280x960",), dimension=dimension
    ).to_message()


class Cluster:
    def __init__(self, policy: OperatorPolicy | None = None, *, gpu_node: bool = False) -> None:
        self.api = FakeKubeApi()
        self.nodes = [make_node("cpu-b", {}), make_node("cpu-a", {})]
        if gpu_node:
            self.nodes.append(make_node("h200-a", H200, gpus=8))
        self.now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        self.reconciler = Reconciler(
            kube=self.api, policy=policy or OperatorPolicy(), nodes=lambda: self.nodes, metrics=Metrics(), clock=lambda: self.now
        )

    async def reconcile(self, name: str = "m"):
        return await self.reconciler.reconcile("ns", name)

    def status(self, name: str = "m") -> dict:
        return self.api.resources[("ns", name)]["status"]

    def pools(self, name: str = "m") -> dict[str, dict]:
        return {p["name"]: p for p in self.status(name)["pools"]}

    def jobs(self, component: str) -> dict[str, dict]:
        return {
            name: job
            for name, job in self.api.kinds("Job").items()
            if job["metadata"]["labels"]["app.kubernetes.io/component"] == component
        }

    async def probed(self, spec: dict, probe: str = PROBE_OK, name: str = "m") -> None:
        self.api.add_resource(name, spec)
        await self.reconcile(name)
        (job,) = self.jobs("probe")
        self.api.finish_job(job, probe)
        await self.reconcile(name)


def env_of(cluster: Cluster, deployment: str) -> dict[str, str]:
    container = cluster.api.objects[("Deployment", "ns", deployment)]["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


async def test_a_pool_serves_with_the_rule_until_its_measurement_arrives_then_rolls_to_it() -> None:
    cluster = Cluster()
    await cluster.probed(CPU_SPEC)
    [(job_name, job)] = cluster.jobs("calibration").items()
    pool = cluster.pools()["cpu"]
    # Serving does not wait: the Deployment exists with the rule's count meanwhile.
    assert (pool["processorWorkers"], pool["reason"]) == (2, "CPUPathDefault")
    assert pool["calibration"]["state"] == "Pending" and pool["calibration"]["job"] == job_name
    assert env_of(cluster, pool["deployment"])["MMPREP_PROCESSOR_WORKERS"] == "2"
    assert cluster.status()["calibrationSummary"] == "cpu=pending"

    # The Job measures on one node of the pool, with the pods' own resources, 1..4 workers.
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["kubernetes.io/hostname"] == "cpu-a"
    container = pod["containers"][0]
    assert container["resources"] == CPU_SPEC["resources"]
    command = container["command"]
    assert command[:2] == ["mmprep-runtime", "calibrate"]
    assert command[command.index("--max-workers") + 1] == "4"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert job["spec"]["backoffLimit"] == 0

    cluster.api.finish_job(job_name, report(3, 50.0, 95.0, 140.0, 141.0))
    outcome = await cluster.reconcile()
    assert outcome.kind == "done"
    pool = cluster.pools()["cpu"]
    assert (pool["processorWorkers"], pool["reason"]) == (3, "Measured")
    cal = pool["calibration"]
    assert (cal["state"], cal["reason"], cal["chosenWorkers"], cal["node"]) == ("Succeeded", "Measured", 3, "cpu-a")
    assert [(p["workers"], p["reqPerS"]) for p in cal["curve"]] == [(1, 50.0), (2, 95.0), (3, 140.0), (4, 141.0)]
    assert cal["measuredAt"] == "2026-01-01T00:00:00Z"
    assert "fewest within 5%" in cal["message"]
    assert env_of(cluster, pool["deployment"])["MMPREP_PROCESSOR_WORKERS"] == "3"
    assert cluster.status()["calibrationSummary"] == "cpu=measured"
    reasons = [e["reason"] for e in cluster.api.events]
    assert "Calibrated" in reasons
    calibrated = next(e for e in cluster.api.events if e["reason"] == "Calibrated")
    assert "4: 141 req/s" in calibrated["message"]


async def test_a_failed_calibration_falls_back_to_the_rule_with_a_reason() -> None:
    cluster = Cluster()
    await cluster.probed(CPU_SPEC)
    (job_name,) = cluster.jobs("calibration")
    cluster.api.finish_job(job_name, "Traceback: killed", succeeded=False, reason="BackoffLimitExceeded")
    await cluster.reconcile()
    pool = cluster.pools()["cpu"]
    assert (pool["processorWorkers"], pool["reason"]) == (2, "CPUPathDefault")
    assert (pool["calibration"]["state"], pool["calibration"]["reason"]) == ("Failed", "CalibrationFailed")
    assert "Traceback: killed" in pool["calibration"]["message"]
    warning = next(e for e in cluster.api.events if e["reason"] == "CalibrationFailed")
    assert warning["type"] == "Warning" and "the rule's count stays" in warning["message"]
    # Settled: no new Job, no retry storm.
    await cluster.reconcile()
    assert len(cluster.jobs("calibration")) == 1


async def test_a_timed_out_calibration_says_so() -> None:
    cluster = Cluster()
    await cluster.probed(CPU_SPEC)
    (job_name,) = cluster.jobs("calibration")
    cluster.api.finish_job(job_name, "", succeeded=False, reason="DeadlineExceeded")
    await cluster.reconcile()
    assert "did not finish within 900s" in cluster.pools()["cpu"]["calibration"]["message"]


async def test_an_unreadable_answer_is_a_failure_not_a_crash() -> None:
    cluster = Cluster()
    await cluster.probed(CPU_SPEC)
    (job_name,) = cluster.jobs("calibration")
    cluster.api.finish_job(job_name, json.dumps({"curve": [], "chosen": 99}))
    await cluster.reconcile()
    cal = cluster.pools()["cpu"]["calibration"]
    assert cal["state"] == "Failed" and "impossible worker count" in cal["message"]
    assert cluster.pools()["cpu"]["reason"] == "CPUPathDefault"


async def test_a_run_that_could_not_measure_reports_its_own_error() -> None:
    cluster = Cluster()
    await cluster.probed(CPU_SPEC)
    (job_name,) = cluster.jobs("calibration")
    cluster.api.finish_job(job_name, Report(error="--samples /data holds no images").to_message(), succeeded=False)
    await cluster.reconcile()
    assert "--samples /data holds no images" in cluster.pools()["cpu"]["calibration"]["message"]


async def test_pods_with_one_cpu_cannot_be_calibrated_and_say_why() -> None:
    cluster = Cluster()
    await cluster.probed({**CPU_SPEC, "resources": {"limits": {"cpu": "1500m"}}})
    cal = cluster.pools()["cpu"]["calibration"]
    assert (cal["state"], cal["reason"]) == ("Unavailable", "CalibrationUnavailable")
    assert "less than 2 CPUs" in cal["message"]
    assert cluster.jobs("calibration") == {}
    assert any(e["reason"] == "CalibrationUnavailable" for e in cluster.api.events)


@pytest.mark.parametrize(
    ("workers", "probe", "why"),
    [
        ({"calibrate": True, "processor": 3}, PROBE_OK, "spec.workers.processor asks for 3"),
        ({"calibrate": True}, PROBE_NOT_CLONEABLE, "cannot be deep-copied"),
    ],
)
async def test_pools_a_higher_rule_decides_are_not_measured(workers: dict, probe: str, why: str) -> None:
    cluster = Cluster()
    await cluster.probed({**CPU_SPEC, "workers": workers}, probe)
    cal = cluster.pools()["cpu"]["calibration"]
    assert (cal["state"], cal["reason"]) == ("NotNeeded", "CalibrationNotNeeded")
    assert why in cal["message"]
    assert cluster.jobs("calibration") == {}


async def test_an_override_wins_and_its_pool_is_not_measured() -> None:
    spec = {**CPU_SPEC, "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": "4"}},
            "workers": {"calibrate": True, "overrides": [{"gpuFamily": "hopper", "processor": 5}]}}  # fmt: skip
    cluster = Cluster(gpu_node=True)
    await cluster.probed(spec)
    pool = cluster.pools()["nvidia-h200-141gb-hbm3e"]
    assert pool["reason"] == "Override" and pool["calibration"]["state"] == "NotNeeded"


async def test_calibration_is_off_unless_asked_for_or_the_policy_says_auto() -> None:
    plain = {k: v for k, v in CPU_SPEC.items() if k != "workers"}
    off = Cluster()
    await off.probed(plain)
    assert off.jobs("calibration") == {} and "calibration" not in off.pools()["cpu"]
    assert "calibrationSummary" not in off.status()

    auto = Cluster(OperatorPolicy.model_validate({"calibration": {"mode": "auto"}}))
    await auto.probed(plain)
    assert len(auto.jobs("calibration")) == 1
    opted_out = Cluster(OperatorPolicy.model_validate({"calibration": {"mode": "auto"}}))
    await opted_out.probed({**plain, "workers": {"calibrate": False}})
    assert opted_out.jobs("calibration") == {}


async def test_resources_with_the_same_inputs_share_one_measurement() -> None:
    cluster = Cluster()
    await cluster.probed(CPU_SPEC, name="a")
    (job_name,) = cluster.jobs("calibration")
    cluster.api.finish_job(job_name, report(2, 50.0, 99.0, 100.0, 101.0))
    await cluster.reconcile("a")
    cluster.api.add_resource("b", CPU_SPEC)
    await cluster.reconcile("b")
    assert len(cluster.jobs("calibration")) == 1
    assert cluster.pools("b")["cpu"]["reason"] == "Measured"


def test_what_the_measurement_depends_on_changes_its_hash() -> None:
    policy = OperatorPolicy()
    spec = api.MultimodalPreprocessorSpec.model_validate(CPU_SPEC)
    grouped = pools.group([make_node("cpu-a", {}), make_node("h200-a", H200, gpus=8)], spec)
    cpu = next(p for p in grouped.pools if p.name == "cpu")
    base = calibration.calibration_hash(spec, policy, cpu)
    assert calibration.calibration_hash(spec, policy, cpu) == base
    changed = [
        api.MultimodalPreprocessorSpec.model_validate({**CPU_SPEC, "image": "other:1"}),
        api.MultimodalPreprocessorSpec.model_validate({**CPU_SPEC, "backend": "pil"}),
        api.MultimodalPreprocessorSpec.model_validate({**CPU_SPEC, "model": {"path": "/models/m", "revision": "r2"}}),
        api.MultimodalPreprocessorSpec.model_validate({**CPU_SPEC, "resources": {"limits": {"cpu": "8"}}}),
    ]
    assert all(calibration.calibration_hash(s, policy, cpu) != base for s in changed)
    assert calibration.calibration_hash(spec, policy, cpu, recalibrate="now") != base
    samples = api.MultimodalPreprocessorSpec.model_validate(
        {**CPU_SPEC, "workers": {"calibrate": True, "calibrationSamples": "/s"}}
    )
    assert calibration.calibration_hash(samples, policy, cpu) != base
    # Replicas and placement do not change what a measurement on the pool's hardware says.
    more = api.MultimodalPreprocessorSpec.model_validate({**CPU_SPEC, "replicas": 9})
    assert calibration.calibration_hash(more, policy, cpu) == base


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ({"limits": {"cpu": "4"}}, 4),
        ({"limits": {"cpu": "2500m"}}, 2),
        ({"requests": {"cpu": 3}}, 3),
        ({"limits": {"cpu": "64"}}, 8),  # the policy's cap
        ({}, 8),  # no CPU given: the runtime caps by the CPUs it finds
    ],
)
def test_the_largest_count_measured_follows_the_pods_cpus(resources: dict, expected: int) -> None:
    spec = api.MultimodalPreprocessorSpec.model_validate({"model": {"path": "/m"}, "resources": resources})
    assert calibration.max_workers(spec, OperatorPolicy()) == expected


def test_policy_rejects_a_malformed_image_size() -> None:
    with pytest.raises(ValueError, match="WIDTHxHEIGHT"):
        OperatorPolicy.model_validate({"calibration": {"imageSizes": ["big"]}})


async def test_the_recalibrate_annotation_measures_again() -> None:
    cluster = Cluster()
    await cluster.probed(CPU_SPEC)
    (first,) = cluster.jobs("calibration")
    cluster.api.finish_job(first, report(2, 50.0, 99.0, 100.0, 101.0))
    await cluster.reconcile()
    cluster.api.resources[("ns", "m")]["metadata"]["annotations"] = {calibration.ANNOTATION_RECALIBRATE: "2026-01-02"}
    await cluster.reconcile()
    assert set(cluster.jobs("calibration")) - {first}
    pool = cluster.pools()["cpu"]
    # The old measurement no longer applies; the rule serves until the new one arrives.
    assert pool["calibration"]["state"] == "Pending" and pool["reason"] == "CPUPathDefault"


def test_the_operator_hears_calibration_jobs_as_it_hears_probes() -> None:
    from mmprep_operator.control import handlers

    admits = handlers._JOB_LABELS["app.kubernetes.io/component"]
    assert admits("calibration") and admits("probe")
    assert not admits("runtime") and not admits(None)


def test_sample_images_from_a_volume_replace_the_synthetic_ones() -> None:
    spec = api.MultimodalPreprocessorSpec.model_validate(
        {**CPU_SPEC, "workers": {"calibrate": True, "calibrationSamples": "/samples/photos"}}
    )
    command = calibration.command(spec, OperatorPolicy())
    assert command[command.index("--samples") + 1] == "/samples/photos" and "--image" not in command
    with pytest.raises(ValueError, match="pattern"):
        api.MultimodalPreprocessorSpec.model_validate({**CPU_SPEC, "workers": {"calibrationSamples": "relative/path"}})


async def test_a_model_declared_not_thread_safe_gets_one_worker_per_pool_and_its_io_workers() -> None:
    probe = json.dumps({"cloneable": True, "fast_image_processor": True, "thread_safe": False, "declared_io_workers": 6})
    cluster = Cluster()
    await cluster.probed({**CPU_SPEC, "workers": {"calibrate": True, "processor": 3}}, probe)
    pool = cluster.pools()["cpu"]
    assert (pool["processorWorkers"], pool["reason"], pool["ioWorkers"]) == (1, "NotThreadSafe", 6)
    assert pool["explicitNotHonoured"] == 3
    assert pool["calibration"]["state"] == "NotNeeded"
    degraded = next(c for c in cluster.status()["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "ExplicitWorkersNotHonoured" and "not thread-safe" in degraded["message"]


# ------------------------------------------------------------------ the general render path: processes

#: What the probe says of a model with no native fast path, in the vLLM image.
PROBE_GENERAL = json.dumps({**json.loads(PROBE_OK), "render_path": "general", "render_path_reason": "no native fast path"})
PROBE_NATIVE = json.dumps({**json.loads(PROBE_OK), "render_path": "native", "render_path_reason": "native fast path"})
VLLM_SPEC = {**CPU_SPEC, "api": "vllm-render", "serving": {"vllmArgs": ["--limit-mm-per-prompt", '{"image": 2}']}}


async def test_the_general_render_path_measures_render_processes_and_the_pods_get_the_count() -> None:
    cluster = Cluster()
    await cluster.probed(VLLM_SPEC, PROBE_GENERAL)
    [(job_name, job)] = cluster.jobs("calibration").items()
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    # The pods' own path and vLLM options: the runtime measures what would serve the model.
    assert command[command.index("--render-path") + 1] == "auto"
    assert """--vllm-args=--limit-mm-per-prompt '{"image": 2}'""" in command
    pool = cluster.pools()["cpu"]
    assert "renderProcesses" not in pool
    assert "MMPREP_RENDER_PROCESSES" not in env_of(cluster, pool["deployment"])

    cluster.api.finish_job(job_name, report(3, 40.0, 79.0, 117.0, 118.0, dimension=RENDER_PROCESSES))
    await cluster.reconcile()
    pool = cluster.pools()["cpu"]
    cal = pool["calibration"]
    assert (cal["state"], cal["measures"], cal["chosenRenderProcesses"]) == ("Succeeded", "renderProcesses", 3)
    assert "chosenWorkers" not in cal
    assert cal["message"].startswith("3 render process(es): the fewest within 5%")
    assert pool["renderProcesses"] == 3
    # Processes are the general path's dimension: the worker threads keep their rule.
    assert (pool["processorWorkers"], pool["reason"]) == (2, "CPUPathDefault")
    assert env_of(cluster, pool["deployment"])["MMPREP_RENDER_PROCESSES"] == "3"


async def test_an_explicit_render_process_count_wins_and_is_not_measured() -> None:
    spec = {**VLLM_SPEC, "serving": {"renderProcesses": 3}}
    cluster = Cluster()
    await cluster.probed(spec, PROBE_GENERAL)
    pool = cluster.pools()["cpu"]
    assert pool["calibration"]["state"] == "NotNeeded"
    assert "spec.serving.renderProcesses asks for 3" in pool["calibration"]["message"]
    assert pool["renderProcesses"] == 3
    # The flag carries it; no env beside it.
    assert "MMPREP_RENDER_PROCESSES" not in env_of(cluster, pool["deployment"])
    assert cluster.jobs("calibration") == {}


@pytest.mark.parametrize(
    ("spec", "probe", "measured"),
    [
        (CPU_SPEC, PROBE_GENERAL, PROCESSOR_WORKERS),  # the mmprep API has no render path
        (VLLM_SPEC, PROBE_NATIVE, PROCESSOR_WORKERS),  # auto, and the model has the native path
        (VLLM_SPEC, PROBE_GENERAL, RENDER_PROCESSES),
        ({**VLLM_SPEC, "serving": {"renderPath": "general"}}, PROBE_NATIVE, RENDER_PROCESSES),
        ({**VLLM_SPEC, "serving": {"renderPath": "native"}}, PROBE_GENERAL, PROCESSOR_WORKERS),
    ],
)
def test_what_a_calibration_measures_follows_the_path_that_serves(spec: dict, probe: str, measured: str) -> None:
    parsed = api.MultimodalPreprocessorSpec.model_validate(spec)
    assert calibration.measures(parsed, api.ProbeResult.model_validate(json.loads(probe))) == measured


def test_the_render_path_and_vllms_options_join_the_hash_of_vllm_render_resources_only() -> None:
    policy = OperatorPolicy()
    (cpu,) = pools.group([make_node("cpu-a", {})], api.MultimodalPreprocessorSpec.model_validate(CPU_SPEC)).pools

    def hash_of(spec: dict) -> str:
        return calibration.calibration_hash(api.MultimodalPreprocessorSpec.model_validate(spec), policy, cpu)

    assert "render" not in calibration.calibration_inputs(api.MultimodalPreprocessorSpec.model_validate(CPU_SPEC), policy, cpu)
    general = {**VLLM_SPEC, "serving": {"renderPath": "general"}}
    assert len({hash_of(VLLM_SPEC), hash_of(general), hash_of({**VLLM_SPEC, "serving": {}})}) == 3
