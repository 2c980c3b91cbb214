"""Whether a resource's engine answers: ``GET <url>/health`` within a short timeout.

The observation behind the EngineReachable condition (``logic.status`` folds its answer). A
resource without spec.engine never gets here, so its passes cost nothing. For one with an engine
the GET runs on the event loop (aiohttp), never blocking it; an engine that does not answer costs
its pass at most ``timeout_seconds``. An answer is reused for ``ttl_seconds``: resources that share
an engine (several resources behind one Service) and the bursts of passes of one resource (a
rollout's pod events) cost one GET, and passes that ask at the same time wait on one request.

Nothing here repeats the check: ``reconcile`` looks at a resource with an engine again within the
policy's ``engineCheckSeconds``, longer than ``ttl_seconds``, so that pass asks anew.

Its own HTTP session, not the API client's: that one carries the cluster's credentials, which
must never reach an engine. No keep-alive: each check opens its own connection, so it tests what
a new connection from a pod would meet, and a connection the engine dropped when it restarted
cannot fail a check of the engine that is back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Final

import aiohttp

from mmprep_operator import bounded
from mmprep_operator.logic.status import EngineCheck

log = logging.getLogger("mmprep.operator.engine_checker")

#: vLLM's liveness path: 200 while the engine runs, answered at once (not queued behind generation).
HEALTH_PATH: Final = "/health"
#: An engine that has not answered /health within this is unreachable: a live one answers in
#: milliseconds, and a pass must not wait long on an engine that is gone.
TIMEOUT_SECONDS: Final = 2.0
#: Engines whose last answers are kept; beyond that the oldest is asked again, nothing worse.
_KEPT_ANSWERS: Final = 1024


def _said(error: BaseException) -> str:
    return str(error) or type(error).__name__


@dataclasses.dataclass
class EngineChecker:
    ttl_seconds: float
    timeout_seconds: float = TIMEOUT_SECONDS
    clock: Callable[[], float] = time.monotonic
    #: url -> (when the answer came, the answer)
    _answers: dict[str, tuple[float, EngineCheck]] = dataclasses.field(default_factory=dict)
    #: url -> the request in flight, which every pass that asks meanwhile waits on
    _asking: dict[str, asyncio.Task[EngineCheck]] = dataclasses.field(default_factory=dict)
    _session: aiohttp.ClientSession | None = None

    async def check(self, url: str) -> EngineCheck:
        """What ``GET {url}/health`` answered, asked now or at most ``ttl_seconds`` ago."""
        known = self._answers.get(url)
        if known is not None and self.clock() - known[0] < self.ttl_seconds:
            return known[1]
        task = self._asking.get(url)
        if task is None:
            task = asyncio.create_task(self._ask(url), name=f"mmprep-engine-check {url}")
            self._asking[url] = task
            task.add_done_callback(lambda _: self._asking.pop(url, None))
        # Shielded: a pass that is cancelled (the operator stopping) leaves the request to the others.
        return await asyncio.shield(task)

    async def _ask(self, url: str) -> EngineCheck:
        if self._session is None:
            # Created here, inside the running event loop it belongs to.
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        try:
            async with self._session.get(
                url + HEALTH_PATH, timeout=aiohttp.ClientTimeout(total=self.timeout_seconds), allow_redirects=False
            ) as response:
                code = response.status
        except TimeoutError:
            answer = EngineCheck(url, answered=False, error=f"no answer within {self.timeout_seconds:g} s")
        except aiohttp.ClientError as e:
            answer = EngineCheck(url, answered=False, error=_said(e))
        else:
            answer = EngineCheck(url, answered=True) if code == 200 else EngineCheck(url, answered=False, error=f"HTTP {code}")
        previous = self._answers.get(url)
        if previous is None or previous[1].answered != answer.answered:
            log.info("engine checked", extra={"url": url, "answered": answer.answered, "error": answer.error or None})
        bounded.remember(self._answers, url, (self.clock(), answer), size=_KEPT_ANSWERS)
        return answer

    async def close(self) -> None:
        """Stop the requests in flight and close the session."""
        asking = list(self._asking.values())
        for task in asking:
            task.cancel()
        await asyncio.gather(*asking, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
