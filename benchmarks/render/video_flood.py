#!/usr/bin/env python3
"""Memory under a flood of large videos: the general render path against vLLM's render server.

Both servers serve one Qwen3-VL folder (``make-model --kind qwen3-vl``) from vLLM's virtualenv:
- vLLM: ``vllm launch render --mm-processor-cache-gb 0`` (one process);
- mmprep: ``mmprep-runtime serve --render-path general --render-processes 2`` with its defaults
  otherwise (admission before a body is read: at most the processes plus ``--queue-size`` bodies
  held; the rest answered 429 at once, their bodies never read).

Each gets the same flood, one server after the other in one run: ``--clients`` threads, each
posting one chat request with an MP4 (``--video-seconds``, 10, of 1280x720 at 30 fps, MPEG-4 Part 2:
about 15 MB, 20 MB as a ``data:`` URI, under mmprep's 32 MiB body cap) again as soon as the last
answer came, for ``--seconds``. The
resident memory of the server's process tree (the server and its render processes; shared pages
counted in each) is sampled every 0.25 s: before (one request served), its peak in each quarter
of the flood (memory that grows with time would show as rising quarters), and after. Statuses
are counted per server.

``python benchmarks/render/video_flood.py [--clients 16] [--seconds 60]``. Writes
``results-video-flood.json`` and ``.md`` next to this file.
"""

from __future__ import annotations

import argparse
import base64
import collections
import http.client
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from mmprep_runtime.synthetic import models

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO / "tests"), str(HERE)]

import run_benchmark as _BENCH  # noqa: E402 - after the sys.path line; vLLM's virtualenv, process-tree memory
from support.servers import free_port, vllm_render_command, vllm_render_env  # noqa: E402 - after the sys.path line

CHAT = "/v1/chat/completions/render"
SAMPLE_SECONDS = 0.25

# Encodes a synthetic clip with PyAV (vLLM's virtualenv has it: vLLM's audio extra), moving shapes
# over noise so the encoder cannot shrink it to nothing and every frame decodes to new pixels.
_ENCODE = """
import sys, av, numpy as np
out, seconds, width, height, fps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rng = np.random.default_rng(0)
noise = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
with av.open(out, "w") as container:
    stream = container.add_stream("mpeg4", rate=fps)
    stream.width, stream.height, stream.pix_fmt, stream.bit_rate = width, height, "yuv420p", 6_000_000
    for i in range(int(seconds * fps)):
        frame = np.roll(noise, i * 7, axis=1)
        frame[(i * 5) % height : (i * 5) % height + 80, :, 0] = 255
        for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)
"""


def encode_video(venv: pathlib.Path, out: pathlib.Path, seconds: float, width: int = 1280, height: int = 720) -> bytes:
    subprocess.run(
        [str(venv / "bin" / "python"), "-c", _ENCODE, str(out), f"{seconds:g}", str(width), str(height), "30"],
        check=True,
        capture_output=True,
    )
    return out.read_bytes()


def chat_body(video: bytes) -> bytes:
    url = f"data:video/mp4;base64,{base64.b64encode(video).decode()}"
    content = [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "What happens?"}]
    return json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": 16}).encode()


def _post(port: int, body: bytes, timeout: float = 600) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", CHAT, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def _wait_ready(process: subprocess.Popen[bytes], port: int, name: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}")
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            connection.close()
        time.sleep(0.5)
    raise RuntimeError(f"{name} not ready in {timeout:.0f} s")


