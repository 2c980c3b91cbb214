"""A steady load of POSTs against one URL that counts how every request ended: served, refused
with a retryable answer, or failed. What the drain tests measure "zero failed requests" with.

Closed loop and per attempt, for tests that watch one server drain from the host: each attempt
is recorded (when it was sent, how it ended, whether the answer said ``Connection: close``), and a
test can wait on the attempts (``Load.wait_for``). Load through a Service from inside a cluster
is ``benchmarks/autoscale/loadgen.py`` (open loop, per-second counts; ``support.kind_load`` runs
it in a pod). Standard library only; as a script (``python3 load_client.py URL --body-file F
--duration 60``) it prints the tally as JSON, also into ``--summary-file``.

Outcomes of one attempt:
- ``ok``: a 2xx answer;
- ``retryable``: 429 or 503 carrying ``Retry-After`` (the runtime's refusals while overloaded or
  shutting down: the request did no work and may go to another pod);
- ``not_delivered``: the connection was refused (nothing listens: the request never reached a
  server, so retrying it is always safe);
- ``failed``: anything else (another status, a reset or a timeout after the request was sent):
  a request that may have been lost. The drain's promise is that this count stays 0.

With ``retries`` > 0 a retryable or undelivered attempt is retried (after ``Retry-After``, at most
``retries`` times): ``requests_failed`` then counts the requests that never got a 2xx.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import http.client
import json
import signal
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

OK, RETRYABLE, NOT_DELIVERED, FAILED = "ok", "retryable", "not_delivered", "failed"


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One attempt: when it was sent and answered (``time.monotonic``), how it ended, and why."""

    sent: float
    ended: float
    outcome: str
    status: int | None
    detail: str = ""
    #: Whether the answer asked to close the connection (``Connection: close``).
    closed_connection: bool = False
    #: Seconds the answer asked to wait before a retry (``Retry-After``).
    retry_after: float | None = None


@dataclasses.dataclass
class Tally:
    attempts: list[Attempt] = dataclasses.field(default_factory=list)
    requests_ok: int = 0
    requests_failed: int = 0

    def count(self, outcome: str) -> int:
        return sum(1 for a in self.attempts if a.outcome == outcome)

    def failures(self) -> list[Attempt]:
        return [a for a in self.attempts if a.outcome == FAILED]

    def summary(self) -> dict[str, Any]:
        return {
            "attempts": len(self.attempts),
            "by_outcome": dict(collections.Counter(a.outcome for a in self.attempts)),
            "by_status": {str(k): v for k, v in collections.Counter(a.status for a in self.attempts).items()},
            "requests_ok": self.requests_ok,
            "requests_failed": self.requests_failed,
            "failures": [f"{a.status}: {a.detail}" for a in self.failures()[:20]],
        }


