"""The kopf wiring: only indexes and event handlers (no finalizers, no annotations), own login."""

from __future__ import annotations

import asyncio
import logging
import pathlib

import kopf
import pytest
import yaml
from kopf._cogs.clients import errors, watching
from kopf._cogs.structs import references
from kopf._core.reactor import observation

from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.control import kopf_watch
from mmprep_operator.control.controller import Controller
from mmprep_operator.control.handlers import build_registry
from mmprep_operator.control.metrics import Metrics
from mmprep_operator.control.state import OperatorState


def test_registry_uses_no_handler_kind_that_needs_finalizers_or_annotations() -> None:
    registry = build_registry()
    # kopf's registries are private; reading them is the only way to assert what kinds of handlers
    # exist. Changing handlers (create/update/delete/resume) write annotations; daemons and timers
    # add finalizers: the operator must have neither.
    assert registry._changing.get_all_handlers() == []
    assert registry._spawning.get_all_handlers() == []
    watched = {(h.selector.group, h.selector.any_name) for h in registry._watching.get_all_handlers()}
    assert watched == {
        ("", "nodes"),
        ("mmprep.dev", "multimodalpreprocessors"),
        ("apps", "deployments"),
        ("", "services"),
        ("batch", "jobs"),
        ("policy", "poddisruptionbudgets"),
        ("autoscaling", "horizontalpodautoscalers"),
        ("keda.sh", "scaledobjects"),
        ("", "pods"),
    }
    assert [h.id for h in registry._indexing.get_all_handlers()] == ["mmprep_nodes"]


def test_each_child_event_reaches_the_controller_as_its_own_kind() -> None:
    heard: list[tuple[str, str | None, dict]] = []

    class StubController:
        def child_event(self, kind: str, type: str | None, body: dict) -> None:  # noqa: A002
            heard.append((kind, type, body))

    memo = kopf.Memo(state=kopf.Memo(controller=StubController()))
    kinds = {
        "deployments": "Deployment",
        "services": "Service",
        "poddisruptionbudgets": "PodDisruptionBudget",
        "horizontalpodautoscalers": "HorizontalPodAutoscaler",
        "scaledobjects": "ScaledObject",
        "pods": "Pod",
        "jobs": "Job",
    }
    for handler in build_registry()._watching.get_all_handlers():
        plural = handler.selector.any_name
        if plural in kinds:
            handler.fn(type="MODIFIED", body={"metadata": {"name": plural}}, memo=memo)
    assert heard == [(kind, "MODIFIED", {"metadata": {"name": plural}}) for plural, kind in kinds.items()]


def test_two_registries_do_not_share_handlers() -> None:
    a, b = build_registry(), build_registry()
    assert a is not b
    assert len(a._watching.get_all_handlers()) == len(b._watching.get_all_handlers()) == 9


def test_login_uses_the_kubeconfig_given_on_the_command_line(tmp_path: pathlib.Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
                "users": [{"name": "u", "user": {"token": "s3cret"}}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "ctx",
            }
        )
    )
    metrics = Metrics()
    state = OperatorState(
        policy=OperatorPolicy(), metrics=metrics, controller=Controller(metrics=metrics), kubeconfig=str(kubeconfig)
    )
    registry = build_registry()
    (login,) = [h for h in registry._activities.get_all_handlers() if h.activity.value == "authentication"]
    info = login.fn(memo=kopf.Memo(state=state))
    assert (info.server, info.scheme, info.token, info.insecure) == ("https://127.0.0.1:6443", "Bearer", "s3cret", True)


async def test_startup_filters_children_on_the_server_and_starts_the_workers() -> None:
    class StubState:
        started_with = None

        async def start(self, nodes):
            StubState.started_with = nodes

    registry = build_registry()
    (start,) = [h for h in registry._activities.get_all_handlers() if h.activity.value == "startup"]
    settings = kopf.OperatorSettings()
    index: dict = {"node-a": ["facts-a"]}
    await start.fn(settings=settings, memo=kopf.Memo(state=StubState()), logger=logging.getLogger("t"), mmprep_nodes=index)
    selectors = {(s.group, s.any_name): v for s, v in settings.watching.label_selectors._items.items()}
    assert selectors == {
        ("apps", "deployments"): "app.kubernetes.io/managed-by=mmprep-operator",
        ("", "services"): "app.kubernetes.io/managed-by=mmprep-operator",
        ("batch", "jobs"): "app.kubernetes.io/managed-by=mmprep-operator,app.kubernetes.io/component in (calibration,probe)",
        ("policy", "poddisruptionbudgets"): "app.kubernetes.io/managed-by=mmprep-operator",
        ("autoscaling", "horizontalpodautoscalers"): "app.kubernetes.io/managed-by=mmprep-operator",
        ("keda.sh", "scaledobjects"): "app.kubernetes.io/managed-by=mmprep-operator",
        # Runtime pods only (their scheduling and exits go into status), never the probe's.
        ("", "pods"): "app.kubernetes.io/component=preprocessor,app.kubernetes.io/managed-by=mmprep-operator",
    }
    assert settings.posting.level == logging.WARNING
    assert StubState.started_with() == ["facts-a"]  # reads the live kopf index


