"""The protocol-agnostic pipeline: decode -> (fetch) -> process -> encode, and mmprep's own API on it.

An HTTP API plugs into the engine as an ``Api``: its stages as plain functions, and whether its
answer is large. Where each stage runs (event loop, IO pool, processor worker, one job or two) is
``engine.Engine.serve``'s business; an API never picks a thread.

mmprep's native API (``POST /v1/preprocess``) is ``PreprocessApi``:
- ``decode_request``: JSON parsing, validation against the processor's facts, base64 and media
  decoding. Parsing a body with megabytes of base64 holds the GIL; it never runs on the event loop.
- ``process``: the processor call on the worker's own clone.
- ``encode_json`` (small) / ``encode_safetensors`` (tens of megabytes of copying): the answer.

Every failure is an ``errors.RequestError``; the HTTP layer only maps them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final, Protocol, TypeVar

import numpy as np
import orjson

from mmprep_runtime import errors
from mmprep_runtime.engine import decoding
from mmprep_runtime.engine.loading import ProcessorFacts
from mmprep_runtime.settings import Limits

KNOWN_FIELDS: Final = frozenset({"text", "images", "audio"})

RequestT = TypeVar("RequestT")
OutputT = TypeVar("OutputT")


@dataclasses.dataclass(frozen=True)
class Pieces:
    """An answer as consecutive byte strings, sent one after the other.

    A render answer is megabytes of base64 between a few kilobytes of JSON; joining them into one
    bytes object would copy the megabytes once more (with the GIL held) only to send them.
    """

    parts: tuple[bytes, ...]

    @property
    def size(self) -> int:
        return sum(len(part) for part in self.parts)

    def joined(self) -> bytes:
        return b"".join(self.parts)


#: What an API's encode stage answers: the bytes, or the bytes in pieces.
AnswerBody = bytes | Pieces


@dataclasses.dataclass(frozen=True)
class PreprocessRequest:
    text: str
    images: tuple[Any, ...] = ()
    audio: tuple[np.ndarray[Any, Any], ...] = ()


def _string_list(payload: Mapping[str, Any], field: str, limit: int) -> list[str]:
    value = payload.get(field)
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise errors.BadRequest(f"'{field}' must be a list of base64 strings, got {type(value).__name__}")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise errors.BadRequest(f"'{field}[{index}]' must be a base64 string, got {type(item).__name__}")
    if len(value) > limit:
        raise errors.BadRequest(f"'{field}' has {len(value)} items, more than the limit of {limit}")
    return value


def json_object(body: bytes) -> dict[str, Any]:
    """A request body that must be one JSON object (both HTTP APIs), or a 400 saying why."""
    # orjson, not json: it parses the bytes as they are (json decodes them to a str first, one
    # more copy of the body) and scans the long base64 strings with SIMD. Both hold the GIL, and
    # on a 570 KB body orjson holds it 0.19 ms instead of 0.34 ms. It also rejects what JSON
    # forbids and json accepts (NaN, invalid UTF-8) with a message.
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise errors.BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise errors.BadRequest(f"body must be a JSON object, got {type(payload).__name__}")
    return payload


def count_request_pixels(total: int, image: Any, what: str, limits: Limits) -> int:
    """``total`` plus ``image``'s pixels; a 413 once a request's images together pass the limit.

    Called as each image is decoded, so at most one image beyond the budget is ever held.
    """
    width, height = decoding.image_size(image)
    total += width * height
    if total > limits.max_request_pixels:
        raise errors.MediaTooLarge(
            f"the images up to {what} have {total} pixels together, over the request limit of {limits.max_request_pixels}"
        )
    return total


def parse_payload(body: bytes) -> dict[str, Any]:
    payload = json_object(body)
    unknown = sorted(set(payload) - KNOWN_FIELDS)
    if unknown:
        raise errors.BadRequest(f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(KNOWN_FIELDS))}")
    return payload


def decode_request(body: bytes, facts: ProcessorFacts, limits: Limits) -> PreprocessRequest:
    payload = parse_payload(body)
    if "text" not in payload:
        raise errors.BadRequest("missing 'text'")
    text = payload["text"]
    if not isinstance(text, str):
        raise errors.BadRequest(f"'text' must be a string, got {type(text).__name__}")
    if len(text) > limits.max_text_chars:
        raise errors.BadRequest(f"'text' has {len(text)} characters, more than the limit of {limits.max_text_chars}")
    images = _string_list(payload, "images", limits.max_images)
    audio = _string_list(payload, "audio", limits.max_audio_items)

    # Checks that need only the text come before any decoding: a wrong request costs nothing.
    if images and not facts.takes_images:
        raise errors.Unprocessable(f"this processor ({facts.processor_class}) takes no images")
    if audio and not facts.takes_audio:
        raise errors.Unprocessable(f"this processor ({facts.processor_class}) takes no audio")
    if facts.image_token:
        placeholders = text.count(facts.image_token)
        if placeholders != len(images):
            raise errors.Unprocessable(
                f"the text has {placeholders} image placeholder(s) {facts.image_token!r} "
                f"but {len(images)} image(s) were sent; they must match"
            )

    decoded_images = []
    total_pixels = 0
    for index, item in enumerate(images):
        what = f"images[{index}]"
        image = decoding.decode_image(
            decoding.b64decode(item, what),
            what,
            max_pixels=limits.max_image_pixels,
            layout=facts.image_layout,
        )
        total_pixels = count_request_pixels(total_pixels, image, what, limits)
        decoded_images.append(image)
    decoded_audio = tuple(
        decoding.decode_wav(
            decoding.b64decode(item, f"audio[{index}]"),
            f"audio[{index}]",
            target_rate=facts.sampling_rate or 16000,
            max_seconds=limits.max_audio_seconds,
        )
        for index, item in enumerate(audio)
    )
    return PreprocessRequest(text, tuple(decoded_images), decoded_audio)


def process(
    processor: Any, request: PreprocessRequest, facts: ProcessorFacts, processor_kwargs: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Run the processor (on the calling worker's own clone). Returns name -> torch tensor.

    ``processor_kwargs``: e.g. ``loading.DEVICE_NORMALIZE_KWARGS`` for uint8 pixels."""
    kwargs: dict[str, Any] = {"return_tensors": "pt", **(processor_kwargs or {})}
    with errors.processor_call():
        if facts.takes_images or facts.takes_audio:
            if request.images:
                kwargs["images"] = list(request.images)
            if request.audio:
                kwargs["audio"] = list(request.audio) if len(request.audio) > 1 else request.audio[0]
                kwargs["sampling_rate"] = facts.sampling_rate
            outputs = processor(text=request.text, **kwargs)
        else:
            outputs = processor(request.text, **kwargs)
    # On the GPU path the image tensors come back on the device; the answer leaves the process,
    # so it is moved here, on the worker, not on the event loop. A no-op for CPU tensors.
    return {name: value.cpu() for name, value in dict(outputs).items() if hasattr(value, "cpu")}


