"""``mmprep-runtime probe``: what is this processor, can it be cloned, which path would it take.

The operator runs this as a Job and reads the answer from the pod's termination message: one
``contract.ProbeAnswer``, as JSON under 4 KiB (Kubernetes truncates termination messages there).

Exit status: 0 when it could answer (cloneable or not); 1 when the processor cannot be loaded
(the JSON then has ``error`` set and a message goes to stderr); 2 on usage errors.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Final

from mmprep_runtime import exits, versions
from mmprep_runtime.backends import choice
from mmprep_runtime.contract import ProbeAnswer
from mmprep_runtime.engine import executor, loading
from mmprep_runtime.exits import ModelLoadError, write_termination_message
from mmprep_runtime.settings import ModelSettings, SettingsError, model_settings_from_args

_MAX_ERROR_CHARS: Final = 1500
EXIT_LOAD_FAILED: Final = exits.EXIT_LOAD_FAILED
EXIT_USAGE: Final = exits.EXIT_USAGE


def _short(text: str | None) -> str | None:
    if text is None or len(text) <= _MAX_ERROR_CHARS:
        return text
    return text[: _MAX_ERROR_CHARS - 3] + "..."


def probe(settings: ModelSettings) -> ProbeAnswer:
    """The probe's answer. Raises ``ModelLoadError`` when the processor cannot be loaded."""
    processor, facts = loading.load_processor(settings)
    clone = executor.try_clone(lambda: processor)
    path = choice.choose("auto", facts.processor_class, versions.vllm_version())
    return ProbeAnswer.model_validate(
        {
            **facts.reported(),
            "model": settings.model,
            "cloneable": clone.cloneable,
            "error": _short(clone.error),
            "clone_seconds": round(clone.seconds, 6),
            "path_if_gpu": facts.path(gpu_available=True, device=settings.device),
            "versions": _installed_versions(),
            "render_path": path.primary,
            "render_path_reason": _short(path.reason),
        }
    )


def failure(model: str, message: str) -> ProbeAnswer:
    return ProbeAnswer(model=model, cloneable=False, error=_short(message), versions=_installed_versions())


def _installed_versions() -> dict[str, str]:
    # A library missing from the image has no version to report; the status schema has no nulls.
    return {name: version for name, version in versions.versions().items() if version is not None}


def main(args: argparse.Namespace) -> int:
    try:
        settings = model_settings_from_args(args, os.environ)
    except SettingsError as exc:
        print(f"mmprep-runtime probe: {exc}", file=sys.stderr)
        return EXIT_USAGE
    code = 0
    try:
        answer = probe(settings)
    except ModelLoadError as exc:
        print(f"mmprep-runtime probe: {exc}", file=sys.stderr)
        answer = failure(settings.model, str(exc))
        code = EXIT_LOAD_FAILED
    text = answer.to_message()
    print(text)
    if not write_termination_message(args.termination_log, text):
        return code or EXIT_LOAD_FAILED
    return code
