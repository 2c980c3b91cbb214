"""vLLM's wire format for rendered requests, written from its documented behaviour (pure, no I/O).

What vLLM's GPU-less render server answers is a ``GenerateRequest``; vLLM's generate server takes
it at ``POST /inference/v1/generate``. The parts that must match vLLM bit for bit live here:

- ``mm_hash``: an item's cache identity. vLLM feeds a framed byte stream to blake3: every chunk
  preceded by its length (8 bytes, little-endian), every container by a tag and its length, keys
  sorted; an image it decoded from bytes is hashed by those original bytes (plus the mode
  conversion it applied, if any). Equal hashes are what make vLLM's prefix and encoder caches hit
  on a request rendered here.
- ``encode_kwargs_item``: one image's processor outputs as vLLM serializes a multimodal kwargs
  item: a msgpack map ``{key: {"data": [dtype, shape, Ext(3, raw bytes)], "field": [kind,
  {field args}]}}``, base64-encoded.

The compatibility tests decode what this module writes with vLLM's own decoder and compare.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

import numpy as np

_LENGTH_BYTES: Final = 8
_TAG_NONE: Final = b"\x00"
_TAG_SEQUENCE: Final = b"\x01"
_TAG_MAPPING: Final = b"\x02"
_TAG_LEAF: Final = b"\x03"

#: msgpack extension code vLLM uses for a tensor's raw bytes inline.
RAW_VIEW_EXT: Final = 3


def _length(value: int) -> bytes:
    return value.to_bytes(_LENGTH_BYTES, "little")


def _framed(chunk: bytes | memoryview) -> Iterator[bytes | memoryview]:
    yield _length(chunk.nbytes if isinstance(chunk, memoryview) else len(chunk))
    yield chunk


@dataclasses.dataclass(frozen=True)
class EncodedImage:
    """An image as vLLM hashes it: its original bytes, and the decode settings that changed it
    (``None`` when the decoded image is the file's own mode)."""

    data: bytes
    io_config: Mapping[str, Any] | None = None


def _leaf(value: object) -> Iterator[bytes | memoryview]:
    if isinstance(value, EncodedImage):
        if value.io_config:
            yield from _item("image", {"io_config": value.io_config, "data": value.data})
        else:
            yield from _item("image", value.data)
    elif isinstance(value, np.ndarray):
        # An audio clip as vLLM hashes a decoded array: its dtype, its shape and its bytes.
        data = np.ascontiguousarray(value).view(np.uint8).data
        yield from _item("ndarray", {"dtype": value.dtype.str, "shape": value.shape, "data": data})
    elif isinstance(value, (bytes, memoryview)):
        yield from _framed(value)
    elif isinstance(value, str):
        yield from _framed(value.encode("utf-8"))
    elif isinstance(value, (bool, int, float)):
        # NumPy's scalar bytes: bool 1 byte, int int64, float float64 (what vLLM hashes).
        yield from _framed(np.array(value).tobytes())
    else:
        raise TypeError(f"cannot hash a {type(value).__name__}")


def _value(value: object) -> Iterator[bytes | memoryview]:
    if value is None:
        yield _TAG_NONE
    elif isinstance(value, (list, tuple)):
        yield _TAG_SEQUENCE
        yield _length(len(value))
        for element in value:
            yield from _value(element)
    elif isinstance(value, dict):
        yield _TAG_MAPPING
        yield _length(len(value))
        for key, element in value.items():
            yield from _framed(str(key).encode("utf-8"))
            yield from _value(element)
    else:
        yield _TAG_LEAF
        yield from _leaf(value)


def _item(key: str, value: object) -> Iterator[bytes | memoryview]:
    yield from _framed(key.encode("utf-8"))
    yield from _value(value)


def mm_hash(model_id: str, modality: str, item: EncodedImage | np.ndarray[Any, Any], processor_kwargs: Mapping[str, Any]) -> str:
    """The hex digest vLLM gives ``item`` (blake3, vLLM's default ``mm_hasher_algorithm``).

    ``processor_kwargs``: per-request processor arguments (none from this server's API)."""
    from blake3 import blake3

    factors: dict[str, object] = {"model_id": model_id, modality: item}
    if processor_kwargs:
        factors["mm_processor_kwargs"] = dict(processor_kwargs)
    hasher = blake3()
    for key in sorted(factors):
        for chunk in _item(key, factors[key]):
            hasher.update(chunk)
    return str(hasher.hexdigest())


# ---- multimodal kwargs items --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FlatField:
    """Each item is a slice along ``dim`` of one tensor (``pixel_values`` of all images).

    Every item carries the slices of all items of its request, each one a tuple of per-dimension
    slices (vLLM's ``flat_from_sizes`` form), a slice being ``[start, stop, step]``."""

    slices: tuple[tuple[int, int], ...]
    keep_on_cpu: bool = False
    dim: int = 0

    def wire(self) -> list[Any]:
        leading = [[None, None, None]] * self.dim
        return [
            "flat",
            {
                "keep_on_cpu": self.keep_on_cpu,
                "slices": [[*leading, [start, stop, None]] for start, stop in self.slices],
                "dim": self.dim,
            },
        ]


@dataclasses.dataclass(frozen=True)
class BatchedField:
    """Each item is one row of a batch (``image_grid_thw``)."""

    keep_on_cpu: bool = False

    def wire(self) -> list[Any]:
        return ["batched", {"keep_on_cpu": self.keep_on_cpu}]


@dataclasses.dataclass(frozen=True)
class SharedField:
    """Every item holds the same value (InternVL's ``image_token_id``), as vLLM's ``shared``."""

    batch_size: int
    keep_on_cpu: bool = False

    def wire(self) -> list[Any]:
        return ["shared", {"keep_on_cpu": self.keep_on_cpu, "batch_size": self.batch_size}]


Field = FlatField | BatchedField | SharedField


@dataclasses.dataclass(frozen=True)
class KwargsElement:
    data: Any  # a CPU torch tensor
    field: Field


def encode_kwargs_item(item: Mapping[str, KwargsElement]) -> str:
    """One multimodal kwargs item, msgpack then base64, as vLLM's ``encode_mm_kwargs_item``."""
    return kwargs_item_base64(item).decode("ascii")


#: Tensors above this many bytes are copied once into the message instead of through ``msgpack``.
_LARGE: Final = 4096


def _ext_header(length: int) -> bytes:
    # msgpack's ext 8/16/32 forms (the fixext forms only exist for 1..16 bytes, packed by msgpack).
    if length < 1 << 8:
        return bytes((0xC7, length, RAW_VIEW_EXT))
    if length < 1 << 16:
        return b"\xc8" + length.to_bytes(2, "big") + bytes((RAW_VIEW_EXT,))
    return b"\xc9" + length.to_bytes(4, "big") + bytes((RAW_VIEW_EXT,))


def kwargs_item_base64(item: Mapping[str, KwargsElement]) -> bytes:
    """``encode_kwargs_item`` as ASCII bytes (``kwargs_item_base64_pieces`` joined)."""
    return b"".join(kwargs_item_base64_pieces(item))


def _message_parts(item: Mapping[str, KwargsElement]) -> list[bytes | np.ndarray[Any, Any]]:
    """The item's msgpack message as consecutive parts: small ones packed by ``msgpack``, and each
    large tensor's bytes (a uint8 view, not a copy) behind a hand-written ext header, the same bytes
    ``msgpack`` would write."""
    import msgpack
    import torch

    parts: list[bytes | np.ndarray[Any, Any]] = [bytes((0x80 | len(item),))]  # a fixmap: a handful of keys
    for key, element in item.items():
        tensor = element.data.contiguous()
        parts.append(msgpack.packb(key, use_bin_type=True))
        parts.append(b"\x82" + msgpack.packb("data", use_bin_type=True) + b"\x93")
        parts.append(
            msgpack.packb([str(tensor.dtype).removeprefix("torch."), list(tensor.shape)], use_bin_type=True)[1:]
        )  # the two elements, without their array header
        raw = tensor.reshape(-1).view(torch.uint8).numpy() if tensor.numel() else None
        nbytes = 0 if raw is None else raw.nbytes
        if raw is not None and nbytes > _LARGE:
            parts.append(_ext_header(nbytes))
            parts.append(raw)
        else:
            parts.append(msgpack.packb(msgpack.ExtType(RAW_VIEW_EXT, b"" if raw is None else raw.tobytes()), use_bin_type=True))
        parts.append(msgpack.packb("field", use_bin_type=True) + msgpack.packb(element.field.wire(), use_bin_type=True))
    return parts


def kwargs_item_base64_pieces(item: Mapping[str, KwargsElement]) -> list[bytes]:
    """``encode_kwargs_item``'s ASCII, in pieces whose concatenation is the item's base64.

    The message is never assembled: base64 turns each 3 bytes into 4 characters on its own, so
    the base64 of consecutive parts is the concatenation of their base64s whenever every part but
    the last is a multiple of 3 bytes long. Each large tensor is encoded straight from its memory
    (the few bytes around it that break the multiple of 3 travel with its neighbours), so one
    answer of a 1280x960 image reads its 7 MB of pixels once, in base64, instead of first copying
    them into a message: every avoided copy is time a worker holds the GIL.
    """
    from pybase64 import b64encode

    pieces: list[bytes] = []
    pending = bytearray()  # small parts, and a large one's ends, not yet encoded
    for part in _message_parts(item):
        if isinstance(part, bytes):
            pending += part
            continue
        head = -len(pending) % 3  # the tensor's first bytes complete the pending run to a multiple of 3
        body_end = head + (part.nbytes - head) // 3 * 3
        pending += part[:head].tobytes()
        if pending:
            pieces.append(b64encode(bytes(pending)))
        pieces.append(b64encode(part[head:body_end].data))
        pending = bytearray(part[body_end:].tobytes())
    if pending or not pieces:
        pieces.append(b64encode(bytes(pending)))
    return pieces


def metadata_item(item: Mapping[str, KwargsElement]) -> dict[str, KwargsElement] | None:
    """The fields a prefill node still needs once the embedding arrives by other means
    (``mm_metadata``): vLLM keeps the ``keep_on_cpu`` ones (grid sizes)."""
    kept = {key: element for key, element in item.items() if element.field.keep_on_cpu}
    return kept or None


# ---- placeholders and errors -------------------------------------------------------------------


def placeholder_runs(token_ids: Sequence[int] | np.ndarray[Any, Any], token_id: int) -> list[dict[str, int]]:
    """``[{"offset", "length"}]`` of each run of ``token_id`` (one run per image)."""
    ids = np.asarray(token_ids)
    is_token = np.concatenate(([False], ids == token_id, [False]))
    edges = np.flatnonzero(is_token[1:] != is_token[:-1])
    return [{"offset": int(start), "length": int(stop - start)} for start, stop in zip(edges[::2], edges[1::2], strict=True)]
