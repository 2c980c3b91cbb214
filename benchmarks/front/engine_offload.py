#!/usr/bin/env python3
"""The OpenAI front against the engine's own OpenAI API, side by side in one run: what the tier
takes off the engine's node.

One vLLM engine (``vllm serve --enable-scale-out``: vLLM's CPU build here, dummy weights on the
tiny Qwen2.5-VL folder) and one tier in front of it (``mmprep-runtime serve --engine``, from the
engine's virtualenv so both run one vLLM). The same load goes, in alternating rounds,
(a) to the engine's own ``/v1/chat/completions`` and (b) through the tier to the same engine:
closed-loop clients, each sending streamed image chats (a JPEG never sent before in each request,
so no cache of either side answers for it), each answer a fixed number of tokens (``ignore_eos``).

Per round: requests per second; time to first token (request sent to the first content event) and
the gap between tokens, p50/p90; the CPU seconds per request of the engine's process tree and of
the tier's; and each side's resident memory. On a GPU node the engine's CPU per request is what
limits it (its preprocessing runs on the node's CPUs while the GPU waits); the tier moves that
work to CPU-only nodes. Here the engine's forward passes run on the CPU too, so its CPU per
request counts the (tiny) model as well: the difference between (a) and (b) is the preprocessing
the tier took off it.

``python benchmarks/front/engine_offload.py [--rounds 2] [--duration 30] [--clients 4]`` writes
``results.json`` and ``results.md`` next to this file.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import psutil

from mmprep_runtime.synthetic import media, models

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.render_servers import Server  # noqa: E402 - after the sys.path line
from support.servers import cpu_engine_env, free_port  # noqa: E402 - after the sys.path line

sys.path.insert(0, str(REPO / "benchmarks" / "render"))
from run_benchmark import process_tree_cpu as tree_cpu  # noqa: E402 - after the sys.path line
from run_benchmark import process_tree_rss as tree_rss  # noqa: E402 - after the sys.path line

CHAT = "/v1/chat/completions"


def cpu_engine_venv() -> pathlib.Path:
    done = subprocess.run([str(REPO / "hack" / "vllm" / "venv.sh"), "cpu-engine"], stdout=subprocess.PIPE, text=True, check=True)
    return pathlib.Path(done.stdout.strip().splitlines()[-1])


class Images:
    """JPEGs made ahead, each handed out once (a request never repeats one)."""

    def __init__(self, count: int, size: tuple[int, int]) -> None:
        self._uris = [
            "data:image/jpeg;base64," + base64.b64encode(media.jpeg(*size, seed=1000 + i)).decode() for i in range(count)
        ]
        self._lock = threading.Lock()

    def take(self) -> str:
        with self._lock:
            if not self._uris:
                raise RuntimeError("out of images: raise --images")
            return self._uris.pop()


def one_request(port: int, body: dict[str, Any]) -> tuple[float, list[float]]:
    """Send a streamed chat; (seconds to the first content event, the gaps between tokens)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    sent = time.perf_counter()
    try:
        connection.request("POST", CHAT, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {response.read()[:500]!r}")
        first: float | None = None
        last = sent
        gaps = []
        while line := response.readline():
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            event = json.loads(line[6:])
            if any((c.get("delta") or {}).get("content") or (c.get("delta") or {}).get("reasoning") for c in event["choices"]):
                now = time.perf_counter()
                if first is None:
                    first = now - sent
                else:
                    gaps.append(now - last)
                last = now
        return (first if first is not None else time.perf_counter() - sent), gaps
    finally:
        connection.close()


def load(port: int, model: str, images: Images, clients: int, duration: float, tokens: int) -> dict[str, Any]:
    deadline = time.perf_counter() + duration
    ttfts: list[float] = []
    gaps: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()

    def client() -> None:
        while time.perf_counter() < deadline:
            content = [{"type": "image_url", "image_url": {"url": images.take()}}, {"type": "text", "text": "Describe it."}]
            body = {
                "model": model,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": tokens,
                "ignore_eos": True,
                "temperature": 0,
                "stream": True,
            }
            try:
                ttft, request_gaps = one_request(port, body)
            except Exception as exc:  # noqa: BLE001 - counted and shown
                with lock:
                    failures.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            with lock:
                ttfts.append(ttft)
                gaps.extend(request_gaps)

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"seconds": time.perf_counter() - started, "ttfts": ttfts, "gaps": gaps, "failures": failures}


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load per side and round")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16, help="tokens per answer")
    parser.add_argument("--image", default="1280x960")
    parser.add_argument("--images", type=int, default=2000, help="distinct JPEGs made ahead")
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    size = tuple(int(v) for v in args.image.split("x"))
    venv = cpu_engine_venv()
    work = pathlib.Path(tempfile.mkdtemp(prefix="front-bench-"))
    folder = models.make_model("qwen2.5-vl", work / "qwen2.5-vl")
    engine_port, tier_port = free_port(), free_port()
    engine_command = [str(venv / "bin" / "vllm"), "serve", str(folder), "--enable-scale-out", "--host", "127.0.0.1"]
    engine_command += ["--port", str(engine_port), "--load-format", "dummy", "--enforce-eager", "--max-model-len", "4096"]
    tier_command = [str(venv / "bin" / "python"), "-m", "mmprep_runtime.cli", "serve", "--model", str(folder)]
    tier_command += ["--host", "127.0.0.1", "--port", str(tier_port), "--render-processes", "1"]
    tier_command += ["--engine", f"http://127.0.0.1:{engine_port}"]
    engine = Server("engine", engine_command, cpu_engine_env(venv), "/health", work / "engine.log")
    tier_env = {**cpu_engine_env(venv), "PYTHONPATH": str(REPO / "runtime")}
    tier = Server("tier", tier_command, tier_env, "/health", work / "tier.log")
    images = Images(args.images, size)  # type: ignore[arg-type]
    rows: list[dict[str, Any]] = []
    try:
        engine.wait()
        tier.wait()
        for port in (engine_port, tier_port):  # warm both paths
            load(port, str(folder), images, 1, 3.0, args.tokens)
        for round_index in range(args.rounds):
            for side, port in (("engine", engine_port), ("tier", tier_port)):
                engine_cpu, tier_cpu = tree_cpu(engine.process.pid), tree_cpu(tier.process.pid)
                measured = load(port, str(folder), images, args.clients, args.duration, args.tokens)
                done = len(measured["ttfts"])
                row = {
                    "round": round_index,
                    "side": side,
                    "requests": done,
                    "failures": len(measured["failures"]),
                    "failure_examples": measured["failures"][:3],
                    "requests_per_s": done / measured["seconds"],
                    "ttft_p50_ms": 1000 * quantile(measured["ttfts"], 0.5),
                    "ttft_p90_ms": 1000 * quantile(measured["ttfts"], 0.9),
                    "token_gap_p50_ms": 1000 * quantile(measured["gaps"], 0.5),
                    "token_gap_p90_ms": 1000 * quantile(measured["gaps"], 0.9),
                    "engine_cpu_ms_per_request": 1000 * (tree_cpu(engine.process.pid) - engine_cpu) / max(done, 1),
                    "tier_cpu_ms_per_request": 1000 * (tree_cpu(tier.process.pid) - tier_cpu) / max(done, 1),
                    "engine_rss_gb": tree_rss(engine.process.pid) / 1e9,
                    "tier_rss_gb": tree_rss(tier.process.pid) / 1e9,
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        tier.stop()
        engine.stop()
    summary = summarize(rows)
    result = {
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "cpus": psutil.cpu_count(),
        "rows": rows,
        "summary": summary,
    }
    pathlib.Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
    pathlib.Path(args.out + ".md").write_text(markdown(result))
    print(markdown(result))
    return 0


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def mean(side: str, key: str) -> float:
        return statistics.fmean(r[key] for r in rows if r["side"] == side)

    keys = [k for k in rows[0] if k.endswith(("_per_s", "_ms", "_per_request", "_gb"))]
    means = {side: {k: mean(side, k) for k in keys} for side in ("engine", "tier")}
    return {
        "means": means,
        "tier_over_engine": {k: means["tier"][k] / means["engine"][k] for k in keys if means["engine"][k]},
    }


def markdown(result: dict[str, Any]) -> str:
    args = result["args"]
    lines = [
        "# The OpenAI front against the engine's own API",
        "",
        f"One run, {args['rounds']} alternating rounds of {args['duration']:g} s per side, {args['clients']} closed-loop "
        f"clients, streamed image chats ({args['image']} JPEG, each new), {args['tokens']} tokens per answer; "
        f"vLLM's CPU engine (dummy weights, tiny Qwen2.5-VL) on {result['cpus']} CPUs shared by both servers and the "
        "client. `python benchmarks/front/engine_offload.py` reruns it.",
        "",
        "| round | side | req/s | TTFT p50 ms | TTFT p90 ms | token gap p50 ms | engine CPU ms/req | tier CPU ms/req "
        "| engine RSS GB | tier RSS GB | failed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['round']} | {r['side']} | {r['requests_per_s']:.2f} | {r['ttft_p50_ms']:.0f} | {r['ttft_p90_ms']:.0f} "
            f"| {r['token_gap_p50_ms']:.1f} | {r['engine_cpu_ms_per_request']:.0f} | {r['tier_cpu_ms_per_request']:.0f} "
            f"| {r['engine_rss_gb']:.2f} | {r['tier_rss_gb']:.2f} | {r['failures']} |"
        )
    ratio = result["summary"]["tier_over_engine"]
    lines += [
        "",
        "Through the tier, as a ratio of the engine's own API (means over rounds):",
        "",
        f"- requests/s: {ratio.get('requests_per_s', float('nan')):.2f}x",
        f"- engine CPU per request: {ratio.get('engine_cpu_ms_per_request', float('nan')):.2f}x",
        f"- time to first token p50: {ratio.get('ttft_p50_ms', float('nan')):.2f}x",
        f"- gap between tokens p50: {ratio.get('token_gap_p50_ms', float('nan')):.2f}x",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
