"""The pieces every runtime pod is made of, whichever object runs it: the serving Deployment's pods
and the probe and calibration Jobs' pods.

Image and pull policy, the restricted security contexts, the flags that say what loads (and so
join the probe hash), the model's env, volumes and mounts. Pure.

Neighbours: ``render`` (the Deployment), ``jobs`` (the Jobs that answer through their
termination message), ``identity`` (labels and names).
"""

from __future__ import annotations

from typing import Any, Final

from mmprep_operator import api
from mmprep_operator.api.policy import OperatorPolicy

TERMINATION_LOG: Final = "/dev/termination-log"  # Kubernetes' default terminationMessagePath
CONTAINER_NAME: Final = "runtime"
CACHE_MOUNT: Final = "/var/cache/mmprep/huggingface"
TMP_VOLUME: Final = "mmprep-tmp"
# A fixed non-root uid: runAsNonRoot cannot verify a named USER, and the runtime image's user is 65532.
RUN_AS: Final = 65532


def image_of(spec: api.MultimodalPreprocessorSpec, policy: OperatorPolicy) -> str:
    return spec.image or policy.default_image


def pull_policy_of(spec: api.MultimodalPreprocessorSpec, policy: OperatorPolicy) -> str | None:
    return spec.image_pull_policy or policy.image_pull_policy


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    # restricted Pod Security Standard, plus a read-only root: caches go to mounted volumes.
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def model_args(spec: api.MultimodalPreprocessorSpec) -> list[str]:
    """``--model ...`` and the flags that change what loads; shared by serve and probe (and so
    part of the probe hash). The device is not among them: it is the decision, passed as env."""
    model = spec.model
    args = ["--model", model.path if model.path is not None else str(model.id)]
    if model.revision:
        args += ["--revision", model.revision]
    if model.trust_remote_code:
        args.append("--trust-remote-code")
    if spec.backend.value != "auto":
        # The backend changes which image processor loads, so the probe must see it too.
        args += ["--backend", spec.backend.value]
    return args


def model_env(spec: api.MultimodalPreprocessorSpec) -> list[dict[str, Any]]:
    """User env first, then the cache location: later entries win in Kubernetes."""
    env = [e.wire() for e in spec.env]
    if spec.model.cache_volume:
        env.append({"name": "HF_HOME", "value": CACHE_MOUNT})
    return env


def model_volumes(spec: api.MultimodalPreprocessorSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container mounts): the user's, the cache mount, and a writable /tmp."""
    volumes = [v.wire() for v in spec.volumes] + [{"name": TMP_VOLUME, "emptyDir": {}}]
    mounts = [m.wire() for m in spec.volume_mounts] + [{"name": TMP_VOLUME, "mountPath": "/tmp"}]
    if spec.model.cache_volume:
        mounts.append({"name": spec.model.cache_volume, "mountPath": CACHE_MOUNT})
    return volumes, mounts
