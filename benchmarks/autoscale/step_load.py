"""Step-load benchmark: an autoscaled pool and a fixed-size pool, side by side on the kind cluster,
each driven through its Service by a load pod whose rate is multiplied by 4 mid-run.

    make kind-up                                   # the cluster (metrics-server included)
    .venv/bin/python benchmarks/autoscale/step_load.py --out benchmarks/autoscale/results

Both pools run the same processor on the same (CPU) node with the same resources; the elastic one
has ``spec.autoscaling`` on CPU (1 to 4 pods), the fixed one ``replicas: 1``. Measured, per pool:
the seconds from the step until a new replica serves (it is a ready endpoint of the Service), the
p50/p99 latency and the failed requests of the step, and the pool's pods over time (sampled every
2 s). Written: results.json, results.md (the table) and replicas.svg (the plot).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from support.kind_bringup import KUBECONFIG, NAMESPACE  # noqa: E402 - after the sys.path line
from support.kind_load import LoadPod, start_load  # noqa: E402 - after the sys.path line
from support.kube import Kube, condition_is  # noqa: E402 - after the sys.path line

from mmprep_runtime.synthetic.models import QWEN_IMAGE_PLACEHOLDER  # noqa: E402 - after the sys.path line

ELASTIC, FIXED = "step-elastic", "step-fixed"
CPU_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}]}]
        }
    }
}


def log(message: str) -> None:
    print(f"[step-load {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def resource(name: str, *, autoscaling: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"path": "/models/qwen2-vl"},
        "device": "cpu",
        "workers": {"processor": 1},
        "replicas": 1,
        "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}},
        "affinity": CPU_AFFINITY,
        "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "mmprep-models", "readOnly": True}}],
        "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
    }
    if autoscaling:
        spec["autoscaling"] = autoscaling
    return {"apiVersion": "mmprep.dev/v1alpha1", "kind": "MultimodalPreprocessor", "metadata": {"name": name}, "spec": spec}


def serving_endpoints(kube: Kube, service: str) -> int:
    slices = client.DiscoveryV1Api(kube.api).list_namespaced_endpoint_slice(
        NAMESPACE, label_selector=f"kubernetes.io/service-name={service}"
    )
    return sum(1 for s in slices.items for e in s.endpoints or [] if e.conditions and e.conditions.ready)


def sample(kube: Kube, stop: threading.Event, start: float, out: list[dict[str, Any]]) -> None:
    while not stop.wait(2.0):
        row: dict[str, Any] = {"t": round(time.monotonic() - start, 1)}
        for name in (ELASTIC, FIXED):
            row[name] = serving_endpoints(kube, name)
        out.append(row)


def svg_plot(samples: list[dict[str, Any]], loads: dict[str, list[dict[str, Any]]], step_at: float, path: Path) -> None:
    """Two panels: serving pods over time, and each second's p99 latency, per pool."""
    width, height, pad = 720, 420, 48
    panel = (height - 3 * pad) / 2
    t_max = max([s["t"] for s in samples] + [len(v) for v in loads.values()] + [1])
    colors = {ELASTIC: "#1f77b4", FIXED: "#d62728"}

    def x(t: float) -> float:
        return pad + (width - 2 * pad) * t / t_max

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">'
    ]
    parts.append(f'<rect width="{width}" height="{height}" fill="white"/>')
    pods_max = max([s[n] for s in samples for n in (ELASTIC, FIXED)] + [1])
    p99_max = max([line["p99_s"] or 0 for lines in loads.values() for line in lines] + [0.01])
    for i, (title, top, vmax) in enumerate(
        (("serving pods", pad, pods_max), ("p99 latency per second (s)", 2 * pad + panel, p99_max))
    ):
        parts.append(f'<text x="{pad}" y="{top - 8}">{title} (max {vmax:g})</text>')
        parts.append(f'<rect x="{pad}" y="{top}" width="{width - 2 * pad}" height="{panel}" fill="none" stroke="#999"/>')
        parts.append(
            f'<line x1="{x(step_at)}" y1="{top}" x2="{x(step_at)}" y2="{top + panel}" stroke="#999" stroke-dasharray="4"/>'
        )
        for name, color in colors.items():
            if i == 0:
                points = [(s["t"], s[name]) for s in samples]
            else:
                points = [(line["t"], line["p99_s"]) for line in loads[name] if line["p99_s"] is not None]
            coords = " ".join(f"{x(t):.1f},{top + panel - panel * v / vmax:.1f}" for t, v in points)
            parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.5"/>')
    for j, (name, color) in enumerate(colors.items()):
        parts.append(f'<text x="{pad + 160 * j}" y="{height - 12}" fill="{color}">{name}</text>')
    parts.append(f'<text x="{width - pad - 150}" y="{height - 12}">seconds; dashed: the 4x step</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=3, help="requests per second before the step (default 3)")
    parser.add_argument("--step-at", type=float, default=60, help="seconds of base load before the step")
    parser.add_argument("--duration", type=float, default=240, help="seconds of load in all")
    parser.add_argument("--image-side", type=int, default=1600, help="side of the square test image (default 1600)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "autoscale" / "results")
    parser.add_argument("--image", default=os.environ.get("RUNTIME_IMAGE", "mmprep-runtime:0.1.0"))
    args = parser.parse_args()
    kube = Kube(config.new_client_from_config(config_file=str(KUBECONFIG)))
    autoscaling = {
        "minReplicas": 1,
        "maxReplicas": 4,
        "signal": "cpu",
        "target": 50,
        "scaleUp": {"stabilizationWindowSeconds": 0, "rate": {"pods": 2, "periodSeconds": 15}},
        "scaleDown": {"stabilizationWindowSeconds": 120},
    }
    docs = [resource(ELASTIC, autoscaling=autoscaling), resource(FIXED, autoscaling=None)]
    for doc in docs:
        kube.custom.create_namespaced_custom_object("mmprep.dev", "v1alpha1", NAMESPACE, "multimodalpreprocessors", doc)
    loads: list[LoadPod] = []
    try:
        for name in (ELASTIC, FIXED):
            kube.wait_mmp(NAMESPACE, name, lambda o: condition_is(o, "Ready", "True"), 900, what=f"{name} Ready")
        log("both pools Ready; starting the load")
        schedule = f"0:{args.rate:g},{args.step_at:g}:{4 * args.rate:g}"
        text = f"{QWEN_IMAGE_PLACEHOLDER}describe"
        samples: list[dict[str, Any]] = []
        stop = threading.Event()
        start = time.monotonic()
        sampler = threading.Thread(target=sample, args=(kube, stop, start, samples), daemon=True)
        sampler.start()
        for name in (ELASTIC, FIXED):
            url = f"http://{name}:8080/v1/preprocess"
            loads.append(
                start_load(
                    kube,
                    NAMESPACE,
                    image=args.image,
                    url=url,
                    schedule=schedule,
                    duration=args.duration,
                    text=text,
                    extra_args=("--image-side", str(args.image_side)),
                )
            )
        results = {name: load.result(args.duration + 300) for name, load in zip((ELASTIC, FIXED), loads, strict=True)}
        stop.set()
        sampler.join()
        log("load finished")
        before = {name: next((s[name] for s in samples if s["t"] >= args.step_at), 1) for name in (ELASTIC, FIXED)}
        report: dict[str, Any] = {
            "schedule": schedule,
            "duration_s": args.duration,
            "image_side": args.image_side,
            "pools": {},
            "samples": samples,
        }
        for name, result in results.items():
            grown = next((s["t"] - args.step_at for s in samples if s["t"] > args.step_at and s[name] > before[name]), None)
            step = result.summary["steps"][-1]
            report["pools"][name] = {
                "autoscaled": name == ELASTIC,
                "seconds_until_a_new_replica_serves": grown,
                "most_pods": max(s[name] for s in samples),
                "base": result.summary["steps"][0],
                "step": step,
            }
            report.setdefault("per_second", {})[name] = result.seconds
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(report, indent=1) + "\n")
        svg_plot(samples, report["per_second"], args.step_at, args.out / "replicas.svg")
        rows = ["| pool | new replica serves after the step | most pods | step p50 | step p99 | step failed / sent | retried |"]
        rows.append("|---|---|---|---|---|---|---|")
        for name, pool in report["pools"].items():
            s = pool["step"]
            grown = pool["seconds_until_a_new_replica_serves"]
            rows.append(
                f"| {name} | {'-' if grown is None else f'{grown:.0f} s'} | {pool['most_pods']} | "
                f"{s['p50_s']:.3f} s | {s['p99_s']:.3f} s | {s['failed']} / {s['sent']} | {s['retried']} |"
            )
        (args.out / "results.md").write_text("\n".join(rows) + "\n")
        print("\n".join(rows))
        print(yaml.safe_dump({"pools": {n: {k: v for k, v in p.items() if k != "base"} for n, p in report["pools"].items()}}))
    finally:
        for load in loads:
            load.delete()
        for name in (ELASTIC, FIXED):
            kube.custom.delete_namespaced_custom_object("mmprep.dev", "v1alpha1", NAMESPACE, "multimodalpreprocessors", name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
