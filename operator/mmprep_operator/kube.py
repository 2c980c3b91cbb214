"""The one seam that talks to the Kubernetes API.

``KubeApi`` is the protocol the reconciler uses; ``RestKubeApi`` implements it over aiohttp with
plain JSON dicts (no generated model classes: every object here is rendered as a dict anyway).
Unit tests substitute an in-memory fake. Credentials come from the kubernetes client's config
loaders (KUBECONFIG or in-cluster), which also refresh expiring tokens.

Conflicts: server-side apply surfaces a field owned by another manager as ``Conflict``; the
reconciler then forces only objects its resource controls (see ``applier.ChildApplier.apply``). Creating an
object that exists returns the existing one; optimistic-concurrency patches (adding an owner to a
shared probe or calibration Job, a status written from the watch's copy of a resource) surface ``Conflict`` for
the caller to retry.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from typing import Any, Final, Protocol
from urllib.parse import quote

import aiohttp

from mmprep_operator import api
from mmprep_operator.bounded import remember

FIELD_MANAGER: Final = "mmprep-operator"
#: The manager that keeps an autoscaled Deployment's replicas while the operator lets go of them
#: (``applier``): a field no manager owns any more falls back to its default (1 replica).
HANDOVER_FIELD_MANAGER: Final = "mmprep-replicas-handover"
_TIMEOUT: Final = aiohttp.ClientTimeout(total=30)
#: Events whose count this client last set, remembered so a repeat is one PATCH.
_EVENT_COUNTS_KEPT: Final = 4096

# Cluster-scoped kinds the operator reads (what the cluster can autoscale with) -> collection path.
_CLUSTER_PATHS: Final[dict[tuple[str, str], str]] = {
    ("apiregistration.k8s.io/v1", "APIService"): "/apis/apiregistration.k8s.io/v1/apiservices",
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
}

# Kinds the operator writes -> (API prefix, plural).
_PATHS: Final[dict[tuple[str, str], tuple[str, str]]] = {
    ("apps/v1", "Deployment"): ("/apis/apps/v1", "deployments"),
    ("v1", "Service"): ("/api/v1", "services"),
    ("batch/v1", "Job"): ("/apis/batch/v1", "jobs"),
    ("policy/v1", "PodDisruptionBudget"): ("/apis/policy/v1", "poddisruptionbudgets"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"): ("/apis/autoscaling/v2", "horizontalpodautoscalers"),
    ("keda.sh/v1alpha1", "ScaledObject"): ("/apis/keda.sh/v1alpha1", "scaledobjects"),
    ("v1", "Event"): ("/api/v1", "events"),
    ("coordination.k8s.io/v1", "Lease"): ("/apis/coordination.k8s.io/v1", "leases"),
    (api.API_VERSION, api.KIND): (f"/apis/{api.API_VERSION}", api.PLURAL),
}


#: What the pods refer to by name and the operator may look up: only ever asked whether it exists
#: (``object_exists``), never written, so not in ``_PATHS``.
_LOOKED_UP: Final[dict[tuple[str, str], tuple[str, str]]] = {
    ("v1", "PersistentVolumeClaim"): ("/api/v1", "persistentvolumeclaims"),
}
#: Ask the API server for an object's metadata alone.
_METADATA_ONLY: Final = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"


class ApiError(Exception):
    """An API call failed; ``status`` is the HTTP status (0 when the server was not reached)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def permanent(self) -> bool:
        """The request itself is wrong (invalid object, forbidden): retrying unchanged will not help."""
        return self.status in (400, 403, 404, 405, 415, 422)

    @property
    def namespace_terminating(self) -> bool:
        """Refused because the namespace is being deleted (with everything in it)."""
        # The API server's NamespaceLifecycle admission answers 403 with this wording; there is no
        # separate reason code for it.
        return self.status == 403 and "because it is being terminated" in self.message