class Load:
    """``clients`` threads, each sending ``body`` to ``url`` one request after another until
    ``stop()``. ``keep_alive``: each client keeps its connection open between requests (as HTTP
    client pools do) and opens a new one only when the server closed it or said it would."""

    def __init__(
        self,
        url: str,
        body: bytes,
        *,
        clients: int = 4,
        keep_alive: bool = True,
        timeout: float = 60.0,
        retries: int = 0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"an http:// URL is needed, not {url!r}")
        self._host, self._port = parsed.hostname, parsed.port or 80
        self._path = parsed.path + (f"?{parsed.query}" if parsed.query else "")
        self._body = body
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        self._keep_alive = keep_alive
        self._timeout = timeout
        self._retries = retries
        self._stopping = threading.Event()
        # Guards the tally (every client thread appends to it) and wakes ``wait_for`` on each append.
        self._changed = threading.Condition()
        self.tally = Tally()
        self._threads = [threading.Thread(target=self._client, name=f"load-{i}", daemon=True) for i in range(clients)]

    def __enter__(self) -> Load:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float | None = None) -> Tally:
        """Stop after each client's current request (waited for, so nothing in flight is lost)."""
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout if timeout is not None else self._timeout + 5)
        return self.tally

    def snapshot(self) -> list[Attempt]:
        with self._changed:
            return list(self.tally.attempts)

    def wait_for(self, predicate: Callable[[list[Attempt]], bool], timeout: float) -> None:
        """Block until ``predicate(attempts)`` holds (checked after each attempt); AssertionError
        after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self.tally.attempts):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"load: condition not met within {timeout} s: {self.tally.summary()}")
                self._changed.wait(left)

    def _record(self, attempt: Attempt) -> None:
        with self._changed:
            self.tally.attempts.append(attempt)
            self._changed.notify_all()

    def _client(self) -> None:
        connection: http.client.HTTPConnection | None = None
        while not self._stopping.is_set():
            for tries_left in range(self._retries, -1, -1):
                if connection is None:
                    connection = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
                attempt, keep = self._send(connection)
                if not keep or not self._keep_alive:
                    connection.close()
                    connection = None
                self._record(attempt)
                if attempt.outcome == OK or attempt.outcome == FAILED or tries_left == 0:
                    break
                # Retry-After, or a moment for an undelivered one; a stop cuts it short.
                self._stopping.wait(attempt.retry_after if attempt.retry_after is not None else 0.1)
            if attempt.outcome == NOT_DELIVERED:
                self._stopping.wait(0.05)  # nothing listens: back off a little instead of spinning
            with self._changed:
                if attempt.outcome == OK:
                    self.tally.requests_ok += 1
                else:
                    self.tally.requests_failed += 1
        if connection is not None:
            connection.close()

    def _send(self, connection: http.client.HTTPConnection) -> tuple[Attempt, bool]:
        """(the attempt, whether the connection may be reused)."""
        sent = time.monotonic()
        headers = dict(self._headers)
        if not self._keep_alive:
            headers["Connection"] = "close"
        try:
            connection.request("POST", self._path, body=self._body, headers=headers)
            response = connection.getresponse()
            response.read()
        except ConnectionRefusedError as exc:
            return Attempt(sent, time.monotonic(), NOT_DELIVERED, None, str(exc)), False
        except (OSError, http.client.HTTPException) as exc:
            return Attempt(sent, time.monotonic(), FAILED, None, f"{type(exc).__name__}: {exc}"), False
        ended = time.monotonic()
        closing = response.will_close
        retry_after = response.getheader("Retry-After")
        if 200 <= response.status < 300:
            return Attempt(sent, ended, OK, response.status, closed_connection=closing), not closing
        if response.status in (429, 503) and retry_after is not None:
            attempt = Attempt(sent, ended, RETRYABLE, response.status, f"HTTP {response.status}", closing, _seconds(retry_after))
            return attempt, not closing
        return Attempt(sent, ended, FAILED, response.status, f"HTTP {response.status}", closed_connection=closing), not closing


def _seconds(retry_after: str) -> float:
    try:
        return max(0.0, float(retry_after))
    except ValueError:  # an HTTP date: not what the runtime sends; wait a second
        return 1.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="POST a steady load and print how every request ended (JSON).")
    parser.add_argument("url")
    parser.add_argument("--body-file", required=True, help="the request body (JSON)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (SIGTERM ends it sooner)")
    parser.add_argument("--retries", type=int, default=3, help="retries of a retryable or undelivered attempt")
    parser.add_argument("--no-keep-alive", dest="keep_alive", action="store_false")
    parser.add_argument("--summary-file", default=None, help="also write the JSON here (e.g. /dev/termination-log)")
    args = parser.parse_args(argv)
    with open(args.body_file, "rb") as f:
        body = f.read()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    load = Load(args.url, body, clients=args.clients, keep_alive=args.keep_alive, retries=args.retries)
    load.start()
    done.wait(args.duration)
    tally = load.stop()
    summary = tally.summary()
    if args.summary_file:
        # A termination message holds 4 KiB: the failures' list is the part that may be cut.
        brief = {**summary, "failures": summary["failures"][:5]}
        with open(args.summary_file, "w") as f:
            f.write(json.dumps(brief)[:4000])
    print(json.dumps(summary))
    return 0 if tally.requests_failed == 0 and not tally.failures() else 1


if __name__ == "__main__":
    sys.exit(main())
