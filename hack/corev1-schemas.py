#!/usr/bin/env python3
"""Regenerate operator/mmprep_operator/api/corev1.json: the upstream core/v1 schemas of the pod
fields the MultimodalPreprocessor passes through (volumes, env, tolerations, affinity, ...).

Input: the core/v1 OpenAPI v3 document that a real API server of the Kubernetes version the
control plane is built from (hack/build-control-plane.sh) serves at /openapi/v3/api/v1. The live
document, not the one committed in Kubernetes' source tree (api/openapi-spec/v3): only the
server's carries the enums of enumerated fields (a toleration's operator, a seccomp profile's
type), which let the CRD refuse a misspelt value at admission. Output: the fields' schemas and the
definitions they reach, trimmed so that the CRD stays small (descriptions cut to their first
sentence) and rid of the extensions a CRD cannot carry (patch strategies, unions). ``$ref``s are
kept; the operator resolves them (``mmprep_operator.api.corev1``).

    hack/cluster-up.sh                          # a local API server (prints its kubeconfig)
    hack/corev1-schemas.py --kubeconfig FILE    # from that server
    hack/corev1-schemas.py --openapi FILE       # from a saved copy of the document

tests/integration/test_typed_fields_on_api_server.py fails when the committed file is not what
the live server's document trims to.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
OUTPUT = REPO / "operator" / "mmprep_operator" / "api" / "corev1.json"

#: The pod fields typed by upstream, as ``Owner.field`` of io.k8s.api.core.v1 (a contract with
#: mmprep_operator.api.corev1, which names the same keys).
FIELDS = (
    "PodSpec.affinity",
    "PodSpec.imagePullSecrets",
    "PodSpec.securityContext",
    "PodSpec.tolerations",
    "PodSpec.volumes",
    "Container.env",
    "Container.envFrom",
    "Container.securityContext",
    "Container.volumeMounts",
)
CORE = "io.k8s.api.core.v1."
#: Extensions the CRD schema (apiextensions JSONSchemaProps) has no field for.
_DROPPED = frozenset({"x-kubernetes-patch-merge-key", "x-kubernetes-patch-strategy", "x-kubernetes-unions"})
#: Definitions kept opaque: an ephemeral volume's claim template metadata. The CRD does not type
#: embedded object metadata (neither does controller-gen); the Deployment's own validation checks
#: it when the operator applies the pod template.
_OPAQUE = frozenset({"io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"})
_FIRST_SENTENCE = re.compile(r"^(.*?[.!?])(\s|$)", re.S)
_MAX_DESCRIPTION = 200


def k8s_version() -> str:
    text = (REPO / "hack" / "build-control-plane.sh").read_text()
    match = re.search(r"K8S_VERSION=\$\{K8S_VERSION:-(v[0-9.]+)\}", text)
    if not match:
        raise SystemExit("cannot read K8S_VERSION from hack/build-control-plane.sh")
    return os.environ.get("K8S_VERSION", match.group(1))


def server_document(kubeconfig: str) -> dict[str, Any]:
    """The live API server's core/v1 OpenAPI v3 document (kubectl from the control-plane build)."""
    binaries = subprocess.run([str(REPO / "hack" / "build-control-plane.sh")], capture_output=True, text=True, check=True)
    kubectl = pathlib.Path(binaries.stdout.strip().splitlines()[-1]) / "kubectl"
    raw = subprocess.run(
        [str(kubectl), "--kubeconfig", kubeconfig, "get", "--raw", "/openapi/v3/api/v1"],
        capture_output=True,
        text=True,
        check=True,
    )
    document: dict[str, Any] = json.loads(raw.stdout)
    return document


def _short(description: str) -> str:
    match = _FIRST_SENTENCE.match(description.strip())
    text = match.group(1) if match else description.strip()
    text = " ".join(text.split())
    return text if len(text) <= _MAX_DESCRIPTION else text[: _MAX_DESCRIPTION - 3].rstrip() + "..."


def _clean(node: Any) -> Any:
    if isinstance(node, list):
        return [_clean(x) for x in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "description":
            out[key] = _short(value)
        elif key == "properties":
            out[key] = {name: _clean(sub) for name, sub in value.items()}
        else:
            out[key] = _clean(value)
    return out


def _refs(node: Any) -> set[str]:
    if isinstance(node, list):
        return set().union(*(_refs(x) for x in node)) if node else set()
    if not isinstance(node, dict):
        return set()
    found = {node["$ref"].rsplit("/", 1)[-1]} if "$ref" in node else set()
    return found.union(*(_refs(v) for v in node.values()))


def trim(document: dict[str, Any], source: str) -> dict[str, Any]:
    """The committed file's content, from the core/v1 OpenAPI v3 document."""
    schemas = document["components"]["schemas"]
    fields: dict[str, Any] = {}
    for name in FIELDS:
        owner, field = name.split(".")
        fields[name] = _clean(schemas[CORE + owner]["properties"][field])
    definitions: dict[str, Any] = {}
    todo = sorted(_refs(fields))
    while todo:
        ref = todo.pop()
        if ref in definitions:
            continue
        if ref in _OPAQUE:
            upstream = schemas[ref]
            definitions[ref] = {"description": _short(upstream["description"]), "type": "object"}
            continue
        definitions[ref] = _clean(schemas[ref])
        todo.extend(sorted(_refs(definitions[ref]) - definitions.keys()))
    return {"source": source, "fields": fields, "definitions": dict(sorted(definitions.items()))}


def source_name(version: str) -> str:
    return f"Kubernetes {version} API server, /openapi/v3/api/v1"


def render(content: dict[str, Any]) -> str:
    return json.dumps(content, indent=1, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--kubeconfig", help="read the document from this cluster's API server")
    source.add_argument("--openapi", type=pathlib.Path, help="read a saved copy of the document")
    parser.add_argument("--check", action="store_true", help="compare with the committed file instead of writing it")
    args = parser.parse_args(argv)
    document = json.loads(args.openapi.read_text()) if args.openapi else server_document(args.kubeconfig)
    text = render(trim(document, source_name(k8s_version())))
    if args.check:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(REPO)} is not what the document trims to: run hack/corev1-schemas.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
