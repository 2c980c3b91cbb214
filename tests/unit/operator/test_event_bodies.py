"""The Event a status change posts is built by a pure function: its name, its object, its text."""

from __future__ import annotations

import datetime as dt

from mmprep_operator import api
from mmprep_operator.logic import events, identity, status

OWNER = identity.Owner(name="m", namespace="ns", uid="uid-1")
NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def body(event: events.EventSpec, version: str | None = "42") -> dict:
    return events.event_body(OWNER, event, resource_version=version, instance="op-0", now=NOW)


def test_the_same_event_again_gets_the_same_name_and_another_event_another() -> None:
    decided = events.EventSpec("Normal", "Decided", "pool a: 4 workers")
    again = body(decided)["metadata"]["name"]
    assert again == body(decided, version="43")["metadata"]["name"]
    assert again.startswith("m.")
    assert again != body(events.EventSpec("Normal", "Decided", "pool a: 2 workers"))["metadata"]["name"]
    assert again != body(events.EventSpec("Warning", "Failed", "pool a: 4 workers"))["metadata"]["name"]


def test_the_event_names_the_resource_at_its_version_when_known() -> None:
    event = events.EventSpec("Warning", "ProbeFailed", "the processor cannot be loaded")
    involved = body(event)["involvedObject"]
    assert involved == {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "name": "m",
        "namespace": "ns",
        "uid": "uid-1",
        "resourceVersion": "42",
    }
    assert "resourceVersion" not in body(event, version=None)["involvedObject"]


def test_the_event_says_who_posted_it_and_when_and_fits_the_api_servers_limit() -> None:
    out = body(events.EventSpec("Warning", "ApplyFailed", "x" * 5000))
    assert (out["type"], out["reason"], out["metadata"]["namespace"]) == ("Warning", "ApplyFailed", "ns")
    assert len(out["message"]) == events.EVENT_MESSAGE_LIMIT
    assert out["reportingInstance"] == "op-0" and out["reportingComponent"] == identity.MANAGED_BY
    assert out["firstTimestamp"] == out["lastTimestamp"] == status.timestamp(NOW) and out["count"] == 1
