"""What one running operator holds: policy, metrics, controller and the API seam.

Created by ``cli run`` before kopf starts and handed to kopf as the memo; the API client is
created in the startup handler because it belongs to kopf's event loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.control.controller import Controller
from mmprep_operator.control.metrics import Metrics
from mmprep_operator.control.reconcile import Reconciler
from mmprep_operator.kube import RestKubeApi
from mmprep_operator.logic.nodes import NodeFacts


@dataclasses.dataclass
class OperatorState:
    policy: OperatorPolicy
    metrics: Metrics
    controller: Controller
    kubeconfig: str | None = None
    context: str | None = None
    api: RestKubeApi | None = None

    async def start(self, nodes: Callable[[], Iterable[NodeFacts]]) -> None:
        self.api = await RestKubeApi.connect(self.kubeconfig, self.context)
        self.controller.start(
            Reconciler(
                kube=self.api,
                policy=self.policy,
                nodes=nodes,
                metrics=self.metrics,
                children=self.controller.children,
                watched=self.controller.watched,
                report_first=True,
                events_in_background=True,
            )
        )

    async def stop(self) -> None:
        await self.controller.stop()
        if self.api is not None:
            await self.api.close()
