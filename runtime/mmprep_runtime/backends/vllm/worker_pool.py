"""The general render path's worker processes: start, watch, lease, stop (``VllmWorkerPool``).

Each worker is ``worker``: vLLM's own render server on a Unix socket, one per process, with a
second socket that takes requests handed over with their client's connection (``handoff``).
The pool starts them side by side, is ready once every one answers ``/health``, leases the one with
the fewest requests in flight to each request (``lease``), restarts a worker that dies (its
in-flight requests fail with a 5xx; the others keep serving), and stops them all on close.

Processes, not threads: vLLM processes a model's multimodal inputs on one thread fixed in its
code, holding the GIL for most of that time, so only more processes add throughput (the render
benchmark measures the GIL-held share and predicts the scaling from it). One process per usable
core is the default; ``--render-processes`` overrides it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, Final

from mmprep_runtime.contract import ENV_API_KEY
from mmprep_runtime.settings import RenderSettings
from mmprep_runtime.versions import vllm_version

logger = logging.getLogger(__name__)

#: How often a starting worker is asked for ``/health``.
_POLL_SECONDS: Final = 0.5
#: A worker that died is restarted at most this often, so a model that cannot load does not spin.
_RESTART_BACKOFF_SECONDS: Final = 5.0
#: How long starting the pool may take: each process imports vLLM and loads the model (tens of
#: seconds on a loaded node).
START_TIMEOUT_S: Final = 600.0
#: What a worker's start may print before it fails, kept for the error message.
_LOG_TAIL_LINES: Final = 30


class GeneralPathUnavailable(RuntimeError):
    """vLLM is not installed, or its render server could not start on this model."""


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP to one render process over its Unix socket (health checks, the calibration's load)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def _healthy(path: str) -> bool:
    if not os.path.exists(path):
        return False
    connection = UnixHTTPConnection(path, timeout=2.0)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """A leased process's sockets: its HTTP server, and the one that takes handed-over requests."""

    http: str
    handoff: str


def _endpoint(directory: str, index: int) -> Endpoint:
    """Where process ``index`` listens, in the pool's folder."""
    return Endpoint(os.path.join(directory, f"w{index}.sock"), os.path.join(directory, f"w{index}.handoff.sock"))


@dataclasses.dataclass
class _Worker:
    index: int
    endpoint: Endpoint
    log_path: str
    process: subprocess.Popen[bytes] | None = None
    ready: bool = False
    in_flight: int = 0
    #: Seconds with at least one request in flight (the busy fraction's numerator).
    busy_seconds: float = 0.0
    busy_since: float | None = None
    restarts: int = 0

    def log_tail(self) -> str:
        try:
            with open(self.log_path, errors="replace") as log:
                return "".join(log.readlines()[-_LOG_TAIL_LINES:])
        except OSError:
            return ""


#: Linux's limit on a Unix socket's path (``sun_path``: 108 bytes with its terminating zero).
_MAX_SOCKET_PATH: Final = 107


def _socket_dir(processes: int) -> str:
    """A new folder for the processes' sockets and logs, in the temp folder when the longest socket
    path fits there, else in the first of /tmp and /dev/shm where it fits. A temp folder can sit
    deep (an emptyDir mounted under a long path), and a socket path over the limit fails vLLM's
    server at bind time with nothing but "AF_UNIX path too long"."""
    for base in dict.fromkeys((tempfile.gettempdir(), "/tmp", "/dev/shm")):
        # The last process's sockets are the longest (mkdtemp's folder name has 8 random characters).
        longest = max(
            len(path) for path in dataclasses.astuple(_endpoint(os.path.join(base, "mmprep-vllm-xxxxxxxx"), processes - 1))
        )
        if longest <= _MAX_SOCKET_PATH and os.access(base, os.W_OK):
            return tempfile.mkdtemp(prefix="mmprep-vllm-", dir=base)
    raise GeneralPathUnavailable(
        f"no writable folder is short enough for the render processes' sockets (at most {_MAX_SOCKET_PATH} bytes); "
        f"the temp folder is {tempfile.gettempdir()}: set TMPDIR to a shorter path"
    )


def vllm_options(settings: RenderSettings) -> list[str]:
    """vLLM's options for the render settings mmprep also has, then the ones given as they are
    (``--vllm-args``, later ones win in vLLM's parser)."""
    options: list[str] = []
    if settings.served_model_name:
        options += ["--served-model-name", settings.served_model_name]
    if settings.max_model_len:
        options += ["--max-model-len", str(settings.max_model_len)]
    if settings.normalized_pixels:
        options.append("--no-mm-device-do-normalize")
    return [*options, *settings.vllm_args]


