"""The HTTP seam speaks the API server's dialect: paths, verbs, content types, 404/409 handling.

A small aiohttp app stands in for the API server and records each request; what it answers is
what the real server answers in those cases (a Status object on errors).
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from mmprep_operator.kube import ApiError, Conflict, RestKubeApi


class Auth:
    """Stands in for kubernetes.client.Configuration's token lookup."""

    def get_api_key_with_prefix(self, identifier: str, alias: str | None = None) -> str:
        return "Bearer t0ken"


def status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response(
        {"kind": "Status", "status": "Failure", "reason": reason, "message": message, "code": code}, status=code
    )


class FakeServer:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.jobs: dict[str, dict[str, Any]] = {}
        self.events: dict[str, dict[str, Any]] = {}

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.text()
        self.requests.append(
            {
                "method": request.method,
                "path": request.path,
                "query": dict(request.query),
                "content_type": request.headers.get("Content-Type"),
                "auth": request.headers.get("Authorization"),
                "accept": request.headers.get("Accept"),
                "body": json.loads(body) if body else None,
            }
        )
        path, method = request.path, request.method
        if path.endswith(("/multimodalpreprocessors/absent", "/persistentvolumeclaims/absent")):
            return status(404, "NotFound", "not found")
        if path.endswith("/deployments/bad"):
            return status(422, "Invalid", 'Deployment.apps "bad" is invalid: spec.template.spec.volumes[0]: Required value')
        if "/jobs" in path:
            name = path.rsplit("/", 1)[-1]
            if method == "POST":
                job = json.loads(body)
                if job["metadata"]["name"] in self.jobs:
                    return status(409, "AlreadyExists", "jobs.batch exists")
                self.jobs[job["metadata"]["name"]] = job
                return web.json_response(job, status=201)
            if method == "GET":
                return web.json_response(self.jobs[name]) if name in self.jobs else status(404, "NotFound", "nope")
            if method == "PATCH":
                return status(409, "Conflict", "the object has been modified")
        if "/events" in path:
            if method == "POST":
                event = json.loads(body)
                if event["metadata"]["name"] in self.events:
                    return status(409, "AlreadyExists", "exists")
                self.events[event["metadata"]["name"]] = event
                return web.json_response(event, status=201)
            name = path.rsplit("/", 1)[-1]
            if name not in self.events:
                return status(404, "NotFound", "expired")
            if method == "GET":
                return web.json_response(self.events[name])
            self.events[name].update(json.loads(body))  # a merge patch of top-level fields
            return web.json_response(self.events[name])
        if method == "PATCH" and path.endswith("/status"):
            ops = json.loads(body)
            version = next((op["value"] for op in ops if op["path"] == "/metadata/resourceVersion"), None)
            if version not in (None, "7"):
                return status(409, "Conflict", "the object has been modified")
            return web.json_response({"metadata": {"name": "m", "resourceVersion": "8"}, "status": ops[-1]["value"]})
        if method == "GET" and path.endswith("/pods"):
            return web.json_response({"items": [{"metadata": {"name": "p"}}]})
        if method == "PATCH" and request.query.get("fieldManager"):
            applied = json.loads(body)
            return web.json_response({**applied, "status": {"readyReplicas": 1}})
        return web.json_response({"metadata": {"name": path.rsplit("/", 1)[-1]}})


@pytest.fixture
async def seam():
    fake = FakeServer()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    server = TestServer(app)
    await server.start_server()
    session = aiohttp.ClientSession()
    api = RestKubeApi(str(server.make_url("/")), session, Auth())
    try:
        yield api, fake
    finally:
        await api.close()
        await server.close()


async def test_resource_reads_and_status_replacement(seam) -> None:
    api, fake = seam
    assert await api.get_resource("ns", "absent") is None
    await api.replace_resource_status("ns", "m", {"observedGeneration": 2})
    req = fake.requests[-1]
    assert (req["method"], req["path"]) == ("PATCH", "/apis/mmprep.dev/v1alpha1/namespaces/ns/multimodalpreprocessors/m/status")
    assert req["content_type"] == "application/json-patch+json"
    assert req["body"] == [{"op": "add", "path": "/status", "value": {"observedGeneration": 2}}]
    assert req["auth"] == "Bearer t0ken"


async def test_a_status_write_can_be_conditional_on_a_version(seam) -> None:
    api, fake = seam
    assert await api.replace_resource_status("ns", "m", {"observedGeneration": 2}, resource_version="7") == "8"
    assert fake.requests[-1]["body"] == [
        {"op": "replace", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "add", "path": "/status", "value": {"observedGeneration": 2}},
    ]
    with pytest.raises(Conflict):
        await api.replace_resource_status("ns", "m", {"observedGeneration": 2}, resource_version="6")


