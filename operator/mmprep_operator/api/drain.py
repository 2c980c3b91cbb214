"""How runtime pods stop (``spec.drain``): the drain window and the pod's grace period.

A deleted runtime pod (scale-down, rolling update, eviction) drains (the runtime's
``server.drain``): its preStop hook tells the runtime to turn not ready and keep serving, every
answer closing its connection, for ``seconds`` while the endpoint's removal reaches every proxy;
then the kubelet's SIGTERM closes its listener and lets the requests in flight finish. The grace
period bounds it all; what is left of it after the window and the runtime's own stop
(``contract.SHUTDOWN_STOP_SECONDS``) is the time in-flight requests get, so nothing here can be
set that Kubernetes would cut off with SIGKILL.
"""

from __future__ import annotations

from typing import Final

from pydantic import Field, model_validator

from mmprep_operator.api.base import ApiModel, CelRule, cel_rules
from mmprep_runtime.contract import SHUTDOWN_STOP_SECONDS, DrainEnv

#: The least time in-flight requests get once the window is over.
MIN_IN_FLIGHT_SECONDS: Final = 1
_GRACE_FITS: Final = CelRule(
    # has() guards: defaults fill both in, but a rule must not depend on that.
    "!has(self.seconds) || !has(self.gracePeriodSeconds) || "
    f"self.gracePeriodSeconds >= self.seconds + {SHUTDOWN_STOP_SECONDS + MIN_IN_FLIGHT_SECONDS}",
    f"drain.gracePeriodSeconds must be at least drain.seconds + {SHUTDOWN_STOP_SECONDS + MIN_IN_FLIGHT_SECONDS} "
    f"(the window, then at least {MIN_IN_FLIGHT_SECONDS} s for requests in flight and {SHUTDOWN_STOP_SECONDS} s to stop)",
)


class Drain(ApiModel):
    """How a runtime pod stops: not ready but still serving for ``seconds``, then its requests in
    flight finish within what is left of ``gracePeriodSeconds``."""

    model_config = cel_rules(_GRACE_FITS)

    seconds: int = Field(
        10,
        ge=0,
        le=600,
        description=(
            "Seconds a stopping pod keeps serving while not ready, so that requests still routed to it while "
            "its endpoint is removed everywhere are answered (every answer closes its connection). Longer behind "
            "load balancers that learn of endpoint changes slowly."
        ),
    )
    grace_period_seconds: int = Field(
        45,
        ge=SHUTDOWN_STOP_SECONDS + MIN_IN_FLIGHT_SECONDS,
        le=3600,
        description=(
            "The pods' terminationGracePeriodSeconds. After the drain window, requests in flight get "
            f"gracePeriodSeconds - seconds - {SHUTDOWN_STOP_SECONDS} seconds to finish (the default leaves 30, the "
            "runtime's request deadline); the pod usually exits as soon as they are done."
        ),
    )

    @model_validator(mode="after")
    def _grace_fits(self) -> Drain:
        if self.grace_period_seconds < self.seconds + SHUTDOWN_STOP_SECONDS + MIN_IN_FLIGHT_SECONDS:
            raise ValueError(_GRACE_FITS.message)
        return self

    def runtime_env(self) -> DrainEnv:
        """What the runtime is told: the window, and the in-flight time the grace period leaves."""
        return DrainEnv(self.seconds, self.grace_period_seconds - self.seconds - SHUTDOWN_STOP_SECONDS)
