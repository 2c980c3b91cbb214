"""The objects a resource's pods refer to by name, which no schema can check: Secrets, ConfigMaps
and PersistentVolumeClaims in the resource's namespace; and the problem a missing one is.

A pod that names a missing one does not run (a Pending pod, or CreateContainerConfigError), and
a Deployment rolled to such a template would replace serving pods with ones that never get
ready. Claims (``LOOKED_UP``) the reconciler looks up first (``control.reference_checker``): while
one is missing it applies nothing and starts no probe, the pods already serving stay as they
are, and the Degraded condition names what is missing and where the spec refers to it. Secrets
and ConfigMaps the operator does not read (least privilege); the kubelet's word on a pod that
names a missing one becomes the same reasons (``podstates``), and since env, envFrom and volumes
join the probe hash, a new reference holds the rollout behind a probe that cannot start.
Optional references (``optional: true``) are left out: the pod runs without them. Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, Literal

from mmprep_operator import api
from mmprep_operator.logic.conditions import Reason
from mmprep_operator.logic.status import Problem

Kind = Literal["Secret", "ConfigMap", "PersistentVolumeClaim"]

#: The Degraded reason when an object of that kind is missing.
REASONS: Final[Mapping[Kind, str]] = {
    "Secret": Reason.SECRET_NOT_FOUND,
    "ConfigMap": Reason.CONFIG_MAP_NOT_FOUND,
    "PersistentVolumeClaim": Reason.PERSISTENT_VOLUME_CLAIM_NOT_FOUND,
}


#: The kinds the operator looks up (RBAC ``get``); the others it never reads.
LOOKED_UP: Final[frozenset[Kind]] = frozenset({"PersistentVolumeClaim"})


@dataclasses.dataclass(frozen=True)
class Reference:
    """An object the pods need, and where the spec names it."""

    kind: Kind
    name: str
    where: str


def _required(ref: Mapping[str, Any] | None, key: str = "name") -> str | None:
    if not ref or ref.get("optional") is True:
        return None
    name = ref.get(key)
    return str(name) if name else None


def _env_references(spec: api.MultimodalPreprocessorSpec) -> Iterator[Reference]:
    for i, source in enumerate(spec.env_from):
        if name := _required(source.get("secretRef")):
            yield Reference("Secret", name, f"spec.envFrom[{i}].secretRef")
        if name := _required(source.get("configMapRef")):
            yield Reference("ConfigMap", name, f"spec.envFrom[{i}].configMapRef")
    for i, var in enumerate(spec.env):
        value_from = var.get("valueFrom") or {}
        if name := _required(value_from.get("secretKeyRef")):
            yield Reference("Secret", name, f"spec.env[{i}].valueFrom.secretKeyRef")
        if name := _required(value_from.get("configMapKeyRef")):
            yield Reference("ConfigMap", name, f"spec.env[{i}].valueFrom.configMapKeyRef")


def _volume_references(spec: api.MultimodalPreprocessorSpec) -> Iterator[Reference]:
    for i, volume in enumerate(spec.volumes):
        if name := _required(volume.get("persistentVolumeClaim"), "claimName"):
            yield Reference("PersistentVolumeClaim", name, f"spec.volumes[{i}].persistentVolumeClaim")
        if name := _required(volume.get("secret"), "secretName"):
            yield Reference("Secret", name, f"spec.volumes[{i}].secret")
        if name := _required(volume.get("configMap")):
            yield Reference("ConfigMap", name, f"spec.volumes[{i}].configMap")


def references(spec: api.MultimodalPreprocessorSpec) -> list[Reference]:
    """Every object the pods cannot run without, in spec order (projected volumes aside)."""
    pull = [Reference("Secret", str(s["name"]), f"spec.imagePullSecrets[{i}]") for i, s in enumerate(spec.image_pull_secrets)]
    return [*pull, *_env_references(spec), *_volume_references(spec)]


def problem(missing: Sequence[Reference], namespace: str) -> Problem:
    """Degraded, named after the first missing object's kind; Ready follows the pods that serve."""
    said = "; ".join(f'{m.kind} "{m.name}" ({m.where}) not found in namespace {namespace}' for m in missing)
    return Problem(
        REASONS[missing[0].kind],
        f"{said}; nothing is probed or rolled out until it exists, and the pods already serving are left as they are",
        blocks_ready=False,
    )
