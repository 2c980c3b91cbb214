"""The committed CRD reference (docs/crd-reference.md) is generated from the API models, as crds/ is."""

from __future__ import annotations

import pathlib

import pytest

from mmprep_operator.api import crd, reference
from mmprep_operator.cli import main

REPO = pathlib.Path(__file__).resolve().parents[3]
COMMITTED = REPO / "docs" / "crd-reference.md"


def test_committed_reference_matches_the_models() -> None:
    assert COMMITTED.read_text() == reference.crd_reference_markdown(), "docs/crd-reference.md drifted: run `make crd`"


def test_crd_reference_command_prints_the_committed_reference(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd-reference"]) == 0
    assert capsys.readouterr().out == COMMITTED.read_text()


def test_every_spec_and_status_field_of_the_crd_has_a_row() -> None:
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    text = COMMITTED.read_text()
    for part in ("spec", "status"):
        for path, _node, _required in reference._fields(schema["properties"][part], part):
            assert f"| `{path}` |" in text, f"{path} has no row"
    assert "| `spec.model.path` |" in text and "| `status.pools[].calibration.curve[].reqPerS` |" in text


def test_a_row_says_type_default_validation_and_description() -> None:
    row = next(line for line in COMMITTED.read_text().splitlines() if line.startswith("| `spec.replicas` |"))
    assert row.split(" | ")[1:4] == ["integer", "`1`", ">= 0; <= 1000"]
    assert "Total runtime pods" in row


def test_cross_field_rules_and_printer_columns_are_listed() -> None:
    text = COMMITTED.read_text()
    assert "set exactly one of model.path and model.id" in text
    assert "model.cacheVolume must name a volume in spec.volumes" in text
    for column in crd.PRINTER_COLUMNS:
        assert f"| {column['name'].upper()} |" in text
