"""A watched kind whose CRD is deleted must not stop the operator.

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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, Final

from kopf._cogs.clients import errors as kopf_errors
from kopf._cogs.clients import watching as kopf_watching

log = logging.getLogger("mmprep.operator.watch")

#: Seconds before the next list of a kind whose collection answered 404.
GONE_RETRY_SECONDS: Final = 5.0
_MARK: Final = "_mmprep_tolerates_deleted_crds"


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
