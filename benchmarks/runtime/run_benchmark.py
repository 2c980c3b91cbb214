#!/usr/bin/env python3
"""The runtime's performance benchmark: one run, all figures, a JSON file and a Markdown table.

What it measures (Qwen2-VL processor built with ``make-model``, one 1280x960 JPEG per request):

1. Serial cost: CPU seconds per request spent on parsing, decoding and processing (and encoding
   the answer), in one thread with one torch thread, measured in slices between the HTTP rounds
   (below). The machine's bound is ``usable CPUs / that cost``: no server can do better on this
   machine.
2. In process, images already decoded (``mmprep-runtime bench``): the processor called directly in
   one thread vs the pool at 1 and 2 workers, one torch thread each. Targets: 2 workers >= 1.7x
   1 worker; the pool's per-request overhead vs the direct call < 5%. Then the pool again with
   ``fast_paths=False`` (transformers' own token steps), to show what the stand-ins change.
3. Through HTTP: ``mmprep-runtime serve`` at 1, 2 and 4 workers, both backends, loaded by ``wrk``
   (C, low overhead: a Python client would eat the cores it measures). Server CPU and RSS come from
   the server process. Target: the best worker count reaches >= 90% of the bound.

Run it on a quiet machine: ``python benchmarks/runtime/run_benchmark.py [--duration 20]``.
Needs ``wrk`` on PATH (Debian package ``wrk``).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import pathlib
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

import psutil

from mmprep_runtime import versions
from mmprep_runtime.commands import bench, measuring
from mmprep_runtime.engine import cpus, loading, memory, pipeline
from mmprep_runtime.settings import Limits, ModelSettings
from mmprep_runtime.sizing import Backend
from mmprep_runtime.synthetic import media, models

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from support.servers import free_port, runtime_command  # noqa: E402 - after the sys.path line

IMAGE_SIZE = (1280, 960)
#: The load generator's script: POST one body, nothing per answer. A ``response`` callback would
#: make wrk keep every answer and copy it into Lua: with the render API's 10 MB answers that was
#: a third of a core on a 2-core machine, taken from the server under test. Failed answers are
#: counted by wrk (``non_2xx``) and one is shown by ``show_failure``.
WRK_SCRIPT = r"""
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local file = assert(io.open(os.getenv("MMPREP_BODY"), "rb"))
wrk.body = file:read("*a")
file:close()
"""


def show_failure(url: str, body_file: pathlib.Path) -> str:
    """What the server answers ``body_file`` now, when a load saw failed answers: the status and the
    start of the answer (wrk only counts them)."""
    request = urllib.request.Request(url, data=body_file.read_bytes(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return f"{response.status} (answered fine now)"
    except urllib.error.HTTPError as error:
        return f"{error.code} {error.read()[:200]!r}"
    except OSError as error:
        return f"no answer: {error}"


def request_body() -> bytes:
    image = media.jpeg(*IMAGE_SIZE, seed=1)
    payload = {
        "text": f"Describe this picture in one sentence. {models.QWEN_IMAGE_PLACEHOLDER}",
        "images": [base64.b64encode(image).decode()],
    }
    return json.dumps(payload).encode()


class SerialCost:
    """CPU seconds per request of each stage, in one thread with one torch thread.

    Measured in slices, one before each HTTP round, and summed: the bound is the denominator of
    every efficiency figure, and this VM's speed drifts by 10% over minutes (other tenants), so
    the bound must be measured over the same minutes as the servers it is compared with.
    """

    STAGES = ("decode", "process", "encode")

    def __init__(self, model: pathlib.Path, backend: Backend, body: bytes) -> None:
        import torch

        torch.set_num_threads(1)
        self.processor, self.facts = loading.load_processor(ModelSettings(str(model), backend=backend))
        self.body, self.limits = body, Limits()
        self.totals = dict.fromkeys(self.STAGES, 0.0)
        self.count = self.slices = 0
        for _ in range(3):  # warm caches and lazy imports
            self._one()

    def _one(self) -> tuple[float, float, float]:
        t0 = time.thread_time()
        request = pipeline.decode_request(self.body, self.facts, self.limits)
        t1 = time.thread_time()
        outputs = pipeline.process(self.processor, request, self.facts)
        t2 = time.thread_time()
        pipeline.encode_json(outputs, "m")
        return t1 - t0, t2 - t1, time.thread_time() - t2

    def measure(self, seconds: float) -> None:
        started, count = time.perf_counter(), 0
        while time.perf_counter() - started < seconds or count < 10:
            for stage, spent in zip(self.STAGES, self._one(), strict=True):
                self.totals[stage] += spent
            count += 1
        self.count += count
        self.slices += 1

    def summary(self) -> dict[str, float]:
        per_request: dict[str, float] = {stage: total / self.count for stage, total in self.totals.items()}
        per_request["total"] = sum(per_request.values())
        per_request["requests"] = self.count
        per_request["slices"] = self.slices
        return per_request


def machine_busy_seconds() -> float:
    """CPU seconds all processes have used so far (all CPUs), from /proc/stat."""
    fields = [int(x) for x in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def minor_faults(pid: int) -> int:
    # Field 10 of /proc/PID/stat; the command name (field 2) may hold spaces, so split after it.
    return int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wrk_command(lua: pathlib.Path, url: str, *, connections: int, seconds: float, timeout_s: int) -> list[str]:
    """One wrk thread (the load generator must not take the server's cores) posting ``lua``'s body."""
    return [
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{seconds:g}s",
        "--latency",
        "--timeout",
        f"{timeout_s}s",
        "-s",
        str(lua),
        url,
    ]


def wait_ready(base: str, process: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server not ready in time")


def wait_idle(base: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
            text = response.read().decode()
        in_flight = next(float(line.split()[1]) for line in text.splitlines() if line.startswith("mmprep_requests_in_flight "))
        if in_flight == 0:
            return
        time.sleep(0.1)
    raise RuntimeError("the server did not go idle after the warm-up")


def parse_wrk(output: str) -> dict[str, Any]:
    def duration_ms(text: str) -> float:
        number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
        return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]

    latency = dict(re.findall(r"^\s+(50|99)%\s+(\S+)\s*$", output, re.MULTILINE))
    requests = re.search(r"(\d+) requests in ([\d.]+)(s|m)", output)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors = re.search(r"Socket errors: (.*)", output)
    assert requests is not None, output
    return {
        "requests": int(requests.group(1)),
        "req_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1)),  # type: ignore[union-attr]
        "p50_ms": duration_ms(latency["50"]),
        "p99_ms": duration_ms(latency["99"]),
        "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
        "socket_errors": errors.group(1) if errors else None,
    }


class Server:
    """One ``mmprep-runtime serve`` process under test, and the wrk command that loads it."""

    def __init__(
        self,
        model: pathlib.Path,
        backend: Backend,
        workers: int,
        body_file: pathlib.Path,
        lua: pathlib.Path,
        io_workers: int | None = None,
    ) -> None:
        self.backend, self.workers = backend, workers
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        command = [
            *runtime_command(),
            "serve",
            "--model",
            str(model),
            "--backend",
            backend.value,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--processor-workers",
            str(workers),
            "--log-level",
            "WARNING",
        ]
        if io_workers is not None:
            command += ["--io-workers", str(io_workers)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Enough connections to keep every worker and the decoders busy, within the server's
        # admission capacity (5 per worker by default) so that no request is refused.
        self.connections = 2 * workers + 2
        self.env = {**os.environ, "MMPREP_BODY": str(body_file)}
        self.lua = lua
        self.rounds: list[dict[str, Any]] = []
        self.info: dict[str, Any] = {}

    def ready(self) -> None:
        wait_ready(self.base, self.process)
        with urllib.request.urlopen(f"{self.base}/v1/info", timeout=10) as response:
            self.info = json.loads(response.read())

    def _wrk(self, seconds: float) -> str:
        command = wrk_command(self.lua, self.base + "/v1/preprocess", connections=self.connections, seconds=seconds, timeout_s=30)
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, check=True)
        return done.stdout

    def load(self, seconds: float, *, measure: bool) -> None:
        # wrk drops its connections mid-request when it stops; the server still finishes those
        # requests. Starting before they are done would meet 429s for the slots they still hold.
        wait_idle(self.base)
        process = psutil.Process(self.process.pid)
        cpu_before = sum(process.cpu_times()[:2])
        faults_before = minor_faults(self.process.pid)
        machine_before, wrk_before = machine_busy_seconds(), children_cpu_seconds()
        output = self._wrk(seconds)
        if measure:
            result = parse_wrk(output)
            if result["non_2xx"]:
                raise RuntimeError(
                    f"{self.backend.value}/{self.workers} workers: {result['non_2xx']} answers were not 200 "
                    f"(one now: {show_failure(self.base + '/v1/preprocess', pathlib.Path(self.env['MMPREP_BODY']))}); "
                    "the figures would be meaningless"
                )
            result["cpu_seconds"] = sum(process.cpu_times()[:2]) - cpu_before
            result["minor_faults"] = minor_faults(self.process.pid) - faults_before
            result["wrk_cpu_seconds"] = children_cpu_seconds() - wrk_before
            # Whatever else ran meanwhile (other tenants of a shared machine) took these cores.
            result["other_cpu_seconds"] = max(
                0.0, machine_busy_seconds() - machine_before - result["cpu_seconds"] - result["wrk_cpu_seconds"]
            )
            result["seconds"] = seconds
            result["rss_mb"] = round(process.memory_info().rss / 2**20, 1)
            self.rounds.append(result)

    def summary(self) -> dict[str, Any]:
        requests = sum(r["requests"] for r in self.rounds)
        seconds = sum(r["seconds"] for r in self.rounds)
        cpu = sum(r["cpu_seconds"] for r in self.rounds)
        p50s = sorted(r["p50_ms"] for r in self.rounds)
        return {
            "backend": self.backend.value,
            "workers": self.workers,
            "intra_op_threads": self.info.get("intra_op_threads"),
            "io_workers": self.info.get("workers", {}).get("io"),
            "decode_on_worker": self.info.get("decode_on_worker"),
            "connections": self.connections,
            "requests": requests,
            "req_per_s": round(requests / seconds, 2),
            # wrk reports percentiles per run: the median round's p50, the worst round's p99.
            "p50_ms": p50s[len(p50s) // 2],
            "p99_ms": max(r["p99_ms"] for r in self.rounds),
            "non_2xx": sum(r["non_2xx"] for r in self.rounds),
            "server_cpu_cores": round(cpu / seconds, 3),
            "cpu_ms_per_request": round(cpu * 1000 / max(1, requests), 2),
            "rss_mb": max(r["rss_mb"] for r in self.rounds),
            "page_faults_per_request": round(sum(r["minor_faults"] for r in self.rounds) / max(1, requests)),
            "wrk_cpu_cores": round(sum(r["wrk_cpu_seconds"] for r in self.rounds) / seconds, 3),
            "other_cpu_cores": round(sum(r["other_cpu_seconds"] for r in self.rounds) / seconds, 3),
            "rounds": self.rounds,
        }

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def http_sweep(
    model: pathlib.Path,
    backends: list[Backend],
    workers: list[int],
    body_file: pathlib.Path,
    lua: pathlib.Path,
    duration: float,
    warmup: float,
    rounds: int,
    serial: dict[str, SerialCost],
    io_workers: int | None = None,
) -> list[dict[str, Any]]:
    """All servers up at once (idle ones cost no CPU), measured in interleaved rounds, each round
    after a slice of the serial cost."""
    servers = [Server(model, backend, count, body_file, lua, io_workers) for backend in backends for count in workers]
    try:
        for server in servers:
            server.ready()
        for server in servers:
            server.load(warmup, measure=False)
        for round_index in range(rounds):
            for server in servers:  # requests wrk left behind would share the CPU with the slice
                wait_idle(server.base)
            for backend, meter in serial.items():
                print(f"serial cost {round_index + 1}/{rounds}: {backend}", file=sys.stderr)
                meter.measure(max(2.5, duration / rounds / 2))
            for server in servers:
                print(
                    f"http round {round_index + 1}/{rounds}: {server.backend.value}, {server.workers} worker(s)", file=sys.stderr
                )
                server.load(duration / rounds, measure=True)
        return [server.summary() for server in servers]
    finally:
        for server in servers:
            server.stop()


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"Machine: {report['usable_cpus']} usable CPUs ({report['cpu_model']}); "
        f"load average before the run {report['load_before']}; image {IMAGE_SIZE[0]}x{IMAGE_SIZE[1]} JPEG; "
        f"{report['duration_s']:g} s per measurement.",
        "",
        "Serial CPU cost per request (one thread; in slices between the HTTP rounds): "
        + "; ".join(
            f"{b}: {c['total'] * 1000:.1f} ms (decode {c['decode'] * 1000:.1f}, process {c['process'] * 1000:.1f}, "
            f"encode {c['encode'] * 1000:.1f}) -> bound {report['bound'][b]:.1f} req/s"
            for b, c in report["serial"].items()
        ),
        "",
        f"In process, decoded images, one torch thread per worker (torchvision backend; other processes used "
        f"{report['in_process']['other_cpu_cores']:.2f} cores meanwhile):",
        "",
        "| run | req/s | p50 ms | p99 ms | CPU ms/req | vs 1 worker | vs direct |",
        "|---|---|---|---|---|---|---|",
    ]
    inproc = report["in_process"]
    for row in [inproc["direct"], *inproc["results"]]:
        lines.append(
            f"| {row['label']} | {row['req_per_s']:.1f} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | "
            f"{row['cpu_ms_per_request']:.1f} | {row.get('speedup_vs_1_worker', '')} | "
            f"{row.get('throughput_vs_direct', '')} |"
        )
    lines += [
        "",
        f"2 workers / 1 worker: **{report['targets']['pool_2_vs_1']:.2f}x** (target >= 1.7); "
        f"pool overhead vs direct: **{report['targets']['pool_overhead'] * 100:.1f}%** (target < 5%).",
        "",
        # The throughput ratio above compares 15 ms jobs across slices of a noisy machine; this is
        # the executor's own work per job, measured with jobs that do nothing.
        f"The pool's own cost per job (queue, future, accounting; {inproc['dispatch']['jobs']} jobs that do "
        f"nothing, {inproc['dispatch']['workers']} worker(s)): {inproc['dispatch']['us_per_job']:.1f} us, "
        f"{inproc['dispatch']['share_of_direct_call'] * 100:.2f}% of a direct call.",
    ]
    library = report.get("in_process_library_steps")
    if library:
        by_workers = {row["workers"]: row for row in library["results"]}
        lines += [
            "",
            "The same without the fast paths (`--no-fast-paths`: transformers' own placeholder check, "
            "token-type ids and tensor conversion of the token ids, GIL-held): "
            + ", ".join(
                f"{w} worker(s) {row['req_per_s']:.1f} req/s at {row['cpu_ms_per_request']:.1f} CPU ms/req"
                for w, row in sorted(by_workers.items())
            )
            + f"; 2 workers / 1 worker: {by_workers[2]['req_per_s'] / by_workers[1]['req_per_s']:.2f}x.",
        ]
    lines += [
        "",
        f"Through HTTP (`wrk`, server CPU and RSS from the server process; IO workers: "
        f"{report['io_workers'] or 'the decision (4)'}):",
        "",
        "| backend | workers | threads | decode on | conns | req/s | p50 ms | p99 ms | server cores | CPU ms/req "
        "| faults/req | RSS MB | of bound | wrk (cores) | other load (cores) | of free CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["http"]:
        lines.append(
            f"| {row['backend']} | {row['workers']} | {row['intra_op_threads']} | "
            f"{'worker' if row['decode_on_worker'] else 'IO pool'} | {row['connections']} | "
            f"{row['req_per_s']:.1f} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | {row['server_cpu_cores']:.2f} | "
            f"{row['cpu_ms_per_request']:.1f} | {row['page_faults_per_request']} | {row['rss_mb']:.0f} | "
            f"{row['efficiency'] * 100:.0f}% | {row['wrk_cpu_cores']:.2f} | {row['other_cpu_cores']:.2f} | "
            f"{row['efficiency_of_free_cpu'] * 100:.0f}% |"
        )
    best = report["targets"]["http_best_efficiency"]
    lines += [
        "",
        "Best HTTP efficiency against the bound: "
        + ", ".join(f"{b}: **{e * 100:.0f}%**" for b, e in best.items())
        + " (target >= 90%).",
    ]
    return "\n".join(lines) + "\n"


def have_wrk() -> bool:
    """wrk comes from Debian (hack/system-packages.txt, group bench), installed on first use."""
    if shutil.which("wrk") is None:
        subprocess.run([str(HERE.parents[1] / "hack" / "system-packages.sh"), "bench"], check=False)
    if shutil.which("wrk") is None:
        print("wrk is not installed and could not be installed (hack/system-packages.sh bench)", file=sys.stderr)
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per measurement")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per HTTP measurement")
    parser.add_argument(
        "--in-process-rounds",
        type=int,
        default=10,
        help="interleaved rounds in process: finer slices average out this VM's speed drift, "
        "to which the direct-vs-pool overhead (a few percent) is sensitive",
    )
    parser.add_argument("--io-workers", type=int, default=None, help="serve --io-workers (default: the decision's)")
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--backends", default="torchvision,pil")
    parser.add_argument("--out", default=str(HERE / "results"), help="folder for results.json and results.md")
    args = parser.parse_args()
    # The serial cost is the bound's denominator: measure it with the allocator the server uses.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    memory.tune_allocator()
    if not have_wrk():
        return 2
    workers = measuring.parse_workers(args.workers)
    backends = [Backend(b) for b in args.backends.split(",")]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "usable_cpus": cpus.usable_cpus(),
        "cpu_model": next(
            (
                line.split(":", 1)[1].strip()
                for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            "unknown",
        ),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "duration_s": args.duration,
        "versions": versions.versions(),
    }
    # Not under /tmp: on a shared machine other jobs may clean it up in the middle of a run.
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "mmprep"
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-", dir=cache) as scratch:
        scratch_path = pathlib.Path(scratch)
        model = models.make_model("qwen2-vl", scratch_path / "qwen2-vl")
        body = request_body()
        body_file = scratch_path / "body.json"
        body_file.write_bytes(body)
        lua = scratch_path / "post.lua"
        lua.write_text(WRK_SCRIPT)

        print("in process ...", file=sys.stderr)
        machine_before, own_before, wall_before = machine_busy_seconds(), own_cpu_seconds(), time.perf_counter()
        report["in_process"] = bench.run(
            ModelSettings(str(model), backend=Backend.TORCHVISION),
            [1, 2],
            duration=args.duration,
            size=IMAGE_SIZE,
            warmup=args.warmup,
            intra_op_threads=1,
            rounds=args.in_process_rounds,
        )
        report["in_process"]["model"] = "make-model --kind qwen2-vl"  # not the scratch folder's path
        report["in_process"]["other_cpu_cores"] = round(
            (machine_busy_seconds() - machine_before - (own_cpu_seconds() - own_before)) / (time.perf_counter() - wall_before), 3
        )
        rows = {row["workers"]: row for row in report["in_process"]["results"]}
        direct = report["in_process"]["direct"]

        # The same pool with transformers' own placeholder check, token-type ids and id tensors, for the
        # difference the GIL-light stand-ins make (mmprep_runtime.engine.stand_ins).
        print("in process, without the fast paths ...", file=sys.stderr)
        report["in_process_library_steps"] = bench.run(
            ModelSettings(str(model), backend=Backend.TORCHVISION, fast_paths=False),
            [1, 2],
            duration=args.duration,
            size=IMAGE_SIZE,
            warmup=args.warmup,
            intra_op_threads=1,
            rounds=args.in_process_rounds,
        )
        report["in_process_library_steps"]["model"] = report["in_process"]["model"]

        report["io_workers"] = args.io_workers
        serial = {b.value: SerialCost(model, b, body) for b in backends}
        report["http"] = http_sweep(
            model, backends, workers, body_file, lua, args.duration, args.warmup, args.rounds, serial, args.io_workers
        )
        report["serial"] = {b: meter.summary() for b, meter in serial.items()}
        report["bound"] = {b: report["usable_cpus"] / c["total"] for b, c in report["serial"].items()}
        for row in report["http"]:
            row["efficiency"] = round(row["req_per_s"] / report["bound"][row["backend"]], 3)
            # The same bound with only the CPU that other processes left free during the run.
            free = max(0.1, report["usable_cpus"] - row["other_cpu_cores"])
            row["efficiency_of_free_cpu"] = round(row["req_per_s"] * report["serial"][row["backend"]]["total"] / free, 3)
    report["targets"] = {
        "pool_2_vs_1": round(rows[2]["req_per_s"] / rows[1]["req_per_s"], 3),
        "pool_overhead": round(1 - rows[1]["req_per_s"] / direct["req_per_s"], 3),
        "http_best_efficiency": {
            b.value: max(r["efficiency"] for r in report["http"] if r["backend"] == b.value) for b in backends
        },
    }
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    (out / "results.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