def _dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def describe(outputs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: {"shape": list(tensor.shape), "dtype": _dtype_name(tensor)} for name, tensor in outputs.items()}


def encode_json(outputs: Mapping[str, Any], model: str) -> bytes:
    input_ids = outputs.get("input_ids")
    answer = {
        "model": model,
        # Straight from the array's memory: ``tolist()`` and ``json.dumps`` would build and then
        # print ~1600 Python ints with the GIL held (0.1 ms against 0.007 ms).
        "input_ids": np.ascontiguousarray(input_ids.numpy()) if input_ids is not None else None,
        "tensors": describe(outputs),
    }
    return orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)


def encode_safetensors(outputs: Mapping[str, Any], model: str) -> bytes:
    from safetensors.torch import save

    return save({name: tensor.contiguous() for name, tensor in outputs.items()}, metadata={"model": model})


class Api(Protocol[RequestT, OutputT]):
    """One HTTP API's stages over the engine (see ``engine.Engine.serve`` for where they run).

    ``decode`` and ``process`` raise ``errors.RequestError`` for bad input. ``fetch`` is the one
    asynchronous stage (remote media): it runs on the event loop and must never block it.
    """

    @property
    def large_answer(self) -> bool:
        """Tens of megabytes to encode: the engine encodes it off the worker when the placement says so."""
        ...

    def decode(self, body: bytes) -> RequestT: ...

    def needs_fetch(self, request: RequestT) -> bool: ...

    async def fetch(self, request: RequestT) -> RequestT: ...

    def process(self, processor: Any, request: RequestT) -> OutputT: ...

    def encode(self, outputs: OutputT) -> AnswerBody: ...


@dataclasses.dataclass(frozen=True)
class PreprocessApi:
    """``POST /v1/preprocess``: JSON in; JSON (shapes) or safetensors (the tensors) out."""

    facts: ProcessorFacts
    limits: Limits
    binary: bool = False
    #: Extra processor arguments (uint8 pixels: ``loading.DEVICE_NORMALIZE_KWARGS``).
    processor_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def large_answer(self) -> bool:
        return self.binary

    def decode(self, body: bytes) -> PreprocessRequest:
        return decode_request(body, self.facts, self.limits)

    def needs_fetch(self, request: PreprocessRequest) -> bool:
        return False

    async def fetch(self, request: PreprocessRequest) -> PreprocessRequest:
        return request

    def process(self, processor: Any, request: PreprocessRequest) -> dict[str, Any]:
        return process(processor, request, self.facts, self.processor_kwargs)

    def encode(self, outputs: dict[str, Any]) -> bytes:
        if self.binary:
            return encode_safetensors(outputs, self.facts.model)
        return encode_json(outputs, self.facts.model)