def flood(
    name: str, command: list[str], env: dict[str, str], body: bytes, args: argparse.Namespace, log: pathlib.Path
) -> dict[str, Any]:
    port = int(command[command.index("--port") + 1])
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_ready(process, port, name)
        first = _post(port, body)
        before = _BENCH.process_tree_rss(process.pid)
        statuses: collections.Counter[str] = collections.Counter()
        lock = threading.Lock()
        stop = threading.Event()

        def client() -> None:
            while not stop.is_set():
                try:
                    status = str(_post(port, body))
                except OSError as exc:
                    status = type(exc).__name__
                with lock:
                    statuses[status] += 1

        threads = [threading.Thread(target=client, daemon=True) for _ in range(args.clients)]
        samples: list[tuple[float, int]] = []
        started = time.monotonic()
        for thread in threads:
            thread.start()
        while (elapsed := time.monotonic() - started) < args.seconds:
            samples.append((elapsed, _BENCH.process_tree_rss(process.pid)))
            time.sleep(SAMPLE_SECONDS)
        stop.set()
        for thread in threads:
            thread.join(timeout=600)
        after = _BENCH.process_tree_rss(process.pid)
    finally:
        process.terminate()
        process.wait(timeout=60)
    quarter = args.seconds / 4
    peaks = [max((rss for t, rss in samples if q * quarter <= t < (q + 1) * quarter), default=0) for q in range(4)]
    mb = 2**20
    return {
        "server": name,
        "first_status": first,
        "statuses": dict(statuses),
        "rss_before_mb": round(before / mb),
        "rss_peak_by_quarter_mb": [round(p / mb) for p in peaks],
        "rss_peak_mb": round(max(peaks) / mb),
        "rss_after_mb": round(after / mb),
        "samples": len(samples),
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Memory under a flood of large videos",
        "",
        f"{report['cpus']} CPUs, vLLM {report['vllm']}, a Qwen3-VL folder; each request one "
        f"{report['video_seconds']:g} s 1280x720 MP4 ({report['body_mb']:.1f} MB request body); "
        f"{report['clients']} clients posting back to back for {report['seconds']:g} s per server. Resident memory of "
        "the server's process tree (its render processes included; shared pages counted in each):",
        "",
        "| server | before MB | peak by quarter MB | peak MB | after MB | answers |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["servers"]:
        answers = ", ".join(f"{k}: {v}" for k, v in sorted(r["statuses"].items()))
        quarters = " / ".join(str(q) for q in r["rss_peak_by_quarter_mb"])
        lines.append(
            f"| {r['server']} | {r['rss_before_mb']} | {quarters} | {r['rss_peak_mb']} | {r['rss_after_mb']} | {answers} |"
        )
    ours, theirs = report["servers"][1], report["servers"][0]
    growth = [r["rss_peak_mb"] - r["rss_before_mb"] for r in (ours, theirs)]
    lines += [
        "",
        f"Growth under the flood (peak less before): mmprep {growth[0]} MB, vLLM {growth[1]} MB "
        f"(**{growth[0] / max(growth[1], 1):.2f}x**).",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of flood per server")
    parser.add_argument("--video-seconds", type=float, default=10.0)
    parser.add_argument("--render-processes", type=int, default=2)
    parser.add_argument("--out", default=str(HERE))
    parser.add_argument("--markdown-only", action="store_true", help="rewrite the .md from the committed .json")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    if args.markdown_only:
        (out / "results-video-flood.md").write_text(markdown(json.loads((out / "results-video-flood.json").read_text())))
        return 0
    venv, vllm_version = _BENCH.vllm_venv()
    work = pathlib.Path(tempfile.mkdtemp(prefix="mmprep-video-flood-"))
    folder = models.make_model("qwen3-vl", work / "qwen3-vl")
    body = chat_body(encode_video(venv, work / "clip.mp4", args.video_seconds))
    mmprep = [str(venv / "bin" / "python"), "-m", "mmprep_runtime.cli", "serve", "--model", str(folder)]
    mmprep += ["--host", "127.0.0.1", "--port", str(free_port()), "--log-level", "WARNING", "--render-path", "general"]
    mmprep += ["--render-processes", str(args.render_processes), "--vllm-args", "--mm-processor-cache-gb 0"]
    report: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "vllm": vllm_version,
        "clients": args.clients,
        "seconds": args.seconds,
        "video_seconds": args.video_seconds,
        "body_mb": len(body) / 2**20,
        "load_start": [round(x, 2) for x in os.getloadavg()],
        "servers": [
            flood(
                "vLLM render",
                vllm_render_command(venv, folder, free_port(), normalized=False),
                vllm_render_env(),
                body,
                args,
                work / "vllm.log",
            ),
            flood("mmprep", mmprep, {**vllm_render_env(), "PYTHONPATH": str(REPO / "runtime")}, body, args, work / "mmprep.log"),
        ],
    }
    print(json.dumps(report, indent=2))
    (out / "results-video-flood.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "results-video-flood.md").write_text(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
