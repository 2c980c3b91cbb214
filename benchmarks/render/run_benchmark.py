#!/usr/bin/env python3
"""mmprep's vLLM render API against vLLM's own render server: one run, interleaved rounds.

Both servers serve the same processor folder (``mmprep-runtime make-model --kind qwen2-vl``, plus
the model config and chat template it writes), on the same cores (the whole machine, nothing
pinned), and get the same chat body: one 1280x960 JPEG as a ``data:`` URI and a question.
- vLLM: ``vllm launch render --mm-processor-cache-gb 0`` (its processor cache off: a benchmark
  repeating one image would otherwise measure cache hits), from ``hack/vllm/venv.sh``.
- mmprep: ``mmprep-runtime serve`` at the worker count it decides itself.
Two pixel hand-offs: uint8 (both defaults) and normalized (vLLM ``--no-mm-device-do-normalize``,
mmprep ``--normalized-pixels``). Before loading, each pair's answers are checked equal (token ids,
placeholders, hashes, every kwargs tensor byte): the ratio compares equal work.

``wrk`` (C, low overhead) loads one server at a time, in rounds: each round visits every server,
in an order that alternates, so a change in the machine's background load hits all of them. Per
server: req/s, p50/p99, server CPU ms per request (the server process and its children), answer
bytes; per round the machine's load average and the CPU other processes used.

``python benchmarks/render/run_benchmark.py [--duration 15] [--rounds 3]`` (needs ``wrk``).
Writes ``results.json`` and ``results.md`` next to this file.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import msgpack
import psutil

from mmprep_runtime import versions
from mmprep_runtime.commands import measuring
from mmprep_runtime.settings import ModelSettings
from mmprep_runtime.synthetic import models

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.servers import free_port, runtime_command, vllm_render_command, vllm_render_env  # noqa: E402 - after the sys.path line


def _runtime_benchmark() -> Any:
    """The runtime benchmark's helpers (wrk output parsing, CPU accounting): one implementation."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("runtime_benchmark", HERE.parent / "runtime" / "run_benchmark.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_RUNTIME = _runtime_benchmark()
machine_busy_seconds, parse_wrk = _RUNTIME.machine_busy_seconds, _RUNTIME.parse_wrk

IMAGE_SIZE = (1280, 960)
CHAT_PATH = "/v1/chat/completions/render"
# The runtime benchmark's wrk script: the path comes from the URL each run is given.
WRK_SCRIPT = _RUNTIME.WRK_SCRIPT


def vllm_venv() -> tuple[pathlib.Path, str]:
    """vLLM's virtualenv (installed on first use, cached by version) and the vLLM version in it."""
    venv = pathlib.Path(
        subprocess.run([str(REPO / "hack" / "vllm" / "venv.sh")], stdout=subprocess.PIPE, text=True, check=True)
        .stdout.strip()
        .splitlines()[-1]
    )
    version = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return venv, version


def chat_body() -> bytes:
    """The chat request both servers get: one 1280x960 photo-like JPEG and a question."""
    return measuring.request_body("vllm-render", IMAGE_SIZE, seed=1)


def post(base: str, body: bytes) -> bytes:
    request = urllib.request.Request(base + CHAT_PATH, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.read()


def process_tree_cpu(pid: int) -> float:
    process = psutil.Process(pid)
    total = 0.0
    for p in [process, *process.children(recursive=True)]:
        try:
            times = p.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def process_tree_rss(pid: int) -> int:
    process = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [process, *process.children(recursive=True)])


