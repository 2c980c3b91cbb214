"""The vLLM render API on the engine: OpenAI chat/completion bodies in, vLLM ``GenerateRequest`` out.

``RenderApi`` is a ``pipeline.Api``: the engine runs its stages where it places them.
- decode: ``openai_chat`` parses and checks the body; inline images stay encoded bytes;
- fetch (only with http(s) image URLs): ``fetching.Fetcher`` on the event loop;
- process (on a worker's own processor clone): decode each image the way vLLM's media loader
  does (EXIF orientation, transparency onto white), hash it as vLLM does (``vllm_format``), render
  the chat template from the processor folder, run the processor, and cut its outputs into one
  kwargs item per image;
- encode: the ``GenerateRequest`` JSON (msgpack + base64 of each item, then orjson).

Pixel hand-off (``RenderSettings.normalized_pixels``): by default, like vLLM's ``mm_device_do_normalize``,
a processor that can skip rescale/normalize does so and the pixels leave as uint8 (the GPU
normalizes; 4x less to copy and send). With ``normalized_pixels`` the processor normalizes and floating
outputs are cast to the model's dtype, as vLLM does with ``--no-mm-device-do-normalize``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pathlib
import uuid
from collections.abc import Mapping
from typing import Any, Final

import orjson

from mmprep_runtime import errors
from mmprep_runtime.apis import fetching, openai_chat, vllm_format
from mmprep_runtime.engine import decoding, loading, patches, pipeline
from mmprep_runtime.engine.loading import ProcessorFacts
from mmprep_runtime.settings import Limits, RenderSettings

#: Processors whose images this API renders: how vLLM cuts processor outputs into items is
#: model-specific (Qwen2-VL: rows of ``pixel_values`` by ``image_grid_thw``). Others: text only.
IMAGE_PROCESSORS: Final = loading.DEVICE_NORMALIZE_PROCESSORS

_RGBA_BACKGROUND: Final = (255, 255, 255)


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What rendering needs from the model folder beyond the processor."""

    model_id: str
    served_name: str
    max_model_len: int
    dtype: str | None
    image_token_id: int | None
    device_normalize: bool
    #: Placeholders expand to ``grid.prod() / merge_size**2`` tokens (Qwen2-VL's rule): tokenize once.
    expands_by_grid: bool = False

    @property
    def processor_kwargs(self) -> dict[str, Any]:
        return dict(loading.DEVICE_NORMALIZE_KWARGS) if self.device_normalize else {}


def _torch_dtype_name(config: Mapping[str, Any]) -> str | None:
    for source in (config, config.get("text_config") or {}):
        for key in ("torch_dtype", "dtype"):
            value = source.get(key)
            if isinstance(value, str):
                return value
    return None


def _model_config(model: str) -> dict[str, Any]:
    folder = pathlib.Path(model)
    if (folder / "config.json").is_file():
        return dict(json.loads((folder / "config.json").read_text()))
    try:  # a hub id: the config sits beside the processor in the cache
        from transformers import AutoConfig

        return dict(AutoConfig.from_pretrained(model).to_dict())
    except Exception:  # noqa: BLE001 - no model config: defaults below, as for a bare processor
        return {}


def model_facts(processor: Any, facts: ProcessorFacts, settings: RenderSettings) -> ModelFacts:
    config = _model_config(facts.model)
    text_config = config.get("text_config") or config
    max_len = text_config.get("max_position_embeddings") or config.get("max_position_embeddings") or 2048
    token_id = getattr(processor, "image_token_id", None)
    if token_id is None and facts.image_token:
        token_id = processor.tokenizer.convert_tokens_to_ids(facts.image_token)
    return ModelFacts(
        model_id=facts.model,
        served_name=settings.served_model_name or facts.model,
        max_model_len=int(max_len),
        dtype=_torch_dtype_name(config),
        image_token_id=token_id,
        device_normalize=not settings.normalized_pixels and facts.normalizes_on_device,
        expands_by_grid=facts.normalizes_on_device
        and token_id is not None
        and hasattr(getattr(processor, "image_processor", None), "merge_size"),
    )


# ---- images, the way vLLM's media loader decodes them -----------------------------------------


