#!/usr/bin/env python3
"""Derender per call: mmprep's render tier against vLLM's render server, side by side in one run.

Derender is on the path of every generated token of a streamed request (one call per engine
event), so its cost per call is what the tier adds to each token. For one Qwen folder
(``make-model --kind qwen2.5-vl``, its parsers' markers included) both servers start twice: without
parsers, and with vLLM's Hermes tool parser and Qwen3 reasoning parser
(``--tool-call-parser hermes --enable-auto-tool-choice --reasoning-parser qwen3``):
- vLLM: ``vllm launch render`` (one process);
- mmprep: ``mmprep-runtime serve --render-path auto --render-processes 1`` from vLLM's
  virtualenv (the native path, which answers derender itself without a parser; with the reasoning
  parser, vLLM's processing only).

Per server and answer length (1, 100 and 1,000 output tokens, from vLLM's own ``/tokenize``):
- whole: one ``/v1/chat/completions/derender`` of the whole answer, repeated;
- streamed: the answer one token per call, ``stream_state`` carried as a client carries it.
Every answer is first compared with vLLM's (equal but for timestamps and vLLM's random tool call
ids). Calls go one at a time over one connection, the servers in alternating order per round; the
figures are the client's latency p50/p99 and the server's CPU per call (its process tree).

``python benchmarks/render/derender.py [--rounds 3] [--calls 200]`` writes ``results-derender.json``
and ``.md`` next to this file.
"""

from __future__ import annotations

import argparse
import http.client
import json
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

from mmprep_runtime.synthetic import models

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.render_servers import Server  # noqa: E402 - after the sys.path line
from support.servers import free_port, vllm_render_command, vllm_render_env  # noqa: E402 - after the sys.path line

sys.path.insert(0, str(HERE))
from run_benchmark import process_tree_cpu, process_tree_rss, vllm_venv  # noqa: E402 - after the sys.path line

DERENDER = "/v1/chat/completions/derender"
PARSERS = ["--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--reasoning-parser", "qwen3"]
LENGTHS = (1, 100, 1000)
CHAT = {"messages": [{"role": "user", "content": "Describe the picture."}]}
SENTENCE = " A cat is sitting on a red mat next to the window."


class Client:
    """One kept-alive connection to a server, JSON in and out; opened again when the server closed
    it while idle (uvicorn does after 5 s, while the other server is measured)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        data = json.dumps(body)
        try:
            return self._post(path, data)
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            self.connection.close()
            self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            return self._post(path, data)

    def _post(self, path: str, data: str) -> tuple[int, Any]:
        self.connection.request("POST", path, data, {"Content-Type": "application/json"})
        response = self.connection.getresponse()
        return response.status, json.loads(response.read())


def _steady(answer: Any) -> Any:
    if isinstance(answer, dict):
        return {k: _steady(v) for k, v in answer.items() if k != "created"}
    if isinstance(answer, list | tuple):
        return [_steady(v) for v in answer]
    if isinstance(answer, str) and answer.startswith("chatcmpl-tool-"):
        return "chatcmpl-tool-<random>"
    return answer


def _whole(tokens: list[int], prompt: list[int]) -> dict[str, Any]:
    choice = {"index": 0, "token_ids": tokens, "finish_reason": "length"}
    return {"generate_response": {"request_id": "b-1", "choices": [choice]}, "prompt_token_ids": prompt, "chat_request": CHAT}


def _chunk(token: int, last: bool, state: Any, prompt: list[int]) -> dict[str, Any]:
    choice = {"index": 0, "token_ids": [token], "finish_reason": "length" if last else None}
    return {
        "stream": True,
        "generate_chunk": {"request_id": "b-2", "choices": [choice]},
        "stream_state": state,
        "prompt_token_ids": prompt,
        "chat_request": {**CHAT, "stream": True},
    }


def _stream(client: Client, tokens: list[int], prompt: list[int]) -> list[tuple[int, Any]]:
    answers, state = [], None
    for i, token in enumerate(tokens):
        status, answer = client.post(DERENDER, _chunk(token, i == len(tokens) - 1, state, prompt))
        answers.append((status, answer))
        state = answer.get("stream_state")
    return answers


def _timed(pid: int, calls: int, call: Any) -> dict[str, float]:
    """``calls`` calls of ``call()``: each call's latency, and the server's CPU per call."""
    latencies = []
    cpu = process_tree_cpu(pid)
    for _ in range(calls):
        start = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - start)
    return _figures(latencies, process_tree_cpu(pid) - cpu)


def _timed_streams(pid: int, runs: int, client: Client, tokens: list[int], prompt: list[int]) -> dict[str, float]:
    """``runs`` streams of ``tokens``, one token a call: each call's latency, and the CPU per call."""
    latencies = []
    cpu = process_tree_cpu(pid)
    for _ in range(runs):
        state = None
        for i, token in enumerate(tokens):
            start = time.perf_counter()
            _, answer = client.post(DERENDER, _chunk(token, i == len(tokens) - 1, state, prompt))
            latencies.append(time.perf_counter() - start)
            state = answer.get("stream_state")
    return _figures(latencies, process_tree_cpu(pid) - cpu)


