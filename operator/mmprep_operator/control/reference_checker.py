"""Whether the claims a resource's pods mount exist (``logic.references`` lists them).

One metadata-only GET per claim and pass (``KubeApi.object_exists``): a resource that mounts none
costs nothing. Secrets and ConfigMaps are not looked up: least privilege keeps the operator from
reading them at all, and a missing one is reported from what the kubelet says of the pod that
names it (``logic.podstates``). Nothing watches claims, so while one is missing the reconciler
looks again after ``RECHECK_SECONDS``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Final

from mmprep_operator import api
from mmprep_operator.kube import KubeApi
from mmprep_operator.logic import references

#: How soon a resource that waits for a missing object is reconciled again.
RECHECK_SECONDS: Final = 30.0


@dataclasses.dataclass(frozen=True)
class ReferenceChecker:
    kube: KubeApi

    async def missing(self, namespace: str, spec: api.MultimodalPreprocessorSpec) -> list[references.Reference]:
        wanted = [r for r in references.references(spec) if r.kind in references.LOOKED_UP]
        if not wanted:
            return []
        # The same object named twice (an env Secret also pulled from) is looked up once.
        names = sorted({(r.kind, r.name) for r in wanted})
        found = await asyncio.gather(*(self.kube.object_exists("v1", kind, namespace, name) for kind, name in names))
        absent = {key for key, exists in zip(names, found, strict=True) if not exists}
        return [r for r in wanted if (r.kind, r.name) in absent]
