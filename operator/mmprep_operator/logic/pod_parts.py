"""The pieces every runtime pod is made of, whichever object runs it: the serving Deployment's pods
and the probe and calibration Jobs' pods.

Image and pull policy, the restricted security contexts with the resource's additions, the flags
that say what loads (and so join the probe hash), the model's env, volumes and mounts, the pod's
labels, annotations, pull secrets and service account. Pure.

Neighbours: ``render`` (the Deployment), ``jobs`` (the Jobs that answer through their
termination message), ``identity`` (labels and names).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
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
    """The resource's image, else the policy's: its vLLM flavor for `api: vllm-render` or a
    `spec.engine` where it names one (the render tier must run the engine's vLLM version, and the
    OpenAI front's derender is vLLM's code), its default image otherwise."""
    if spec.image:
        return spec.image
    if (spec.api == "vllm-render" or spec.engine is not None) and policy.vllm_render_image:
        return policy.vllm_render_image
    return policy.default_image


def pull_policy_of(spec: api.MultimodalPreprocessorSpec, policy: OperatorPolicy) -> str | None:
    return spec.image_pull_policy or policy.image_pull_policy


def pod_security_context(spec: api.MultimodalPreprocessorSpec) -> dict[str, Any]:
    """The restricted baseline with the resource's additions (``api.security`` says which).

    A resource that sets ``podSecurityContext`` (even ``{}``) owns the user, group and fsGroup ids:
    a platform that assigns them (OpenShift's restricted SCC) refuses pods that name their own.
    """
    own = spec.pod_security_context
    ids = {"runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS} if own is None else {}
    enforced = {"runAsNonRoot": True}
    # The enforced key first and again last: it keeps its place and its value.
    return {**enforced, **ids, "seccompProfile": {"type": "RuntimeDefault"}, **(own or {}), **enforced}


def container_security_context(spec: api.MultimodalPreprocessorSpec) -> dict[str, Any]:
    # restricted Pod Security Standard, plus a read-only root: caches go to mounted volumes. The
    # baseline is written last, so no addition weakens it (the CRD refuses those that try).
    own = dict(spec.security_context or {})
    capabilities = {**(own.pop("capabilities", None) or {}), "drop": ["ALL"]}
    own.pop("privileged", None)
    enforced = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": capabilities,
    }
    return {**enforced, "seccompProfile": {"type": "RuntimeDefault"}, **own, **enforced}


def pod_metadata(spec: api.MultimodalPreprocessorSpec, labels: Mapping[str, str]) -> dict[str, Any]:
    """A pod template's metadata: the resource's pod labels and annotations, the operator's labels
    last (the CRD refuses pod labels that would replace them; this order makes sure)."""
    meta: dict[str, Any] = {"labels": {**spec.pod_labels, **labels}}
    if spec.pod_annotations:
        meta["annotations"] = dict(spec.pod_annotations)
    return meta


def pod_identity(spec: api.MultimodalPreprocessorSpec) -> dict[str, Any]:
    """The pod spec fields every runtime pod has: its security context, service account (whose
    token it does not mount: the runtime never calls the API) and image pull secrets."""
    out: dict[str, Any] = {"automountServiceAccountToken": False, "securityContext": pod_security_context(spec)}
    if spec.service_account_name:
        out["serviceAccountName"] = spec.service_account_name
    if spec.image_pull_secrets:
        out["imagePullSecrets"] = [dict(s) for s in spec.image_pull_secrets]
    return out


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


def vllm_args_flag(vllm_args: Sequence[str]) -> str:
    """``spec.serving.vllmArgs`` as the runtime's ``--vllm-args`` (serve's and calibrate's): one
    argument, split back into words by the runtime as a shell would (shlex); joined to its flag,
    as a value that starts with "--" would otherwise read as a flag of its own."""
    return f"--vllm-args={shlex.join(vllm_args)}"


def model_env(spec: api.MultimodalPreprocessorSpec) -> list[dict[str, Any]]:
    """User env first, then the cache location: later entries win in Kubernetes."""
    env = [dict(e) for e in spec.env]
    if spec.model.cache_volume:
        env.append({"name": "HF_HOME", "value": CACHE_MOUNT})
    return env


def env_from(spec: api.MultimodalPreprocessorSpec) -> list[dict[str, Any]]:
    return [dict(e) for e in spec.env_from]


def model_volumes(spec: api.MultimodalPreprocessorSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container mounts): the user's, the cache mount, and a writable /tmp."""
    volumes = [dict(v) for v in spec.volumes] + [{"name": TMP_VOLUME, "emptyDir": {}}]
    mounts = [dict(m) for m in spec.volume_mounts] + [{"name": TMP_VOLUME, "mountPath": "/tmp"}]
    if spec.model.cache_volume:
        mounts.append({"name": spec.model.cache_volume, "mountPath": CACHE_MOUNT})
    return volumes, mounts
