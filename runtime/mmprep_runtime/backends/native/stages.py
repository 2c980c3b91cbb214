"""The vLLM render API on the engine: OpenAI chat/completion bodies in, vLLM ``GenerateRequest`` out.

``RenderApi`` is a ``pipeline.Api``: the engine runs its stages where it places them.
- decode: ``chat_request`` parses and checks the body; inline images stay encoded bytes;
- fetch (only with http(s) image URLs): ``fetching.Fetcher`` on the event loop;
- process (on a worker's own processor clone): decode each image the way vLLM's media loader
  does (EXIF orientation, transparency onto white), hash it as vLLM does (``wire_format``), render
  the chat template from the processor folder, run the processor, and cut its outputs into one
  kwargs item per image;
- encode: the ``GenerateRequest`` JSON (msgpack + base64 of each item, then orjson).

Pixel hand-off (``RenderSettings.normalized_pixels``): by default, like vLLM's ``mm_device_do_normalize``,
a processor that can skip rescale/normalize does so and the pixels leave as uint8 (the GPU
normalizes; 4x less to copy and send). With ``normalized_pixels`` the processor normalizes and floating
outputs are cast to the model's dtype, as vLLM does with ``--no-mm-device-do-normalize``.

Neighbours: ``model_facts`` (what the model is, read at start-up), ``generate_request`` (the
``GenerateRequest`` written from a ``Rendered``), ``wire_format`` (vLLM's hashes and wire
formats), ``vllm_render_server`` (the HTTP handlers).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import io
import itertools
import uuid
import wave
from typing import Any, Final

from mmprep_runtime import errors
from mmprep_runtime.backends import choice
from mmprep_runtime.backends.model_facts import CROPS, ROWS, SEQUENCE, SPLIT, TILES, ModelFacts
from mmprep_runtime.backends.native import chat_request, item_layouts, model_pixels, wire_format
from mmprep_runtime.backends.native.generate_request import Rendered, encode_answer, generate_request
from mmprep_runtime.engine import decoding, patches, pipeline
from mmprep_runtime.engine.loading import ProcessorFacts
from mmprep_runtime.httpio import fetching
from mmprep_runtime.settings import Limits

_RGBA_BACKGROUND: Final = (255, 255, 255)


# ---- images, the way vLLM's media loader decodes them -----------------------------------------


def decode_image(data: bytes, what: str, limits: Limits, layout: decoding.ImageLayout) -> tuple[Any, wire_format.EncodedImage]:
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
        return decoding.decode_opened(image, data, what, layout), wire_format.EncodedImage(data)
    try:
        image = ImageOps.exif_transpose(image)
    except Exception:  # noqa: BLE001 - as vLLM: a broken EXIF block leaves the image as it is
        pass
    decoding.load_pixels(image, what)
    converted = _to_rgb(image)
    io_config = None
    if converted is not image:
        io_config = {"image_mode": "RGB", "rgba_background_color": _RGBA_BACKGROUND}
    return decoding.in_layout(converted, layout), wire_format.EncodedImage(data, io_config)


def decode_clip(data: bytes, what: str, rate: int, limits: Limits) -> Any:
    """A WAV clip's samples as vLLM's soundfile decoder gives them: float32, 16-bit PCM over
    32768 (a power of two: exact). Only where that is all vLLM does to it: mono 16-bit PCM at the
    model's rate; vLLM's decoders and resampler take every other clip."""
    import numpy as np

    try:
        with wave.open(io.BytesIO(data), "rb") as reader:
            channels, width, clip_rate, frames = (
                reader.getnchannels(),
                reader.getsampwidth(),
                reader.getframerate(),
                reader.getnframes(),
            )
            if (channels, width, clip_rate) != (1, 2, rate):
                raise errors.BeyondFastPath(
                    f"{what}: a {channels}-channel {8 * width}-bit clip at {clip_rate} Hz is decoded by vLLM's code"
                )
            if frames > limits.max_audio_seconds * clip_rate:
                limit = limits.max_audio_seconds
                raise errors.MediaTooLarge(f"{what} lasts {frames / clip_rate:.1f} s, over the limit of {limit:g} s")
            raw = reader.readframes(frames)
    except (wave.Error, EOFError):
        problem = decoding.audio_decode_problem(data)
        if problem is not None:
            raise errors.BadMedia(f"{what}: the audio cannot be decoded: {problem}") from None
        raise errors.BeyondFastPath(f"{what}: a clip that is not a PCM WAV file is decoded by vLLM's code") from None
    samples = np.frombuffer(raw, dtype="<i2", count=len(raw) // 2)
    if not samples.size:
        raise errors.BadMedia(f"{what} has no samples")
    return samples.astype(np.float32) / np.float32(32768)


def _to_rgb(image: Any) -> Any:
    from PIL import Image

    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image if image.mode == "RGBA" else image.convert("RGBA")
        flat = Image.new("RGB", rgba.size, _RGBA_BACKGROUND)
        flat.paste(rgba, mask=rgba.split()[3])
        return flat
    return image if image.mode == "RGB" else image.convert("RGB")


# ---- processing ---------------------------------------------------------------------------------


def _chat_template(processor: Any) -> str | None:
    template = getattr(processor, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    if not template:
        template = getattr(patches.tokenizer_of(processor), "chat_template", None)
    return template if isinstance(template, str) else None


def _prompt_text(processor: Any, request: chat_request.RenderRequest, limits: Limits) -> str:
    text = request.prompt if request.prompt is not None else _chat_text(processor, request)
    if len(text) > limits.max_text_chars:
        raise errors.BadRequest(f"the prompt has {len(text)} characters, more than the limit of {limits.max_text_chars}")
    return text


def _chat_text(processor: Any, request: chat_request.RenderRequest) -> str:
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


def render(
    processor: Any, request: chat_request.RenderRequest, facts: ProcessorFacts, model: ModelFacts, limits: Limits
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
    text = _prompt_text(processor, request, limits)
    dtype = model.dtype if not model.device_normalize else None
    kwargs: dict[str, Any] = {"return_tensors": "pt", "add_special_tokens": False, **model.processor_kwargs}
    with errors.processor_call():
        if images and model.expands_by_grid:
            outputs = _process_tokenizing_once(processor, text, images, model)
        elif images and model.item_layout == ROWS and (block := _row_block(processor)):
            outputs = _process_rows_tokenizing_once(processor, text, images, model, block)
        elif images and model.item_layout == TILES and model.image_token_id is not None:
            outputs = _process_tiles_tokenizing_once(processor, text, images, model, dtype)
        elif images and model.item_layout == SPLIT and model.image_token_id is not None:
            outputs = _process_split_tokenizing_once(processor, text, images, model)
        elif images and model.item_layout == CROPS and _normalizes_alone(model):
            outputs = _process_crops_tokenizing_once(processor, text, images, model, dtype)
        elif images and model.item_layout == SEQUENCE and _normalizes_alone(model):
            outputs = _process_sequence_in_dtype(processor, text, images, model, dtype)
        elif images:
            outputs = processor(text=[text], images=images, **kwargs)
        else:
            outputs = patches.tokenizer_of(processor)(text, return_tensors="pt", add_special_tokens=False)
    token_ids = np.ascontiguousarray(outputs["input_ids"][0].numpy())
    splits = [_split_tiles(processor, image) for image in images] if model.item_layout == SPLIT else []
    if splits:
        # Idefics3's image sequences hold text tokens, so they are found as the ids vLLM writes.
        placeholders = item_layouts.ordered_placeholders(
            token_ids, [_split_tokens(processor, rows, columns) for _, rows, columns in splits]
        )
    else:
        placeholders = _placeholders(token_ids, model) if images else []
    if len(placeholders) < len(images) and model.item_layout == TILES:
        # Touching images make one run; vLLM tells them apart by each one's token count.
        raise errors.BeyondFastPath("images whose placeholders touch are rendered by vLLM's code")
    if len(placeholders) != len(images):
        raise errors.Unprocessable(f"the rendered prompt has {len(placeholders)} image placeholder(s) for {len(images)} image(s)")
    _check_apart(placeholders)
    if model.item_layout == SEQUENCE:
        items = item_layouts.sequence_items(outputs, len(images), dtype)
    elif model.item_layout == ROWS:
        items = item_layouts.rows_items(outputs, len(images), dtype)
    elif model.item_layout == TILES:
        items = item_layouts.tiles_items(outputs, len(images), dtype)
    elif model.item_layout == CROPS:
        items = item_layouts.crops_items(outputs, placeholders, dtype, model.crop_ids[1], model.tokens_per_crop)
    elif model.item_layout == SPLIT:
        items = item_layouts.split_items(outputs, [max(tiles, 1) for tiles, _, _ in splits], dtype)
    else:
        items = item_layouts.grid_items(outputs, len(images), dtype)
    hashes = [wire_format.mm_hash(model.model_id, "image", identity, {}) for identity in encoded]
    return Rendered(token_ids, hashes, placeholders, items, request)


def render_audio(processor: Any, request: chat_request.RenderRequest, model: ModelFacts, limits: Limits) -> Rendered:
    """A request with audio clips (no images): the processor's Whisper features per clip, each
    clip's run of audio tokens its placeholder, as vLLM's Qwen2-Audio code renders it."""
    import numpy as np

    rate = model.sampling_rate
    assert rate is not None and model.audio_token_id is not None, "checked before processing"
    clips = []
    for source in request.audio:
        assert source.data is not None, "fetched before processing"
        clips.append(decode_clip(source.data, source.what, rate, limits))
    text = _prompt_text(processor, request, limits)
    with errors.processor_call():
        # vLLM's arguments: the feature extractor's rate, and clips truncated to its window.
        outputs = processor(
            text=[text], audio=clips, sampling_rate=rate, truncation=True, return_tensors="pt", add_special_tokens=False
        )
    token_ids = np.ascontiguousarray(outputs["input_ids"][0].numpy())
    placeholders = wire_format.placeholder_runs(token_ids, model.audio_token_id)
    if len(placeholders) != len(clips):
        raise errors.Unprocessable(f"the rendered prompt has {len(placeholders)} audio placeholder(s) for {len(clips)} clip(s)")
    items = item_layouts.audio_items(outputs, len(clips), model.dtype)
    hashes = [wire_format.mm_hash(model.model_id, chat_request.AUDIO, clip, {}) for clip in clips]
    return Rendered(token_ids, hashes, placeholders, items, request, modality=chat_request.AUDIO)


def _process_tokenizing_once(processor: Any, text: str, images: list[Any], model: ModelFacts) -> dict[str, Any]:
    """The processor's outputs, with the prompt tokenized before its placeholders are expanded.

    A Qwen2-VL processor repeats each image placeholder ``grid_t * grid_h * grid_w / merge**2``
    times in the text and tokenizes the result: 1230 special tokens for a 1280x960 image, and then
    its Python checks over all of them. vLLM tokenizes the prompt with one placeholder per image and
    repeats the placeholder's id instead; special tokens never merge with their neighbours, so
    the ids are the same (the compatibility tests compare them), for a fraction of the cost.
    """
    image_processor = processor.image_processor
    image_outputs = dict(image_processor(images=images, return_tensors="pt", **model.processor_kwargs))
    counts = (image_outputs["image_grid_thw"].prod(-1) // image_processor.merge_size**2).numpy()
    return _with_image_tokens_repeated(processor, text, model, counts, image_outputs)


def _process_tiles_tokenizing_once(
    processor: Any, text: str, images: list[Any], model: ModelFacts, dtype: str | None
) -> dict[str, Any]:
    """LLaVA-OneVision's outputs, its tiles normalized into the model's dtype where they can be
    (``_tiles_in_dtype``), with the prompt tokenized before its image tokens are repeated: its
    processor writes about 7,300 of them for a 1280x960 image and tokenizes them all. Each image's
    count is the one the processor writes (its own ``replace_image_token``)."""
    image_outputs = _tiles_in_dtype(processor.image_processor, images, model, dtype)
    if image_outputs is None:
        image_outputs = dict(processor.image_processor(images=images, return_tensors="pt", **model.processor_kwargs))
    token = processor.image_token
    counts = [len(processor.replace_image_token(image_outputs, image_idx=index)) // len(token) for index in range(len(images))]
    return _with_image_tokens_repeated(processor, text, model, counts, image_outputs)


def _tiles_in_dtype(image_processor: Any, images: list[Any], model: ModelFacts, dtype: str | None) -> dict[str, Any] | None:
    """LLaVA-OneVision's image outputs with its tiles normalized by ``model_pixels``; None where
    the library's own call must answer (its normalizing arguments given, or images with different
    tile counts that it is told not to pad).

    The image processor pads each image's tiles to the most any image has, with zeros after its
    normalizing: here the uint8 tiles come unpadded and the missing ones are zeros in the answer.
    """
    import torch
    from transformers import BatchFeature

    call = model.processor_kwargs
    if not _normalizes_alone(model):
        return None
    raw = image_processor(images=images, return_tensors=None, **{**call, **model_pixels.SKIP_NORMALIZE, "do_pad": False})
    counts = [len(tiles) for tiles in raw["pixel_values"]]
    most = max(counts)
    if not call.get("do_pad", image_processor.do_pad) and min(counts) != most:
        return None
    flat = model_pixels.normalized(image_processor, [tile for tiles in raw["pixel_values"] for tile in tiles], dtype, call)
    if min(counts) == most:
        pixels = flat.view(len(counts), most, *flat.shape[1:])
    else:
        pixels = torch.zeros((len(counts), most, *flat.shape[1:]), dtype=flat.dtype)
        start = 0
        for index, count in enumerate(counts):
            pixels[index, :count] = flat[start : start + count]
            start += count
    sizes = BatchFeature({"image_sizes": raw["image_sizes"], "batch_num_images": raw["batch_num_images"]}, tensor_type="pt")
    return {"pixel_values": pixels, **sizes}


def _process_sequence_in_dtype(
    processor: Any, text: str, images: list[Any], model: ModelFacts, dtype: str | None
) -> dict[str, Any]:
    """Gemma 3's outputs from its processor's own call, asked for lists and uint8 images, each image
    then normalized into the model's dtype (``model_pixels``).

    Asked for tensors, the processor counts its image tokens one tensor element at a time (its own
    ``_check_special_mm_tokens``: a Python comparison per token) and the image processor stacks its
    float32 images before vLLM casts them to the model's dtype: about a tenth of the CPU per request
    on the two, for the same ids and the same arithmetic.
    """
    import numpy as np
    import torch

    call = {"return_tensors": None, "add_special_tokens": False, **model.processor_kwargs}
    outputs = processor(text=[text], images=images, **{**call, **model_pixels.SKIP_NORMALIZE})
    pixels = model_pixels.normalized(processor.image_processor, list(outputs["pixel_values"]), dtype, model.processor_kwargs)
    ids = torch.from_numpy(np.asarray(outputs["input_ids"], dtype=np.int64))
    return {"input_ids": ids, "pixel_values": pixels}


def _with_image_tokens_repeated(
    processor: Any, text: str, model: ModelFacts, counts: Any, image_outputs: dict[str, Any]
) -> dict[str, Any]:
    """The prompt's ids with each image's one token repeated its count of times, beside the image outputs."""
    import numpy as np
    import torch

    ids, positions = _image_token_positions(processor, text, model.image_token_id, len(counts))
    repeats = np.ones(len(ids), dtype=np.int64)
    repeats[positions] = counts
    return {"input_ids": torch.from_numpy(np.repeat(ids, repeats))[None], **image_outputs}


def _image_token_positions(processor: Any, text: str, token_id: Any, count: int) -> tuple[Any, Any]:
    """The prompt's ids, tokenized with one ``token_id`` per image, and where those are; a count
    other than the images' is refused, as a processor refuses it."""
    import numpy as np

    ids = np.asarray(processor.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    positions = np.flatnonzero(ids == token_id)
    if len(positions) != count:
        raise errors.Unprocessable(f"the rendered prompt has {len(positions)} image placeholder(s) for {count} image(s)")
    return ids, positions


def _row_block(processor: Any) -> int:
    """The side in pixels of one of Pixtral's image tokens (its patch times its spatial merge), or 0
    where the processor does not say."""
    patch, merge = getattr(processor, "patch_size", None), getattr(processor, "spatial_merge_size", None)
    if type(patch) is not int or type(merge) is not int or patch <= 0 or merge <= 0:
        return 0
    return patch * merge


def _process_rows_tokenizing_once(processor: Any, text: str, images: list[Any], model: ModelFacts, block: int) -> dict[str, Any]:
    """Pixtral's outputs, with the prompt tokenized before its image tokens are written out.

    Pixtral's processor writes each image's rows of image tokens, a break after each row and the
    end token in place of the last break into the text, about 1,650 special tokens for a 1280x960
    image, and tokenizes them all. Here the prompt is tokenized with its one image token per image
    and each is replaced by the same ids; special tokens never merge with their neighbours, so the
    ids are equal (the compatibility tests compare them with vLLM's). The image processor gets what
    the processor gives it: the token's side (``block``) as the patch size to resize to.
    """
    import numpy as np

    image_outputs = dict(
        processor.image_processor(images=images, return_tensors="pt", patch_size=block, **model.processor_kwargs)
    )
    image_id, break_id, end_id = model.row_ids
    ids, positions = _image_token_positions(processor, text, image_id, len(images))
    expansions = []
    for height, width in image_outputs["image_sizes"].tolist():
        rows = np.full((height // block, width // block + 1), image_id, dtype=np.int64)
        rows[:, -1] = break_id
        expanded = rows.reshape(-1)
        expanded[-1] = end_id
        expansions.append(expanded)
    return {"input_ids": _spliced(ids, positions, expansions), **image_outputs}


def _process_split_tokenizing_once(processor: Any, text: str, images: list[Any], model: ModelFacts) -> dict[str, Any]:
    """Idefics3's outputs, with the prompt tokenized before its images are written out.

    Idefics3's processor writes each image as its tiles' and global view's tokens (about 2,300 for
    a 1280x960 image), tokenizes them all and then maps each image's characters back to tokens.
    Here the prompt is tokenized with one image token per image and each is replaced by the ids
    of the text the processor writes for it, from the rows and columns its image processor made;
    that text begins and ends with a special token, so its ids do not depend on their neighbours
    (the compatibility tests compare them with vLLM's).
    """
    import numpy as np

    image_outputs = dict(
        processor.image_processor(images=[images], return_tensors="pt", return_row_col_info=True, **model.processor_kwargs)
    )
    rows, columns = image_outputs.pop("rows")[0], image_outputs.pop("cols")[0]
    ids, positions = _image_token_positions(processor, text, model.image_token_id, len(images))
    expansions = [
        np.asarray(_split_tokens(processor, int(image_rows), int(image_columns)), dtype=np.int64)
        for image_rows, image_columns in zip(rows, columns, strict=True)
    ]
    return {"input_ids": _spliced(ids, positions, expansions), **image_outputs}


def _normalizes_alone(model: ModelFacts) -> bool:
    """Whether ``model_pixels`` may normalize this model's patches: only where its call arguments
    leave rescaling and normalizing to the image processor's own settings or skip both."""
    given = {name: model.processor_kwargs[name] for name in model_pixels.NORMALIZE_STEPS if name in model.processor_kwargs}
    return not given or given == model_pixels.SKIP_NORMALIZE


def _process_crops_tokenizing_once(
    processor: Any, text: str, images: list[Any], model: ModelFacts, dtype: str | None
) -> dict[str, Any]:
    """InternVL's outputs, its crops normalized into the model's dtype (``model_pixels``) and its
    prompt tokenized before its images are written out.

    InternVL's processor writes each image as its start token, 256 context tokens per crop and its
    end token (about 3,300 tokens for a 1280x960 image in 13 crops) and tokenizes them all. Here the
    prompt is tokenized with its one context token per image and each is replaced by the same ids;
    all three are special tokens, which never merge with their neighbours (the compatibility tests
    compare the ids with vLLM's). The image processor crops as the processor asks it to.
    """
    import numpy as np

    call = {"crop_to_patches": True, **model.processor_kwargs}
    image_outputs = processor.image_processor(images=images, return_tensors=None, **{**call, **model_pixels.SKIP_NORMALIZE})
    crops = list(image_outputs["num_patches"])
    start_id, context_id, end_id = model.crop_ids
    ids, positions = _image_token_positions(processor, text, context_id, len(images))
    expansions = []
    for count in crops:
        expanded = np.full(count * model.tokens_per_crop + 2, context_id, dtype=np.int64)
        expanded[0], expanded[-1] = start_id, end_id
        expansions.append(expanded)
    pixels = model_pixels.normalized(processor.image_processor, image_outputs["pixel_values"], dtype, call)
    return {"input_ids": _spliced(ids, positions, expansions), "pixel_values": pixels}


def _spliced(ids: Any, positions: Any, expansions: list[Any]) -> Any:
    """The prompt's ids (a batch of one) with the id at each of ``positions`` replaced by its expansion."""
    import numpy as np
    import torch

    pieces, start = [], 0
    for position, expanded in zip(positions.tolist(), expansions, strict=True):
        pieces += [ids[start:position], expanded]
        start = position + 1
    pieces.append(ids[start:])
    return torch.from_numpy(np.concatenate(pieces))[None]


def _split_tiles(processor: Any, image: Any) -> tuple[int, int, int]:
    """Idefics3's (tiles, rows, columns) for an image of this size, as vLLM asks the image processor."""
    width, height = decoding.image_size(image)
    tiles, rows, columns = processor.image_processor.get_number_of_image_patches(height, width, {})
    return int(tiles), int(rows), int(columns)


@functools.lru_cache(maxsize=256)
def _split_text_tokens(tokenizer: Any, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=False))


def _split_tokens(processor: Any, rows: int, columns: int) -> tuple[int, ...]:
    """The ids vLLM replaces an Idefics3 image with: a tile placeholder per row and column, a
    newline after each row, a newline, the global view's placeholder, the closing token."""
    image = processor.image_token * processor.image_seq_len
    fake = processor.fake_image_token
    global_view = fake + processor.global_image_tag + image
    if rows == 0 and columns == 0:
        return _split_text_tokens(processor.tokenizer, global_view + fake)
    grid = "".join(
        "".join(f"{fake}<row_{row + 1}_col_{column + 1}>{image}" for column in range(columns)) + "\n" for row in range(rows)
    )
    return _split_text_tokens(processor.tokenizer, grid + "\n" + global_view + fake)


def _check_apart(placeholders: list[dict[str, int]]) -> None:
    """vLLM's check of its request features: placeholders in order, none overlapping. Gemma 3's
    image sequences overlap where two images touch (the newlines between them are one token)."""
    for before, after in itertools.pairwise(placeholders):
        if after["offset"] < before["offset"] + before["length"]:
            raise errors.BadRequest(
                "mm_placeholders must be globally non-overlapping and sorted: write text between images that touch"
            )


def _placeholders(token_ids: Any, model: ModelFacts) -> list[dict[str, int]]:
    if model.item_layout == SEQUENCE:
        return item_layouts.sequence_placeholders(token_ids, model.image_sequence, model.newline_ids)
    if model.item_layout == ROWS:
        return item_layouts.rows_placeholders(token_ids, model.row_ids)
    if model.item_layout == CROPS:
        return item_layouts.crops_placeholders(token_ids, model.crop_ids)
    # A model without an image token renders no placeholder: the caller then refuses the images.
    return wire_format.placeholder_runs(token_ids, model.image_token_id) if model.image_token_id is not None else []


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

    @property
    def reserved(self) -> tuple[str, ...]:
        """The texts a prompt may not contain: the image placeholder (images come from parts)."""
        return (self.facts.image_token,) if self.facts.image_token else ()

    def decode(self, body: bytes) -> chat_request.RenderRequest:
        if self.chat:
            request = chat_request.parse_chat(
                body, reserved=self.reserved, max_images=self.limits.max_images, max_audio=self.limits.max_audio_items
            )
        else:
            request = chat_request.parse_completion(body, reserved=self.reserved)
        return self.checked(request)

    def checked(self, request: chat_request.RenderRequest) -> chat_request.RenderRequest:
        """``request`` if this model renders it: the model served, images only where it takes them."""
        check_model(self.model, request.model)
        if request.images and not self.facts.takes_images:
            raise errors.BadRequest(f"this model ({self.facts.processor_class}) takes no images")
        if request.audio and (self.model.audio_token_id is None or request.images):
            # Audio parts went to vLLM's code before this path rendered any: a model without a
            # native audio path keeps vLLM's answer, error or not.
            what = "images and audio in one request" if request.images else f"{self.facts.processor_class}'s audio"
            raise errors.BeyondFastPath(f"the native path does not render {what}")
        if request.images and self.model.item_layout is None:
            raise errors.BeyondFastPath(
                f"the native path does not render {self.facts.processor_class}'s images (its families: "
                f"{', '.join(sorted(choice.NATIVE_FAMILIES))}; Gemma 3 without pan-and-scan)"
            )
        return request

    def needs_fetch(self, request: chat_request.RenderRequest) -> bool:
        return bool(request.urls)

    async def fetch(self, request: chat_request.RenderRequest) -> chat_request.RenderRequest:
        pending = request.urls
        bodies = await asyncio.gather(*(self.fetcher.fetch(source.url or "", source.what) for _, source in pending))
        return request.fetched({index: body for (index, _), body in zip(pending, bodies, strict=True)})

    def process(self, processor: Any, request: chat_request.RenderRequest) -> Rendered:
        if request.audio:
            return render_audio(processor, request, self.model, self.limits)
        return render(processor, request, self.facts, self.model, self.limits)

    def encode(self, rendered: Rendered) -> pipeline.AnswerBody:
        prefix = "chatcmpl-" if self.chat else "cmpl-"
        request_id = prefix + (self.request_id or rendered.request.request_id or uuid.uuid4().hex)
        body, blobs = generate_request(rendered, self.model, request_id)
        return encode_answer(body if self.chat else [body], blobs)


def check_model(model: ModelFacts, asked: str | None) -> None:
    """vLLM's check of a request's ``model``: absent, or the name this server serves."""
    if asked is not None and asked != model.served_name:
        raise ModelNotFound(f"The model `{asked}` does not exist.")


class ModelNotFound(errors.RequestError):
    status = 404
    code = "model_not_found"
    #: The request field at fault, in vLLM's error JSON.
    param = "model"
