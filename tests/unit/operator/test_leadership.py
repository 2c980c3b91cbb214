"""The leader Lease's rules and one replica's side of the election, over an in-memory Lease API."""

from __future__ import annotations

import asyncio
import copy
import datetime
from typing import Any

import pytest

from mmprep_operator.control.leadership import Elector
from mmprep_operator.kube import Conflict
from mmprep_operator.logic import leadership
from mmprep_operator.logic.leadership import LeaseRecord, LeaseTerms, Observation

WALL = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.UTC)


def test_terms_keep_client_gos_proportions_and_refuse_a_lease_too_short_to_renew() -> None:
    terms = LeaseTerms(15)
    assert (terms.renew_deadline, terms.retry_period) == (10, 2)
    # The holder must give up before anyone may take over.
    assert LeaseTerms(3).renew_deadline < 3
    with pytest.raises(ValueError, match="at least 2 seconds"):
        LeaseTerms(1)


def test_an_expired_lease_is_measured_on_the_local_clock_from_when_the_record_last_changed() -> None:
    held = LeaseRecord(holder="a", duration_seconds=10, renew_time="2020-01-01T00:00:00.000000Z")
    first = leadership.observe(None, held, now=100.0)
    # A renew time far in the past (a skewed clock) does not make the lease expired...
    assert leadership.held_by_other(first, "b", now=100.0)
    # ...the same record seen again keeps its first sighting, and runs out from then.
    again = leadership.observe(first, held, now=109.0)
    assert again.seen_at == 100.0
    assert leadership.held_by_other(again, "b", now=109.9)
    assert not leadership.held_by_other(again, "b", now=110.0)
    # A renewal is a new record: counted from its own sighting.
    renewed = leadership.observe(again, LeaseRecord(holder="a", duration_seconds=10, renew_time="x"), now=109.0)
    assert leadership.held_by_other(renewed, "b", now=118.0)


def test_nobody_holds_a_released_lease_and_the_holder_never_waits_for_itself() -> None:
    assert not leadership.held_by_other(Observation(LeaseRecord(None, 15), 0.0), "b", now=0.0)
    assert not leadership.held_by_other(Observation(LeaseRecord("b", 15), 0.0), "b", now=0.0)


def test_claiming_counts_transitions_and_a_renewal_keeps_the_acquire_time() -> None:
    first = leadership.claim(None, "a", LeaseTerms(15), WALL)
    assert (first.holder, first.transitions, first.acquire_time) == ("a", 0, "2026-12-01T12:00:00.000000Z")
    renewed = leadership.claim(first, "a", LeaseTerms(15), WALL + datetime.timedelta(seconds=2))
    assert renewed.acquire_time == first.acquire_time and renewed.transitions == 0
    assert renewed.renew_time == "2026-12-01T12:00:02.000000Z"
    taken = leadership.claim(renewed, "b", LeaseTerms(15), WALL + datetime.timedelta(seconds=30))
    assert (taken.holder, taken.transitions) == ("b", 1)
    assert taken.acquire_time == taken.renew_time


def test_only_the_holder_releases_and_a_released_lease_has_no_holder() -> None:
    held = LeaseRecord("a", 15, transitions=3)
    assert leadership.release(held, "b") is None
    released = leadership.release(held, "a")
    assert released is not None and released.holder is None and released.transitions == 3
    assert "holderIdentity" not in released.spec()


class FakeLeases:
    """One Lease with resourceVersion checks, as the API server keeps it."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0

    async def get_object(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert (api_version, kind) == ("coordination.k8s.io/v1", "Lease")
        return copy.deepcopy(self.lease)

    async def write_lease(self, lease: dict[str, Any]) -> dict[str, Any]:
        given = lease["metadata"].get("resourceVersion")
        if self.lease is None and given:
            raise Conflict(404, "NotFound", "gone")
        if self.lease is not None and given != self.lease["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", "the object has been modified")
        self.version += 1
        self.lease = copy.deepcopy(lease)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)


def test_two_replicas_one_lease_the_second_waits_until_release() -> None:
    async def scenario() -> None:
        leases = FakeLeases()
        a = Elector("ns", "lock", "a", LeaseTerms(15))
        b = Elector("ns", "lock", "b", LeaseTerms(15))
        assert await a.try_hold(leases)
        assert not await b.try_hold(leases)
        assert await a.try_hold(leases)  # a renewal
        assert leases.lease is not None and leases.lease["spec"]["holderIdentity"] == "a"
        await b.release(leases)  # not b's to release: nothing written
        assert leases.lease["spec"]["holderIdentity"] == "a"
        await a.release(leases)
        assert await b.try_hold(leases)
        assert leases.lease["spec"]["holderIdentity"] == "b"
        assert leases.lease["spec"]["leaseTransitions"] == 1

    asyncio.run(scenario())


def test_a_write_that_loses_the_race_is_not_taken_for_leadership() -> None:
    async def scenario() -> None:
        leases = FakeLeases()
        a = Elector("ns", "lock", "a", LeaseTerms(15))
        b = Elector("ns", "lock", "b", LeaseTerms(15))

        class RacedByA:
            """b's view: a writes between b's read and b's write."""

            async def get_object(self, *args: Any) -> dict[str, Any] | None:
                seen = await leases.get_object(*args)
                assert await a.try_hold(leases)
                return seen

            write_lease = leases.write_lease

        assert not await b.try_hold(RacedByA())
        assert leases.lease is not None and leases.lease["spec"]["holderIdentity"] == "a"

    asyncio.run(scenario())
