"""Deliver the resource's Events to the API server: now, or in order from one background task.

Which Events a status change tells, and what each says, is decided in ``logic.events`` (``events``,
``event_body``); this module only posts them, because posting has a policy of its own that the
reconcile pass should not carry: Events are best effort (a failed post is logged, never a failed
reconcile), and after a node change the status writes are what users wait for, so the operator
posts from one background task (``background``), in the order the passes produced them, while
the passes go on. Tests and one-shot callers post inline, so a pass's Events exist when it returns.

Neighbours: ``reconcile`` hands it each status write's Events; ``kube`` turns a repeat of the
same Event into a count bump.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import socket
from collections.abc import Callable, Mapping
from typing import Any, Final

from mmprep_operator.kube import ApiError, KubeApi
from mmprep_operator.logic import events, identity

log = logging.getLogger("mmprep.operator.event_poster")

_Pending = tuple[identity.Owner, str | None, events.EventSpec]
#: How long shutting down waits for the Events still queued: long enough for a backlog after a
#: node change, short against the pod's termination grace period.
DRAIN_SECONDS: Final = 5.0


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclasses.dataclass
class EventPoster:
    kube: KubeApi
    clock: Callable[[], dt.datetime] = utcnow
    #: Names this operator instance in the Events it posts (the pod name in a cluster).
    instance: str = dataclasses.field(default_factory=socket.gethostname)
    #: Post from one background task, in order, instead of within ``post`` (the operator sets it).
    background: bool = False
    _backlog: asyncio.Queue[_Pending] | None = None
    _task: asyncio.Task[None] | None = None

    async def post(self, owner: identity.Owner, body: Mapping[str, Any], event: events.EventSpec) -> None:
        """Tell ``event`` about the resource ``body`` (its version is the one the Event names)."""
        version = (body.get("metadata") or {}).get("resourceVersion")
        pending: _Pending = (owner, str(version) if version else None, event)
        if not self.background:
            await self._post(pending)
            return
        if self._backlog is None:
            self._backlog = asyncio.Queue()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(self._backlog), name="mmprep-events")
        self._backlog.put_nowait(pending)

    @property
    def running(self) -> bool:
        """A background task is posting (or waiting for) Events."""
        return self._task is not None

    async def close(self, timeout: float = DRAIN_SECONDS) -> None:
        """Post the Events still waiting (for at most ``timeout`` seconds), then stop posting."""
        if self._task is None:
            return
        if self._backlog is not None:
            try:
                await asyncio.wait_for(self._backlog.join(), timeout)
            except TimeoutError:
                log.warning("events left unposted at shutdown", extra={"count": self._backlog.qsize()})
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        self._task = None

    async def _drain(self, backlog: asyncio.Queue[_Pending]) -> None:
        while True:
            pending = await backlog.get()
            try:
                await self._post(pending)
            except Exception:  # noqa: BLE001 - one Event must not stop the others
                log.exception("could not post event", extra={"reason": pending[2].reason})
            finally:
                backlog.task_done()

    async def _post(self, pending: _Pending) -> None:
        owner, version, event = pending
        body = events.event_body(owner, event, resource_version=version, instance=self.instance, now=self.clock())
        try:
            await self.kube.post_event(body)
        except ApiError as e:
            # Events are best effort: never fail a reconcile for one.
            log.warning("could not post event", extra={"reason": event.reason, "error": str(e)})
        log.info(event.message, extra={"namespace": owner.namespace, "resource": owner.name, "event": event.reason})
