"""What GPU a node has, from NVIDIA GPU Feature Discovery (GFD) labels.

GFD writes ``nvidia.com/gpu.product`` as the driver's device name with spaces turned into ``-``,
possibly suffixed ``-MIG-<profile>`` (MIG "single" strategy) or ``-SHARED`` (time-slicing/MPS).
Short model names are matched on whole ``-``-separated tokens, longest first, so that ``GB200``
is never read as ``B200`` and ``H200`` never as ``H20``. When the product label is missing the
family comes from ``nvidia.com/gpu.family`` or, failing that (older GFD labels Blackwell
``undefined``), from the compute capability.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Final

PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
FAMILY_LABEL: Final = "nvidia.com/gpu.family"
COMPUTE_MAJOR_LABEL: Final = "nvidia.com/gpu.compute.major"
COMPUTE_MINOR_LABEL: Final = "nvidia.com/gpu.compute.minor"
GPU_LABELS: Final = (PRODUCT_LABEL, FAMILY_LABEL, COMPUTE_MAJOR_LABEL)

# Short model -> family. Only families GFD itself reports; an unknown model keeps family None.
_MODEL_FAMILIES: Final[dict[str, str]] = {
    "GB300": "blackwell",
    "GB200": "blackwell",
    "B300": "blackwell",
    "B200": "blackwell",
    "B100": "blackwell",
    "RTX-PRO-6000": "blackwell",
    "GH200": "hopper",
    "H200": "hopper",
    "H100": "hopper",
    "H800": "hopper",
    "H20": "hopper",
    "L40S": "ada-lovelace",
    "L40": "ada-lovelace",
    "L4": "ada-lovelace",
    "A100": "ampere",
    "A800": "ampere",
    "A40": "ampere",
    "A30": "ampere",
    "A10G": "ampere",
    "A10": "ampere",
    "T4": "turing",
    "V100": "volta",
}
# Longest first so a multi-token name wins over a single token inside it.
_MODELS_BY_SPECIFICITY: Final = sorted(_MODEL_FAMILIES, key=lambda m: (-len(m.split("-")), -len(m), m))

_MIG_SUFFIX: Final = re.compile(r"-MIG-(?P<profile>[0-9]+g\.[0-9]+gb(?:[+.][a-z0-9.]+)?)$", re.IGNORECASE)
_SHARED_SUFFIX: Final = "-SHARED"


@dataclasses.dataclass(frozen=True)
class GpuIdentity:
    """The GPU facts of one node, as far as its labels tell."""

    product: str | None  # the label value exactly
    base_product: str | None  # without -MIG-<profile> / -SHARED
    model: str | None  # short model name, e.g. "H200"
    family: str | None
    compute: str | None  # "9.0"
    mig_profile: str | None
    shared: bool


def family_from_compute(major: int, minor: int) -> str | None:
    """GFD's own mapping of compute capability to family names."""
    if major >= 10:
        return "blackwell"  # 10.x data centre, 12.x workstation parts
    if major == 9:
        return "hopper"
    if (major, minor) == (8, 9):
        return "ada-lovelace"
    if major == 8:
        return "ampere"
    if (major, minor) == (7, 5):
        return "turing"
    if major == 7:
        return "volta"
    return None


def split_product(product: str) -> tuple[str, str | None, bool]:
    """Strip the MIG or SHARED suffix: (base product, MIG profile, shared)."""
    if product.upper().endswith(_SHARED_SUFFIX):
        base, mig, _ = split_product(product[: -len(_SHARED_SUFFIX)])
        return base, mig, True
    match = _MIG_SUFFIX.search(product)
    if match:
        return product[: match.start()], match.group("profile"), False
    return product, None, False


def model_of(product: str) -> str | None:
    """The short model name in a product label, matched on whole tokens, most specific first."""
    tokens = [t.upper() for t in product.split("-")]
    for model in _MODELS_BY_SPECIFICITY:
        parts = model.split("-")
        for i in range(len(tokens) - len(parts) + 1):
            if tokens[i : i + len(parts)] == parts:
                return model
    return None


def identify(labels: Mapping[str, str]) -> GpuIdentity | None:
    """The node's GPU identity, or None when no GPU label is present."""
    product = labels.get(PRODUCT_LABEL) or None
    family_label = labels.get(FAMILY_LABEL) or None
    major, minor = labels.get(COMPUTE_MAJOR_LABEL), labels.get(COMPUTE_MINOR_LABEL)
    if product is None and family_label is None and major is None:
        return None
    compute = f"{major}.{minor or 0}" if major is not None else None
    base = model = mig = None
    shared = False
    if product is not None:
        base, mig, shared = split_product(product)
        model = model_of(base)
    family = family_label if family_label not in (None, "undefined") else None
    if family is None and model is not None:
        family = _MODEL_FAMILIES[model]
    if family is None and major is not None and major.isdigit():
        family = family_from_compute(int(major), int(minor) if minor and minor.isdigit() else 0)
    return GpuIdentity(product, base, model, family, compute, mig, shared)
