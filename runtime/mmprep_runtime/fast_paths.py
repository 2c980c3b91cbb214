"""Exact, cheaper stand-ins for two steps of transformers' ``ProcessorMixin.__call__``.

After tokenizing, every multimodal processor call runs two steps over the whole token sequence
(about 1600 tokens for one 1280x960 image with Qwen2-VL) in pure Python, holding the GIL:

- ``_check_special_mm_tokens``: turns ``input_ids`` into Python lists to count each placeholder
  id, and runs a regular expression over the text to count the placeholders there;
- ``create_mm_token_type_ids``: turns ``input_ids`` into lists, then NumPy arrays, then lists
  again, to mark which tokens belong to which modality.

Together about 0.6 ms per request, nearly all of it GIL-held. That is little for one thread but
a lot for the pool: while one worker holds the GIL the other waits, and on 2 cores two workers
gave 1.64x one worker; with these stand-ins the pool's cores stay busier (measured in
``benchmarks/runtime``). The stand-ins count and mark with tensor operations, which release the GIL.

They only ever *agree* faster. Each handles the common case (a 2-D integer tensor of ids, plain
strings without the chat template's control marker) and hands every other case, and every
mismatch, to transformers' own method, so the answers and the error messages are the library's.
Each is bound to the instance with ``types.MethodType`` (a deep copy rebinds it to the copy) and
only where the class uses ``ProcessorMixin``'s implementation: a processor that overrides either
step keeps its own.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Final

CHECK_SPECIAL_MM_TOKENS: Final = "_check_special_mm_tokens"
CREATE_MM_TOKEN_TYPE_IDS: Final = "create_mm_token_type_ids"
_MODALITY_TYPES: Final = (("image", 1), ("video", 2), ("audio", 3))


@functools.cache
def _base() -> tuple[type, str] | None:
    """transformers' ProcessorMixin and its control-token marker, or None if they moved."""
    try:
        from transformers import processing_utils
    except ImportError:  # pragma: no cover - the runtime extra is missing
        return None
    marker = getattr(processing_utils, "_CONTROL_TOKEN_START", None)
    mixin = getattr(processing_utils, "ProcessorMixin", None)
    if not isinstance(marker, str) or not marker or mixin is None:
        return None
    return mixin, marker


def _integer_id_matrix(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and value.dim() == 2 and not value.is_floating_point() \
        and not value.is_complex() and value.dtype != torch.bool


def _check_special_mm_tokens(self: Any, text: Any, text_inputs: Any, modalities: list[str]) -> None:
    mixin, marker = _base()  # type: ignore[misc]  # not None: apply() bound this stand-in
    library = getattr(mixin, CHECK_SPECIAL_MM_TOKENS)
    input_ids = text_inputs["input_ids"]
    plain = isinstance(text, list) and all(isinstance(sample, str) and marker not in sample for sample in text)
    if not plain or not _integer_id_matrix(input_ids) or input_ids.shape[0] != len(text):
        return library(self, text, text_inputs, modalities)
    for modality in modalities:
        token = getattr(self, f"{modality}_token", None)
        token_id = getattr(self, f"{modality}_token_id", None)
        if token is None or token_id is None:
            continue
        if not isinstance(token, str) or not token or type(token_id) is not int:
            return library(self, text, text_inputs, modalities)
        # Without the marker, the library's regex (the token not preceded by the marker) finds
        # exactly the non-overlapping occurrences that str.count counts.
        if (input_ids == token_id).sum(dim=1).tolist() != [sample.count(token) for sample in text]:
            return library(self, text, text_inputs, modalities)  # it raises, with its own message
    return None


def _create_mm_token_type_ids(self: Any, input_ids: Any) -> Any:
    import torch

    mixin, _ = _base()  # type: ignore[misc]  # not None: apply() bound this stand-in
    library = getattr(mixin, CREATE_MM_TOKEN_TYPE_IDS)
    if not _integer_id_matrix(input_ids):
        return library(self, input_ids)
    marked = torch.zeros_like(input_ids)
    for modality, value in _MODALITY_TYPES:
        # The library matches with np.isin, where a None id matches nothing.
        wanted = [token_id for token_id in getattr(self, f"{modality}_token_ids") if token_id is not None]
        if any(type(token_id) is not int for token_id in wanted):
            return library(self, input_ids)
        if wanted:
            marked[torch.isin(input_ids, torch.tensor(wanted, dtype=input_ids.dtype))] = value
    return marked.tolist()


_STAND_INS: Final = {
    CHECK_SPECIAL_MM_TOKENS: _check_special_mm_tokens,
    CREATE_MM_TOKEN_TYPE_IDS: _create_mm_token_type_ids,
}


def apply(processor: Any) -> tuple[str, ...]:
    """Bind the stand-ins on ``processor`` where its class uses the library's steps; their names."""
    base = _base()
    if base is None or not isinstance(processor, base[0]):
        return ()
    mixin, _ = base
    applied = []
    for name, stand_in in _STAND_INS.items():
        library = getattr(mixin, name, None)
        if library is not None and getattr(type(processor), name, None) is library:
            setattr(processor, name, types.MethodType(stand_in, processor))
            applied.append(name)
    return tuple(applied)


def applied(processor: Any) -> tuple[str, ...]:
    """The stand-ins bound on ``processor`` (on a clone too: deep copies keep them)."""
    return tuple(name for name in _STAND_INS if isinstance(vars(processor).get(name), types.MethodType))
