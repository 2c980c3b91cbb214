"""Who owns the rendered objects and how they are found: the owner reference, labels, selectors, names.

Every object the operator creates (Deployments, budgets, the Service, probe and calibration
Jobs) carries these labels and an owner reference to its resource; the controller's watches
select by them and the reconciler finds its children by them. Names come from ``naming`` (DNS-safe,
hashed when cut). Pure.

Neighbours: ``pod_parts`` (the pod pieces every runtime container shares), ``render`` (the
runtime's objects), ``probe`` and ``calibration`` (their Jobs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from mmprep_operator import api
from mmprep_operator.logic import naming

MANAGED_BY: Final = "mmprep-operator"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_RESOURCE: Final = "mmprep.dev/resource"
LABEL_POOL: Final = "mmprep.dev/pool"
COMPONENT_RUNTIME: Final = "preprocessor"
ANNOTATION_DECISION: Final = "mmprep.dev/decision"


@dataclasses.dataclass(frozen=True)
class Owner:
    """The resource that owns the rendered objects."""

    name: str
    namespace: str
    uid: str | None = None

    def reference(self, *, controller: bool = True) -> dict[str, Any]:
        return {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": controller,
            "blockOwnerDeletion": True,
        }

    def metadata(self, name: str, labels: Mapping[str, str], annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": self.namespace, "labels": dict(labels)}
        if annotations:
            meta["annotations"] = dict(annotations)
        if self.uid:
            # Without a uid (a render preview of a resource not yet created) there is nothing to own by.
            meta["ownerReferences"] = [self.reference()]
        return meta


def resource_labels(owner: Owner) -> dict[str, str]:
    return {
        LABEL_NAME: "mmprep-runtime",
        LABEL_INSTANCE: naming.label_value(owner.name),
        LABEL_COMPONENT: COMPONENT_RUNTIME,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_RESOURCE: naming.label_value(owner.name),
    }


def selector_labels(owner: Owner) -> dict[str, str]:
    """Labels every runtime pod of the resource carries (Service selector, scale selector)."""
    return {LABEL_RESOURCE: naming.label_value(owner.name), LABEL_MANAGED_BY: MANAGED_BY}


def label_selector(labels: Mapping[str, str]) -> str:
    """Labels as the API's ``labelSelector`` query: every one must match."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def selector_string(owner: Owner) -> str:
    return label_selector(selector_labels(owner))


def pool_labels(owner: Owner, pool: str) -> dict[str, str]:
    return {**resource_labels(owner), LABEL_POOL: naming.label_value(pool)}


def deployment_name(owner: Owner, pool: str) -> str:
    return naming.dns_label(owner.name, pool)


def service_name(owner: Owner) -> str:
    return naming.dns_label(owner.name)


def pool_selector(owner: Owner, pool: str) -> dict[str, str]:
    """The labels that select exactly one pool's pods (Deployment, PodDisruptionBudget, spread)."""
    labels = pool_labels(owner, pool)
    return {LABEL_RESOURCE: labels[LABEL_RESOURCE], LABEL_POOL: labels[LABEL_POOL]}


def disruption_budget_name(owner: Owner, pool: str) -> str:
    return deployment_name(owner, pool)
