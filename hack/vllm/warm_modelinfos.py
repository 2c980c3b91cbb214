"""Fill vLLM's cache of model-class inspections for every architecture the tests' folders declare.

    VLLM_CACHE_ROOT=... PYTHONPATH=runtime VENV/bin/python hack/vllm/warm_modelinfos.py

The first time vLLM serves an architecture it inspects the model's class in a fresh Python process
(importing vLLM and the model's module: 15-40 s on two cores) and caches what it found under
``$VLLM_CACHE_ROOT/modelinfos``, keyed by the module's hash. A test session on a new machine starts a
dozen servers on as many architectures, each paying that, two at a time where mmprep's render process
starts beside vLLM's server. Here one process inspects them all (the inspection is the same; the
subprocess only keeps CUDA out of the server's process, and this process serves nothing), in well
under a minute. Run by hack/vllm/venv.sh once per virtualenv.
"""

from __future__ import annotations

import json
import pathlib
import sys
import tempfile
import time

from vllm.model_executor.models import registry

from mmprep_runtime.synthetic import models


def architectures() -> list[str]:
    """The architectures of every folder ``make-model`` writes, read from the folders themselves."""
    found: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        for kind in models.Kind:
            folder = models.make_model(kind, pathlib.Path(tmp) / kind.value)
            config = folder / "config.json"
            if config.exists():
                found.update(json.loads(config.read_text()).get("architectures") or ())
    return sorted(found)


def main() -> int:
    registry._run_in_subprocess = lambda fn: fn()  # type: ignore[attr-defined]
    known = registry.ModelRegistry.models
    for architecture in architectures():
        if architecture not in known:
            print(f"{architecture}: not one of this vLLM's architectures; skipped", file=sys.stderr)
            continue
        start = time.monotonic()
        known[architecture].inspect_model_cls()
        print(f"{architecture}: inspected in {time.monotonic() - start:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
