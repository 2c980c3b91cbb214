"""What the cluster has to autoscale with: metrics-server (its APIService is available) and KEDA
(its ScaledObject CRD is installed), looked up only when a resource asks for autoscaling, and
cached for a while, so a pass costs no call and an install is noticed within ``ttl_seconds``.

Two GETs of one named object each, which the operator's ClusterRole allows by name and no more
(``api.rbac``). An answer the API server refuses (403: a narrower role than the chart's) counts
as absent and is logged: the status then says which engine is missing, which is what to fix.

Neighbours: ``logic.autoscaling`` decides from the answer; ``reconcile`` asks.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from mmprep_operator.kube import ApiError, KubeApi
from mmprep_operator.logic import autoscaling

log = logging.getLogger("mmprep.operator.autoscalers")

#: Long enough that detection is no load, short enough that installing metrics-server or KEDA
#: shows in a resource's status within a minute or so (the periodic resync brings the pass).
DEFAULT_TTL_SECONDS: Final = 60.0


def _condition_true(body: Mapping[str, Any] | None, type_: str) -> bool:
    conditions = ((body or {}).get("status") or {}).get("conditions") or ()
    return any(c.get("type") == type_ and c.get("status") == "True" for c in conditions)


@dataclasses.dataclass
class AutoscalerDetector:
    kube: KubeApi
    ttl_seconds: float = DEFAULT_TTL_SECONDS
    clock: Callable[[], float] = time.monotonic
    _known: autoscaling.Autoscalers | None = None
    _at: float = 0.0

    async def current(self) -> autoscaling.Autoscalers:
        if self._known is not None and self.clock() - self._at < self.ttl_seconds:
            return self._known
        found = autoscaling.Autoscalers(
            # Registered is not enough: an APIService whose backend is down is not Available, and
            # an HPA on it could not read a metric.
            metrics_server=_condition_true(
                await self._get("apiregistration.k8s.io/v1", "APIService", autoscaling.METRICS_API_SERVICE), "Available"
            ),
            keda=_condition_true(
                await self._get("apiextensions.k8s.io/v1", "CustomResourceDefinition", autoscaling.KEDA_CRD), "Established"
            ),
        )
        if found != self._known:
            log.info("autoscalers found", extra={"metrics_server": found.metrics_server, "keda": found.keda})
        self._known, self._at = found, self.clock()
        return found

    async def _get(self, api_version: str, kind: str, name: str) -> dict[str, Any] | None:
        try:
            return await self.kube.get_cluster_object(api_version, kind, name)
        except ApiError as e:
            if e.status != 403:
                raise
            log.warning("not allowed to look for an autoscaler; counted as absent", extra={"kind": kind, "object": name})
            return None
