"""The upstream core/v1 schemas the pod fields are typed with: the committed trim names the
Kubernetes version it was read from, its list semantics are upstream's, and the schema checker
refuses what the API server refuses."""

from __future__ import annotations

import importlib.util
import json
import pathlib
from types import ModuleType

import pytest

from mmprep_operator.api import corev1, structural
from mmprep_operator.api.status import REASON_PATTERN
from mmprep_operator.logic.conditions import Reason
from mmprep_runtime.sizing import WorkerReason

REPO = pathlib.Path(__file__).resolve().parents[3]
SCRIPT = REPO / "hack" / "corev1-schemas.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("corev1_schemas", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_schemas_name_the_kubernetes_version_the_control_plane_is_built_from() -> None:
    # Bumping K8S_VERSION fails here until hack/corev1-schemas.py has read the new server's
    # document; tests/integration/test_typed_fields_on_api_server.py compares it with that server's.
    script = _script()
    assert json.loads(script_output())["source"] == script.source_name(script.k8s_version())


def test_every_field_the_script_trims_is_typed_in_the_api() -> None:
    assert set(_script().FIELDS) == set(json.loads(script_output())["fields"])


def script_output() -> str:
    return (REPO / "operator" / "mmprep_operator" / "api" / "corev1.json").read_text()


@pytest.mark.parametrize(
    ("field", "keys"),
    [("PodSpec.volumes", ["name"]), ("Container.env", ["name"]), ("Container.volumeMounts", ["mountPath"])],
)
def test_lists_keep_upstreams_merge_keys(field: str, keys: list[str]) -> None:
    schema = corev1.schema_of(field)
    assert schema["x-kubernetes-list-type"] == "map" and schema["x-kubernetes-list-map-keys"] == keys
    assert set(keys) <= set(schema["items"]["required"])


def test_resolved_schemas_are_structural_and_default_nothing_but_a_list_key() -> None:
    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            for forbidden in ("$ref", "allOf", "oneOf", "anyOf", "x-kubernetes-patch-merge-key"):
                assert forbidden not in node, f"{forbidden} at {path}"
            if "default" in node:
                assert path == "PodSpec.imagePullSecrets.items.properties.name", path
            for key, value in node.items():
                walk(value, f"{path}.{key}")

    for name in json.loads(script_output())["fields"]:
        walk(corev1.schema_of(name), name)


def test_quantities_inside_upstream_types_are_checked_too() -> None:
    size = corev1.schema_of("PodSpec.volumes")["items"]["properties"]["emptyDir"]["properties"]["sizeLimit"]
    assert size["x-kubernetes-int-or-string"] is True and size["pattern"] == corev1.QUANTITY_PATTERN


@pytest.mark.parametrize("good", ["1", "500m", "4Gi", "1.5", "2e3", "+1k", ".5"])
def test_the_quantity_pattern_takes_kubernetes_grammar(good: str) -> None:
    assert list(structural.errors(good, corev1.QUANTITY_SCHEMA)) == []


@pytest.mark.parametrize("bad", ["2x", "1.5.5", "Gi", "4 Gi", "", "1Ki2"])
def test_the_quantity_pattern_refuses_what_kubernetes_refuses(bad: str) -> None:
    assert list(structural.errors(bad, corev1.QUANTITY_SCHEMA))


def test_the_checker_says_where_and_what() -> None:
    schema = corev1.schema_of("Container.env")
    found = list(structural.errors([{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "kee": "k"}}}], schema))
    assert found == ["[0].valueFrom.secretKeyRef.key: required", "[0].valueFrom.secretKeyRef.kee: unknown field"]
    assert list(structural.errors([{"name": "A", "value": 1}], schema)) == ["[0].value: must be of type string"]
    assert list(structural.errors([{"name": str(i)} for i in range(65)], schema)) == [".: at most 64 entries"]


def test_every_reason_the_operator_writes_is_camel_case() -> None:
    import re

    reasons = [v for k, v in vars(Reason).items() if k.isupper()] + [r.value for r in WorkerReason]
    assert reasons
    for reason in reasons:
        assert re.fullmatch(REASON_PATTERN, reason) and reason[0].isupper(), reason
