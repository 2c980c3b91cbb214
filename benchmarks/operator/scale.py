"""Operator reconcile at scale, against the real local control plane (hack/cluster-up.sh).

Setup: 1000 KWOK nodes over 4 GPU products (H100, H200, B200, GB300; 250 each, labeled
``mmprep.dev/bench=true``), then MultimodalPreprocessor resources in steps (default 50 -> 100 ->
200), all requesting a GPU on the bench nodes, sharing 3 models (3 real probes, run by the test
agent). The operator runs as a real subprocess, exactly as in the integration tests.

Measured at each step (cumulative resource count):
- apply -> all Ready: from the first create of the step until every resource of the step is
  Ready; for the first step also from "all probes finished" (the target: 60 s for 200);
- reconciles per second while converging (the operator's own counter);
- reaction to a node label change: one bench node changes GPU product; per resource, the time
  until its status shows the new pool sizes; p50/p99 over all resources and several changes
  (the target: p99 < 2 s);
- operator RSS (peak while converging and reacting; the target: < 300 MiB).

Timestamps come from a watch on the resources, not from polling, so latencies are not
quantized by a poll interval. Run: ``.venv/bin/python benchmarks/operator/scale.py`` (it starts the
cluster when absent and leaves it up; its own nodes and namespace are removed at the end).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from support.kube import GROUP, PLURAL, VERSION, Cluster, Kube, condition_is, wait_for  # noqa: E402 - after the sys.path line
from support.operator_process import OperatorProcess  # noqa: E402 - after the sys.path line
from support.specs import make_spec  # noqa: E402 - after the sys.path line

BENCH_LABEL = "mmprep.dev/bench"
PRODUCTS = {
    # product label: (family, compute major, GPUs per node, arch)
    "NVIDIA-H100-80GB-HBM3": ("hopper", "9", 8, "amd64"),
    "NVIDIA-H200": ("hopper", "9", 8, "amd64"),
    "NVIDIA-B200": ("blackwell", "10", 8, "amd64"),
    "NVIDIA-GB300": ("blackwell", "10", 4, "arm64"),
}


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def node_body(name: str, product: str) -> dict[str, Any]:
    family, major, gpus, arch = PRODUCTS[product]
    resources = {"cpu": "128", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {
                "type": "kwok",
                BENCH_LABEL: "true",
                "kubernetes.io/hostname": name,
                "kubernetes.io/arch": arch,
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.family": family,
                "nvidia.com/gpu.compute.major": major,
                "nvidia.com/gpu.count": str(gpus),
                "nvidia.com/gpu.present": "true",
            },
        },
        "status": {"capacity": resources, "allocatable": resources},
    }


class Observer:
    """Watches the resources and timestamps what the benchmark waits for."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.lock = threading.Lock()
        self.ready_at: dict[str, float] = {}
        self.pool_nodes: dict[str, tuple[float, dict[str, int]]] = {}
        self.history: dict[str, list[tuple[float, dict[str, int]]]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                w = watch.Watch()
                for event in w.stream(
                    self.kube.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, timeout_seconds=60
                ):
                    now = time.monotonic()
                    obj = event["object"]
                    name = obj["metadata"]["name"]
                    nodes = {p.get("gpuProduct") or p["name"]: p["nodes"] for p in (obj.get("status") or {}).get("pools") or []}
                    with self.lock:
                        if condition_is(obj, "Ready", "True"):
                            self.ready_at.setdefault(name, now)
                        self.history.setdefault(name, []).append((now, nodes))
                    if self.stop.is_set():
                        w.stop()
            except (ApiException, OSError) as exc:
                log(f"watch restarted: {exc}")

    def first_time(self, name: str, since: float, nodes: dict[str, int]) -> float | None:
        with self.lock:
            for at, seen in self.history.get(name, []):
                if at >= since and seen == nodes:
                    return at
        return None


class Sampler:
    """Peak RSS of the operator process, sampled in the background."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.25):
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
            except psutil.Error:
                return

    def now(self) -> int:
        return int(self.process.memory_info().rss)


def metric(text: str, name: str, labels: str = "") -> float:
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? ([0-9.e+-]+)$", line)
        if m and labels in (m.group(1) or ""):
            total += float(m.group(2))
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--levels", default="50,100,200", help="cumulative resource counts")
    parser.add_argument("--replicas", type=int, default=1, help="replicas per resource")
    parser.add_argument("--label-changes", type=int, default=3)
    parser.add_argument("--operator-workers", type=int, default=4, help="mmprep-operator run --workers")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "operator" / "results.json")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]

    kubeconfig = Path(
        subprocess.run([str(REPO / "hack" / "cluster-up.sh")], stdout=subprocess.PIPE, text=True, check=True).stdout.split()[-1]
    )
    bin_dir = Path(
        subprocess.run(
            [str(REPO / "hack" / "build-control-plane.sh")], stdout=subprocess.PIPE, text=True, check=True
        ).stdout.split()[-1]
    )
    cluster = Cluster(kubeconfig=kubeconfig, bin_dir=bin_dir, state_dir=kubeconfig.parent)
    for crd in sorted((REPO / "crds").glob("*.yaml")):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    # A new CRD's storage answers 429 "(re)initializing" for a moment: start nothing before it serves.
    wait_for(lambda: cluster.kubectl("get", "mmp", "-A", check=False).returncode == 0, 60, what="the CRD serving lists")
    api = cluster.api_client()
    api.configuration.connection_pool_maxsize = 32
    kube = Kube(api)
    namespace = f"mmprep-bench-{int(time.time())}"
    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    wait_for(lambda: kube.core.read_namespaced_service_account("default", namespace), 60, what="default ServiceAccount")
    work = Path(tempfile.mkdtemp(prefix="mmprep-operator-scale-"))
    results: dict[str, Any] = {
        "nodes": args.nodes,
        "products": list(PRODUCTS),
        "replicas_per_resource": args.replicas,
        "levels": [],
    }
    operator: OperatorProcess | None = None
    try:
        # --- nodes ---------------------------------------------------------------------------
        names = [(f"bench-{i:04d}", list(PRODUCTS)[i % len(PRODUCTS)]) for i in range(args.nodes)]
        t = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda n: kube.core.create_node(node_body(*n)), names))
        wait_for(
            lambda: (
                sum(
                    1
                    for n in kube.core.list_node(label_selector=f"{BENCH_LABEL}=true").items
                    if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
                )
                == args.nodes
            ),
            300,
            what=f"{args.nodes} KWOK nodes Ready",
            interval=1,
        )
        results["nodes_ready_seconds"] = round(time.monotonic() - t, 1)
        log(f"{args.nodes} nodes Ready in {results['nodes_ready_seconds']} s")

        # --- models and the operator ------------------------------------------------------------
        cli = Path(sys.executable).parent / "mmprep-runtime"
        models = []
        for kind, declared in (("qwen2-vl", None), ("llava", None), ("qwen2-vl", 3)):
            out = work / f"{kind}-{declared or 0}"
            cmd = [str(cli), "make-model", "--kind", kind, "--out", str(out)]
            if declared:
                cmd += ["--declared-workers", str(declared)]
            subprocess.run(cmd, check=True, capture_output=True)
            models.append(out)
        operator = OperatorProcess(
            cluster,
            log_dir=work,
            namespaces=[namespace],
            extra_args=["--workers", str(args.operator_workers), "--log-format", "text"],
        )
        operator.start()
        assert operator.process is not None
        sampler = Sampler(operator.process.pid)
        sampler.thread.start()
        observer = Observer(kube, namespace)
        observer.thread.start()
        results["operator_rss_idle_mib"] = round(sampler.now() / 2**20, 1)

        created = 0
        for level in levels:
            batch = [f"r{i:03d}" for i in range(created, level)]
            metrics_before = operator.metrics()
            t_apply = time.monotonic()

            def create(i: int, name: str) -> None:
                spec = make_spec(
                    models[i % len(models)],
                    nodeSelector={BENCH_LABEL: "true"},
                    resources={"limits": {"nvidia.com/gpu": 1}},
                    replicas=args.replicas,
                )
                kube.create_mmp(namespace, name, spec)

            # In parallel, as `kubectl apply -f dir/` would send them: the clock is the operator's.
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(create, range(created, level), batch))
            t_applied = time.monotonic()
            probes_done = None
            if created == 0:
                wait_for(
                    lambda: sum(1 for j in kube.jobs(namespace) if j.status.succeeded) == len(models),
                    600,
                    what="the 3 probe Jobs",
                    interval=0.2,
                )
                probes_done = time.monotonic()
            wait_for(
                lambda batch=batch: all(n in observer.ready_at for n in batch),
                900,
                what=f"{level} resources Ready",
                interval=0.5,
                describe=lambda batch=batch: f"{sum(n in observer.ready_at for n in batch)} of {len(batch)} Ready",
            )
            t_ready = max(observer.ready_at[n] for n in batch)
            metrics_after = operator.metrics()
            reconciles = metric(metrics_after, "mmprep_operator_reconciles_total") - metric(
                metrics_before, "mmprep_operator_reconciles_total"
            )
            step: dict[str, Any] = {
                "resources": level,
                "new_resources": len(batch),
                "apply_seconds": round(t_applied - t_apply, 2),
                "apply_to_all_ready_seconds": round(t_ready - t_apply, 2),
                "probes_done_to_all_ready_seconds": round(t_ready - probes_done, 2) if probes_done else None,
                "reconciles": int(reconciles),
                "reconciles_per_second": round(reconciles / max(1e-6, t_ready - t_apply), 1),
                "deployments": len(kube.deployments(namespace)),
            }
            created = level
            log(f"step {level}: {step}")

            # --- reaction to node label changes --------------------------------------------------
            latencies: list[float] = []
            for change in range(args.label_changes):
                node, old = names[change]
                new = "NVIDIA-H200" if old != "NVIDIA-H200" else "NVIDIA-B200"
                family, _, _, _ = PRODUCTS[new]
                expected: dict[str, int] = {}
                for n, product in names:
                    key = new if n == node else product
                    expected[key] = expected.get(key, 0) + 1
                t_patch = time.monotonic()
                kube.core.patch_node(
                    node, {"metadata": {"labels": {"nvidia.com/gpu.product": new, "nvidia.com/gpu.family": family}}}
                )
                names[change] = (node, new)
                everyone = [f"r{i:03d}" for i in range(created)]
                wait_for(
                    lambda t_patch=t_patch, expected=expected, everyone=everyone: all(
                        observer.first_time(r, t_patch, expected) for r in everyone
                    ),
                    120,
                    what="every resource reacting to the label change",
                    interval=0.2,
                )
                latencies += [observer.first_time(r, t_patch, expected) - t_patch for r in everyone]  # type: ignore[operator]
            step["label_change_reaction_seconds"] = {
                "samples": len(latencies),
                "p50": round(statistics.median(latencies), 3),
                "p99": round(pct(latencies, 0.99), 3),
                "max": round(max(latencies), 3),
            }
            step["operator_rss_mib"] = round(sampler.now() / 2**20, 1)
            step["operator_rss_peak_mib"] = round(sampler.peak / 2**20, 1)
            results["levels"].append(step)
            log(f"step {level}: reaction {step['label_change_reaction_seconds']}, RSS {step['operator_rss_mib']} MiB")
        results["reconcile_duration_mean_ms"] = round(
            1000
            * metric(operator.metrics(), "mmprep_operator_reconcile_duration_seconds_sum")
            / max(1.0, metric(operator.metrics(), "mmprep_operator_reconcile_duration_seconds_count")),
            1,
        )
        observer.stop.set()
        sampler.stop.set()
    finally:
        # Namespace first, while the operator and the nodes are still there (pods on a deleted
        # node wait for the pod garbage collector); the nodes last.
        log("cleaning up the bench namespace and nodes")
        try:
            kube.core.delete_namespace(namespace)
            wait_for(
                lambda: not [n for n in kube.core.list_namespace().items if n.metadata.name == namespace],
                300,
                what="the bench namespace deleted",
                interval=1,
            )
        except (ApiException, AssertionError) as exc:
            log(f"namespace cleanup incomplete: {exc}")
        if operator:
            operator.stop()
        try:
            kube.core.delete_collection_node(label_selector=f"{BENCH_LABEL}=true")
        except ApiException as exc:
            log(f"node cleanup failed: {exc.reason}")
        if operator:
            log(f"operator log: {operator.log_path} (kept); models and the rest of {work} removed")
        for child in work.iterdir():
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
    results["machine"] = {"cpus": psutil.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1)}
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
