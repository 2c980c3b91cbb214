"""An open-loop load generator for one runtime Service, run inside the cluster (a pod of the
runtime image: Python, aiohttp and Pillow are there) by the autoscaling tests and the step-load
benchmark.

Open loop: requests leave at the scheduled rate whatever the answers, as independent users send
them, so a saturated pool shows as latency and queueing instead of slowing the generator down.

    python loadgen.py --url http://svc:8080/v1/preprocess --schedule 0:2,60:8 --duration 120

(``--stop-file F``: stop early once F exists, e.g. ``kubectl exec POD -- touch F``.)

Each second it prints one JSON line (``{"t": ..., "sent": ..., "ok": ..., ...}``), and at the end
one ``{"summary": ...}`` line. Outcomes, from the client's side:

- ok: a 2xx answer;
- retried: a refusal a client is told to retry (429, 503) or a connection refused before anything
  was sent; retried (up to ``--retries`` times, after a short pause) and counted apart, each
  refusal also by its cause in ``refusals`` ({"http 429": n, "http 503": n, "connect refused": n}),
  so a test can tell an overloaded pod's 429 from a 5xx;
- failed: any other status, a timeout, or a connection dropped after the request was sent (the
  request may be lost), or retries exhausted. A graceful scale-down must leave this at zero.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import aiohttp

RETRYABLE = (429, 503)


@dataclass
class Second:
    sent: int = 0
    ok: int = 0
    retried: int = 0
    failed: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    refusals: dict[str, int] = field(default_factory=dict)

    def refused(self, cause: str) -> None:
        self.retried += 1
        self.refusals[cause] = self.refusals.get(cause, 0) + 1


def parse_schedule(text: str) -> list[tuple[float, float]]:
    """``"0:2,60:8"`` -> [(0, 2), (60, 8)]: from each time (s) on, that many requests per second."""
    steps = []
    for part in text.split(","):
        at, rate = part.split(":")
        steps.append((float(at), float(rate)))
    steps.sort()
    if not steps or steps[0][0] != 0:
        raise SystemExit("--schedule must start at 0, e.g. 0:2,60:8")
    return steps


def rate_at(steps: list[tuple[float, float]], t: float) -> float:
    rate = steps[0][1]
    for at, r in steps:
        if t >= at:
            rate = r
    return rate


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def request_body(text: str, side: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (side, side), (20, 120, 200)).save(buf, "PNG")
    return json.dumps({"text": text, "images": [base64.b64encode(buf.getvalue()).decode()]}).encode()


async def one_request(
    session: aiohttp.ClientSession, url: str, body: bytes, retries: int, timeout: float, seconds: dict[int, Second], start: float
) -> None:
    sent_at = time.monotonic()
    second = seconds.setdefault(int(sent_at - start), Second())
    second.sent += 1
    outcome = "failed"
    reason = ""
    for attempt in range(retries + 1):
        try:
            async with session.post(
                url, data=body, headers={"Content-Type": "application/json"}, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                await resp.read()
                if 200 <= resp.status < 300:
                    outcome = "ok"
                    break
                if resp.status in RETRYABLE and attempt < retries:
                    second.refused(f"http {resp.status}")
                    await asyncio.sleep(0.2 * (attempt + 1))
                    continue
                reason = f"http {resp.status}"
                break
        except aiohttp.ClientConnectorError:
            # Nothing was sent: a pod gone from the endpoints, or not listening any more.
            if attempt < retries:
                second.refused("connect refused")
                await asyncio.sleep(0.2 * (attempt + 1))
                continue
            reason = "connect refused"
            break
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError):
            reason = "dropped"
            break
        except TimeoutError:
            reason = "timeout"
            break
    if outcome == "ok":
        second.ok += 1
        second.latencies.append(time.monotonic() - sent_at)
    else:
        second.failed += 1
        second.errors[reason] = second.errors.get(reason, 0) + 1


async def watch_stop_file(path: str, stopped: asyncio.Event) -> None:
    # A file is the one signal `kubectl exec` can give a pod without a shell or a port.
    while True:  # polled: nothing notifies of a file's creation portably
        if await asyncio.to_thread(os.path.exists, path):
            stopped.set()
            return
        await asyncio.sleep(0.5)


async def run(args: argparse.Namespace) -> dict[str, object]:
    steps = parse_schedule(args.schedule)
    body = request_body(args.text, args.image_side)
    seconds: dict[int, Second] = {}
    connector = aiohttp.TCPConnector(limit=args.max_in_flight, force_close=args.no_keepalive)
    pending: set[asyncio.Task[None]] = set()
    start = time.monotonic()
    printed = 0
    async with aiohttp.ClientSession(connector=connector) as session:
        next_at = start
        stopped = asyncio.Event()
        watcher = asyncio.create_task(watch_stop_file(args.stop_file, stopped)) if args.stop_file else None
        while (now := time.monotonic()) - start < args.duration and not stopped.is_set():
            rate = rate_at(steps, now - start)
            if rate > 0 and now >= next_at:
                task = asyncio.create_task(one_request(session, args.url, body, args.retries, args.timeout, seconds, start))
                pending.add(task)
                task.add_done_callback(pending.discard)
                next_at += 1.0 / rate
                if next_at < now - 1:  # fell behind by over a second: do not burst to catch up
                    next_at = now
            else:
                await asyncio.sleep(min(0.05, max(0.0, next_at - now)) if rate > 0 else 0.05)
            while printed < int(time.monotonic() - start) - args.timeout:
                printed = _print_second(seconds, printed, steps)
        if watcher is not None:
            watcher.cancel()
        if pending:
            await asyncio.wait(pending)
    while printed <= max(seconds, default=-1):
        printed = _print_second(seconds, printed, steps)
    summary = _tally(seconds.values())
    summary["duration_s"] = round(time.monotonic() - start, 1)
    # Each step of the schedule on its own (by when requests were sent): a step's latency and
    # failures are what a load step does to the pool.
    bounds = [at for at, _ in steps] + [float("inf")]
    summary["steps"] = [
        {"from_s": lo, "rate": rate, **_tally(s for t, s in seconds.items() if lo <= t < hi)}
        for (lo, rate), hi in zip(steps, bounds[1:], strict=True)
    ]
    return summary


def _tally(seconds: Iterable[Second]) -> dict[str, object]:
    total = Second()
    for s in seconds:
        total.sent += s.sent
        total.ok += s.ok
        total.retried += s.retried
        total.failed += s.failed
        total.latencies += s.latencies
        for k, v in s.errors.items():
            total.errors[k] = total.errors.get(k, 0) + v
        for k, v in s.refusals.items():
            total.refusals[k] = total.refusals.get(k, 0) + v
    return {
        "sent": total.sent,
        "ok": total.ok,
        "retried": total.retried,
        "failed": total.failed,
        "errors": total.errors,
        "refusals": total.refusals,
        "p50_s": quantile(total.latencies, 0.5),
        "p99_s": quantile(total.latencies, 0.99),
    }


def _print_second(seconds: dict[int, Second], t: int, steps: list[tuple[float, float]]) -> int:
    s = seconds.get(t, Second())
    line: dict[str, object] = {"t": t, "rate": rate_at(steps, t)}
    line.update(sent=s.sent, ok=s.ok, retried=s.retried, failed=s.failed)
    line["p50_s"], line["p99_s"] = quantile(s.latencies, 0.5), quantile(s.latencies, 0.99)
    if s.errors:
        line["errors"] = s.errors
    print(json.dumps(line), flush=True)
    return t + 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--schedule", default="0:2", help="TIME:RATE,... requests per second from each time on")
    parser.add_argument("--duration", type=float, default=60)
    parser.add_argument("--stop-file", help="stop sending (and report) once this file exists, before --duration")
    parser.add_argument("--timeout", type=float, default=30, help="seconds a request may take")
    parser.add_argument("--retries", type=int, default=3)
    parser.add_argument("--max-in-flight", type=int, default=256)
    parser.add_argument("--no-keepalive", action="store_true", help="a new connection per request")
    parser.add_argument("--text", default="<|vision_start|><|image_pad|><|vision_end|>describe")
    parser.add_argument("--image-side", type=int, default=224)
    args = parser.parse_args()
    summary = asyncio.run(run(args))
    print(json.dumps({"summary": summary}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
