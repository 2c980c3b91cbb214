"""How a model declares the processor worker count it measured best.

Two sources, first match wins:
1. a sidecar file ``mmprep.json`` in the model folder: ``{"processor_workers": N}``. It travels
   with the model, so whoever measured the model (e.g. with ``mmprep-runtime bench``) can ship the
   figure without touching mmprep;
2. a small built-in table keyed by the processor class, for models whose number is known from
   published measurements (SGLang declares 2 for the Qwen-VL family and PaddleOCR-VL).

The declared number is only an input to ``mmprep_runtime.policy.decide_workers``: the GPU path caps
it, an explicit count beats it. Import-light on purpose (the probe reports it; no torch needed).
"""

from __future__ import annotations

import json
import pathlib
from typing import Final, Mapping

from mmprep_runtime import policy

SIDECAR_NAME: Final = "mmprep.json"
SIDECAR_KEY: Final = "processor_workers"

BUILTIN_DECLARED_WORKERS: Final[Mapping[str, int]] = {
    "Qwen2VLProcessor": 2,
    "Qwen2_5_VLProcessor": 2,
    "PaddleOCRVLProcessor": 2,
}


class DeclarationError(ValueError):
    """The sidecar exists but does not say a valid worker count."""


def read_sidecar(model_dir: pathlib.Path | str) -> int | None:
    path = pathlib.Path(model_dir) / SIDECAR_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DeclarationError(f"{SIDECAR_NAME} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise DeclarationError(f"{SIDECAR_NAME} must be a JSON object, got {type(data).__name__}")
    value = data.get(SIDECAR_KEY)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise DeclarationError(f"{SIDECAR_NAME}: {SIDECAR_KEY} must be an integer, got {value!r}")
    if not policy.MIN_WORKERS <= value <= policy.MAX_WORKERS:
        raise DeclarationError(
            f"{SIDECAR_NAME}: {SIDECAR_KEY} must be between {policy.MIN_WORKERS} and "
            f"{policy.MAX_WORKERS}, got {value}"
        )
    return value


def write_sidecar(model_dir: pathlib.Path | str, workers: int) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise DeclarationError(f"declared workers must be an integer, got {workers!r}")
    if not policy.MIN_WORKERS <= workers <= policy.MAX_WORKERS:
        raise DeclarationError(
            f"declared workers must be between {policy.MIN_WORKERS} and {policy.MAX_WORKERS}, got {workers}"
        )
    (pathlib.Path(model_dir) / SIDECAR_NAME).write_text(json.dumps({SIDECAR_KEY: workers}) + "\n")


def declared_workers(model_dir: pathlib.Path | str | None, processor_class: str) -> int | None:
    """The sidecar's number when there is one, else the built-in table's, else None."""
    if model_dir is not None:
        from_sidecar = read_sidecar(model_dir)
        if from_sidecar is not None:
            return from_sidecar
    return BUILTIN_DECLARED_WORKERS.get(processor_class)
