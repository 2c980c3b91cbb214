"""The pod fields typed by upstream Kubernetes: volumes, volume mounts, env, envFrom, tolerations,
affinity, image pull secrets and security contexts, with core/v1's own schemas; and quantities.

The schemas come from ``corev1.json``: the core/v1 OpenAPI v3 document that the API server of the
Kubernetes version the tests run against serves, trimmed to the definitions these fields reach
(``hack/corev1-schemas.py`` regenerates it; an integration test compares it with the live
server's). Each field's schema is the
upstream *field's* (``PodSpec.volumes``, ``Container.env``), so it carries upstream's list
semantics too: volumes, env and imagePullSecrets are maps keyed by name, volume mounts by
mountPath (``x-kubernetes-list-type: map``).

``schema_of`` resolves one into a structural schema (the CRD cannot hold ``$ref``), and each type
below (``Volumes``, ``Env``, ...) (1) puts that schema into the CRD and (2) checks a value against
the same schema (``structural``), keeping the value as the plain object the user wrote. Typed pydantic models of
upstream's 80 definitions would say the same thing a second time, and re-serializing them would be
one more place to lose a field the pods need: the pods get exactly what the user wrote.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import re
from collections.abc import Callable
from typing import Annotated, Any, Final

from pydantic import AfterValidator, WithJsonSchema

from mmprep_operator.api import structural

#: Entries in each list field. Upstream's lists are unbounded; a CRD's are bounded so that the API
#: server can cost its CEL rules (a rule that walks spec.volumes is refused without a bound).
MAX_ITEMS: Final = 64
QUANTITY_REF: Final = "io.k8s.apimachinery.pkg.api.resource.Quantity"
#: What a resource.Quantity string looks like: the pattern controller-gen puts on every quantity
#: in a CRD (k8s.io/apimachinery's ParseQuantity accepts the same grammar).
QUANTITY_PATTERN: Final = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
QUANTITY_SCHEMA: Final = {"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}


@functools.cache
def _document() -> dict[str, Any]:
    text = importlib.resources.files(__package__).joinpath("corev1.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline ``$ref``/``allOf``; quantities as int-or-string; object defaults dropped."""
    if isinstance(node, list):
        return [_resolve(x, defs) for x in node]
    if not isinstance(node, dict):
        return node
    if "allOf" in node:
        rest = {k: v for k, v in node.items() if k != "allOf"}
        (only,) = node["allOf"]
        return _resolve({**only, **rest}, defs)
    if "$ref" in node:
        ref = node["$ref"].rsplit("/", 1)[-1]
        rest = {k: v for k, v in node.items() if k != "$ref"}
        if ref == QUANTITY_REF:
            return {**({"description": rest["description"]} if "description" in rest else {}), **QUANTITY_SCHEMA}
        # The field's own description wins over its type's.
        return _resolve({**defs[ref], **rest}, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "default" and (isinstance(value, dict | list) or "x-kubernetes-list-map-keys" not in node):
            # Upstream's defaults are Go zero values the native API never applies from the schema;
            # in a CRD the API server would write them into every resource. Kept only where a CRD
            # needs one: a list-map key that is not required (imagePullSecrets' name), below.
            continue
        if key == "properties":
            out[key] = {name: _resolve(sub, defs) for name, sub in value.items()}
        else:
            out[key] = _resolve(value, defs)
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True  # ObjectMeta of a claim template
    return out


def _keep_map_key_defaults(schema: dict[str, Any], upstream_items: dict[str, Any]) -> None:
    """The API server needs each list-map key required or defaulted: keep upstream's default there."""
    items = schema.get("items") or {}
    required = set(items.get("required", ()))
    for key in schema.get("x-kubernetes-list-map-keys", ()):
        if key not in required and "default" in upstream_items.get("properties", {}).get(key, {}):
            items["properties"][key]["default"] = upstream_items["properties"][key]["default"]


@functools.cache
def _field_json(name: str) -> str:
    document = _document()
    upstream = document["fields"][name]
    schema = _resolve(upstream, document["definitions"])
    if "x-kubernetes-list-map-keys" in schema:
        item_ref = upstream["items"]["allOf"][0]["$ref"].rsplit("/", 1)[-1]
        _keep_map_key_defaults(schema, document["definitions"][item_ref])
    schema.pop("description", None)  # each spec field describes itself
    if schema.get("type") == "array":
        schema["maxItems"] = MAX_ITEMS
    return json.dumps(schema)


def schema_of(name: str) -> dict[str, Any]:
    """The structural schema of upstream field ``name`` (``Owner.field``, e.g. ``PodSpec.volumes``)."""
    loaded: dict[str, Any] = json.loads(_field_json(name))
    return loaded


def _canonical(schema: dict[str, Any]) -> str:
    # What a spec field adds to an upstream schema: its own description and rules.
    return json.dumps(
        {k: v for k, v in schema.items() if k not in ("description", "default", "x-kubernetes-validations")}, sort_keys=True
    )


@functools.cache
def _names_by_schema() -> dict[str, str]:
    return {_canonical(schema_of(name)): name for name in _document()["fields"]}


def upstream_field(node: dict[str, Any]) -> str | None:
    """Which upstream field (``PodSpec.volumes``) a CRD schema node copies, if it copies one."""
    return _names_by_schema().get(_canonical(node))


def type_name(name: str) -> str:
    """The core/v1 type of upstream field ``name``, as ``kubectl explain pod.spec`` names it:
    ``[]Volume``, ``Affinity``."""
    upstream = _document()["fields"][name]
    node = upstream.get("items", upstream)
    ref = str(node["allOf"][0]["$ref"]).rsplit(".", 1)[-1]
    return f"[]{ref}" if "items" in upstream else ref


def _checker(name: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        found = list(structural.errors(value, schema_of(name)))
        if found:
            # The path starts at the field: the caller's location names the field itself.
            raise ValueError("; ".join(found[:3]))
        return value

    return check


def _schema(name: str) -> WithJsonSchema:
    return WithJsonSchema(schema_of(name))


def _checked(name: str) -> AfterValidator:
    return AfterValidator(_checker(name))


# The types, one per upstream field they copy: its schema in the CRD, checked here by the same
# schema. Plain JSON values: the pods get them as written.
Volumes = Annotated[list[dict[str, Any]], _schema("PodSpec.volumes"), _checked("PodSpec.volumes")]
ImagePullSecrets = Annotated[list[dict[str, Any]], _schema("PodSpec.imagePullSecrets"), _checked("PodSpec.imagePullSecrets")]
Tolerations = Annotated[list[dict[str, Any]], _schema("PodSpec.tolerations"), _checked("PodSpec.tolerations")]
Affinity = Annotated[dict[str, Any], _schema("PodSpec.affinity"), _checked("PodSpec.affinity")]
PodSecurityContext = Annotated[dict[str, Any], _schema("PodSpec.securityContext"), _checked("PodSpec.securityContext")]
Env = Annotated[list[dict[str, Any]], _schema("Container.env"), _checked("Container.env")]
EnvFrom = Annotated[list[dict[str, Any]], _schema("Container.envFrom"), _checked("Container.envFrom")]
VolumeMounts = Annotated[list[dict[str, Any]], _schema("Container.volumeMounts"), _checked("Container.volumeMounts")]
SecurityContext = Annotated[dict[str, Any], _schema("Container.securityContext"), _checked("Container.securityContext")]


def _check_quantity(value: int | str) -> int | str:
    if isinstance(value, str) and not re.fullmatch(QUANTITY_PATTERN, value):
        raise ValueError(f"{value!r} is not a quantity (e.g. 500m, 2, 4Gi)")
    return value


#: A resource quantity (``2``, ``500m``, ``4Gi``): an integer or a string of Kubernetes' grammar.
#: Plain JSON Schema here (the policy file's schema is one); ``crd`` makes it int-or-string.
Quantity = Annotated[
    int | str,
    WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "string", "pattern": QUANTITY_PATTERN}]}),
    AfterValidator(_check_quantity),
]