class Server:
    def __init__(
        self,
        name: str,
        command: list[str],
        env: dict[str, str],
        ready_path: str,
        body_file: pathlib.Path,
        lua: pathlib.Path,
        connections: int,
        log: pathlib.Path,
    ) -> None:
        self.name, self.ready_path, self.lua, self.connections = name, ready_path, lua, connections
        self.port = int(command[command.index("--port") + 1])
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log.open("wb")
        self.process = subprocess.Popen(command, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.env = {**os.environ, "MMPREP_BODY": str(body_file)}
        self.body_file = body_file
        self.rounds: list[dict[str, Any]] = []
        self.answer_bytes = 0

    def wait(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(self.base + self.ready_path, timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} not ready in time")

    def load(self, seconds: float, *, measure: bool) -> None:
        cpu_before = process_tree_cpu(self.process.pid)
        machine_before = machine_busy_seconds()
        wrk_before = _RUNTIME.children_cpu_seconds()
        load_before = os.getloadavg()[0]
        started = time.monotonic()
        done = subprocess.run(
            _RUNTIME.wrk_command(self.lua, self.base + CHAT_PATH, connections=self.connections, seconds=seconds, timeout_s=60),
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        elapsed = time.monotonic() - started
        self.settle()
        if not measure:
            return
        result = parse_wrk(done.stdout)
        if result["non_2xx"]:
            sample = _RUNTIME.show_failure(self.base + CHAT_PATH, self.body_file)
            print(f"{self.name}: {result['non_2xx']} answers were not 200; one now: {sample}", file=sys.stderr)
        result["cpu_seconds"] = process_tree_cpu(self.process.pid) - cpu_before
        result["seconds"] = elapsed
        result["wrk_cpu_seconds"] = _RUNTIME.children_cpu_seconds() - wrk_before
        result["other_cpu_seconds"] = max(
            0.0, machine_busy_seconds() - machine_before - result["cpu_seconds"] - result["wrk_cpu_seconds"]
        )
        result["load_average_before"] = load_before
        result["rss_mb"] = round(process_tree_rss(self.process.pid) / 2**20, 1)
        self.rounds.append(result)

    def settle(self, timeout: float = 20.0) -> None:
        """Requests wrk dropped when it stopped are still finished by the server: wait until its CPU
        use stops, so they are not charged to the next server's slice."""
        deadline = time.monotonic() + timeout
        previous = process_tree_cpu(self.process.pid)
        while time.monotonic() < deadline:
            time.sleep(0.25)
            now = process_tree_cpu(self.process.pid)
            if now - previous < 0.02:
                return
            previous = now

    def summary(self) -> dict[str, Any]:
        requests = sum(r["requests"] for r in self.rounds)
        seconds = sum(r["seconds"] for r in self.rounds)
        return {
            "server": self.name,
            "connections": self.connections,
            "requests": requests,
            "req_per_s": round(sum(r["req_per_s"] for r in self.rounds) / len(self.rounds), 2),
            "req_per_s_by_round": [r["req_per_s"] for r in self.rounds],
            "p50_ms": sorted(r["p50_ms"] for r in self.rounds)[len(self.rounds) // 2],
            "p99_ms": max(r["p99_ms"] for r in self.rounds),
            "cpu_ms_per_request": round(sum(r["cpu_seconds"] for r in self.rounds) * 1000 / max(1, requests), 1),
            "server_cpu_cores": round(sum(r["cpu_seconds"] for r in self.rounds) / seconds, 2),
            "wrk_cpu_cores": round(sum(r["wrk_cpu_seconds"] for r in self.rounds) / seconds, 2),
            "other_cpu_cores": round(sum(r["other_cpu_seconds"] for r in self.rounds) / seconds, 2),
            "load_average": [round(r["load_average_before"], 2) for r in self.rounds],
            "non_2xx": sum(r["non_2xx"] for r in self.rounds),
            "answer_bytes": self.answer_bytes,
            "rss_mb": max(r["rss_mb"] for r in self.rounds),
        }

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


class Replicas:
    """vLLM's render server as its users scale it: ``len(commands)`` processes, one per core, each
    loaded by its own wrk with its share of the connections (the same total as a ``Server``), all
    at once. Measured as one server: requests summed, CPU and memory summed over every process
    tree, latency the worst replica's p50 and p99."""

    def __init__(
        self,
        name: str,
        commands: list[list[str]],
        env: dict[str, str],
        ready_path: str,
        body_file: pathlib.Path,
        lua: pathlib.Path,
        connections: int,
        logs: list[pathlib.Path],
    ) -> None:
        share = max(1, -(-connections // len(commands)))
        self.replicas = [
            Server(f"{name} {i + 1}", command, env, ready_path, body_file, lua, share, log)
            for i, (command, log) in enumerate(zip(commands, logs, strict=True))
        ]
        self.name, self.connections = name, share * len(commands)
        self.base = self.replicas[0].base
        self.body_file = body_file
        self.rounds: list[dict[str, Any]] = []
        self.answer_bytes = 0

    def wait(self, timeout: float = 600) -> None:
        for replica in self.replicas:
            replica.wait(timeout)

    def _cpu(self) -> float:
        return sum(process_tree_cpu(r.process.pid) for r in self.replicas)

    def load(self, seconds: float, *, measure: bool) -> None:
        cpu_before = self._cpu()
        machine_before = machine_busy_seconds()
        wrk_before = _RUNTIME.children_cpu_seconds()
        load_before = os.getloadavg()[0]
        started = time.monotonic()
        running = [
            subprocess.Popen(
                _RUNTIME.wrk_command(r.lua, r.base + CHAT_PATH, connections=r.connections, seconds=seconds, timeout_s=60),
                env=r.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in self.replicas
        ]
        outputs = [process.communicate()[0] for process in running]
        elapsed = time.monotonic() - started
        for replica in self.replicas:
            replica.settle()
        if not measure:
            return
        each = [parse_wrk(output) for output in outputs]
        result: dict[str, Any] = {
            "requests": sum(r["requests"] for r in each),
            "req_per_s": round(sum(r["req_per_s"] for r in each), 2),
            "p50_ms": max(r["p50_ms"] for r in each),
            "p99_ms": max(r["p99_ms"] for r in each),
            "non_2xx": sum(r["non_2xx"] for r in each),
        }
        result["cpu_seconds"] = self._cpu() - cpu_before
        result["seconds"] = elapsed
        result["wrk_cpu_seconds"] = _RUNTIME.children_cpu_seconds() - wrk_before
        result["other_cpu_seconds"] = max(
            0.0, machine_busy_seconds() - machine_before - result["cpu_seconds"] - result["wrk_cpu_seconds"]
        )
        result["load_average_before"] = load_before
        result["rss_mb"] = round(sum(process_tree_rss(r.process.pid) for r in self.replicas) / 2**20, 1)
        self.rounds.append(result)

    def summary(self) -> dict[str, Any]:
        return {**Server.summary(self), "replicas": len(self.replicas)}  # type: ignore[arg-type]

    def stop(self) -> None:
        for replica in self.replicas:
            replica.stop()


def equal_answers(ours: bytes, theirs: bytes) -> dict[str, Any]:
    """The two answers render the same request: ids, placeholders, hashes and every tensor byte."""
    a, b = json.loads(ours), json.loads(theirs)
    checks = {
        "token_ids": a["token_ids"] == b["token_ids"],
        "mm_placeholders": a["features"]["mm_placeholders"] == b["features"]["mm_placeholders"],
        "mm_hashes": a["features"]["mm_hashes"] == b["features"]["mm_hashes"],
        "sampling_params": a["sampling_params"] == b["sampling_params"],
    }

    def tensors(item: str) -> dict[str, Any]:
        decoded = msgpack.unpackb(base64.b64decode(item), raw=False)
        return {key: (value["data"][0], value["data"][1], value["data"][2].data) for key, value in decoded.items()}

    checks["kwargs_tensors"] = all(
        tensors(x) == tensors(y)
        for x, y in zip(a["features"]["kwargs_data"]["image"], b["features"]["kwargs_data"]["image"], strict=True)
    )
    return checks


def stage_costs(model: pathlib.Path, body: bytes, normalized: bool, seconds: float = 5.0) -> dict[str, float]:
    """Serial thread CPU ms per request of each stage of mmprep's render path, in one thread with
    one torch thread: where a request's cost goes."""
    import torch

    from mmprep_runtime.backends import model_facts
    from mmprep_runtime.backends.native import chat_request, generate_request, stages, wire_format
    from mmprep_runtime.engine import loading
    from mmprep_runtime.settings import Limits, RenderSettings

    torch.set_num_threads(1)
    processor, facts = loading.load_processor(ModelSettings(str(model)))
    model_facts = model_facts.model_facts(processor, facts, RenderSettings(normalized_pixels=normalized))
    limits = Limits()
    totals: dict[str, float] = {}
    count = 0

    def timed(name: str, work: Any) -> Any:
        started = time.thread_time()
        value = work()
        totals[name] = totals.get(name, 0.0) + time.thread_time() - started
        return value

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline or count < 5:
        request = timed("parse body (JSON, base64)", lambda: chat_request.parse_chat(body))
        data = request.images[0].data
        image, identity = timed("decode JPEG", lambda: stages.decode_image(data, "image", limits, facts.image_layout))
        text = timed("chat template", lambda: stages._prompt_text(processor, request))
        outputs = timed(
            "processor (resize, patches, tokenize)",
            lambda: stages._process_tokenizing_once(processor, text, [image], model_facts),
        )
        items = timed(
            "split into items",
            lambda: stages._items(outputs, 1, None if model_facts.device_normalize else model_facts.dtype),
        )
        timed("mm_hash (blake3)", lambda: wire_format.mm_hash(model_facts.model_id, "image", identity, {}))
        rendered = generate_request.Rendered(
            outputs["input_ids"][0].numpy(), ["0" * 64], [{"offset": 0, "length": 1}], items, request
        )
        api = stages.RenderApi(facts, model_facts, limits, None, chat=True)  # type: ignore[arg-type]
        timed("answer JSON (msgpack, base64, orjson)", lambda: api.encode(rendered))
        count += 1
    return {name: round(total * 1000 / count, 2) for name, total in totals.items()}


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# vLLM render vs mmprep render API",
        "",
        f"{report['machine']['cpus']} CPUs, {report['image']} JPEG per request, {report['rounds']} interleaved "
        f"rounds of {report['duration_s']:g} s per server, `wrk -t1`; vLLM {report['versions']['vllm']} "
        "render with its processor cache off; mmprep at its decided worker count "
        f"({report['mmprep_workers']}). Load average at the start: {report['machine']['load_average_start']}.",
        "",
        "| pixels | server | req/s | by round | p50 ms | p99 ms | CPU ms/req | server cores | wrk cores "
        "| other load (cores) | answer MB | RSS MB | equal answers |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, pair in report["modes"].items():
        for row in pair["servers"]:
            lines.append(
                f"| {mode} | {row['server']} | {row['req_per_s']} | {', '.join(f'{x:.1f}' for x in row['req_per_s_by_round'])} "
                f"| {row['p50_ms']:.0f} | {row['p99_ms']:.0f} | {row['cpu_ms_per_request']} | {row['server_cpu_cores']} "
                f"| {row['wrk_cpu_cores']} | {row['other_cpu_cores']} | {row['answer_bytes'] / 1e6:.2f} | {row['rss_mb']:.0f} "
                f"| {'yes' if all(pair['equal'].values()) else pair['equal']} |"
            )
    lines.append("")
    for mode, pair in report["modes"].items():
        lines.append(
            f"- {mode}: mmprep / vLLM throughput **{pair['throughput_ratio']:.2f}x**, "
            f"CPU per request {pair['cpu_ratio']:.2f}x of vLLM's"
        )
    for mode, stages in report.get("stages_ms", {}).items():
        lines += ["", f"mmprep's serial CPU ms per request by stage ({mode}, one thread):", "", "| stage | ms |", "|---|---|"]
        lines += [f"| {name} | {ms} |" for name, ms in stages.items()]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per server per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--modes", default="uint8,normalized")
    parser.add_argument("--out", default=str(HERE))
    args = parser.parse_args()
    if not _RUNTIME.have_wrk():
        return 2
    venv, vllm_version = vllm_venv()
    modes = [m for m in args.modes.split(",") if m]
    work = pathlib.Path(tempfile.mkdtemp(prefix="mmprep-render-bench-"))
    model = models.make_model("qwen2-vl", work / "qwen2-vl")
    body_file = work / "body.json"
    body = chat_body()
    body_file.write_bytes(body)
    lua = work / "post.lua"
    lua.write_text(WRK_SCRIPT)
    servers: dict[str, list[Server]] = {}
    load_start = [round(x, 2) for x in os.getloadavg()]
    try:
        for mode in modes:
            normalized = mode == "normalized"
            vllm_cmd = vllm_render_command(venv, model, free_port(), normalized=normalized)
            mmprep_cmd = [*runtime_command(), "serve", "--model", str(model), "--host", "127.0.0.1", "--port", str(free_port())]
            mmprep_cmd += ["--log-level", "WARNING", *(["--normalized-pixels"] if normalized else [])]
            # The same client concurrency for both: enough to keep mmprep's workers and decoders busy.
            servers[mode] = [
                Server("vLLM render", vllm_cmd, vllm_render_env(), "/health", body_file, lua, 4, work / f"vllm-{mode}.log"),
                Server("mmprep", mmprep_cmd, dict(os.environ), "/readyz", body_file, lua, 4, work / f"mmprep-{mode}.log"),
            ]
        for pair in servers.values():
            for server in pair:
                server.wait()
        equal: dict[str, dict[str, bool]] = {}
        for mode, (vllm, mmprep) in servers.items():
            theirs, ours = post(vllm.base, body), post(mmprep.base, body)
            vllm.answer_bytes, mmprep.answer_bytes = len(theirs), len(ours)
            equal[mode] = equal_answers(ours, theirs)
            print(f"{mode}: answers equal: {equal[mode]}", file=sys.stderr)
        with urllib.request.urlopen(servers[modes[0]][1].base + "/v1/info", timeout=10) as response:
            workers = json.loads(response.read())["workers"]
        everyone = [s for pair in servers.values() for s in pair]
        for server in everyone:
            server.load(args.warmup, measure=False)
        for round_ in range(args.rounds):
            order = everyone if round_ % 2 == 0 else list(reversed(everyone))
            for server in order:
                server.load(args.duration, measure=True)
                print(f"round {round_ + 1}: {server.name}: {server.rounds[-1]['req_per_s']} req/s", file=sys.stderr)
    finally:
        for pair in servers.values():
            for server in pair:
                server.stop()
    report: dict[str, Any] = {
        "image": f"{IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}",
        "duration_s": args.duration,
        "rounds": args.rounds,
        "mmprep_workers": f"{workers['processor']} processor ({workers['reason']}), {workers['io']} io",
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_start": load_start,
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
        },
        "versions": {**versions.versions(), "vllm": vllm_version},
        "modes": {},
    }
    for mode, (vllm, mmprep) in servers.items():
        a, b = mmprep.summary(), vllm.summary()
        report["modes"][mode] = {
            "servers": [b, a],
            "equal": equal[mode],
            "throughput_ratio": round(a["req_per_s"] / b["req_per_s"], 3),
            "cpu_ratio": round(a["cpu_ms_per_request"] / b["cpu_ms_per_request"], 3),
        }
    report["stages_ms"] = {mode: stage_costs(model, body, mode == "normalized") for mode in modes}
    out = pathlib.Path(args.out)
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "results.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
