"""Deterministic, DNS-safe names and label values for the objects the operator creates.

Kubernetes allows resource names up to 253 characters, but Service names and label values are
limited to 63, and a pod's hostname is cut from its Deployment's name. Every name here is a
DNS-1035 label (lowercase alphanumerics and '-', starting with a letter, at most 63 characters).
When something has to be cut, a hash of the full input is appended, so distinct inputs keep
distinct names and the same input always yields the same name.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

MAX_NAME: Final = 63
_HASH_LEN: Final = 8
_INVALID: Final = re.compile(r"[^a-z0-9-]+")


def short_hash(text: str, length: int = _HASH_LEN) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def slug(text: str) -> str:
    """Lowercase, non-alphanumerics to '-', no leading/trailing/double '-'."""
    out = _INVALID.sub("-", text.lower())
    return re.sub("-{2,}", "-", out).strip("-")


def dns_label(*parts: str, max_len: int = MAX_NAME) -> str:
    """Join parts into one DNS-1035 label. Returned as joined when already valid; otherwise slugged
    and suffixed with a hash of the input, so that "a.b" and "a-b" cannot collide."""
    joined = "-".join(parts)
    name = slug(joined)
    if name == joined and len(name) <= max_len and name[:1].isalpha():
        return name
    suffix = short_hash(joined)
    if name and not name[0].isalpha():
        name = "x-" + name
    head = name[: max_len - len(suffix) - 1].rstrip("-")
    return f"{head}-{suffix}" if head else f"x-{suffix}"


def label_value(text: str) -> str:
    """A valid label value for any input (<= 63, alphanumeric ends); hashed when cut."""
    if len(text) <= MAX_NAME and re.fullmatch(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]", text):
        return text
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-_.")
    suffix = short_hash(text)
    head = cleaned[: MAX_NAME - len(suffix) - 1].rstrip("-_.")
    return f"{head}-{suffix}" if head else suffix
