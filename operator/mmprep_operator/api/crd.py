"""Generate the CustomResourceDefinition from the pydantic models in ``api``.

Pydantic emits JSON Schema; Kubernetes wants a *structural* OpenAPI v3 schema: no ``$ref``, no
``anyOf`` for optional fields, no ``title``, free-form objects marked with
``x-kubernetes-preserve-unknown-fields``, quantities as ``x-kubernetes-int-or-string``. This module
does that conversion and adds what only a CRD has (printer columns, subresources). The result is
committed under ``crds/`` and a unit test regenerates and diffs it.
"""

from __future__ import annotations

from typing import Any

from mmprep_operator import api, yamlio

CRD_NAME = f"{api.PLURAL}.{api.GROUP}"

# JSON Schema keys that mean nothing to (or are rejected by) the API server's OpenAPI subset.
_DROPPED_KEYS = frozenset({"title", "$defs", "examples"})

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Paths", "type": "string", "jsonPath": ".status.pathSummary", "description": "Preprocessing path per pool."},
    {"name": "Workers", "type": "string", "jsonPath": ".status.workerSummary", "description": "Processor workers per pool."},
    {"name": "Ready", "type": "string", "jsonPath": ".status.readySummary", "description": "Ready/desired pods."},
    {
        "name": "Probed",
        "type": "string",
        "priority": 1,
        "jsonPath": '.status.conditions[?(@.type=="Probed")].reason',
        "description": "Probe state.",
    },
    {
        "name": "Degraded",
        "type": "string",
        "priority": 1,
        "jsonPath": '.status.conditions[?(@.type=="Degraded")].reason',
        "description": "Why the resource is degraded, if it is.",
    },
    {
        "name": "Measured",
        "type": "string",
        "priority": 1,
        "jsonPath": ".status.calibrationSummary",
        "description": "Which pools' worker counts were measured (calibration state per pool).",
    },
    {
        "name": "Autoscaling",
        "type": "string",
        "priority": 1,
        "jsonPath": ".status.autoscalingSummary",
        "description": "Per autoscaled pool: engine, current->desired/max replicas.",
    },
    {
        "name": "Scaling",
        "type": "string",
        "priority": 1,
        "jsonPath": '.status.conditions[?(@.type=="Autoscaling")].reason',
        "description": "Who scales the pools, or why nobody can (NoMetricsServer, NoKEDA).",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    """Recursively convert one pydantic JSON-schema node into a structural OpenAPI node."""
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].split("/")[-1]]
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        # Field-level description/default win over the model's own.
        return _structural({**target, **siblings}, defs)
    if "allOf" in node and len(node["allOf"]) == 1:
        rest = {k: v for k, v in node.items() if k != "allOf"}
        return _structural({**node["allOf"][0], **rest}, defs)
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        types = sorted(b.get("type", "") for b in branches)
        if types == ["integer", "string"]:
            quantity: dict[str, Any] = {"x-kubernetes-int-or-string": True}
            if "description" in rest:
                quantity["description"] = rest["description"]
            # A pattern on the string branch (a resource quantity's grammar) holds for strings only,
            # as the API server applies it to an int-or-string.
            patterns = [b["pattern"] for b in branches if "pattern" in b]
            if patterns:
                quantity["pattern"] = patterns[0]
            return quantity
        if len(branches) != 1:
            raise ValueError(f"cannot express anyOf {node['anyOf']} in a structural schema")
        # Optional[X]: absence means None; the API server prunes explicit nulls before defaulting.
        if rest.get("default", ...) is None:
            rest.pop("default")
        return _structural({**branches[0], **rest}, defs)

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "default" and value is None:
            continue
        if key == "properties":
            out[key] = {name: _structural(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = _structural(value, defs)
        elif key == "additionalProperties":
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif value is not False:
                out[key] = _structural(value, defs)
        else:
            out[key] = value
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        # A free-form object (affinity, a toleration): keep whatever the user wrote.
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("enum") and "type" not in out:
        out["type"] = "string"
    return out


def openapi_schema() -> dict[str, Any]:
    """The CRD's openAPIV3Schema, generated from the models."""
    root = api.MultimodalPreprocessor.model_json_schema(by_alias=True, mode="validation")
    defs = root.get("$defs", {})
    spec = _structural(root["properties"]["spec"], defs)
    status = _structural(root["properties"]["status"], defs)
    return {
        "type": "object",
        "description": "MultimodalPreprocessor runs a Hugging Face processor as a preprocessing service, "
        "with worker counts decided per GPU node pool.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def build_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/name": "mmprep"}},
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": list(api.SHORT_NAMES),
                "categories": list(api.CATEGORIES),
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `mmprep-operator crd` from the pydantic models; do not edit by hand.\n"
    return header + yamlio.dump(build_crd())