class Conflict(ApiError):
    """409: the object changed (or exists) meanwhile, or another field manager owns a field."""


class ForeignObject(ApiError):
    """An object the operator would write exists and belongs to someone else: never overwritten."""

    def __init__(self, kind: str, namespace: str, name: str) -> None:
        super().__init__(
            409,
            "AlreadyExists",
            f"{kind} {namespace}/{name} exists and is not managed by this resource; rename the resource or remove that object",
        )

    @property
    def permanent(self) -> bool:
        return True


class KubeApi(Protocol):
    async def get_resource(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def replace_resource_status(
        self, namespace: str, name: str, status: Mapping[str, Any], *, resource_version: str | None = None
    ) -> str | None: ...
    async def apply(self, obj: Mapping[str, Any], *, force: bool, field_manager: str = FIELD_MANAGER) -> dict[str, Any]: ...
    async def get_object(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def get_cluster_object(self, api_version: str, kind: str, name: str) -> dict[str, Any] | None: ...
    async def object_exists(self, api_version: str, kind: str, namespace: str, name: str) -> bool: ...
    async def list_objects(self, api_version: str, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]: ...
    async def delete_object(self, api_version: str, kind: str, namespace: str, name: str) -> None: ...
    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def create_job(self, job: Mapping[str, Any]) -> dict[str, Any]: ...
    async def set_job_owners(self, namespace: str, name: str, owners: list[dict[str, Any]], resource_version: str) -> None: ...
    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]: ...
    async def post_event(self, event: Mapping[str, Any]) -> None: ...


def load_configuration(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A kubernetes.client.Configuration: an explicit kubeconfig first, then in-cluster, then the
    default kubeconfig (KUBECONFIG or ~/.kube/config)."""
    from kubernetes import client, config  # imported here: only the running operator needs it

    configuration = client.Configuration()
    if kubeconfig is None:
        try:
            # kubernetes ships py.typed but leaves its config loaders unannotated.
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return configuration
        except config.ConfigException:
            pass
    config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)  # type: ignore[no-untyped-call]
    return configuration


def bearer_token(configuration: Any) -> str | None:
    """The token alone (configurations store "Bearer <token>"); refreshed when it expires."""
    value = configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
    if not value:
        return None
    scheme, _, token = str(value).partition(" ")
    return token if scheme.lower() == "bearer" and token else str(value)


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    try:
        prefix, plural = _PATHS[(api_version, kind)]
    except KeyError:
        raise ValueError(f"the operator does not write {kind} ({api_version})") from None
    return f"{prefix}/namespaces/{quote(namespace)}/{plural}"


class RestKubeApi:
    """KubeApi over aiohttp. Create with ``connect()`` inside the running event loop."""

    def __init__(self, base_url: str, session: aiohttp.ClientSession, auth: Any) -> None:
        self._base = base_url.rstrip("/")
        self._session = session
        self._auth = auth  # a kubernetes.client.Configuration: refreshes tokens on each call
        self._event_counts: dict[tuple[str, str], int] = {}  # (namespace, name) -> count set last

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, context: str | None = None) -> RestKubeApi:
        configuration = load_configuration(kubeconfig, context)
        ssl_context: ssl.SSLContext | bool
        if configuration.verify_ssl:
            ssl_context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        else:
            ssl_context = False
        if configuration.cert_file and isinstance(ssl_context, ssl.SSLContext):
            ssl_context.load_cert_chain(configuration.cert_file, configuration.key_file)
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_context), timeout=_TIMEOUT)
        return cls(configuration.host, session, configuration)

    async def close(self) -> None:
        await self._session.close()

    def _headers(self, content_type: str | None, accept: str = "application/json") -> dict[str, str]:
        headers = {"Accept": accept}
        if content_type:
            headers["Content-Type"] = content_type
        token = self._auth.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token
        return headers

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        params: Mapping[str, str] | None = None,
        missing_ok: bool = False,
        accept: str = "application/json",
    ) -> dict[str, Any] | None:
        data = json.dumps(body) if body is not None else None
        headers = self._headers(content_type if data else None, accept)
        try:
            async with self._session.request(method, self._base + path, data=data, params=params, headers=headers) as response:
                text = await response.text()
                if response.status == 404 and missing_ok:
                    return None
                if response.status >= 400:
                    raise _error(response.status, text)
                return json.loads(text) if text else {}
        except aiohttp.ClientError as e:
            raise ApiError(0, "Unreachable", str(e)) from e

    # ------------------------------------------------------------------ MultimodalPreprocessor

    def _resource_path(self, namespace: str, name: str) -> str:
        return f"{collection_path(api.API_VERSION, api.KIND, namespace)}/{quote(name)}"

    async def get_resource(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._call("GET", self._resource_path(namespace, name), missing_ok=True)

    async def replace_resource_status(
        self, namespace: str, name: str, status: Mapping[str, Any], *, resource_version: str | None = None
    ) -> str | None:
        """Replace the whole status; return the resource's new resourceVersion.

        JSON Patch "add" on /status replaces the whole status (a merge patch could not remove
        fields). The status is ours alone, so no resourceVersion is needed; given one, the write
        is conditional on it (``Conflict`` when the resource changed since that version).
        """
        patch: list[dict[str, Any]] = [{"op": "add", "path": "/status", "value": status}]
        if resource_version is not None:
            patch.insert(0, {"op": "replace", "path": "/metadata/resourceVersion", "value": resource_version})
        result = await self._call(
            "PATCH",
            self._resource_path(namespace, name) + "/status",
            body=patch,
            content_type="application/json-patch+json",
        )
        version = ((result or {}).get("metadata") or {}).get("resourceVersion")
        return str(version) if version else None

    # ------------------------------------------------------------------------------ children

    async def apply(self, obj: Mapping[str, Any], *, force: bool, field_manager: str = FIELD_MANAGER) -> dict[str, Any]:
        """Server-side apply. Unforced, a field another manager set answers 409 (``Conflict``)."""
        meta = obj["metadata"]
        path = f"{collection_path(obj['apiVersion'], obj['kind'], meta['namespace'])}/{quote(meta['name'])}"
        result = await self._call(
            "PATCH",
            path,
            body=obj,
            content_type="application/apply-patch+yaml",  # JSON is YAML
            params={"fieldManager": field_manager, "force": "true" if force else "false"},
        )
        return result or {}

    async def get_cluster_object(self, api_version: str, kind: str, name: str) -> dict[str, Any] | None:
        try:
            collection = _CLUSTER_PATHS[(api_version, kind)]
        except KeyError:
            raise ValueError(f"the operator does not read {kind} ({api_version})") from None
        return await self._call("GET", f"{collection}/{quote(name)}", missing_ok=True)

    async def get_object(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._call("GET", f"{collection_path(api_version, kind, namespace)}/{quote(name)}", missing_ok=True)

    async def object_exists(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        # Metadata only (PartialObjectMetadata): nothing of the object but that it exists is wanted.
        if (api_version, kind) not in _LOOKED_UP:
            raise ValueError(f"the operator does not look up {kind} ({api_version})")
        prefix, plural = _LOOKED_UP[(api_version, kind)]
        found = await self._call(
            "GET", f"{prefix}/namespaces/{quote(namespace)}/{plural}/{quote(name)}", missing_ok=True, accept=_METADATA_ONLY
        )
        return found is not None

    async def list_objects(self, api_version: str, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        result = await self._call("GET", collection_path(api_version, kind, namespace), params={"labelSelector": selector})
        return list((result or {}).get("items") or ())

    async def delete_object(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        path = f"{collection_path(api_version, kind, namespace)}/{quote(name)}"
        await self._call(
            "DELETE", path, body={"propagationPolicy": "Background"}, content_type="application/json", missing_ok=True
        )

    async def write_lease(self, lease: Mapping[str, Any]) -> dict[str, Any]:
        """Create the leader Lease, or replace it at the resourceVersion it carries (optimistic
        concurrency: ``Conflict`` when another replica wrote it first)."""
        meta = lease["metadata"]
        collection = collection_path("coordination.k8s.io/v1", "Lease", meta["namespace"])
        if meta.get("resourceVersion"):
            result = await self._call("PUT", f"{collection}/{quote(meta['name'])}", body=lease, content_type="application/json")
        else:
            result = await self._call("POST", collection, body=lease, content_type="application/json")
        return result or {}

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._call("GET", f"{collection_path('batch/v1', 'Job', namespace)}/{quote(name)}", missing_ok=True)

    async def create_job(self, job: Mapping[str, Any]) -> dict[str, Any]:
        meta = job["metadata"]
        try:
            return (
                await self._call(
                    "POST", collection_path("batch/v1", "Job", meta["namespace"]), body=job, content_type="application/json"
                )
                or {}
            )
        except Conflict:
            # Another resource with the same Job name (the same hash) created it first: share it.
            existing = await self.get_job(meta["namespace"], meta["name"])
            if existing is None:
                raise
            return existing

    async def set_job_owners(self, namespace: str, name: str, owners: list[dict[str, Any]], resource_version: str) -> None:
        await self._call(
            "PATCH",
            f"{collection_path('batch/v1', 'Job', namespace)}/{quote(name)}",
            body={"metadata": {"ownerReferences": owners, "resourceVersion": resource_version}},
            content_type="application/merge-patch+json",
        )

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        result = await self._call("GET", f"/api/v1/namespaces/{quote(namespace)}/pods", params={"labelSelector": selector})
        return list((result or {}).get("items") or ())

    async def post_event(self, event: Mapping[str, Any]) -> None:
        """Create an Event; the same one again (same name) bumps its count.

        A repeat of an Event this client wrote is one PATCH with the count it remembers; only an
        Event it does not know (after a restart) costs a failed POST, a GET and the PATCH.
        """
        meta = event["metadata"]
        path = collection_path("v1", "Event", meta["namespace"])
        key = (meta["namespace"], meta["name"])
        known = self._event_counts.get(key)
        if known is not None and await self._bump_event(path, meta["name"], known + 1, event):
            return
        try:
            await self._call("POST", path, body=event, content_type="application/json")
            remember(self._event_counts, key, int(event.get("count") or 1), size=_EVENT_COUNTS_KEPT)
        except Conflict:
            # The same event again: bump its count instead of creating a duplicate.
            existing = await self._call("GET", f"{path}/{quote(meta['name'])}", missing_ok=True) or {}
            await self._bump_event(path, meta["name"], int(existing.get("count") or 1) + 1, event)

    async def _bump_event(self, path: str, name: str, count: int, event: Mapping[str, Any]) -> bool:
        """Set an Event's count and last timestamp; False when it no longer exists (Events expire)."""
        result = await self._call(
            "PATCH",
            f"{path}/{quote(name)}",
            body={"count": count, "lastTimestamp": event.get("lastTimestamp")},
            content_type="application/merge-patch+json",
            missing_ok=True,
        )
        key = (event["metadata"]["namespace"], name)
        if result is None:
            self._event_counts.pop(key, None)
            return False
        remember(self._event_counts, key, count, size=_EVENT_COUNTS_KEPT)
        return True


def _error(status: int, text: str) -> ApiError:
    try:
        payload = json.loads(text)
        reason, message = str(payload.get("reason", "")), str(payload.get("message", text))
    except (json.JSONDecodeError, AttributeError):
        reason, message = "", text
    cls = Conflict if status == 409 else ApiError
    return cls(status, reason or "Error", message[:1000])