# ------------------------------------------------------------------------------ deleted CRDs


def test_kopfs_endless_watch_calls_the_stream_the_fix_wraps_by_its_module_name() -> None:
    # The fix replaces the module attribute; it only takes effect if kopf looks the name up there on
    # each reconnection. A kopf upgrade that moves it fails here, not silently in a cluster.
    assert "continuous_watch" in watching.infinite_watch.__code__.co_names
    build_registry()
    assert getattr(watching.continuous_watch, "_mmprep_patched", False)


def _streams(monkeypatch, failure: BaseException):
    """kopf's per-stream generator, replaced by one that yields an event then fails, and wrapped."""

    async def stream(**_: object):
        yield {"type": "ADDED", "object": {}}
        raise failure

    monkeypatch.setattr(watching, "continuous_watch", stream)
    monkeypatch.setattr(kopf_watch, "GONE_RETRY_SECONDS", 0.0)
    kopf_watch.tolerate_deleted_crds()
    wrapped = watching.continuous_watch
    kopf_watch.tolerate_deleted_crds()
    assert watching.continuous_watch is wrapped, "a second call does not wrap twice"

    async def drain() -> list[object]:
        return [event async for event in watching.continuous_watch(resource="scaledobjects.v1alpha1.keda.sh", namespace=None)]

    return drain


def test_a_404_from_a_watched_kinds_list_or_watch_ends_the_stream_instead_of_the_operator(monkeypatch, caplog) -> None:
    drain = _streams(
        monkeypatch, errors.APINotFoundError("the server could not find the requested resource", status=404, headers={})
    )
    with caplog.at_level(logging.INFO, "mmprep.operator.watch"):
        assert asyncio.run(drain()) == [{"type": "ADDED", "object": {}}]
    assert "its CRD was deleted" in caplog.text


def test_any_other_watch_failure_still_reaches_kopf(monkeypatch) -> None:
    drain = _streams(monkeypatch, errors.APIForbiddenError("forbidden", status=403, headers={}))
    with pytest.raises(errors.APIForbiddenError):
        asyncio.run(drain())


# ------------------------------------------------------------------------------ namespaces at start-up


def test_kopfs_namespace_observer_calls_the_processor_the_fix_wraps_by_its_module_name() -> None:
    assert "process_discovered_namespace_event" in observation.namespace_observer.__code__.co_names
    build_registry()
    assert getattr(observation.process_discovered_namespace_event, "_mmprep_patched", False)


def _listed(name: str) -> dict:
    """A namespace as the namespace watch's own listing yields it (kopf marks listings type None)."""
    return {"type": None, "object": {"metadata": {"name": name}}}


async def _process(processor, events: list[dict]) -> set:
    insights = references.Insights()
    for event in events:
        await processor(raw_event=event, namespaces=["it-*"], insights=insights)
    return set(insights.namespaces)


def test_kopf_alone_drops_a_namespace_that_only_its_watchs_listing_shows() -> None:
    # The control: without the fix, a namespace created between kopf's two lists is not served.
    assert asyncio.run(_process(kopf_watch._KOPF_NAMESPACE_PROCESSOR, [_listed("it-new")])) == set()


def test_a_namespace_in_the_watchs_listing_is_served_when_it_matches(monkeypatch) -> None:
    monkeypatch.setattr(observation, "process_discovered_namespace_event", kopf_watch._KOPF_NAMESPACE_PROCESSOR)
    kopf_watch.notice_namespaces_in_listings()
    wrapped = observation.process_discovered_namespace_event
    kopf_watch.notice_namespaces_in_listings()
    assert observation.process_discovered_namespace_event is wrapped, "a second call does not wrap twice"
    served = asyncio.run(_process(wrapped, [_listed("it-new"), _listed("kube-system")]))
    assert served == {"it-new"}
    # Watch events still go through kopf's own rules: a deleted namespace is dropped.
    deleted = {"type": "DELETED", "object": {"metadata": {"name": "it-new"}}}
    assert asyncio.run(_process(wrapped, [_listed("it-new"), deleted])) == set()