def decode_image(data: bytes, what: str, limits: Limits, layout: decoding.ImageLayout) -> tuple[Any, vllm_format.EncodedImage]:
    """The image in ``layout`` and its hash identity.

    vLLM opens the file, applies EXIF orientation, and converts to RGB, compositing transparency
    onto white; a conversion joins the hash. A plain RGB JPEG, the common case, takes mmprep's
    GIL-free decoder (identical pixels).
    """
    from PIL import ImageOps

    image = decoding.open_image(data, what, max_pixels=limits.max_image_pixels)
    plain = image.mode == "RGB" and "transparency" not in image.info
    try:
        oriented = plain and image.getexif().get(0x0112, 1) in (0, 1)
    except Exception:  # noqa: BLE001 - malformed EXIF: vLLM ignores it too
        oriented = plain
    if oriented:
        return decoding.decode_opened(image, data, what, layout), vllm_format.EncodedImage(data)
    try:
        image = ImageOps.exif_transpose(image)
    except Exception:  # noqa: BLE001 - as vLLM: a broken EXIF block leaves the image as it is
        pass
    decoding.load_pixels(image, what)
    converted = _to_rgb(image)
    io_config = None
    if converted is not image:
        io_config = {"image_mode": "RGB", "rgba_background_color": _RGBA_BACKGROUND}
    return decoding.in_layout(converted, layout), vllm_format.EncodedImage(data, io_config)


def _to_rgb(image: Any) -> Any:
    from PIL import Image

    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image if image.mode == "RGBA" else image.convert("RGBA")
        flat = Image.new("RGB", rgba.size, _RGBA_BACKGROUND)
        flat.paste(rgba, mask=rgba.split()[3])
        return flat
    return image if image.mode == "RGB" else image.convert("RGB")


# ---- processing ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Rendered:
    token_ids: Any  # 1-D int64 numpy array
    hashes: list[str]
    placeholders: list[dict[str, int]]
    items: list[dict[str, vllm_format.KwargsElement]]
    request: openai_chat.RenderRequest


