"""The drain: the phases a server goes through from SIGTERM to exit, and what each one allows.

``SERVING`` -> ``DRAINING`` -> ``CLOSING`` -> ``STOPPED``, forward only:

- ``DRAINING`` (for the drain window, from the pod's preStop hook, which sends SIGUSR1, or from
  SIGTERM where no hook ran): readiness answers 503 at once, liveness
  stays 200; the listener still accepts and every request is served as before. Kubernetes takes
  the pod out of its Service's endpoints when it starts terminating, but each proxy, ingress and
  client learns it a little later: connections keep arriving for a few seconds, and this window
  serves them instead of refusing them. Every answer carries ``Connection: close``, so a client
  holding a keep-alive connection to this pod reconnects, through the Service, to a pod that stays.
- ``CLOSING`` (the window is over): the listener is closed and idle connections with it; the
  requests in flight finish (bounded by the shutdown timeout). A request that still arrives on an
  open connection (pipelined behind one in flight) is refused with 503, ``Retry-After`` and
  ``Connection: close`` rather than served: work started now may not finish before the timeout cuts
  it off, and a cut-off request is a failure the client cannot tell from a bug, whereas a 503 before
  any work is one it can safely retry elsewhere (preprocessing is a pure function of the body).
- ``STOPPED``: in-flight requests are done (or timed out); the server and pools stop.

Pure state, used from the event loop only: ``commands.serve`` moves it on, ``state`` and
``requests`` read it, ``app`` closes connections by it, ``metrics`` reports it.
"""

from __future__ import annotations

import enum


class Phase(enum.Enum):
    SERVING = "serving"
    DRAINING = "draining"
    CLOSING = "closing"
    STOPPED = "stopped"


_ORDER = tuple(Phase)


class Drain:
    """Where this server is between SIGTERM and exit, and what it answered meanwhile."""

    def __init__(self) -> None:
        self.phase = Phase.SERVING
        #: When the drain began (a monotonic clock's reading), for the window's accounting.
        self.began_at: float | None = None
        #: Requests answered since the drain began: served (any answer but a drain refusal), and
        #: refused because the server was closing; the last log line reports them.
        self.served = 0
        self.refused = 0

    def _advance(self, to: Phase) -> bool:
        """Move forward to ``to``; False when already there or past it (a second signal)."""
        if _ORDER.index(to) <= _ORDER.index(self.phase):
            return False
        self.phase = to
        return True

    def begin(self, now: float | None = None) -> bool:
        """The preStop hook's SIGUSR1, or SIGTERM: not ready from now on, still serving. False when
        the drain had begun (its start stays the first one's)."""
        if not self._advance(Phase.DRAINING):
            return False
        self.began_at = now
        return True

    def close(self) -> bool:
        """The window is over: refuse what still arrives, let in-flight requests finish."""
        return self._advance(Phase.CLOSING)

    def stop(self) -> bool:
        return self._advance(Phase.STOPPED)

    @property
    def ready(self) -> bool:
        """Whether readiness may say ready: only before the drain began."""
        return self.phase is Phase.SERVING

    @property
    def admits(self) -> bool:
        """Whether a new request is taken on: before and during the window."""
        return self.phase in (Phase.SERVING, Phase.DRAINING)

    @property
    def closes_connections(self) -> bool:
        """Whether every answer closes its connection (``Connection: close``): once draining."""
        return self.phase is not Phase.SERVING

    def answered(self, refused: bool) -> None:
        """Count one answer given while draining (no-op before the drain)."""
        if self.phase is Phase.SERVING:
            return
        if refused:
            self.refused += 1
        else:
            self.served += 1
