"""Adapt example resources to the local cluster, for `make demo`; prints YAML for `kubectl apply`.

The examples are written for a real cluster: the processor folders come from a PersistentVolume
mounted at /models, and the probe runs wherever the runtime would. Locally there is no storage
provisioner and only the test agent's node runs pods for real, so each resource gets:
- its ``models`` volume as a hostPath to the local folder holding the demo's model folders (the
  agent maps the mount path onto it, as a kubelet would bind-mount it);
- its probe sent to the agent's node (``spec.probe`` placement), so the real probe runs.
Nothing else changes: pools, decisions and Deployments are what the examples would get anywhere.

Usage: python localize.py --models DIR FILE.yaml...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

AGENT_LABEL = "mmprep.dev/test-agent"


def localize(doc: dict[str, Any], models: Path) -> dict[str, Any]:
    spec = doc.setdefault("spec", {})
    for volume in spec.get("volumes") or []:
        if volume.get("name") == "models":
            volume.pop("persistentVolumeClaim", None)
            volume["hostPath"] = {"path": str(models), "type": "Directory"}
    spec["probe"] = {
        **(spec.get("probe") or {}),
        "nodeSelector": {AGENT_LABEL: "true"},
        "tolerations": [{"key": AGENT_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
    }
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True, type=Path, help="local folder holding the model folders")
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args()
    docs = []
    for file in args.files:
        for doc in yaml.safe_load_all(file.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "MultimodalPreprocessor":
                docs.append(localize(doc, args.models.resolve()))
    yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