def _chat_template(processor: Any) -> str | None:
    template = getattr(processor, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    if not template:
        template = getattr(patches.tokenizer_of(processor), "chat_template", None)
    return template if isinstance(template, str) else None


def _prompt_text(processor: Any, request: openai_chat.RenderRequest) -> str:
    if request.prompt is not None:
        return request.prompt
    template = _chat_template(processor)
    if template is None:
        raise errors.BadRequest(
            "this model has no chat template (no chat_template.jinja in the processor folder); use /v1/completions/render"
        )
    try:
        text = patches.tokenizer_of(processor).apply_chat_template(
            list(request.conversation or ()),
            chat_template=template,
            tokenize=False,
            add_generation_prompt=request.add_generation_prompt,
        )
    except Exception as exc:  # noqa: BLE001 - a template that raises rejects this conversation
        raise errors.BadRequest(f"the chat template rejected the messages: {exc}") from None
    return str(text)


def _to_model_dtype(tensor: Any, dtype: str | None) -> Any:
    import torch

    if dtype is None or not tensor.is_floating_point():
        return tensor
    target = getattr(torch, dtype, None)
    return tensor.to(target) if isinstance(target, torch.dtype) else tensor


def render(
    processor: Any, request: openai_chat.RenderRequest, facts: ProcessorFacts, model: ModelFacts, limits: Limits
) -> Rendered:
    import numpy as np

    images = []
    encoded = []
    total_pixels = 0
    for source in request.images:
        assert source.data is not None, "fetched before processing"
        image, identity = decode_image(source.data, source.what, limits, facts.image_layout)
        total_pixels = pipeline.count_request_pixels(total_pixels, image, source.what, limits)
        images.append(image)
        encoded.append(identity)
    text = _prompt_text(processor, request)
    if len(text) > limits.max_text_chars:
        raise errors.BadRequest(f"the prompt has {len(text)} characters, more than the limit of {limits.max_text_chars}")
    kwargs: dict[str, Any] = {"return_tensors": "pt", "add_special_tokens": False, **model.processor_kwargs}
    with errors.processor_call():
        if images and model.expands_by_grid:
            outputs = _process_tokenizing_once(processor, text, images, model)
        elif images:
            outputs = processor(text=[text], images=images, **kwargs)
        else:
            outputs = patches.tokenizer_of(processor)(text, return_tensors="pt", add_special_tokens=False)
    token_ids = np.ascontiguousarray(outputs["input_ids"][0].numpy())
    # A model without an image token renders no placeholder: the check below then refuses the images.
    placeholders = (
        vllm_format.placeholder_runs(token_ids, model.image_token_id) if images and model.image_token_id is not None else []
    )
    if len(placeholders) != len(images):
        raise errors.Unprocessable(f"the rendered prompt has {len(placeholders)} image placeholder(s) for {len(images)} image(s)")
    items = _items(outputs, len(images), model.dtype if not model.device_normalize else None)
    hashes = [vllm_format.mm_hash(model.model_id, "image", identity, {}) for identity in encoded]
    return Rendered(token_ids, hashes, placeholders, items, request)


def _process_tokenizing_once(processor: Any, text: str, images: list[Any], model: ModelFacts) -> dict[str, Any]:
    """The processor's outputs, with the prompt tokenized before its placeholders are expanded.

    A Qwen2-VL processor repeats each image placeholder ``grid_t * grid_h * grid_w / merge**2``
    times in the text and tokenizes the result: 1230 special tokens for a 1280x960 image, and then
    its Python checks over all of them. vLLM tokenizes the prompt with one placeholder per image and
    repeats the placeholder's id instead; special tokens never merge with their neighbours, so
    the ids are the same (the compatibility tests compare them), for a fraction of the cost.
    """
    import numpy as np
    import torch

    image_processor = processor.image_processor
    image_outputs = dict(image_processor(images=images, return_tensors="pt", **model.processor_kwargs))
    counts = (image_outputs["image_grid_thw"].prod(-1) // image_processor.merge_size**2).numpy()
    ids = np.asarray(processor.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    positions = np.flatnonzero(ids == model.image_token_id)
    if len(positions) != len(images):
        raise errors.Unprocessable(f"the rendered prompt has {len(positions)} image placeholder(s) for {len(images)} image(s)")
    repeats = np.ones(len(ids), dtype=np.int64)
    repeats[positions] = counts
    return {"input_ids": torch.from_numpy(np.repeat(ids, repeats))[None], **image_outputs}


def _items(outputs: Mapping[str, Any], count: int, dtype: str | None) -> list[dict[str, vllm_format.KwargsElement]]:
    """One kwargs item per image: its rows of ``pixel_values`` and its row of ``image_grid_thw``."""
    if not count:
        return []
    grid = outputs["image_grid_thw"]
    pixels = _to_model_dtype(outputs["pixel_values"], dtype)
    sizes = grid.prod(-1).tolist()
    slices = []
    start = 0
    for size in sizes:
        slices.append((start, start + int(size)))
        start += int(size)
    flat = vllm_format.FlatField(tuple(slices))
    batched = vllm_format.BatchedField(keep_on_cpu=True)
    return [
        {
            "pixel_values": vllm_format.KwargsElement(pixels[a:b], flat),
            "image_grid_thw": vllm_format.KwargsElement(grid[index], batched),
        }
        for index, (a, b) in enumerate(slices)
    ]


# ---- the answer ---------------------------------------------------------------------------------

#: ``SamplingParams.output_kind``: a rendered, non-streaming request gets only the final output.
_OUTPUT_KIND_DELTA: Final = 1
_OUTPUT_KIND_FINAL_ONLY: Final = 2


#: ``ChatCompletionRequest``'s float sampling fields with their OpenAI defaults: vLLM always
#: serializes them (msgspec omits a default only when it is the very default object).
_FLOAT_FIELDS: Final = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "min_p": 0.0,
}
#: Fields serialized only when they differ from ``SamplingParams``' defaults.
_OTHER_DEFAULTS: Final = {
    "top_k": 0,
    "n": 1,
    "min_tokens": 0,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "include_stop_str_in_output": False,
}


def sampling_params(request: openai_chat.RenderRequest, prompt_tokens: int, max_model_len: int) -> dict[str, Any]:
    """``sampling_params`` as vLLM's render serializes the ``SamplingParams`` it builds."""
    if prompt_tokens > max_model_len:
        raise errors.BadRequest(f"Input length ({prompt_tokens}) exceeds model's maximum context length ({max_model_len}).")
    room = max_model_len - prompt_tokens
    max_tokens = min(room, request.max_tokens) if request.max_tokens is not None else room
    sampling = request.sampling
    params: dict[str, Any] = {name: float(sampling.get(name, default)) for name, default in _FLOAT_FIELDS.items()}
    for name, default in _OTHER_DEFAULTS.items():
        if name in sampling and sampling[name] != default:
            params[name] = sampling[name]
    if "seed" in sampling:
        params["seed"] = sampling["seed"]
    stop = sampling.get("stop") or []
    params["stop"] = [stop] if isinstance(stop, str) else list(stop)
    params["stop_token_ids"] = list(sampling.get("stop_token_ids") or [])
    params["max_tokens"] = max_tokens
    params["output_kind"] = _OUTPUT_KIND_DELTA if request.stream else _OUTPUT_KIND_FINAL_ONLY
    params["skip_clone"] = True
    params["bad_words"] = []
    params["skip_reading_prefix_cache"] = False
    return params


#: Stands in for each kwargs item while the answer's JSON is written, then replaced by its bytes;
#: a per-process random part, so no user-supplied string (a model name) can collide with it.
_MARKER: Final = f"mmprep-kwargs-{uuid.uuid4().hex}-"


def generate_request(rendered: Rendered, model: ModelFacts, request_id: str) -> tuple[dict[str, Any], list[bytes]]:
    """The ``GenerateRequest`` as a JSON-ready dict whose kwargs items are markers, and the items'
    base64 (``encode_answer`` splices them in: megabytes that never become a Python str)."""
    request = rendered.request
    body: dict[str, Any] = {
        "request_id": request_id,
        "token_ids": rendered.token_ids,
        "sampling_params": sampling_params(request, len(rendered.token_ids), model.max_model_len),
        "model": request.model,
        "stream": request.stream,
        "priority": request.priority,
    }
    blobs: list[bytes] = []
    if rendered.items:
        metadata = [vllm_format.metadata_item(item) for item in rendered.items]
        markers = []
        for item in rendered.items:
            markers.append(f"{_MARKER}{len(blobs)}")
            blobs.append(vllm_format.kwargs_item_base64(item))
        body["features"] = {
            "mm_hashes": {"image": rendered.hashes},
            "mm_placeholders": {"image": rendered.placeholders},
            "kwargs_data": {"image": markers},
            "mm_metadata": {"image": [vllm_format.encode_kwargs_item(m) if m else None for m in metadata]},
        }
    if request.chat:
        # The template arguments the answer was rendered with, vLLM's server defaults included.
        template_kwargs = {
            "cohere_format": "cmd4",
            "add_generation_prompt": request.add_generation_prompt,
            "continue_final_message": False,
        }
        body["parse_context"] = {
            "tools": None,
            "tool_choice": "none",
            "parallel_tool_calls": True,
            "include_reasoning": True,
            "chat_template_kwargs": template_kwargs,
            "history_tool_call_cnt": 0,
        }
    return body, blobs


def encode_answer(answer: Any, blobs: list[bytes]) -> bytes:
    """JSON bytes of ``answer`` with each marker string replaced by its base64 blob (as a string)."""
    text = orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return text
    pieces: list[bytes] = []
    rest = text
    for index, blob in enumerate(blobs):
        before, found, rest = rest.partition(f"{_MARKER}{index}".encode())
        assert found, "every kwargs item has its marker"
        pieces += [before, blob]
    pieces.append(rest)
    return b"".join(pieces)


# ---- the API over the engine --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RenderApi:
    """``POST /v1/chat/completions/render`` (``chat``) or ``/v1/completions/render``."""

    facts: ProcessorFacts
    model: ModelFacts
    limits: Limits
    fetcher: fetching.Fetcher
    chat: bool
    request_id: str | None = None
    large_answer: bool = True

    def decode(self, body: bytes) -> openai_chat.RenderRequest:
        reserved = (self.facts.image_token,) if self.facts.image_token else ()
        if self.chat:
            request = openai_chat.parse_chat(body, reserved=reserved, max_images=self.limits.max_images)
        else:
            request = openai_chat.parse_completion(body, reserved=reserved)
        if request.model is not None and request.model != self.model.served_name:
            raise ModelNotFound(f"The model `{request.model}` does not exist.")
        if request.images and not self.facts.takes_images:
            raise errors.BadRequest(f"this model ({self.facts.processor_class}) takes no images")
        if request.images and self.facts.processor_class not in IMAGE_PROCESSORS:
            raise errors.BadRequest(
                f"the vLLM render API renders images for {', '.join(sorted(IMAGE_PROCESSORS))} only, "
                f"not {self.facts.processor_class}"
            )
        return request

    def needs_fetch(self, request: openai_chat.RenderRequest) -> bool:
        return bool(request.urls)

    async def fetch(self, request: openai_chat.RenderRequest) -> openai_chat.RenderRequest:
        pending = request.urls
        bodies = await asyncio.gather(*(self.fetcher.fetch(source.url or "", source.what) for _, source in pending))
        return request.fetched({index: body for (index, _), body in zip(pending, bodies, strict=True)})

    def process(self, processor: Any, request: openai_chat.RenderRequest) -> Rendered:
        return render(processor, request, self.facts, self.model, self.limits)

    def encode(self, rendered: Rendered) -> bytes:
        prefix = "chatcmpl-" if self.chat else "cmpl-"
        request_id = prefix + (self.request_id or rendered.request.request_id or uuid.uuid4().hex)
        body, blobs = generate_request(rendered, self.model, request_id)
        return encode_answer(body if self.chat else [body], blobs)


class ModelNotFound(errors.RequestError):
    status = 404
    code = "model_not_found"
    #: The request field at fault, in vLLM's error JSON.
    param = "model"
