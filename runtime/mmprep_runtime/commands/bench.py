"""``mmprep-runtime bench``: throughput, latency and CPU by processor worker count, in process.

For each worker count the real engine is started (same loading, decision and pool as ``serve``,
with the count given explicitly) and kept busy by a closed loop with one job in flight per worker:
the completion callback submits the next job from the worker thread itself, so a worker never
waits for the load generator, and latency is service time rather than queueing. The processor is
also called directly in one thread: the baseline for the pool's overhead. All configurations are
measured in interleaved rounds, so background load on a shared machine hits them alike.

Images are decoded once up front (``--decode`` makes every job decode its JPEG too, for the
end-to-end CPU cost). ``--api preprocess|vllm-render`` measures instead the served path itself:
each job is one request body through ``Engine.serve`` (parse, decode, process, encode, placed by
the engine exactly as ``serve`` places them), without the HTTP socket. Output: a table and a
progress line on stderr, the JSON on stdout (and in ``--json FILE``). The operator can calibrate
worker counts per node type from this JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Final

from mmprep_runtime import exits, versions
from mmprep_runtime.commands.measuring import (
    MeasureError,
    Measurement,
    build_workload,
    measure_direct,
    measure_dispatch,
    measure_pool,
    measure_served,
    merge,
    parse_size,
    parse_workers,
    request_body,
    served_api,
)
from mmprep_runtime.engine import core as engine
from mmprep_runtime.engine import cpus, cuda, loading
from mmprep_runtime.exits import ModelLoadError
from mmprep_runtime.settings import ModelSettings, SettingsError, model_settings_from_args

EXIT_USAGE: Final = exits.EXIT_USAGE
EXIT_LOAD_FAILED: Final = exits.EXIT_LOAD_FAILED


def bind_baseline_device(processor: Any, engines: dict[int, engine.Engine]) -> str:
    """Put the direct baseline on the pools' device, so the ratio compares like with like: a GPU
    pool against a CPU baseline would credit the pool with the device's speed."""
    devices = {running.device for running in engines.values()}
    if len(devices) != 1:
        raise MeasureError(f"the pools run on different devices: {sorted(devices)}")
    (device,) = devices
    if device != "cpu":
        loading.bind_device(processor, device)
        cuda.worker_init(device)  # its own stream, like each worker
    return device


