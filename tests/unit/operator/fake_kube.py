"""An in-memory stand-in for the API seam (``mmprep_operator.kube.KubeApi``) for reconcile tests.

It keeps objects as dicts, answers like the API server where the reconciler depends on it
(404 -> None, 409 on create, server-side apply merges into what exists), and records writes so
tests can assert on them. It is not a Kubernetes simulator: no controllers run; tests play the
Job controller and kubelet by editing objects.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from mmprep_operator.kube import FIELD_MANAGER, ApiError, Conflict


def _matches(labels: Mapping[str, str], selector: str) -> bool:
    for part in filter(None, selector.split(",")):
        key, _, value = part.partition("=")
        if labels.get(key) != value:
            return False
    return True


class FakeKubeApi:
    def __init__(self) -> None:
        self.resources: dict[tuple[str, str], dict[str, Any]] = {}
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (kind, ns, name)
        self.pods: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.status_writes = 0
        self.stale_status_writes = 0  # conditional writes refused: the resource changed since
        self.gets = 0
        self.pod_lists = 0
        self.applies: list[tuple[str, str]] = []
        self.deleted: list[str] = []
        self.reject: dict[str, ApiError] = {}  # object name -> error on apply
        self.foreign_fields: set[tuple[str, str, str]] = set()  # objects with fields another manager owns
        self.stamp_markers = False  # give applied objects generation/resourceVersion like the server
        self.cluster_objects: dict[tuple[str, str], dict[str, Any]] = {}  # (kind, name): APIServices, CRDs
        self.handovers: list[tuple[str, int]] = []  # (Deployment, replicas) applied by another field manager
        self._version = 0

    def _rv(self) -> str:
        self._version += 1
        return str(self._version)

    # resources
    def add_resource(self, name: str, spec: dict[str, Any], namespace: str = "ns", uid: str | None = None) -> None:
        self.resources[(namespace, name)] = {
            "apiVersion": "mmprep.dev/v1alpha1",
            "kind": "MultimodalPreprocessor",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid or f"uid-{name}",
                "generation": 1,
                "resourceVersion": self._rv(),
            },
            "spec": spec,
        }

    def edit_spec(self, name: str, spec: dict[str, Any], namespace: str = "ns") -> None:
        """A user's spec edit: a new generation and resourceVersion."""
        body = self.resources[(namespace, name)]
        body["spec"] = spec
        body["metadata"]["generation"] += 1
        body["metadata"]["resourceVersion"] = self._rv()

    async def get_resource(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.gets += 1
        body = self.resources.get((namespace, name))
        return copy.deepcopy(body) if body is not None else None

    async def replace_resource_status(
        self, namespace: str, name: str, status: Mapping[str, Any], *, resource_version: str | None = None
    ) -> str | None:
        body = self.resources.get((namespace, name))
        if body is None:
            raise ApiError(404, "NotFound", f"{name} not found")
        if resource_version is not None and resource_version != body["metadata"]["resourceVersion"]:
            self.stale_status_writes += 1
            raise Conflict(409, "Conflict", "the object has been modified")
        self.status_writes += 1
        body["status"] = copy.deepcopy(dict(status))
        body["metadata"]["resourceVersion"] = self._rv()
        return str(body["metadata"]["resourceVersion"])

    # children
    async def apply(self, obj: Mapping[str, Any], *, force: bool, field_manager: str = FIELD_MANAGER) -> dict[str, Any]:
        meta = obj["metadata"]
        if field_manager != FIELD_MANAGER:
            # Only the replicas handover applies under another manager: it keeps the count.
            self.handovers.append((meta["name"], obj["spec"]["replicas"]))
            return copy.deepcopy(self.objects[(obj["kind"], meta["namespace"], meta["name"])])
        if meta["name"] in self.reject:
            raise self.reject[meta["name"]]
        key = (obj["kind"], meta["namespace"], meta["name"])
        if key in self.foreign_fields and not force:
            raise Conflict(409, "Conflict", 'Apply failed with 1 conflict: conflict with "kubectl": .spec')
        self.foreign_fields.discard(key)
        self.applies.append((obj["kind"], meta["name"]))
        existing = self.objects.get(key, {})
        merged = {**copy.deepcopy(dict(obj)), "status": existing.get("status", {})}
        if obj["kind"] == "Deployment" and "replicas" not in obj["spec"]:
            # Like server-side apply once the replicas are handed over: another owner keeps them.
            merged["spec"]["replicas"] = (existing.get("spec") or {}).get("replicas", 1)
        if self.stamp_markers:
            # Like the API server: generation moves when the spec changes, resourceVersion always.
            old_meta = existing.get("metadata", {})
            generation = old_meta.get("generation", 0) + (existing.get("spec") != merged.get("spec"))
            merged["metadata"]["generation"] = generation
            merged["metadata"]["resourceVersion"] = self._rv()
        self.objects[key] = merged
        return copy.deepcopy(merged)

    async def get_object(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    async def get_cluster_object(self, api_version: str, kind: str, name: str) -> dict[str, Any] | None:
        obj = self.cluster_objects.get((kind, name))
        return copy.deepcopy(obj) if obj is not None else None

    async def object_exists(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        return (kind, namespace, name) in self.objects

    def add_foreign(self, kind: str, name: str, body: dict[str, Any], namespace: str = "ns") -> None:
        """An object someone else wrote (another field manager owns its fields)."""
        self.objects[(kind, namespace, name)] = {"kind": kind, "metadata": {"name": name, "namespace": namespace}, **body}
        self.foreign_fields.add((kind, namespace, name))

    def kinds(self, kind: str) -> dict[str, dict[str, Any]]:
        return {name: o for (k, _, name), o in self.objects.items() if k == kind}

    async def list_objects(self, api_version: str, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for (k, ns, _), o in self.objects.items()
            if k == kind and ns == namespace and _matches(o["metadata"].get("labels", {}), selector)
        ]

    async def delete_object(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        if kind == "Deployment":
            self.deleted.append(name)
        else:
            self.deleted.append(f"{kind}/{name}")
        self.objects.pop((kind, namespace, name), None)

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        job = self.objects.get(("Job", namespace, name))
        return copy.deepcopy(job) if job is not None else None

    async def create_job(self, job: Mapping[str, Any]) -> dict[str, Any]:
        meta = job["metadata"]
        key = ("Job", meta["namespace"], meta["name"])
        if key in self.objects:
            return copy.deepcopy(self.objects[key])  # the seam's contract: the 409 answers with the existing Job
        created = copy.deepcopy(dict(job))
        created["metadata"]["resourceVersion"] = self._rv()
        created["status"] = {}
        self.objects[key] = created
        return copy.deepcopy(created)

    async def set_job_owners(self, namespace: str, name: str, owners: list[dict[str, Any]], resource_version: str) -> None:
        job = self.objects[("Job", namespace, name)]
        if job["metadata"]["resourceVersion"] != resource_version:
            raise Conflict(409, "Conflict", "the object has been modified")
        job["metadata"]["ownerReferences"] = copy.deepcopy(owners)
        job["metadata"]["resourceVersion"] = self._rv()

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.pod_lists += 1
        return [copy.deepcopy(p) for p in self.pods if _matches(p["metadata"].get("labels", {}), selector)]

    async def post_event(self, event: Mapping[str, Any]) -> None:
        self.events.append(copy.deepcopy(dict(event)))

    # playing the controllers
    def finish_job(self, name: str, message: str, *, namespace: str = "ns", succeeded: bool = True, reason: str = "") -> None:
        job = self.objects[("Job", namespace, name)]
        job["metadata"]["resourceVersion"] = self._rv()
        job["status"] = {"conditions": [{"type": "Complete" if succeeded else "Failed", "status": "True", "reason": reason}]}
        self.pods.append(
            {
                "metadata": {"labels": {"job-name": name}, "creationTimestamp": "2026-01-01T00:00:00Z"},
                "status": {
                    "phase": "Succeeded" if succeeded else "Failed",
                    "containerStatuses": [{"name": "probe", "state": {"terminated": {"message": message}}}],
                },
            }
        )

    def set_ready(self, deployment: str, ready: int, namespace: str = "ns") -> None:
        dep = self.objects[("Deployment", namespace, deployment)]
        dep["status"] = {
            "replicas": dep["spec"]["replicas"],
            "readyReplicas": ready,
            "updatedReplicas": dep["spec"]["replicas"],
            "observedGeneration": dep["metadata"].get("generation", 0),
        }