async def test_apply_is_forced_server_side_apply_with_our_field_manager(seam) -> None:
    api, fake = seam
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "ns"}, "spec": {}}
    applied = await api.apply(deployment, force=True)
    assert applied["status"] == {"readyReplicas": 1}
    req = fake.requests[-1]
    assert (req["method"], req["path"]) == ("PATCH", "/apis/apps/v1/namespaces/ns/deployments/d")
    assert req["content_type"] == "application/apply-patch+yaml"
    assert req["query"] == {"fieldManager": "mmprep-operator", "force": "true"}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "ns"}}
    await api.apply(service, force=False)
    assert fake.requests[-1]["path"] == "/api/v1/namespaces/ns/services/s"
    assert fake.requests[-1]["query"]["force"] == "false"
    await api.get_object("v1", "Service", "ns", "s")
    assert (fake.requests[-1]["method"], fake.requests[-1]["path"]) == ("GET", "/api/v1/namespaces/ns/services/s")


async def test_rejections_carry_the_servers_message_and_permanence(seam) -> None:
    api, _ = seam
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "bad", "namespace": "ns"}}
    with pytest.raises(ApiError) as caught:
        await api.apply(bad, force=True)
    assert caught.value.status == 422 and caught.value.permanent
    assert "volumes[0]: Required value" in caught.value.message
    with pytest.raises(ValueError, match="does not write ConfigMap"):
        await api.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}}, force=True)


async def test_a_referenced_object_is_looked_up_as_metadata_only(seam) -> None:
    api, fake = seam
    assert await api.object_exists("v1", "PersistentVolumeClaim", "ns", "absent") is False
    req = fake.requests[-1]
    assert (req["method"], req["path"]) == ("GET", "/api/v1/namespaces/ns/persistentvolumeclaims/absent")
    # PartialObjectMetadata: nothing but the metadata is fetched.
    assert req["accept"].startswith("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1")
    assert await api.object_exists("v1", "PersistentVolumeClaim", "ns", "models") is True
    with pytest.raises(ValueError, match="does not look up Secret"):
        await api.object_exists("v1", "Secret", "ns", "s")  # the operator does not read Secrets
    assert fake.requests[-1]["path"] == "/api/v1/namespaces/ns/persistentvolumeclaims/models"


async def test_creating_an_existing_job_returns_it_and_owner_conflicts_surface(seam) -> None:
    api, fake = seam
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "mmprep-probe-x", "namespace": "ns", "labels": {"a": "1"}},
    }
    await api.create_job(job)
    again = await api.create_job({**job, "metadata": {**job["metadata"], "labels": {"b": "2"}}})
    assert again["metadata"]["labels"] == {"a": "1"}  # the one that exists
    with pytest.raises(Conflict):
        await api.set_job_owners("ns", "mmprep-probe-x", [], "1")
    assert fake.requests[-1]["body"]["metadata"]["resourceVersion"] == "1"
    assert await api.get_job("ns", "absent") is None


async def test_a_repeated_event_bumps_the_count(seam) -> None:
    api, fake = seam
    event = {"metadata": {"name": "m.abc", "namespace": "ns"}, "count": 1, "lastTimestamp": "t1"}
    await api.post_event(event)
    await api.post_event({**event, "lastTimestamp": "t2"})
    patch = fake.requests[-1]
    assert (patch["method"], patch["path"]) == ("PATCH", "/api/v1/namespaces/ns/events/m.abc")
    assert patch["body"] == {"count": 2, "lastTimestamp": "t2"}
    assert [r["method"] for r in fake.requests] == ["POST", "PATCH"]  # the count was remembered


async def test_an_event_this_client_does_not_know_is_read_before_its_count_is_bumped(seam) -> None:
    api, fake = seam
    fake.events["m.abc"] = {"metadata": {"name": "m.abc", "namespace": "ns"}, "count": 4}  # from before a restart
    event = {"metadata": {"name": "m.abc", "namespace": "ns"}, "count": 1, "lastTimestamp": "t1"}
    await api.post_event(event)
    assert [r["method"] for r in fake.requests] == ["POST", "GET", "PATCH"]
    assert fake.events["m.abc"]["count"] == 5
    await api.post_event(event)
    assert [r["method"] for r in fake.requests[3:]] == ["PATCH"] and fake.events["m.abc"]["count"] == 6


async def test_an_expired_event_is_created_again(seam) -> None:
    api, fake = seam
    event = {"metadata": {"name": "m.abc", "namespace": "ns"}, "count": 1, "lastTimestamp": "t1"}
    await api.post_event(event)
    del fake.events["m.abc"]  # the API server's event TTL
    await api.post_event(event)
    assert [r["method"] for r in fake.requests] == ["POST", "PATCH", "POST"]
    assert fake.events["m.abc"]["count"] == 1


async def test_lists_use_label_selectors(seam) -> None:
    api, fake = seam
    pods = await api.list_pods("ns", "job-name=mmprep-probe-x")
    assert pods == [{"metadata": {"name": "p"}}]
    assert fake.requests[-1]["query"] == {"labelSelector": "job-name=mmprep-probe-x"}


async def test_an_unreachable_server_is_a_transient_error() -> None:
    session = aiohttp.ClientSession()
    api = RestKubeApi("http://127.0.0.1:9", session, Auth())
    try:
        with pytest.raises(ApiError) as caught:
            await api.get_resource("ns", "m")
        assert caught.value.status == 0 and not caught.value.permanent
    finally:
        await api.close()
