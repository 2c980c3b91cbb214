"""The kopf handlers: thin adapters from watch events to the ``Controller`` in kopf's memo.

Only indexes and ``on.event`` handlers are used, on purpose: they need no finalizers and write
no annotations, so the operator never blocks deletion of a resource (or of a namespace) when it
is not running, and never touches the Deployments it creates except through its own applies.

Handlers are registered on a registry built per run (not at import), so tests and the CLI can
build as many operators as they like.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, Final

import kopf

from mmprep_operator import api
from mmprep_operator.control.controller import Controller, nodes_from_index
from mmprep_operator.control.kopf_watch import notice_namespaces_in_listings, tolerate_deleted_crds
from mmprep_operator.control.state import OperatorState
from mmprep_operator.kube import bearer_token, load_configuration
from mmprep_operator.logic import identity
from mmprep_operator.logic.calibration import LABEL_COMPONENT_CALIBRATION
from mmprep_operator.logic.nodes import node_facts
from mmprep_operator.logic.probe import LABEL_COMPONENT_PROBE

_CHILD_LABELS = {identity.LABEL_MANAGED_BY: identity.MANAGED_BY}
_JOB_COMPONENTS = (LABEL_COMPONENT_CALIBRATION, LABEL_COMPONENT_PROBE)


def _is_job_component(value: str | None, **_: Any) -> bool:
    return value in _JOB_COMPONENTS


_CHILD_SELECTOR = identity.label_selector(_CHILD_LABELS)
# The Jobs the operator reads: probes and calibrations.
_JOB_LABELS: dict[str, Any] = {**_CHILD_LABELS, identity.LABEL_COMPONENT: _is_job_component}
_JOB_SELECTOR = f"{_CHILD_SELECTOR},{identity.LABEL_COMPONENT} in ({','.join(_JOB_COMPONENTS)})"
_RUNTIME_POD_LABELS = {**_CHILD_LABELS, identity.LABEL_COMPONENT: identity.COMPONENT_RUNTIME}
NODE_INDEX = "mmprep_nodes"


@dataclasses.dataclass(frozen=True)
class _ChildWatch:
    """One kind of object the operator owns or reads, watched for the resource it belongs to.

    ``labels`` is kopf's filter, applied client-side; ``selector`` is the same filter for the API
    server, so a large cluster does not stream every object of the kind just to drop it.
    """

    group: str
    version: str
    plural: str
    kind: str
    labels: Mapping[str, Any]
    selector: str


_CHILD_WATCHES: Final = (
    _ChildWatch("apps", "v1", "deployments", "Deployment", _CHILD_LABELS, _CHILD_SELECTOR),
    _ChildWatch("", "v1", "services", "Service", _CHILD_LABELS, _CHILD_SELECTOR),
    _ChildWatch("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", _CHILD_LABELS, _CHILD_SELECTOR),
    # Autoscaled pools: their status (current/desired replicas, the last reason) goes into ours.
    # kopf serves the ScaledObject watch only where KEDA's CRD is installed, and starts it when it is.
    _ChildWatch("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", _CHILD_LABELS, _CHILD_SELECTOR),
    _ChildWatch("keda.sh", "v1alpha1", "scaledobjects", "ScaledObject", _CHILD_LABELS, _CHILD_SELECTOR),
    # Runtime pods only (their scheduling and exits go into status), never the probe's.
    _ChildWatch("", "v1", "pods", "Pod", _RUNTIME_POD_LABELS, identity.label_selector(_RUNTIME_POD_LABELS)),
    _ChildWatch("batch", "v1", "jobs", "Job", _JOB_LABELS, _JOB_SELECTOR),
)


def _watch_child(registry: kopf.OperatorRegistry, watch: _ChildWatch) -> None:
    @kopf.on.event(
        watch.group, watch.version, watch.plural, id=f"{watch.plural}_changed", labels=dict(watch.labels), registry=registry
    )
    def child_changed(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:  # noqa: A002
        memo["state"].controller.child_event(watch.kind, type, body)


def build_registry() -> kopf.OperatorRegistry:
    # The ScaledObject watch below comes and goes with KEDA's CRD (kopf_watch says why this is needed).
    tolerate_deleted_crds()
    # Namespaces created while the operator starts are served at once (kopf_watch says why).
    notice_namespaces_in_listings()
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
        # The same credentials as the reconciler's client, honouring --kubeconfig/--context.
        state: OperatorState = memo["state"]
        c = load_configuration(state.kubeconfig, state.context)
        return kopf.ConnectionInfo(
            server=c.host,
            ca_path=c.ssl_ca_cert,
            insecure=not c.verify_ssl,
            certificate_path=c.cert_file,
            private_key_path=c.key_file,
            scheme="Bearer" if bearer_token(c) else None,
            token=bearer_token(c),
        )

    @kopf.on.startup(registry=registry)
    async def start(
        *, settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger | logging.LoggerAdapter[Any], **kwargs: Any
    ) -> None:
        state: OperatorState = memo["state"]
        # kopf would post an Event for every handler log line; the reconciler posts its own.
        settings.posting.level = logging.WARNING
        # Re-establish watches regularly: a watch that silently stalls must not leave the
        # operator deaf (kopf #1145/#1276).
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        # Filter children on the server: in a large cluster the operator must not stream every
        # Deployment and Job just to drop all but its own (the handlers' labels= filter client-side).
        for watch in _CHILD_WATCHES:
            settings.watching.label_selectors[watch.group, watch.plural] = watch.selector
        await state.start(nodes_from_index(kwargs[NODE_INDEX]))
        logger.info("mmprep operator started")

    @kopf.on.cleanup(registry=registry)
    async def stop(memo: kopf.Memo, **_: Any) -> None:
        await memo["state"].stop()

    @kopf.on.probe(id="workers", registry=registry)
    def workers_alive(memo: kopf.Memo, **_: Any) -> str:
        controller: Controller = memo["state"].controller
        if not controller.healthy():
            raise kopf.PermanentError("reconcile workers are not running")
        return "ok"

    @kopf.index("", "v1", "nodes", id=NODE_INDEX, registry=registry)
    def index_node(name: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {name: node_facts(body)}

    @kopf.on.event("", "v1", "nodes", registry=registry)
    def node_changed(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:  # noqa: A002
        memo["state"].controller.node_event(type, body)

    @kopf.on.event(api.GROUP, api.VERSION, api.PLURAL, registry=registry)
    def resource_changed(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:  # noqa: A002
        memo["state"].controller.resource_event(type, body)

    for watch in _CHILD_WATCHES:
        _watch_child(registry, watch)

    return registry