def run(
    settings: ModelSettings,
    workers: list[int],
    *,
    duration: float,
    size: tuple[int, int],
    warmup: float = 1.0,
    decode: bool = False,
    progress: bool = True,
    intra_op_threads: int | None = None,
    rounds: int = 3,
    api: str = "none",
) -> dict[str, Any]:
    """Measure the direct call and each worker count for ``duration`` seconds each.

    The time is split into ``rounds`` interleaved rounds (direct, 1 worker, 2 workers, direct, ...)
    so a change in the machine's background load hits every configuration alike and the ratios
    between them stay meaningful on a shared machine.
    """
    if rounds < 1:
        raise MeasureError(f"rounds must be at least 1, got {rounds}")
    import torch

    processor, facts = loading.load_processor(settings)
    workload = build_workload(facts, size, decode)
    engines: dict[int, engine.Engine] = {}
    try:
        for count in workers:
            engines[count] = engine.start_engine(settings, processor_workers=count, intra_op_threads=intra_op_threads)
        torch.set_num_threads(1)  # the direct baseline is one thread, like one worker (start_engine set it)
        device = bind_baseline_device(processor, engines)
        if warmup > 0:
            measure_direct(processor, workload, warmup, False)
            for running in engines.values():
                measure_pool(running, workload.job, warmup, False)
        slice_ = duration / rounds
        direct_parts: list[Measurement] = []
        pool_parts: dict[int, list[Measurement]] = {count: [] for count in engines}
        apis = {count: served_api(running, api) for count, running in engines.items()} if api != "none" else {}
        body = request_body(api, size) if api != "none" else b""
        for _ in range(rounds):
            direct_parts.append(measure_direct(processor, workload, slice_, progress))
            for count, running in engines.items():
                if api == "none":
                    pool_parts[count].append(measure_pool(running, workload.job, slice_, progress))
                else:
                    pool_parts[count].append(measure_served(running, apis[count], body, slice_, progress))
        reasons = {count: running.decision.reason.value for count, running in engines.items()}
        smallest = min(engines)
        dispatch = {"workers": smallest, **measure_dispatch(engines[smallest], min(1.0, duration))}
    finally:
        for running in engines.values():
            running.close()
    direct = merge(direct_parts).summary()
    if direct["requests"]:
        direct_us = direct["seconds"] / direct["requests"] * 1e6
        dispatch["share_of_direct_call"] = round(dispatch["us_per_job"] / direct_us, 4)
    results = []
    for count in workers:
        summary = merge(pool_parts[count]).summary()
        summary["reason"] = reasons[count]
        results.append(summary)
    one = next((r for r in results if r["workers"] == 1), None)
    for result in results:
        if one and one["req_per_s"]:
            result["speedup_vs_1_worker"] = round(result["req_per_s"] / one["req_per_s"], 3)
        if direct["req_per_s"]:
            result["throughput_vs_direct"] = round(result["req_per_s"] / direct["req_per_s"], 3)
    return {
        "model": settings.model,
        "processor_class": facts.processor_class,
        "image_processor_class": facts.image_processor_class,
        "backend": facts.backend,
        "image": f"{size[0]}x{size[1]}" if facts.takes_images else None,
        "decode_in_job": decode,
        "api": api,
        "duration_s": duration,
        "rounds": rounds,
        "usable_cpus": cpus.usable_cpus(),
        "device": device,  # of the pools and of the direct baseline alike
        "direct": direct,
        "results": results,
        # The pool's own per-job cost, on the smallest pool (see measure_dispatch).
        "dispatch": dispatch,
        "versions": versions.versions(),
    }


def table(report: dict[str, Any]) -> str:
    header = (
        f"{'run':<10} {'workers':>7} {'threads':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'CPU':>5} {'CPU ms/req':>10} {'RSS MB':>7} {'x 1 wkr':>7}"
    )
    lines = [
        f"{report['processor_class']} ({report['backend'] or 'no image processor'}), image {report['image']}, "
        f"{report['duration_s']:g} s per run, {report['usable_cpus']} usable CPU(s)",
        header,
        "-" * len(header),
    ]
    for row in [report["direct"], *report["results"]]:
        lines.append(
            f"{row['label']:<10} {row['workers']:>7} {row['intra_op_threads']:>7} {row['req_per_s']:>8} "
            f"{row['p50_ms']:>8} {row['p99_ms']:>8} {row['cpu_cores']:>5} {row['cpu_ms_per_request']:>10} "
            f"{row['rss_mb']:>7} {row.get('speedup_vs_1_worker', ''):>7}"
        )
    dispatch = report["dispatch"]
    lines.append(
        f"pool's own cost per job ({dispatch['workers']} worker(s), jobs that do nothing): "
        f"{dispatch['us_per_job']} us, {dispatch.get('share_of_direct_call', 0) * 100:.2f}% of a direct call"
    )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    try:
        settings = model_settings_from_args(args, os.environ)
        workers = parse_workers(args.workers)
        size = parse_size(args.image)
        if args.duration <= 0:
            raise MeasureError(f"--duration must be positive, got {args.duration}")
        if args.rounds < 1:
            raise MeasureError(f"--rounds must be at least 1, got {args.rounds}")
    except (SettingsError, MeasureError) as exc:
        print(f"mmprep-runtime bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        report = run(
            settings,
            workers,
            duration=args.duration,
            size=size,
            warmup=args.warmup,
            decode=args.decode,
            progress=not args.no_progress,
            intra_op_threads=args.intra_op_threads,
            rounds=args.rounds,
            api=args.api,
        )
    except ModelLoadError as exc:
        print(f"mmprep-runtime bench: {exc}", file=sys.stderr)
        return EXIT_LOAD_FAILED
    print(table(report), file=sys.stderr)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_out:
        with open(args.json_out, "w") as out:
            out.write(text + "\n")
    return 0
