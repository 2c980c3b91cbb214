"""What a resource may change in its pods' security contexts, and what the operator always keeps.

The runtime pods run under the restricted Pod Security Standard plus a read-only root. A platform
that assigns its own user and group ids (OpenShift's restricted SCC) refuses pods that name fixed
ones, so ``spec.podSecurityContext`` hands the ids over: once it is set, even to ``{}``, the
operator writes none of runAsUser, runAsGroup and fsGroup, only those it gives. Everything else
in either context may be added to (SELinux options, a Localhost seccomp profile, supplemental
groups, ...), but nothing may weaken the baseline: a rule below refuses the resource at admission,
with its message, rather than the operator quietly overriding what was asked. And the operator
writes the baseline last, so a value no rule names cannot weaken it either
(``logic.pod_parts``).

Each rule is a ``CelRule`` (checked by the API server) paired with the same check in Python (for
``render`` and the reconciler), listed once here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Final

from mmprep_operator.api.base import CelRule

Check = Callable[[Mapping[str, Any]], bool]


@dataclasses.dataclass(frozen=True)
class SecurityRule:
    """A baseline rule: the CEL the API server runs on the context object, and its Python twin
    (``holds``), which says whether a context keeps the rule."""

    cel: CelRule
    holds: Check


def _seccomp_kept(sc: Mapping[str, Any]) -> bool:
    return (sc.get("seccompProfile") or {}).get("type") != "Unconfined"


_SECCOMP: Final = "!has(self.seccompProfile) || !has(self.seccompProfile.type) || self.seccompProfile.type != 'Unconfined'"

POD_RULES: Final = (
    SecurityRule(
        CelRule("!has(self.runAsNonRoot) || self.runAsNonRoot", "podSecurityContext.runAsNonRoot cannot be false"),
        lambda sc: sc.get("runAsNonRoot") is not False,
    ),
    SecurityRule(
        CelRule("!has(self.runAsUser) || self.runAsUser != 0", "podSecurityContext.runAsUser cannot be 0 (root)"),
        lambda sc: sc.get("runAsUser") != 0,
    ),
    SecurityRule(CelRule(_SECCOMP, "podSecurityContext.seccompProfile cannot be Unconfined"), _seccomp_kept),
)

CONTAINER_RULES: Final = (
    SecurityRule(
        CelRule("!has(self.privileged) || !self.privileged", "securityContext.privileged cannot be true"),
        lambda sc: sc.get("privileged") is not True,
    ),
    SecurityRule(
        CelRule(
            "!has(self.allowPrivilegeEscalation) || !self.allowPrivilegeEscalation",
            "securityContext.allowPrivilegeEscalation cannot be true",
        ),
        lambda sc: sc.get("allowPrivilegeEscalation") is not True,
    ),
    SecurityRule(
        CelRule(
            "!has(self.readOnlyRootFilesystem) || self.readOnlyRootFilesystem",
            "securityContext.readOnlyRootFilesystem cannot be false (mount a volume where the runtime must write)",
        ),
        lambda sc: sc.get("readOnlyRootFilesystem") is not False,
    ),
    SecurityRule(
        CelRule("!has(self.runAsNonRoot) || self.runAsNonRoot", "securityContext.runAsNonRoot cannot be false"),
        lambda sc: sc.get("runAsNonRoot") is not False,
    ),
    SecurityRule(
        CelRule("!has(self.runAsUser) || self.runAsUser != 0", "securityContext.runAsUser cannot be 0 (root)"),
        lambda sc: sc.get("runAsUser") != 0,
    ),
    SecurityRule(
        # The restricted standard allows adding NET_BIND_SERVICE only; every other capability is dropped.
        CelRule(
            "!has(self.capabilities) || !has(self.capabilities.add) || self.capabilities.add.all(c, c == 'NET_BIND_SERVICE')",
            "securityContext.capabilities.add may only hold NET_BIND_SERVICE",
        ),
        lambda sc: all(c == "NET_BIND_SERVICE" for c in (sc.get("capabilities") or {}).get("add") or ()),
    ),
    SecurityRule(CelRule(_SECCOMP, "securityContext.seccompProfile cannot be Unconfined"), _seccomp_kept),
)


def broken(rules: tuple[SecurityRule, ...], context: Mapping[str, Any] | None) -> list[str]:
    """The messages of the rules ``context`` breaks."""
    if context is None:
        return []
    return [r.cel.message for r in rules if not r.holds(context)]
