"""The typed pod fields' cases, shared by the unit tier (the models, ``render``) and the integration
tier (the real API server, the operator): a resource that uses every one of them, and the ways
each one is rejected, with what the API server says and what the models say.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: Every typed pod field and the serving section, set; what the pods must get is in the tests.
FULL_SPEC_FIELDS: dict[str, Any] = {
    "volumes": [
        {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}},
        {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}},
    ],
    "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
    "env": [
        {"name": "LOG_FORMAT", "value": "json"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ],
    "envFrom": [{"configMapRef": {"name": "runtime-env"}}, {"secretRef": {"name": "hub-token", "optional": True}}],
    "imagePullSecrets": [{"name": "registry"}],
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 10,
                    "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"a": "b"}}},
                }
            ]
        }
    },
    "resources": {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
    "podLabels": {"team": "vision", "app.kubernetes.io/part-of": "search"},
    "podAnnotations": {"example.com/owner": "vision-team"},
    "podSecurityContext": {"supplementalGroups": [1000]},
    "securityContext": {"seLinuxOptions": {"level": "s0:c123,c456"}},
    "serving": {
        "servedModelName": "qwen",
        "maxModelLen": 8192,
        "requestDeadlineSeconds": 12.5,
        "queueSize": 8,
        "maxImagesPerRequest": 4,
        "maxBodyBytes": 8388608,
        "fetchAllowedNetworks": ["10.0.0.0/8", "fd00::/8"],
    },
}


@dataclasses.dataclass(frozen=True)
class Rejection:
    """A spec change the API server refuses at admission, and the models refuse too."""

    id: str
    fields: dict[str, Any]
    #: What the API server's answer (kubectl's stderr) says.
    server_says: str
    #: What the models' ValidationError says.
    models_say: str


REJECTIONS = [
    Rejection(
        "volume-field-typo",
        {"volumes": [{"name": "m", "persistentVolumeClam": {"claimName": "x"}}]},
        'unknown field "spec.volumes[0].persistentVolumeClam"',
        "[0].persistentVolumeClam: unknown field",
    ),
    Rejection(
        "volume-mount-field-typo",
        {"volumeMounts": [{"name": "m", "mountpath": "/m"}]},
        'unknown field "spec.volumeMounts[0].mountpath"',
        "[0].mountpath: unknown field",
    ),
    Rejection(
        "two-volumes-mounted-at-one-path",
        {"volumeMounts": [{"name": "m", "mountPath": "/m"}, {"name": "n", "mountPath": "/m"}]},
        "spec.volumeMounts[1]: Duplicate value",
        "[1]: duplicate entry with mountPath='/m'",
    ),
    Rejection(
        "env-field-typo",
        {"env": [{"name": "A", "valueFrm": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
        'unknown field "spec.env[0].valueFrm"',
        "[0].valueFrm: unknown field",
    ),
    Rejection(
        "bad-quantity",
        {"resources": {"limits": {"cpu": "2x"}}},
        "spec.resources.limits.cpu in body should match",
        "'2x' is not a quantity",
    ),
    Rejection(
        "bad-quantity-in-a-volume",
        {"volumes": [{"name": "s", "emptyDir": {"sizeLimit": "lots"}}]},
        "spec.volumes[0].emptyDir.sizeLimit in body should match",
        "[0].emptyDir.sizeLimit: 'lots' does not match",
    ),
    Rejection(
        "toleration-bad-operator",
        {"tolerations": [{"key": "k", "operator": "Maybe"}]},
        'spec.tolerations[0].operator: Unsupported value: "Maybe"',
        "[0].operator: must be one of Equal, Exists",
    ),
    Rejection(
        "seccomp-profile-typo",
        {"podSecurityContext": {"seccompProfile": {"type": "RuntimeDefualt"}}},
        'spec.podSecurityContext.seccompProfile.type: Unsupported value: "RuntimeDefualt"',
        ".seccompProfile.type: must be one of Localhost, RuntimeDefault, Unconfined",
    ),
    Rejection(
        "toleration-wrong-type",
        {"tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": "soon"}]},
        "spec.tolerations[0].tolerationSeconds in body must be of type integer",
        "[0].tolerationSeconds: must be of type integer",
    ),
    Rejection(
        "duplicate-env-name",
        {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
        "spec.env[1]: Duplicate value",
        "[1]: duplicate entry with name='A'",
    ),
    Rejection(
        "env-without-name",
        {"env": [{"value": "1"}]},
        "spec.env[0].name: Required value",
        "[0].name: required",
    ),
    Rejection(
        "envfrom-typo",
        {"envFrom": [{"secretRefs": {"name": "s"}}]},
        'unknown field "spec.envFrom[0].secretRefs"',
        "[0].secretRefs: unknown field",
    ),
    Rejection(
        "affinity-typo",
        {"affinity": {"nodeAfinity": {}}},
        'unknown field "spec.affinity.nodeAfinity"',
        ".nodeAfinity: unknown field",
    ),
    Rejection(
        "pull-secret-typo",
        {"imagePullSecrets": [{"nmae": "registry"}]},
        'unknown field "spec.imagePullSecrets[0].nmae"',
        "[0].nmae: unknown field",
    ),
    Rejection(
        "pod-label-replaces-the-operators",
        {"podLabels": {"mmprep.dev/pool": "mine"}},
        "podLabels may not set the operator's own labels",
        "podLabels may not set the operator's own labels",
    ),
    Rejection(
        "pod-annotation-in-the-operators-prefix",
        {"podAnnotations": {"mmprep.dev/decision": "x"}},
        "podAnnotations may not set the operator's own mmprep.dev/* annotations",
        "podAnnotations may not set the operator's own mmprep.dev/* annotations",
    ),
    Rejection(
        "pod-runs-as-root",
        {"podSecurityContext": {"runAsUser": 0}},
        "podSecurityContext.runAsUser cannot be 0 (root)",
        "podSecurityContext.runAsUser cannot be 0 (root)",
    ),
    Rejection(
        "container-escalates",
        {"securityContext": {"allowPrivilegeEscalation": True}},
        "securityContext.allowPrivilegeEscalation cannot be true",
        "securityContext.allowPrivilegeEscalation cannot be true",
    ),
    Rejection(
        "security-context-typo",
        {"securityContext": {"readOnlyRootFilesytem": True}},
        'unknown field "spec.securityContext.readOnlyRootFilesytem"',
        ".readOnlyRootFilesytem: unknown field",
    ),
    Rejection(
        "serving-bad-network",
        {"serving": {"fetchAllowedNetworks": ["10.0.0.0/33"]}},
        "serving.fetchAllowedNetworks must hold IP networks",
        "serving.fetchAllowedNetworks must hold IP networks",
    ),
    Rejection(
        "serving-typo",
        {"serving": {"maxImages": 3}},
        'unknown field "spec.serving.maxImages"',
        # The models ignore unknown fields of their own (an older operator reading a newer
        # resource); the API server's strict validation is what catches this one.
        "",
    ),
]
