"""Who may reconcile: the rules of the leader Lease (coordination.k8s.io/v1), without the I/O.

More than one operator replica runs so that losing a pod (or its node) does not stop
reconciliation until a new pod is scheduled; only one of them may reconcile at a time, or two
would race on the same children and statuses. The replica that holds the Lease is that one.

The rules follow client-go's leader election, for the same reasons:

- A lease is expired when its holder has not renewed it for ``duration`` as measured on *this*
  replica's monotonic clock, from the moment this replica saw the record change. The holder's
  ``renewTime`` is never compared with the local clock: clocks of two nodes may disagree by more
  than a lease lasts.
- The holder gives up (stops reconciling) when it could not renew within ``renew_deadline``, which
  is shorter than ``duration``: it stops before any standby may take over, so two never reconcile
  at once as long as clocks tick at about the same rate.
- A holder that shuts down cleanly releases the lease (no holder), so a standby takes over at its
  next try instead of waiting out the lease.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any, Final

#: The lease's default length: a standby takes over within about this long after the holder died.
DEFAULT_LEASE_SECONDS: Final = 15


@dataclasses.dataclass(frozen=True)
class LeaseTerms:
    """How long a lease lasts, how long the holder keeps trying to renew, and how often anyone tries."""

    duration: float = DEFAULT_LEASE_SECONDS

    @property
    def renew_deadline(self) -> float:
        # client-go's defaults are 15 s / 10 s / 2 s; the same proportions for any duration.
        return self.duration * 2 / 3

    @property
    def retry_period(self) -> float:
        return max(0.5, self.duration / 7.5)

    def __post_init__(self) -> None:
        if self.duration < 2:
            raise ValueError("a lease must last at least 2 seconds")


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    """A Lease's spec as the election reads it."""

    holder: str | None
    duration_seconds: int
    transitions: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None

    @classmethod
    def from_lease(cls, lease: Mapping[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=spec.get("holderIdentity") or None,
            duration_seconds=int(spec.get("leaseDurationSeconds") or DEFAULT_LEASE_SECONDS),
            transitions=int(spec.get("leaseTransitions") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
        )

    def spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {"leaseDurationSeconds": self.duration_seconds, "leaseTransitions": self.transitions}
        if self.holder:
            out["holderIdentity"] = self.holder
        if self.acquire_time:
            out["acquireTime"] = self.acquire_time
        if self.renew_time:
            out["renewTime"] = self.renew_time
        return out


@dataclasses.dataclass(frozen=True)
class Observation:
    """A record and when this replica first saw it as it is (its own monotonic clock)."""

    record: LeaseRecord
    seen_at: float


def observe(previous: Observation | None, record: LeaseRecord, now: float) -> Observation:
    """Keep the time of the first sighting while the record stays the same: a holder that stopped
    renewing leaves the same record behind, and its lease runs out counted from then."""
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


def held_by_other(observation: Observation, me: str, now: float) -> bool:
    """Whether another replica holds the lease now (so this one must wait)."""
    record = observation.record
    if not record.holder or record.holder == me:
        return False
    return now - observation.seen_at < record.duration_seconds


def micro_time(at: datetime.datetime) -> str:
    """A MicroTime as the API server writes it."""
    return at.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def claim(record: LeaseRecord | None, me: str, terms: LeaseTerms, wall: datetime.datetime) -> LeaseRecord:
    """The record that makes (or keeps) ``me`` the holder: a renewal when it already is one."""
    stamp = micro_time(wall)
    duration = max(1, round(terms.duration))
    if record is not None and record.holder == me:
        return dataclasses.replace(record, renew_time=stamp, duration_seconds=duration)
    # A change of holder is a transition, as client-go counts them (a released lease included).
    transitions = record.transitions + 1 if record is not None else 0
    return LeaseRecord(holder=me, duration_seconds=duration, transitions=transitions, acquire_time=stamp, renew_time=stamp)


def release(record: LeaseRecord, me: str) -> LeaseRecord | None:
    """The record that gives the lease up, or None when ``me`` does not hold it (nothing to write)."""
    if record.holder != me:
        return None
    # A 1-second lease with no holder: any standby takes it at its next try.
    return LeaseRecord(holder=None, duration_seconds=1, transitions=record.transitions)
