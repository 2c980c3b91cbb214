"""``spec.engine``: the vLLM engine behind the OpenAI front. Its two shapes and their URL, and the
``--engine`` flag the pool's runtime gets."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from conftest import DATA
from pydantic import ValidationError

from mmprep_operator import api, yamlio
from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.logic import identity, probe
from mmprep_operator.logic.nodes import node_facts
from mmprep_operator.logic.plan import make_plan

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


def _plan_objects(policy: OperatorPolicy | None = None, **spec_fields: Any) -> dict[str, dict[str, Any]]:
    body = yaml.safe_load((DATA / "cr.yaml").read_text())
    spec = api.MultimodalPreprocessorSpec.model_validate({**body["spec"], **spec_fields})
    nodes = [node_facts(n) for n in yamlio.load_objects((DATA / "nodes.yaml").read_text())]
    result = api.ProbeResult(cloneable=True, fast_image_processor=True, declared_workers=None)
    meta = body["metadata"]
    plan = make_plan(
        identity.Owner(meta["name"], meta["namespace"], meta["uid"]), spec, nodes, result, policy or OperatorPolicy()
    )
    return {obj["kind"]: obj for obj in plan.objects}


def _command(objects: dict[str, dict[str, Any]]) -> list[str]:
    command: list[str] = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]["command"]
    return command


def test_the_pools_runtime_is_given_the_engine_only_when_there_is_one() -> None:
    assert "--engine" not in _command(_plan_objects())
    command = _command(_plan_objects(engine={"url": "http://10.0.0.7:8000/"}))
    assert command[command.index("--engine") :][:2] == ["--engine", "http://10.0.0.7:8000"]
    # A Service is named in the resource's namespace (cr.yaml's is "serving").
    command = _command(_plan_objects(engine={"service": {"name": "vllm-engine", "port": 8000}}))
    assert command[command.index("--engine") + 1] == "http://vllm-engine.serving.svc:8000"
    assert command.count("--engine") == 1


def test_an_engine_resource_runs_the_policys_vllm_image_and_needs_no_new_probe() -> None:
    policy = OperatorPolicy.model_validate({"defaultImage": "reg/mmprep-runtime:1", "vllmRenderImage": "reg/vllm:1"})
    engine = {"url": "http://e:8000"}
    container = _plan_objects(policy, image=None, engine=engine)["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "reg/vllm:1"
    # The flag is the serving pods' alone: what the probe loads (so its hash) does not change.
    base = {"model": {"path": "/m"}, "image": "mine:1"}
    with_engine = api.MultimodalPreprocessorSpec.model_validate({**base, "engine": engine})
    assert probe.probe_hash(with_engine, policy) == probe.probe_hash(api.MultimodalPreprocessorSpec.model_validate(base), policy)
