"""Write a resource's folded status when it changed, and hand its Events to the poster.

The status is folded by ``status.fold`` (pure); this module is the one place it is written. A
write is skipped when the folded status equals the one the resource has, so a reconcile caused
by the operator's own status write ends there. A write may be conditional on a
resourceVersion (a pass started from the watch's copy of the resource must not overwrite a
newer one): then a 409 is an answer, not an error, and ``write`` returns None so the pass can
read the resource again. An unconditional write that meets a 409 raises like any API error.

Neighbours: ``logic.status`` folds, ``logic.events`` chooses the Events; ``event_poster`` posts them; ``metrics``
counts the conditions; ``reconcile`` keeps the versions and decides which write is conditional.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import Any

from mmprep_operator import api
from mmprep_operator.control.event_poster import EventPoster
from mmprep_operator.control.metrics import Metrics
from mmprep_operator.kube import Conflict, KubeApi
from mmprep_operator.logic import events, identity, status

log = logging.getLogger("mmprep.operator.status_writer")


@dataclasses.dataclass(frozen=True)
class Written:
    """The status the resource now has, and the resourceVersion the write left (None: no write)."""

    status: api.MultimodalPreprocessorStatus
    version: str | None


@dataclasses.dataclass
class StatusWriter:
    kube: KubeApi
    metrics: Metrics
    events: EventPoster
    clock: Callable[[], dt.datetime]

    async def write(
        self,
        owner: identity.Owner,
        body: Mapping[str, Any],
        previous: api.MultimodalPreprocessorStatus | None,
        obs: status.Observation,
        *,
        if_version: str | None = None,
    ) -> Written | None:
        """Fold ``obs`` into ``previous``, write it if it changed, post its Events.

        With ``if_version``, the write happens only while the resource is at that version; None
        means it had moved on (nothing written, no Events).
        """
        new = status.fold(previous, obs, self.clock())
        wire = new.wire()
        version = None
        if previous is None or previous.wire() != wire:
            try:
                version = await self.kube.replace_resource_status(owner.namespace, owner.name, wire, resource_version=if_version)
            except Conflict:
                if if_version is None:
                    raise
                log.debug("resource changed since its copy", extra={"namespace": owner.namespace, "resource": owner.name})
                return None
        self.metrics.set_conditions((owner.namespace, owner.name), {c.type: c.status for c in new.conditions})
        for event in events.events(previous, new):
            await self.events.post(owner, body, event)
        return Written(new, version)