class VllmWorkerPool:
    """``processes`` workers of vLLM's render server for ``model`` (``vllm_args``: vLLM's options)."""

    def __init__(self, model: str, processes: int, vllm_args: Sequence[str] = (), *, env: dict[str, str] | None = None) -> None:
        if processes < 1:
            raise ValueError(f"the general path needs at least one process, got {processes}")
        self.model = model
        self.vllm_args = tuple(vllm_args)
        self.version = vllm_version()
        self._env = dict(os.environ if env is None else env)
        # The front checks the API key for both paths; a render process that read it too would
        # refuse the requests the front forwards without their Authorization header.
        self._env.pop(ENV_API_KEY, None)
        self._dir = _socket_dir(processes)
        self._workers = [_Worker(i, _endpoint(self._dir, i), os.path.join(self._dir, f"w{i}.log")) for i in range(processes)]
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._watcher: threading.Thread | None = None

    # ---- start and stop --------------------------------------------------------------------

    def _command(self, worker: _Worker) -> list[str]:
        return [
            sys.executable,
            "-m",
            "mmprep_runtime.backends.vllm.worker",
            "--socket",
            worker.endpoint.http,
            "--handoff",
            worker.endpoint.handoff,
            "--",
            self.model,
            *self.vllm_args,
        ]

    def _spawn(self, worker: _Worker) -> None:
        with open(worker.log_path, "ab") as log:
            worker.process = subprocess.Popen(self._command(worker), stdout=log, stderr=subprocess.STDOUT, env=self._env)
        worker.ready = False

    def start(self, timeout: float) -> None:
        """Start every worker side by side; return once all answer, or raise with the reason."""
        if self.version is None:
            raise GeneralPathUnavailable("vLLM is not installed here: the general render path needs the mmprep[vllm] image")
        for worker in self._workers:
            self._spawn(worker)
        deadline = time.monotonic() + timeout
        pending = list(self._workers)
        while pending:
            for worker in list(pending):
                assert worker.process is not None
                if worker.process.poll() is not None:
                    tail = worker.log_tail()  # before close() removes the logs with the sockets
                    self.close()
                    raise GeneralPathUnavailable(
                        f"vLLM {self.version}'s render server exited with {worker.process.returncode} while starting "
                        f"on {self.model}:\n{tail}"
                    )
                if _healthy(worker.endpoint.http):
                    worker.ready = True
                    pending.remove(worker)
            if pending and time.monotonic() > deadline:
                self.close()
                raise GeneralPathUnavailable(f"vLLM's render server did not start within {timeout:g} s")
            if pending:
                time.sleep(_POLL_SECONDS)
        logger.info("general render path: %d vLLM %s render process(es) ready", len(self._workers), self.version)
        self._watcher = threading.Thread(target=self._watch, name="vllm-pool-watch", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        """Restart a worker that died, once it is noticed (its socket answers again: ready)."""
        while not self._closed.wait(_POLL_SECONDS):
            for worker in self._workers:
                process = worker.process
                if process is None:
                    continue
                if process.poll() is not None:
                    with self._lock:
                        worker.ready = False
                    logger.error(
                        "vLLM render process %d exited with %s; restarting it:\n%s",
                        worker.index,
                        process.returncode,
                        worker.log_tail(),
                    )
                    if self._closed.wait(_RESTART_BACKOFF_SECONDS):
                        return
                    worker.restarts += 1
                    self._spawn(worker)
                elif not worker.ready and _healthy(worker.endpoint.http):
                    with self._lock:
                        worker.ready = True
                    logger.info("vLLM render process %d is back", worker.index)

    def close(self, timeout: float | None = None) -> None:
        self._closed.set()
        for worker in self._workers:
            if worker.process is not None and worker.process.poll() is None:
                worker.process.terminate()
        for worker in self._workers:
            if worker.process is None:
                continue
            try:
                worker.process.wait(timeout if timeout is not None else 10.0)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    # ---- leasing ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def lease(self, affinity: int | None = None) -> Iterator[Endpoint]:
        """The sockets of the ready worker with the fewest requests in flight, held while in use.

        With ``affinity`` (a stream's number), the worker it falls on among all of them when that
        one is ready and has at most one request more than the least loaded: the calls of one
        stream then meet the state its previous call left in that process (``parsed_streams``).
        """
        with self._lock:
            ready = [w for w in self._workers if w.ready]
            if not ready:
                raise GeneralPathUnavailable(self.no_workers_reason or "no render process is ready")
            worker = min(ready, key=lambda w: (w.in_flight, w.index))
            if affinity is not None:
                preferred = self._workers[affinity % len(self._workers)]
                if preferred.ready and preferred.in_flight <= worker.in_flight + 1:
                    worker = preferred
            worker.in_flight += 1
            if worker.in_flight == 1:
                worker.busy_since = time.monotonic()
        try:
            yield worker.endpoint
        finally:
            with self._lock:
                worker.in_flight -= 1
                if worker.in_flight == 0 and worker.busy_since is not None:
                    worker.busy_seconds += time.monotonic() - worker.busy_since
                    worker.busy_since = None

    def lost(self, socket_path: str) -> None:
        """The worker on ``socket_path`` did not answer: lease it no more until the watcher sees it
        answer again (or restarts it, when its process is gone)."""
        with self._lock:
            for worker in self._workers:
                if worker.endpoint.http == socket_path:
                    worker.ready = False

    # ---- what the server reports -----------------------------------------------------------

    @property
    def processes(self) -> int:
        return len(self._workers)

    @property
    def socket_paths(self) -> tuple[str, ...]:
        """Each process's socket, in process order (the calibration loads the first n directly)."""
        return tuple(w.endpoint.http for w in self._workers)

    @property
    def busy(self) -> int:
        with self._lock:
            return sum(1 for w in self._workers if w.in_flight)

    @property
    def busy_seconds(self) -> float:
        now = time.monotonic()
        with self._lock:
            return sum(w.busy_seconds + (now - w.busy_since if w.busy_since is not None else 0.0) for w in self._workers)

    @property
    def no_workers_reason(self) -> str | None:
        if self._closed.is_set():
            return "the general render path is stopped"
        if any(w.ready for w in self._workers):
            return None
        return "every vLLM render process is restarting"

    def info(self) -> dict[str, Any]:
        return {
            "engine": "vllm",
            "vllm_version": self.version,
            "processes": len(self._workers),
            "threads_per_process": 1,
            "ready_processes": sum(1 for w in self._workers if w.ready),
            "pids": [w.process.pid if w.process is not None else None for w in self._workers],
            "restarts": sum(w.restarts for w in self._workers),
            "vllm_args": list(self.vllm_args),
        }
