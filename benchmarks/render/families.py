#!/usr/bin/env python3
"""The render tier against vLLM's render server, per model family: one run, interleaved rounds.

For each family ``make-model`` builds (``mmprep_runtime.synthetic.families``), both servers serve the
same folder on the same cores (the whole machine, nothing pinned) and get the same chat body (one
1280x960 JPEG as a ``data:`` URI and a question; for an audio family, one 10 s WAV clip inline):
- vLLM as its users scale it (the peer): ``vllm launch render --mm-processor-cache-gb 0`` replicas,
  one per core (it is one process with one multimodal thread), each loaded by its own ``wrk``
  with its share of the connections, all at once; and one such process alone, with all the
  connections (a secondary figure);
- mmprep: ``mmprep-runtime serve --render-path auto`` from vLLM's virtualenv, its cache off too:
  the native path for the families that have one (``backends.choice.NATIVE_FAMILIES``), vLLM's
  own processing in one render process per core for every other family (the general path).
An audio family also gets a third server, vLLM's with torchcodec hidden (``hidden_torchcodec``), to
tell what mmprep gains from decoding without torchcodec's failed per-clip load (its render
processes try torchcodec once) from what it gains otherwise. Per family also: the share of the
processing that holds the GIL, and the throughput it predicts at 16 and 64 cores for threads in one
process and for one process per core (``gil_share``). Before loading, one answer of each is judged
equal by vLLM's own checker (``tests/support/vllm_check.py``).
``wrk`` loads one server at a time, every server once per round, the order
alternating between rounds, so the machine's background load hits all of them alike. Per server:
req/s, p50/p99, server CPU ms per request (the process tree), answer bytes.

``python benchmarks/render/families.py [--families a,b] [--duration 10] [--rounds 3]`` (needs wrk:
``hack/system-packages.sh bench``). Writes ``results-families.json`` and ``.md`` next to this file.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import urllib.request
from typing import Any

from mmprep_runtime.commands import measuring
from mmprep_runtime.synthetic import families, media, models

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.render_servers import vllm_check  # noqa: E402 - after the sys.path line
from support.servers import free_port, vllm_render_command, vllm_render_env  # noqa: E402 - after the sys.path line


def _render_benchmark() -> Any:
    """The render benchmark's server driver (wrk, CPU accounting, summaries): one implementation."""
    spec = importlib.util.spec_from_file_location("render_benchmark", HERE / "run_benchmark.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_BENCH = _render_benchmark()


def _checked_equal(venv: pathlib.Path, ours: bytes, theirs: bytes, work: pathlib.Path) -> dict[str, Any]:
    """One pair of answers judged by vLLM's own checker (the compatibility tests' judge)."""
    (work / "ours.json").write_bytes(ours)
    (work / "theirs.json").write_bytes(theirs)
    (work / "manifest.json").write_text(json.dumps({"one": [str(work / "ours.json"), str(work / "theirs.json")]}))
    result: dict[str, Any] = vllm_check(venv, work / "manifest.json")["one"]
    return result


def gil_share(folder: pathlib.Path, venv: pathlib.Path, work: pathlib.Path, seconds: float) -> dict[str, Any]:
    """The share of a request's processing that holds the GIL, from how the family's HF processor
    (the one vLLM calls, under vLLM's transformers) scales from one thread to two in one process
    on two cores: with a share g, n threads give 1 / (g + (1 - g) / n) times one thread (Amdahl),
    so g = 2 / speedup(2) - 1. vLLM's own per-request Python (its pydantic models, msgspec, the
    hashing) holds the GIL too: this g is the floor for vLLM's processing, not its ceiling."""
    out = work / f"{folder.name}-gil.json"
    command = [str(venv / "bin" / "python"), "-m", "mmprep_runtime.cli", "bench", "--model", str(folder)]
    command += ["--workers", "1,2", "--intra-op-threads", "1", "--decode", "--image", "1280x960"]
    command += ["--duration", f"{seconds:g}", "--rounds", "2", "--warmup", "2", "--json", str(out), "--no-progress"]
    subprocess.run(command, env={**vllm_render_env(), "PYTHONPATH": str(REPO / "runtime")}, capture_output=True, check=True)
    rows = {r["workers"]: r for r in json.loads(out.read_text())["results"]}
    one, two = rows[1]["req_per_s"], rows[2]["req_per_s"]
    share = min(1.0, max(0.0, 2 * one / two - 1))

    def threads(cores: int) -> float:
        return one / (share + (1 - share) / cores)

    return {
        "thread_req_per_s": one,
        "speedup_2_threads": round(two / one, 3),
        "gil_share": round(share, 3),
        # One process, n threads; n processes of one thread each (no GIL between them; memory
        # bandwidth and the front end's own loop aside).
        "predicted_req_per_s": {
            str(n): {"threads": round(threads(n), 1), "threads_x_processes": round(n * one, 1)} for n in (16, 64)
        },
    }


#: The peer: vLLM's render server scaled as its users scale it, one process per core, each loaded
#: by its own client with its share of the connections.
REPLICAS = "vLLM render replicas"
#: The secondary peer: one vLLM render process, all the connections.
ONE_PROCESS = "vLLM render, one process"
#: The fourth server an audio family is measured against (one vLLM process).
VLLM_NO_TORCHCODEC = "vLLM render, torchcodec hidden"
#: An audio family's request: one clip of this many seconds (a spoken question is a few to tens).
AUDIO_SECONDS = 10.0


def request_body(kind: str) -> bytes:
    """The chat body every server gets: one 1280x960 JPEG, or for an audio family one WAV clip."""
    if not families.FAMILIES[kind].chat.audio:
        return measuring.request_body("vllm-render", (1280, 960), seed=1)
    clip = base64.b64encode(media.wav(AUDIO_SECONDS)).decode()
    content = [{"type": "input_audio", "input_audio": {"data": clip, "format": "wav"}}, {"type": "text", "text": "What is said?"}]
    return json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": 64}).encode()


def hidden_torchcodec(work: pathlib.Path) -> pathlib.Path:
    """A folder that, first on a Python path, makes ``import torchcodec`` fail: vLLM then records
    torchcodec as unavailable once and decodes audio with soundfile from the first clip, as mmprep's
    render processes do, instead of retrying torchcodec's failed library load on every clip (where
    FFmpeg's shared libraries are missing, as here)."""
    package = work / "no-torchcodec" / "torchcodec"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text('raise ImportError("torchcodec is hidden for this benchmark")\n')
    return package.parent


def bench_family(kind: str, venv: pathlib.Path, args: argparse.Namespace, work: pathlib.Path) -> dict[str, Any]:
    folder = models.make_model(kind, work / kind)
    body_file, lua = work / f"{kind}.json", work / "post.lua"
    body = request_body(kind)
    body_file.write_bytes(body)
    lua.write_text(_BENCH.WRK_SCRIPT)
    replicas = os.cpu_count() or 1
    replica_cmds = [vllm_render_command(venv, folder, free_port(), normalized=False) for _ in range(replicas)]
    replica_logs = [work / f"{kind}-vllm-replica-{i + 1}.log" for i in range(replicas)]
    vllm_cmd = vllm_render_command(venv, folder, free_port(), normalized=False)
    mmprep_cmd = [str(venv / "bin" / "python"), "-m", "mmprep_runtime.cli", "serve", "--model", str(folder)]
    mmprep_cmd += ["--host", "127.0.0.1", "--port", str(free_port()), "--log-level", "WARNING", "--render-path", "auto"]
    mmprep_cmd += ["--vllm-args", "--mm-processor-cache-gb 0"]
    mmprep_env = {**vllm_render_env(), "PYTHONPATH": str(REPO / "runtime")}
    servers = [
        _BENCH.Replicas(REPLICAS, replica_cmds, vllm_render_env(), "/health", body_file, lua, 4, replica_logs),
        _BENCH.Server("mmprep", mmprep_cmd, mmprep_env, "/health", body_file, lua, 4, work / f"{kind}-mmprep.log"),
        _BENCH.Server(ONE_PROCESS, vllm_cmd, vllm_render_env(), "/health", body_file, lua, 4, work / f"{kind}-vllm.log"),
    ]
    if families.FAMILIES[kind].chat.audio:
        # The same vLLM without the per-clip torchcodec retry: what mmprep gains besides skipping it.
        hidden_env = {**vllm_render_env(), "PYTHONPATH": str(hidden_torchcodec(work))}
        hidden_cmd = vllm_render_command(venv, folder, free_port(), normalized=False)
        log = work / f"{kind}-vllm-hidden.log"
        servers.append(_BENCH.Server(VLLM_NO_TORCHCODEC, hidden_cmd, hidden_env, "/health", body_file, lua, 4, log))
    try:
        for server in servers:
            server.wait()
        vllm, mmprep = servers[:2]
        theirs, ours = _BENCH.post(vllm.base, body), _BENCH.post(mmprep.base, body)
        vllm.answer_bytes, mmprep.answer_bytes = len(theirs), len(ours)
        equal = _checked_equal(venv, ours, theirs, work)
        for other in servers[2:]:  # the same vLLM decoding with another backend order: the same answer
            answer = _BENCH.post(other.base, body)
            other.answer_bytes = len(answer)
            also = _checked_equal(venv, answer, theirs, work)
            equal = {"ok": equal["ok"] and also["ok"], "problems": [*equal["problems"], *also["problems"]]}
        with urllib.request.urlopen(mmprep.base + "/v1/info", timeout=10) as response:
            render = json.loads(response.read())["vllm_render"]
        for server in servers:
            server.load(args.warmup, measure=False)
        for round_ in range(args.rounds):
            for server in servers if round_ % 2 == 0 else list(reversed(servers)):
                server.load(args.duration, measure=True)
                print(f"{kind} round {round_ + 1}: {server.name}: {server.rounds[-1]['req_per_s']} req/s", file=sys.stderr)
    finally:
        for server in servers:
            server.stop()
    a, b, one = mmprep.summary(), vllm.summary(), servers[2].summary()
    extra = [server.summary() for server in servers[3:]]
    return {
        "gil": gil_share(folder, venv, work, args.gil_seconds),
        "path": render["path"],
        "processes": (render.get("general") or {}).get("processes"),
        "equal": equal["ok"],
        "problems": equal["problems"],
        "servers": [b, a, one, *extra],
        "throughput_ratio": round(a["req_per_s"] / b["req_per_s"], 3),
        "cpu_ratio": round(a["cpu_ms_per_request"] / b["cpu_ms_per_request"], 3),
        "memory_ratio": round(a["rss_mb"] / b["rss_mb"], 3),
        "throughput_ratio_one_process": round(a["req_per_s"] / one["req_per_s"], 3),
        "cpu_ratio_one_process": round(a["cpu_ms_per_request"] / one["cpu_ms_per_request"], 3),
        **(
            {
                "throughput_ratio_no_torchcodec": round(a["req_per_s"] / extra[0]["req_per_s"], 3),
                "cpu_ratio_no_torchcodec": round(a["cpu_ms_per_request"] / extra[0]["cpu_ms_per_request"], 3),
            }
            if extra
            else {}
        ),
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# The render tier vs vLLM's render server, per family",
        "",
        f"{report['cpus']} CPUs, one 1280x960 JPEG per request (an audio family: one {AUDIO_SECONDS:g} s WAV clip), "
        f"{report['rounds']} interleaved rounds of "
        f"{report['duration_s']:g} s per server, 4 connections per server (`wrk -t1 -c4`; the replicas: one "
        f"`wrk -t1` per replica with its share of them); vLLM {report['vllm']} render with its processor "
        f"cache off, one replica per CPU, and one process alone; mmprep `--render-path auto` with its cache off too. "
        "Memory: the resident set of each side's processes, all replicas summed. "
        + (
            "Families re-measured with `--merge` come from a later run: load averages per family below."
            if any("load" in row for row in report["families"].values())
            else f"Load average at the start: {report['load_start']}."
        ),
        "",
        "| family | mmprep path | server | req/s | by round | p50 ms | p99 ms | CPU ms/req | memory MB | answer MB | equal |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, row in report["families"].items():
        path = row["path"]
        if row["processes"]:
            path += f" ({row['processes']} processes)" if path == "general" else f" (+ {row['processes']} general fallback)"
        for s in row["servers"]:
            by_round = ", ".join(f"{x:.1f}" for x in s["req_per_s_by_round"])
            name = s["server"] + (f" ({s['replicas']})" if "replicas" in s else "")
            lines.append(
                f"| {kind} | {path} | {name} | {s['req_per_s']} | {by_round} "
                f"| {s['p50_ms']:.0f} | {s['p99_ms']:.0f} | {s['cpu_ms_per_request']} | {s['rss_mb']:.0f} "
                f"| {s['answer_bytes'] / 1e6:.2f} "
                f"| {'yes' if row['equal'] else row['problems'][:2]} |"
            )
    loads = {kind: row["load"][0] for kind, row in report["families"].items() if "load" in row}
    if loads:
        lines += ["", "Load average (1, 5, 15 min) as each family's measurement began:", ""]
        lines += [f"- {kind}: {load}" for kind, load in loads.items()]
    lines += [
        "",
        "| family | mmprep / vLLM replicas req/s | CPU per request | memory "
        "| mmprep / one vLLM process req/s | CPU per request |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {k} | **{r['throughput_ratio']:.2f}x** | {r['cpu_ratio']:.2f}x | {r['memory_ratio']:.2f}x "
        f"| {r['throughput_ratio_one_process']:.2f}x | {r['cpu_ratio_one_process']:.2f}x |"
        for k, r in report["families"].items()
    ]
    lines += [
        f"| {k}, against {VLLM_NO_TORCHCODEC} "
        f"| {r['throughput_ratio_no_torchcodec']:.2f}x | {r['cpu_ratio_no_torchcodec']:.2f}x |"
        for k, r in report["families"].items()
        if "throughput_ratio_no_torchcodec" in r
    ]
    lines += [
        "",
        "The processing's GIL-held share (its HF processor from one thread to two in one process) and what it predicts:",
        "",
        "| family | 1 thread req/s | 2 threads speedup | GIL share | 16 cores: threads / processes "
        "| 64 cores: threads / processes |",
        "|---|---|---|---|---|---|",
    ]
    for k, r in report["families"].items():
        g, p16, p64 = r["gil"], r["gil"]["predicted_req_per_s"]["16"], r["gil"]["predicted_req_per_s"]["64"]
        lines.append(
            f"| {k} | {g['thread_req_per_s']} | {g['speedup_2_threads']:.2f}x | {g['gil_share']:.2f} "
            f"| {p16['threads']} / {p16['threads_x_processes']} | {p64['threads']} / {p64['threads_x_processes']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(families.FAMILIES))
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per server per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=4.0)
    parser.add_argument("--gil-seconds", type=float, default=6.0, help="seconds per thread count of the GIL measurement")
    parser.add_argument("--out", default=str(HERE))
    parser.add_argument("--markdown-only", action="store_true", help="rewrite the .md from the committed .json")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="re-measure only --families and keep the other families' rows from the committed .json (each row "
        "keeps its own run's load average: a row's two servers are always measured side by side in one run)",
    )
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    if args.markdown_only:
        (out / "results-families.md").write_text(markdown(json.loads((out / "results-families.json").read_text())))
        return 0
    if not _BENCH._RUNTIME.have_wrk():
        return 2
    venv, vllm_version = _BENCH.vllm_venv()
    work = pathlib.Path(tempfile.mkdtemp(prefix="mmprep-family-bench-"))
    report: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "duration_s": args.duration,
        "rounds": args.rounds,
        "load_start": [round(x, 2) for x in os.getloadavg()],
        "vllm": vllm_version,
        "families": {},
    }
    kept: dict[str, Any] = {}
    if args.merge and (out / "results-families.json").exists():
        previous = json.loads((out / "results-families.json").read_text())
        run_load = [previous["load_start"], previous["load_end"]]
        kept = {kind: {"load": run_load, **row} for kind, row in previous["families"].items()}
    for kind in [k for k in args.families.split(",") if k]:
        start = [round(x, 2) for x in os.getloadavg()]
        report["families"][kind] = bench_family(kind, venv, args, work)
        report["families"][kind]["load"] = [start, [round(x, 2) for x in os.getloadavg()]]
        print(markdown(report), file=sys.stderr)
    report["load_end"] = [round(x, 2) for x in os.getloadavg()]
    if kept:
        # Re-measured rows replace theirs; the others keep their order and their own run's load.
        report["families"] = {kind: report["families"].get(kind, row) for kind, row in kept.items()} | report["families"]
    (out / "results-families.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "results-families.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
