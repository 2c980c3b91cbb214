"""Two gaps in kopf's watching that would leave the operator deaf, closed at kopf's own seams.

**A watched kind whose CRD is deleted must not stop the operator.**

The operator watches KEDA's ScaledObjects where KEDA's CRD is installed. kopf starts that watch
when the CRD appears and stops it when its CRD observer sees the CRD go. But deleting a CRD also
ends every watch on its objects, and kopf's watcher lists again at once: when that list (or the
next watch) reaches the API server before kopf's observer has seen the deletion, it answers 404,
and kopf 1.45 treats any error from a watcher as fatal and stops the whole operator. Uninstalling
KEDA would take every resource's reconciliation down with it.

``tolerate_deleted_crds`` wraps kopf's per-stream generator (the one its endless watch loop calls
afresh after each ending) so that a 404 ends that stream quietly: kopf's loop then waits and tries
again, until its observer, having seen the deletion, cancels the watch, or the CRD is back. The
wait after a 404 is ours, so a CRD deletion the observer missed costs one request every few
seconds rather than a busy loop. kopf is pinned (pyproject.toml) and a unit test fails if the
wrapped function moves.

**A namespace created while the operator starts must be served.** With ``--namespace`` patterns,
kopf lists the namespaces once, then starts a namespace watch that lists them again; it drops that
second listing on purpose (it takes it for a repeat of the first). A namespace created between the
two lists is in neither's news: kopf serves it only after its next change, which for a namespace
may be its deletion. ``notice_namespaces_in_listings`` lets the second listing add what matches
(adding a known namespace is a no-op), so nothing created at any moment of start-up is missed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, Final

from kopf._cogs.clients import errors as kopf_errors
from kopf._cogs.clients import watching as kopf_watching
from kopf._core.reactor import observation as kopf_observation

log = logging.getLogger("mmprep.operator.watch")

#: Seconds before the next list of a kind whose collection answered 404.
GONE_RETRY_SECONDS: Final = 5.0
_MARK: Final = "_mmprep_patched"


def tolerate_deleted_crds() -> None:
    """Make kopf's watch streams end on a 404 instead of failing the operator (idempotent)."""
    original = kopf_watching.continuous_watch
    if getattr(original, _MARK, False):
        return

    async def continuous_watch(**kwargs: Any) -> AsyncIterator[Any]:
        try:
            async for event in original(**kwargs):
                yield event
        except kopf_errors.APINotFoundError:
            log.info(
                "a watched kind is gone (its CRD was deleted): its watch stops once kopf sees the deletion",
                extra={"resource": str(kwargs.get("resource")), "namespace": kwargs.get("namespace")},
            )
            await asyncio.sleep(GONE_RETRY_SECONDS)

    setattr(continuous_watch, _MARK, True)
    kopf_watching.continuous_watch = continuous_watch


#: kopf's own processor, kept for the control test that shows the gap without the fix.
_KOPF_NAMESPACE_PROCESSOR: Final = kopf_observation.process_discovered_namespace_event


def notice_namespaces_in_listings() -> None:
    """Let the namespace watch's own listing add matching namespaces too (idempotent)."""
    original = kopf_observation.process_discovered_namespace_event
    if getattr(original, _MARK, False):
        return

    async def process_discovered_namespace_event(*, raw_event: Any, **kwargs: Any) -> None:
        if raw_event["type"] is None:
            # A listing's event: kopf would skip it. Revised as an addition, it adds a matching
            # namespace, and drops one that is gone (the same rules as kopf's first listing).
            raw_event = {**raw_event, "type": "ADDED"}
        await original(raw_event=raw_event, **kwargs)

    setattr(process_discovered_namespace_event, _MARK, True)
    kopf_observation.process_discovered_namespace_event = process_discovered_namespace_event
