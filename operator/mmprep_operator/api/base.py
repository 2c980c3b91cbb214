"""What every part of the MultimodalPreprocessor API shares: its names, the model base class,
the rules the API server checks with CEL, and how a validation error is said.

A rule the API server enforces with CEL (``x-kubernetes-validations``) is checked again by a
pydantic validator, so ``mmprep-operator render`` refuses what the API server would. Each rule is
one ``CelRule``: the CEL expression and the message both checks give, written once.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

from mmprep_runtime.sizing import MAX_WORKERS, MIN_WORKERS

GROUP: Final = "mmprep.dev"
VERSION: Final = "v1alpha1"
KIND: Final = "MultimodalPreprocessor"
PLURAL: Final = "multimodalpreprocessors"
SINGULAR: Final = "multimodalpreprocessor"
SHORT_NAMES: Final = ("mmp",)
CATEGORIES: Final = ("mmprep",)
API_VERSION: Final = f"{GROUP}/{VERSION}"

#: Resource names that give a pod a GPU. ``nvidia.com/mig-<profile>`` is how GFD's "mixed" MIG
#: strategy exposes slices; the others are the vendors' whole-device resources.
GPU_RESOURCE_SUFFIX: Final = "/gpu"
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"


def is_gpu_resource(name: str) -> bool:
    return name.endswith(GPU_RESOURCE_SUFFIX) or name.startswith(MIG_RESOURCE_PREFIX)


# CEL twin of is_gpu_resource, over the keys of a resources map.
CEL_HAS_GPU: Final = "{m}.exists(k, k.endsWith('/gpu') || k.startsWith('nvidia.com/mig-'))"

WorkerCount = Annotated[int, Field(ge=MIN_WORKERS, le=MAX_WORKERS)]
#: A count or a string (a percentage): rendered as x-kubernetes-int-or-string. Quantities are
#: ``corev1.Quantity``, which also checks the string.
IntOrString = int | str
LabelMap = Annotated[dict[str, str], Field(max_length=64)]


class ApiModel(BaseModel):
    """Every API model: camelCase on the wire, unknown fields ignored."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        # The API server prunes unknown fields; here, ignoring them keeps older operators working
        # against resources written for newer schemas.
        extra="ignore",
        use_enum_values=False,
    )

    def wire(self) -> dict[str, Any]:
        """The object as it appears in the Kubernetes API (camelCase, no nulls)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


@dataclasses.dataclass(frozen=True)
class CelRule:
    """A validation rule: the CEL the API server runs, and the message it and the model's own
    validator both give when it fails."""

    rule: str
    message: str


def cel_rules(*rules: CelRule) -> ConfigDict:
    """A model's config that puts ``rules`` into its schema, in order (``x-kubernetes-validations``)."""
    return ConfigDict(json_schema_extra=field_cel_rules(*rules))


def field_cel_rules(*rules: CelRule) -> JsonDict:
    """``rules`` on one field (``Field(json_schema_extra=...)``), for a type that is not a model of ours."""
    return {"x-kubernetes-validations": [{"rule": r.rule, "message": r.message} for r in rules]}


def describe_validation_error(error: ValidationError) -> str:
    """A spec's validation errors as one line, each at its path under ``spec``; at most five.

    Next to the models because the paths it prints are theirs; the reconciler's InvalidSpec
    condition and ``mmprep-operator render`` both say it, so they say it alike.
    """
    parts = []
    for e in error.errors()[:5]:
        where = ".".join(str(p) for p in e["loc"]) or "spec"
        parts.append(f"spec.{where}: {e['msg']}" if where != "spec" else e["msg"])
    return "; ".join(parts)
