"""``spec.engine``: the vLLM engine behind the OpenAI front. Its two shapes and their URL, the
``--engine`` flag the pool's runtime gets, the EngineReachable condition and its Events, and the
check behind it, against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from conftest import plan_objects
from pydantic import ValidationError
from reconcile_cluster import GPU_SPEC, PROBE_OK, Cluster
from test_status_conditions import T0, T1, cond, observation

from mmprep_operator import api
from mmprep_operator.api.policy import DEFAULT_ENGINE_CHECK_SECONDS, OperatorPolicy
from mmprep_operator.control.engine_checker import EngineChecker
from mmprep_operator.logic import events, probe, status

# ------------------------------------------------------------------------------- the API's shapes


def test_an_engine_is_a_url_or_a_service_in_the_resources_own_namespace() -> None:
    by_url = api.Engine.model_validate({"url": "http://vllm-engine.serving.svc:8000/"})
    assert by_url.base_url("anywhere") == "http://vllm-engine.serving.svc:8000"
    by_service = api.Engine.model_validate({"service": {"name": "vllm-engine", "port": 8000}})
    assert by_service.base_url("serving") == "http://vllm-engine.serving.svc:8000"


@pytest.mark.parametrize(
    "url", ["https://engine", "http://10.0.0.7:8000/", "http://[fd00::1]:8000", "http://Engine-1.example.com:80"]
)
def test_an_engine_url_may_be_any_http_base_url(url: str) -> None:
    assert api.Engine.model_validate({"url": url}).url == url


@pytest.mark.parametrize(
    "url",
    [
        "ftp://engine:8000",
        "engine:8000",
        "http://",
        "http://engine:8000/inference/v1/generate",
        "http://engine:8000/v1",
        "http://-engine:8000",
        "http://engine:8000?x=1",
        "http://user@engine:8000",
    ],
)
def test_an_engine_url_with_a_path_or_another_scheme_is_refused(url: str) -> None:
    with pytest.raises(ValidationError, match="url"):
        api.Engine.model_validate({"url": url})


@pytest.mark.parametrize(
    "service", [{"name": "Engine", "port": 8000}, {"name": "e.x", "port": 8000}, {"name": "e", "port": 0}, {"name": "e"}]
)
def test_an_engine_service_needs_a_service_name_and_a_port(service: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="service"):
        api.Engine.model_validate({"service": service})


# ----------------------------------------------------------------------------------- rendering


def _command(objects: dict[str, dict[str, Any]]) -> list[str]:
    command: list[str] = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]["command"]
    return command


def test_the_pools_runtime_is_given_the_engine_only_when_there_is_one() -> None:
    assert "--engine" not in _command(plan_objects())
    command = _command(plan_objects(engine={"url": "http://10.0.0.7:8000/"}))
    assert command[command.index("--engine") :][:2] == ["--engine", "http://10.0.0.7:8000"]
    # A Service is named in the resource's namespace (cr.yaml's is "serving").
    command = _command(plan_objects(engine={"service": {"name": "vllm-engine", "port": 8000}}))
    assert command[command.index("--engine") + 1] == "http://vllm-engine.serving.svc:8000"
    assert command.count("--engine") == 1


def test_an_engine_resource_runs_the_policys_vllm_image_and_needs_no_new_probe() -> None:
    policy = OperatorPolicy.model_validate({"defaultImage": "reg/mmprep-runtime:1", "vllmRenderImage": "reg/vllm:1"})
    engine = {"url": "http://e:8000"}
    container = plan_objects(policy, image=None, engine=engine)["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "reg/vllm:1"
    # The flag is the serving pods' alone: what the probe loads (so its hash) does not change.
    base = {"model": {"path": "/m"}, "image": "mine:1"}
    with_engine = api.MultimodalPreprocessorSpec.model_validate({**base, "engine": engine})
    assert probe.probe_hash(with_engine, policy) == probe.probe_hash(api.MultimodalPreprocessorSpec.model_validate(base), policy)


# ------------------------------------------------------------------------------ the condition

UP = status.EngineCheck("http://e:8000", answered=True)
DOWN = status.EngineCheck("http://e:8000", answered=False, error="HTTP 503")


def _with_engine(check: status.EngineCheck | None, **kw: Any) -> status.Observation:
    return dataclasses.replace(observation(ready=2, **kw), engine=check)


def test_engine_reachable_follows_the_check_and_is_absent_without_an_engine() -> None:
    up = status.fold(None, _with_engine(UP), T0)
    assert cond(up, "EngineReachable") == ("True", "EngineAnswers")
    assert up.condition("EngineReachable").message == "GET http://e:8000/health answered 200"  # type: ignore[union-attr]

    down = status.fold(up, _with_engine(DOWN), T1)
    reachable = down.condition("EngineReachable")
    assert reachable is not None and (reachable.status, reachable.reason) == ("False", "EngineUnreachable")
    assert "http://e:8000/health" in reachable.message and "HTTP 503" in reachable.message
    assert reachable.last_transition_time == status.timestamp(T1)
    # The pods still serve what they render: Ready and Degraded are the pods' and the spec's.
    assert (cond(down, "Ready"), cond(down, "Degraded")) == (cond(up, "Ready"), cond(up, "Degraded"))
    assert [c.type for c in down.conditions] == ["Ready", "Probed", "Cloneable", "Degraded", "EngineReachable"]

    assert status.fold(down, _with_engine(None), T1).condition("EngineReachable") is None
    assert status.fold(None, observation(ready=2), T0).condition("EngineReachable") is None


def test_losing_the_engine_is_a_warning_and_finding_it_again_is_told() -> None:
    up = status.fold(None, _with_engine(UP), T0)
    assert "EngineAnswers" not in [e.reason for e in events.events(None, up)]
    down = status.fold(up, _with_engine(DOWN), T1)
    assert [(e.type, e.reason) for e in events.events(up, down)] == [("Warning", "EngineUnreachable")]
    assert events.events(down, status.fold(down, _with_engine(DOWN), T1)) == []
    back = status.fold(down, _with_engine(UP), T1)
    assert [(e.type, e.reason) for e in events.events(down, back)] == [("Normal", "EngineAnswers")]


# ---------------------------------------------------------------------------------- the check


class Engine:
    """A real HTTP server on 127.0.0.1 that answers GET /health as a test tells it to."""

    def __init__(self) -> None:
        self.code = 200
        self.delay = 0.0
        self.asked = 0
        self.url = ""

    async def health(self, request: web.Request) -> web.Response:
        self.asked += 1
        await asyncio.sleep(self.delay)
        return web.Response(status=self.code, text="")


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    served = Engine()
    app = web.Application()
    app.router.add_get("/health", served.health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    served.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield served
    await runner.cleanup()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_only_a_200_within_the_timeout_counts_as_reachable(engine: Engine) -> None:
    checker = EngineChecker(ttl_seconds=0, timeout_seconds=0.3)
    try:
        assert await checker.check(engine.url) == status.EngineCheck(engine.url, answered=True)
        engine.code = 503
        assert await checker.check(engine.url) == status.EngineCheck(engine.url, answered=False, error="HTTP 503")
        engine.code, engine.delay = 200, 1.0
        slow = await checker.check(engine.url)
        assert (slow.answered, slow.error) == (False, "no answer within 0.3 s")
        gone = await checker.check(f"http://127.0.0.1:{_closed_port()}")
        assert not gone.answered and "Cannot connect" in gone.error
    finally:
        await checker.close()


async def test_an_answer_is_shared_for_its_ttl_and_asked_for_once_at_a_time(engine: Engine) -> None:
    now = [0.0]
    checker = EngineChecker(ttl_seconds=5, clock=lambda: now[0])
    try:
        engine.delay = 0.1
        answers = await asyncio.gather(*(checker.check(engine.url) for _ in range(5)))
        assert all(a.answered for a in answers) and engine.asked == 1
        now[0] = 4.9
        await checker.check(engine.url)
        assert engine.asked == 1
        now[0] = 5.2
        await checker.check(engine.url)
        assert engine.asked == 2
    finally:
        await checker.close()


# --------------------------------------------------------------------------------- the reconcile


class _NeverAsked(EngineChecker):
    async def check(self, url: str) -> status.EngineCheck:
        raise AssertionError(f"a resource without spec.engine checked {url}")


async def test_a_resource_with_an_engine_reports_it_and_is_looked_at_again_to_check_it(engine: Engine) -> None:
    cluster = Cluster()
    cluster.reconciler.engines = EngineChecker(ttl_seconds=0)
    try:
        cluster.api.add_resource("m", {**GPU_SPEC, "engine": {"url": engine.url}})
        waiting = await cluster.reconcile()
        # The probe's own poll is 30 s; the engine's check comes sooner.
        assert (waiting.kind, waiting.requeue_after) == ("waiting", DEFAULT_ENGINE_CHECK_SECONDS)
        assert cluster.condition("EngineReachable") == ("True", "EngineAnswers")

        cluster.api.finish_job(cluster.job_name(), PROBE_OK)
        done = await cluster.reconcile()
        assert (done.kind, done.requeue_after) == ("done", DEFAULT_ENGINE_CHECK_SECONDS)
        for deployment in cluster.api.kinds("Deployment").values():
            command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
            assert command[command.index("--engine") + 1] == engine.url

        engine.code = 500
        again = await cluster.reconcile()
        assert (again.kind, again.requeue_after) == ("done", DEFAULT_ENGINE_CHECK_SECONDS)
        assert cluster.condition("EngineReachable") == ("False", "EngineUnreachable")
        assert [e["type"] for e in cluster.api.events if e["reason"] == "EngineUnreachable"] == ["Warning"]
    finally:
        await cluster.reconciler.engines.close()


async def test_a_resource_without_an_engine_never_checks_one_nor_comes_back_for_it() -> None:
    cluster = Cluster()
    cluster.reconciler.engines = _NeverAsked(ttl_seconds=0)
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    done = await cluster.reconcile()
    assert (done.kind, done.requeue_after) == ("done", None)
    assert all(c["type"] != "EngineReachable" for c in cluster.status()["conditions"])
