"""YAML in and out for the CLI: plain output (no anchors) and tolerant multi-document input."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml


class _PlainDumper(yaml.SafeDumper):
    """Shared sub-objects would otherwise become YAML anchors, which readers of manifests find baffling."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_PlainDumper, sort_keys=False, width=120)


def dump_all(objs: Iterable[Any]) -> str:
    return yaml.dump_all(list(objs), Dumper=_PlainDumper, sort_keys=False, width=120)


def load_objects(text: str) -> list[dict[str, Any]]:
    """Objects from YAML: several documents, a bare list, or a ``kind: List`` (kubectl -o yaml)."""
    out: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(text):
        if doc is None:
            continue
        items: list[Any]
        if isinstance(doc, list):
            items = doc
        elif isinstance(doc, dict) and "items" in doc:
            items = doc["items"] or []  # an empty `kind: List` says `items: null`
        else:
            items = [doc]
        for item in items:
            if not isinstance(item, dict):
                raise ValueError(f"expected Kubernetes objects (mappings), got {type(item).__name__}")
            out.append(item)
    return out
