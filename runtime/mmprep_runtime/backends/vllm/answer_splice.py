"""vLLM's render answers written without passing their megabytes through a JSON encoder.

A render answer is a few kilobytes of JSON around each multimodal item's base64 (megabytes). vLLM
turns each item's base64 into a Python string (a copy), and its JSON encoder then scans and copies
that string again: a sixth of a light request's GIL-held time in a render process (py-spy on a
Gemma 3 render process, 2 cores). In mmprep's render processes two of vLLM's functions are
wrapped (``install``):

- ``encode_mm_kwargs_item``, as ``mm_features`` calls it: the item is encoded exactly as vLLM
  encodes it (its own msgpack encoder, then base64), and a large one is kept as bytes while a
  short marker stands in for it in the answer;
- ``create_json_response``, as the render routes call it: vLLM's own function writes the answer
  with the markers, then each marker is replaced by its item's base64.

Base64 uses no character JSON escapes, so the result is byte for byte what vLLM writes (the
compatibility tests compare every answer with vLLM's own render server's). The wrapping is skipped,
and vLLM's functions left alone, when vLLM's code does not have the shape it was written against.
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
import time
import uuid
from typing import Any, Final

logger = logging.getLogger(__name__)

#: Items whose base64 is shorter than this stay strings: splicing pays off for megabytes.
_SMALL: Final = 64 * 1024
#: A marker whose answer never came (the request failed after encoding) is dropped after this.
_FORGET_AFTER_S: Final = 300.0


class _Kept:
    """Base64 kept aside, by marker, until the answer that carries the markers is written."""

    def __init__(self) -> None:
        # A per-process random part: no client-supplied text can spell a marker.
        self.prefix = f"mmprep-item-{uuid.uuid4().hex}-"
        self.pattern = re.compile(re.escape(self.prefix.encode()) + rb"(\d+)")
        self._numbers = itertools.count()
        self._items: dict[str, tuple[float, bytes]] = {}
        self._lock = threading.Lock()

    def keep(self, encoded: bytes) -> str:
        marker = f"{self.prefix}{next(self._numbers)}"
        with self._lock:
            self._items[marker] = (time.monotonic(), encoded)
        return marker

    def splice(self, body: bytes) -> bytes | None:
        """``body`` with each marker replaced by its base64; None when it holds no marker."""
        if self.prefix.encode() not in body:
            return None
        pieces: list[bytes] = []
        position = 0
        with self._lock:
            for match in self.pattern.finditer(body):
                kept = self._items.pop(match.group(0).decode(), None)
                if kept is None:
                    continue  # not one of ours (it cannot be, but then it stays as it is)
                pieces += [body[position : match.start()], kept[1]]
                position = match.end()
            horizon = time.monotonic() - _FORGET_AFTER_S
            for marker in [m for m, (kept_at, _) in self._items.items() if kept_at < horizon]:
                del self._items[marker]
        pieces.append(body[position:])
        return b"".join(pieces)

    def __len__(self) -> int:
        return len(self._items)


KEPT: Final = _Kept()


def install() -> bool:
    """Wrap vLLM's two functions (see the module's text); False, and nothing changed, when vLLM's
    code is not what this was written against."""
    try:
        import pybase64
        from starlette.responses import Response
        from vllm.entrypoints.scale_out.render import api_router
        from vllm.entrypoints.scale_out.token_in_token_out import mm_features, mm_serde
    except ImportError as exc:
        logger.info("answer splicing is off: %s", exc)
        return False
    encoder = getattr(mm_serde, "_encoder", None)
    original_encode = getattr(mm_features, "encode_mm_kwargs_item", None)
    original_response = getattr(api_router, "create_json_response", None)
    if encoder is None or original_encode is not mm_serde.encode_mm_kwargs_item or original_response is None:
        logger.info("answer splicing is off: vLLM's render answer code is not the shape it expects")
        return False

    def encode_mm_kwargs_item(item: Any) -> str:
        buffers = encoder.encode(item)
        if len(buffers) != 1:  # vLLM asserts this; its own function says so
            return str(original_encode(item))
        encoded: bytes = pybase64.b64encode(buffers[0])
        return encoded.decode("ascii") if len(encoded) < _SMALL else KEPT.keep(encoded)

    def create_json_response(*args: Any, **kwargs: Any) -> Any:
        response = original_response(*args, **kwargs)
        spliced = KEPT.splice(bytes(response.body))
        if spliced is None:
            return response
        return Response(content=spliced, status_code=response.status_code, media_type=response.media_type)

    mm_features.encode_mm_kwargs_item = encode_mm_kwargs_item
    api_router.create_json_response = create_json_response
    return True