def _figures(latencies: list[float], cpu: float) -> dict[str, float]:
    calls = len(latencies)
    latencies.sort()
    return {
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "cpu_ms_per_call": 1000 * cpu / calls,
    }


def _servers(venv: pathlib.Path, folder: pathlib.Path, options: list[str], work: pathlib.Path) -> dict[str, Server]:
    command = vllm_render_command(venv, folder, free_port(), normalized=False, options=options)
    vllm = Server("vLLM", command, vllm_render_env(), "/health", work / "vllm.log")
    command = [str(venv / "bin" / "python"), "-m", "mmprep_runtime.cli", "serve", "--model", str(folder)]
    command += ["--host", "127.0.0.1", "--port", str(free_port()), "--render-path", "auto", "--render-processes", "1"]
    command += ["--vllm-args", " ".join(["--mm-processor-cache-gb 0", *options])]
    env = {**vllm_render_env(), "PYTHONPATH": str(REPO / "runtime")}
    mmprep = Server("mmprep", command, env, "/health", work / "mmprep.log")
    return {"vllm": vllm.wait(), "mmprep": mmprep.wait()}


def measure(
    venv: pathlib.Path, folder: pathlib.Path, options: list[str], rounds: int, calls: int, work: pathlib.Path
) -> dict[str, Any]:
    servers = _servers(venv, folder, options, work)
    try:
        clients = {name: Client(s.port) for name, s in servers.items()}
        pids = {name: s.process.pid for name, s in servers.items()}
        _, prompt = clients["vllm"].post("/tokenize", {**CHAT, "add_generation_prompt": True})
        _, text = clients["vllm"].post("/tokenize", {"prompt": SENTENCE * 100, "add_special_tokens": False})
        assert len(text["tokens"]) >= max(LENGTHS), len(text["tokens"])
        figures: dict[str, Any] = {}
        for length in LENGTHS:
            tokens = text["tokens"][:length]
            whole = _whole(tokens, prompt["tokens"])
            answers = {name: c.post(DERENDER, whole) for name, c in clients.items()}
            assert _steady(answers["mmprep"]) == _steady(answers["vllm"]), (length, answers)
            streams = {name: _stream(c, tokens, prompt["tokens"]) for name, c in clients.items()}
            assert _steady(streams["mmprep"]) == _steady(streams["vllm"]), length
            for name in [*clients] * rounds:
                client = clients[name]
                figures.setdefault(f"whole {length}", {}).setdefault(name, []).append(
                    _timed(pids[name], calls, lambda c=client, w=whole: c.post(DERENDER, w))
                )
                runs = max(1, calls // length)
                figures.setdefault(f"streamed {length}", {}).setdefault(name, []).append(
                    _timed_streams(pids[name], runs, client, tokens, prompt["tokens"])
                )
            clients = dict(reversed(list(clients.items())))
        cases = {case: {name: _median(runs) for name, runs in by_server.items()} for case, by_server in figures.items()}
        # Resident memory of each server's whole process tree (mmprep's front and its render process).
        memory = {name: process_tree_rss(pid) / 1e6 for name, pid in pids.items()}
        return {"cases": cases, "memory_mb": memory}
    finally:
        for server in servers.values():
            server.stop()


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Derender per call: mmprep vs vLLM's render server",
        "",
        f"vLLM {report['vllm_version']}, {report['rounds']} rounds of {report['calls']} calls per case, "
        "one call at a time over one connection; every answer first compared equal to vLLM's.",
        "Streamed: one token a call, `stream_state` carried; the figures are per call of the stream (a stream of",
        "1,000 tokens: its calls at every position, the last ones where vLLM's parser re-reads the most output).",
        "",
    ]
    for setup, measured in report["setups"].items():
        cases, memory = measured["cases"], measured["memory_mb"]
        lines += [
            f"## {setup}",
            "",
            f"Resident memory after the run, each server's process tree: mmprep {memory['mmprep']:.0f} MB, "
            f"vLLM {memory['vllm']:.0f} MB.",
            "",
            "| case | vLLM p50 / p99 ms | mmprep p50 / p99 ms | CPU ms per call, mmprep / vLLM |",
            "|---|---|---|---|",
        ]
        for case, by in cases.items():
            v, m = by["vllm"], by["mmprep"]
            lines.append(
                f"| {case} tokens | {v['p50_ms']:.2f} / {v['p99_ms']:.2f} | {m['p50_ms']:.2f} / {m['p99_ms']:.2f} "
                f"| {m['cpu_ms_per_call']:.2f} / {v['cpu_ms_per_call']:.2f} |"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200, help="calls per case and round (a stream counts its tokens)")
    args = parser.parse_args()
    venv, version = vllm_venv()
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        folder = models.make_model("qwen2.5-vl", work / "qwen2.5-vl")
        setups = {}
        for setup, options in (("no parser", []), ("Hermes tool parser and Qwen3 reasoning parser", PARSERS)):
            (work / setup).mkdir()
            setups[setup] = measure(venv, folder, options, args.rounds, args.calls, work / setup)
    report = {"vllm_version": version, "rounds": args.rounds, "calls": args.calls, "setups": setups}
    (HERE / "results-derender.json").write_text(json.dumps(report, indent=1) + "\n")
    (HERE / "results-derender.md").write_text(markdown(report) + "\n")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
