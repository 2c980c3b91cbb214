"""``spec.engine`` on the real API server with the real operator: the server refuses an engine
named twice or not at all, the pool's runtime is given ``--engine URL``, and EngineReachable
follows a real HTTP server on 127.0.0.1 as it answers ``/health`` and then stops (the operator's
periodic check, every ``engineCheckSeconds`` of the tests' policy)."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes.client.rest import ApiException
from support.kube import Kube, condition, condition_is, wait_for
from support.operator_process import OperatorProcess
from support.specs import CPU_POOL, make_spec

pytestmark = pytest.mark.cluster


class _Health(http.server.BaseHTTPRequestHandler):
    """vLLM's /health as an engine that runs answers it: 200, an empty body."""

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
        pass


@contextlib.contextmanager
def _engine() -> Iterator[tuple[str, Callable[[], None]]]:
    """A real HTTP server on a free port of 127.0.0.1: its base URL, and how to stop it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    stopped = threading.Event()

    def stop() -> None:
        if not stopped.is_set():
            server.shutdown()
            server.server_close()  # the port closes: a new connection is refused
            stopped.set()

    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", stop
    finally:
        stop()
        thread.join(timeout=5)


@pytest.mark.parametrize(
    "engine",
    [
        pytest.param({"url": "http://e:8000", "service": {"name": "e", "port": 8000}}, id="both"),
        pytest.param({}, id="neither"),
    ],
)
def test_the_api_server_refuses_an_engine_named_twice_or_not_at_all(kube: Kube, crd: str, namespace: str, engine: dict) -> None:
    with pytest.raises(ApiException) as refused:
        kube.create_mmp(namespace, "bad-engine", {"model": {"path": "/m"}, "engine": engine})
    assert refused.value.status == 422
    assert "set exactly one of engine.url and engine.service" in str(refused.value.body)


def test_an_engine_that_answers_is_reachable_and_given_to_the_pods_and_one_that_stops_is_not(
    kube: Kube, operator: OperatorProcess, namespace: str, model_dir: Callable[..., Path]
) -> None:
    with _engine() as (url, stop):
        kube.create_mmp(namespace, "fronted", make_spec(model_dir("llava"), nodeSelector=CPU_POOL, engine={"url": url}))
        obj = kube.wait_mmp(
            namespace, "fronted", lambda o: condition_is(o, "EngineReachable", "True"), 60, what="EngineReachable=True"
        )
        assert condition(obj, "EngineReachable")["reason"] == "EngineAnswers"

        def engine_args() -> list[str] | None:
            for deployment in kube.deployments(namespace):
                command = deployment.spec.template.spec.containers[0].command or []
                if "--engine" in command:
                    return command[command.index("--engine") : command.index("--engine") + 2]
            return None

        # The Deployment follows the probe (the real `mmprep-runtime probe`, on the agent).
        assert wait_for(engine_args, 120, what="a Deployment whose runtime has --engine") == ["--engine", url]

        stop()
        obj = kube.wait_mmp(
            namespace, "fronted", lambda o: condition_is(o, "EngineReachable", "False"), 30, what="EngineReachable=False"
        )
        reachable = condition(obj, "EngineReachable")
        assert reachable["reason"] == "EngineUnreachable" and f"{url}/health" in reachable["message"], reachable
