"""Compare two render answers with vLLM's own models and decoder; run by vLLM's Python.

Usage: python vllm_check.py MANIFEST.json
The manifest maps a case name to ``[ours.json, theirs.json]``: the answers of
``/v1/chat/completions/render`` (one object) or ``/v1/completions/render`` (a list). Prints one
JSON object mapping each case to ``{"ok": bool, "problems": [...], "summary": {...}}`` (one run:
importing vLLM takes seconds). Nothing here imports mmprep: the judge is vLLM.

Checks, for each answer pair: vLLM's ``GenerateRequest`` validates ours; token ids, placeholders,
mm_hashes, sampling params (as vLLM parsed them), model, stream, priority and parse_context are
equal; every kwargs item and metadata item, decoded with vLLM's ``decode_mm_kwargs_item``, has
the same keys, the same field kinds and arguments, and equal tensors (dtype, shape, values).
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _plain_slices(value: Any) -> Any:
    if isinstance(value, slice):
        return (value.start, value.stop, value.step)
    return [_plain_slices(v) for v in value]


def _field_signature(field: Any) -> tuple[Any, ...]:
    import dataclasses

    values = []
    for f in dataclasses.fields(field):
        value = getattr(field, f.name)
        if f.name == "slices":
            value = _plain_slices(value)
        values.append((f.name, value))
    return (type(field).__name__, tuple(values))


def _compare_items(label: str, ours: Any, theirs: Any, problems: list[str]) -> None:
    import torch

    if set(ours) != set(theirs):
        problems.append(f"{label}: keys {sorted(ours)} != {sorted(theirs)}")
        return
    for key in theirs:
        a, b = ours[key], theirs[key]
        if _field_signature(a.field) != _field_signature(b.field):
            problems.append(f"{label}.{key}: field {_field_signature(a.field)} != {_field_signature(b.field)}")
        if not isinstance(a.data, torch.Tensor) or not isinstance(b.data, torch.Tensor):
            if a.data != b.data:
                problems.append(f"{label}.{key}: data {a.data!r} != {b.data!r}")
            continue
        if a.data.dtype != b.data.dtype or a.data.shape != b.data.shape:
            problems.append(f"{label}.{key}: {a.data.dtype}{list(a.data.shape)} != {b.data.dtype}{list(b.data.shape)}")
        elif not torch.equal(a.data, b.data):
            diff = (a.data.float() - b.data.float()).abs().max().item()
            problems.append(f"{label}.{key}: values differ (max abs diff {diff})")


def compare(ours_raw: Any, theirs_raw: Any) -> dict[str, Any]:
    from vllm.entrypoints.scale_out.token_in_token_out.mm_serde import decode_mm_kwargs_item
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest

    problems: list[str] = []
    ours_list = ours_raw if isinstance(ours_raw, list) else [ours_raw]
    theirs_list = theirs_raw if isinstance(theirs_raw, list) else [theirs_raw]
    if isinstance(ours_raw, list) != isinstance(theirs_raw, list) or len(ours_list) != len(theirs_list):
        return {"ok": False, "problems": ["answers differ in shape (object vs list, or length)"], "summary": {}}
    summary: dict[str, Any] = {}
    for index, (ours_json, theirs_json) in enumerate(zip(ours_list, theirs_list, strict=True)):
        try:
            ours = GenerateRequest.model_validate(ours_json)
        except Exception as exc:  # noqa: BLE001 - the finding itself
            problems.append(f"[{index}] vLLM's GenerateRequest rejects our answer: {exc}")
            continue
        theirs = GenerateRequest.model_validate(theirs_json)
        for name in ("token_ids", "model", "stream", "priority"):
            if getattr(ours, name) != getattr(theirs, name):
                problems.append(f"[{index}] {name}: ours {getattr(ours, name)!r:.200} != vLLM's {getattr(theirs, name)!r:.200}")
        ours_sp = json.loads(json.dumps(ours_json.get("sampling_params")))
        theirs_sp = json.loads(json.dumps(theirs_json.get("sampling_params")))
        if ours.sampling_params != theirs.sampling_params or ours_sp != theirs_sp:
            problems.append(f"[{index}] sampling_params: ours {ours_sp} != vLLM's {theirs_sp}")
        ours_pc = ours.parse_context.model_dump() if ours.parse_context else None
        theirs_pc = theirs.parse_context.model_dump() if theirs.parse_context else None
        if ours_pc != theirs_pc:
            problems.append(f"[{index}] parse_context: ours {ours_pc} != vLLM's {theirs_pc}")
        if (ours.features is None) != (theirs.features is None):
            problems.append(
                f"[{index}] features: ours {'absent' if ours.features is None else 'present'}, "
                f"vLLM's {'absent' if theirs.features is None else 'present'}"
            )
            continue
        if theirs.features is None:
            summary[str(index)] = {"tokens": len(ours.token_ids), "images": 0}
            continue
        a, b = ours.features, theirs.features
        if a.mm_hashes != b.mm_hashes:
            problems.append(f"[{index}] mm_hashes: ours {a.mm_hashes} != vLLM's {b.mm_hashes}")
        if a.mm_placeholders != b.mm_placeholders:
            problems.append(f"[{index}] mm_placeholders: ours {a.mm_placeholders} != vLLM's {b.mm_placeholders}")
        for kind in ("kwargs_data", "mm_metadata"):
            ours_kind, theirs_kind = getattr(a, kind) or {}, getattr(b, kind) or {}
            if set(ours_kind) != set(theirs_kind):
                problems.append(f"[{index}] {kind}: modalities {sorted(ours_kind)} != {sorted(theirs_kind)}")
                continue
            for modality, theirs_items in theirs_kind.items():
                ours_items = ours_kind[modality]
                if len(ours_items) != len(theirs_items):
                    problems.append(f"[{index}] {kind}.{modality}: {len(ours_items)} items != {len(theirs_items)}")
                    continue
                for item, (x, y) in enumerate(zip(ours_items, theirs_items, strict=True)):
                    label = f"[{index}] {kind}.{modality}[{item}]"
                    if (x is None) != (y is None):
                        problems.append(
                            f"{label}: ours {'None' if x is None else 'set'}, vLLM's {'None' if y is None else 'set'}"
                        )
                    elif x is not None:
                        _compare_items(label, decode_mm_kwargs_item(x), decode_mm_kwargs_item(y), problems)
        # The pixel hand-off, where the first image item has pixel values under that name.
        images = (b.kwargs_data or {}).get("image") or []
        first = decode_mm_kwargs_item(images[0]) if images and images[0] is not None else None
        pixels = first.get("pixel_values") if first is not None else None
        summary[str(index)] = {
            "tokens": len(ours.token_ids),
            "items": {modality: len(hashes) for modality, hashes in b.mm_hashes.items()},
            "images": len(b.mm_hashes.get("image", [])),
            "pixel_dtype": str(pixels.data.dtype) if pixels is not None else None,
            "bytes_ours": len(json.dumps(ours_json)),
            "bytes_vllm": len(json.dumps(theirs_json)),
        }
    return {"ok": not problems, "problems": problems, "summary": summary}


def main() -> int:
    with open(sys.argv[1]) as f:
        manifest = json.load(f)
    results = {}
    for case, (ours_path, theirs_path) in manifest.items():
        with open(ours_path) as f:
            ours = json.load(f)
        with open(theirs_path) as f:
            theirs = json.load(f)
        results[case] = compare(ours, theirs)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
