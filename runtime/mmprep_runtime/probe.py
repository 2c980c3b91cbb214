"""``mmprep-runtime probe``: what is this processor, can it be cloned, which path would it take.

The operator runs this as a Job and parses the JSON from the pod's termination message, so the
answer is one JSON object under 4 KiB (Kubernetes truncates termination messages at 4096 bytes),
with these keys at least: ``cloneable``, ``error``, ``processor_class``, ``image_processor_class``,
``fast_image_processor``, ``declared_workers``, ``clone_seconds``, ``path_if_gpu``, ``versions``.

Exit status: 0 when it could answer (cloneable or not); 1 when the processor cannot be loaded
(the JSON then has ``error`` set and a message goes to stderr); 2 on usage errors.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from typing import Any, Final

from mmprep_runtime import executor, loading, versions
from mmprep_runtime.settings import SettingsError, model_settings_from_args

MAX_BYTES: Final = 4096
_MAX_ERROR_CHARS: Final = 1500
EXIT_LOAD_FAILED: Final = 1
EXIT_USAGE: Final = 2


def _short(text: str | None) -> str | None:
    if text is None or len(text) <= _MAX_ERROR_CHARS:
        return text
    return text[: _MAX_ERROR_CHARS - 3] + "..."


def probe(settings: loading.ModelSettings) -> dict[str, Any]:
    """The probe's answer. Raises ``ModelLoadError`` when the processor cannot be loaded."""
    processor, facts = loading.load_processor(settings)
    clone = executor.probe_clone(lambda: processor)
    path_if_gpu = facts.path(gpu_available=True, device=settings.device)
    return {
        "model": settings.model,
        "cloneable": clone.cloneable,
        "error": _short(clone.error),
        **facts.reported(),
        "clone_seconds": round(clone.seconds, 6),
        "path_if_gpu": path_if_gpu.value,
        "versions": versions.versions(),
    }


def failure(model: str, message: str) -> dict[str, Any]:
    return {
        "model": model,
        "cloneable": False,
        "error": _short(message),
        "processor_class": None,
        "image_processor_class": None,
        "fast_image_processor": False,
        "declared_workers": None,
        "clone_seconds": None,
        "path_if_gpu": None,
        "versions": versions.versions(),
    }


def render(answer: dict[str, Any]) -> str:
    text = json.dumps(answer, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > MAX_BYTES:  # only a pathological model name could do this
        error = answer.get("error")
        short_error = None if error is None else str(error)[:500]
        answer = {**answer, "model": str(answer.get("model"))[:200], "error": short_error}
        text = json.dumps(answer, separators=(",", ":"), sort_keys=True)
    return text


def main(args: argparse.Namespace) -> int:
    try:
        settings = model_settings_from_args(args, os.environ)
    except SettingsError as exc:
        print(f"mmprep-runtime probe: {exc}", file=sys.stderr)
        return EXIT_USAGE
    code = 0
    try:
        answer = probe(settings)
    except loading.ModelLoadError as exc:
        print(f"mmprep-runtime probe: {exc}", file=sys.stderr)
        answer = failure(settings.model, str(exc))
        code = EXIT_LOAD_FAILED
    text = render(answer)
    print(text)
    if args.termination_log:
        try:
            pathlib.Path(args.termination_log).write_text(text)
        except OSError as exc:
            print(f"mmprep-runtime probe: cannot write {args.termination_log}: {exc}", file=sys.stderr)
            return code or EXIT_LOAD_FAILED
    return code
