"""The committed CRD is generated from the pydantic models, and is a valid structural schema."""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from mmprep_operator.api import crd
from mmprep_operator.cli import main

REPO = pathlib.Path(__file__).resolve().parents[3]
COMMITTED = REPO / "crds" / "multimodalpreprocessors.mmprep.dev.yaml"
#: Both committed copies, written by one command (`make crd`): crds/ and the chart's.
COPIES = [COMMITTED, REPO / "charts" / "mmprep" / "crds" / COMMITTED.name]


@pytest.mark.parametrize("committed", COPIES, ids=lambda p: str(p.relative_to(REPO)))
def test_committed_crd_matches_the_models(committed: pathlib.Path) -> None:
    assert committed.read_text() == crd.crd_yaml(), f"{committed.relative_to(REPO)} drifted from the models: run `make crd`"


def test_the_chart_carries_no_other_crd() -> None:
    assert sorted(p.name for p in (REPO / "charts" / "mmprep" / "crds").iterdir()) == [COMMITTED.name]


def test_crd_command_prints_the_committed_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd"]) == 0
    assert capsys.readouterr().out == COMMITTED.read_text()


def _walk(node: object, path: str = ""):  # yields (path, dict) for every schema node
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


def test_schema_is_structural() -> None:
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        for forbidden in ("$ref", "anyOf", "allOf", "oneOf", "title", "$defs"):
            assert forbidden not in node, f"{forbidden} at {path}"
        if "default" in node:
            assert node["default"] is not None, f"null default at {path}"
    # No YAML anchors: readers and some tools choke on them.
    assert "&id" not in COMMITTED.read_text()


def test_the_crd_fits_a_client_side_apply() -> None:
    # kubectl's client-side apply stores the whole object in an annotation, and all of an object's
    # annotations together may hold 256 KiB; the docs' `kubectl apply -f crds/` relies on it.
    as_json = json.dumps(crd.build_crd(), separators=(",", ":"))
    assert len(as_json) < 200 * 1024, len(as_json)


def test_names_subresources_and_columns_follow_the_contract() -> None:
    doc = yaml.safe_load(COMMITTED.read_text())
    assert doc["metadata"]["name"] == "multimodalpreprocessors.mmprep.dev"
    names = doc["spec"]["names"]
    assert (names["kind"], names["shortNames"], names["categories"]) == ("MultimodalPreprocessor", ["mmp"], ["mmprep"])
    version = doc["spec"]["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "status" in version["subresources"]
    assert [c["name"] for c in version["additionalPrinterColumns"]][:3] == ["Paths", "Workers", "Ready"]
    assert version["additionalPrinterColumns"][-1]["name"] == "Age"


def test_schema_carries_descriptions_defaults_bounds_and_cel() -> None:
    spec = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props = spec["properties"]
    assert props["model"]["properties"]["trustRemoteCode"]["default"] is False
    assert props["backend"]["enum"] == ["auto", "pil", "torchvision"] and props["backend"]["default"] == "auto"
    assert props["workers"]["properties"]["processor"]["minimum"] == 1
    assert props["workers"]["properties"]["processor"]["maximum"] == 64
    quantity = props["resources"]["properties"]["limits"]["additionalProperties"]
    assert quantity["x-kubernetes-int-or-string"] is True and quantity["pattern"].startswith("^(\\+|-)?")
    # Upstream-typed pod fields: closed schemas (a typo is an unknown field), upstream's list keys.
    assert "x-kubernetes-preserve-unknown-fields" not in props["affinity"]
    assert "nodeAffinity" in props["affinity"]["properties"]
    for field, key in (("volumes", "name"), ("env", "name"), ("volumeMounts", "mountPath"), ("imagePullSecrets", "name")):
        assert props[field]["x-kubernetes-list-type"] == "map" and props[field]["x-kubernetes-list-map-keys"] == [key]
    status = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status["properties"]["pools"]["x-kubernetes-list-map-keys"] == ["name"]
    rules = json.dumps(spec["x-kubernetes-validations"]) + json.dumps(props["model"]["x-kubernetes-validations"])
    assert "has(self.path) != has(self.id)" in rules
    assert "self.device == 'cuda'" in rules
    missing = [
        p
        for p, node in _walk(spec)
        if p.count(".properties.")
        and isinstance(node, dict)
        and "type" in node
        and "description" not in node
        # (a ".properties" node is the map of fields itself, which may hold one named "type")
        and not p.endswith(("items", "additionalProperties", ".properties"))
    ]
    assert not missing, f"fields without description (kubectl explain shows nothing): {missing}"
