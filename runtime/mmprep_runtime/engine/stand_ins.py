"""Exact, cheaper stand-ins for steps of transformers' processor and tokenizer calls.

Every multimodal processor call spends a few hundred microseconds per request in pure Python
over the whole token sequence (about 1600 tokens for one 1280x960 image with Qwen2-VL), holding
the GIL:

- ``_check_special_mm_tokens`` (``ProcessorMixin``): turns ``input_ids`` into Python lists to
  count each placeholder id, and runs a regular expression over the text to count the
  placeholders there;
- ``create_mm_token_type_ids`` (``ProcessorMixin``): turns ``input_ids`` into lists, then NumPy
  arrays, then lists again, to mark which tokens belong to which modality; ``BatchFeature`` then
  turns those lists into a tensor with ``torch.tensor`` (0.14 ms for 1600 ids);
- ``_encode_plus`` (the tokenizer, ``TokenizersBackend``): the Rust tokenizer releases the GIL,
  but its ids and attention mask come back as Python lists that ``torch.tensor`` converts one
  element at a time (0.14 ms each; through NumPy 0.02 ms).

One stand-in moves pixels rather than ids: ``patchify`` (Qwen2-VL's torchvision image processor,
which Qwen2.5-VL and Qwen3-VL load too, and GLM-4.1V's, a copy of the same steps) cuts the resized
image into the model's flat patch rows with one ``reshape`` of a permuted view that also repeats
each patch ``temporal_patch_size`` times. Its inner runs are one patch row (14 pixels), and torch's
strided copy spends about 8 ms on a 1280x960 image there, a third of the native path's CPU per
request. The stand-in makes the same bytes in two NumPy copies: the patch rows once, then each
whole patch again for its repeats. The same classes, and Gemma 3's and Pixtral's torchvision image
processors, keep a decoded image in the memory it was decoded into. Decoders write pixels interleaved (height,
width, channel) and hand the processor a channel-first view of them; the library's
``process_image`` copies that view into channel-first memory (about 2 ms at 1280x960), and torch's
antialiased uint8 resize then packs it back into interleaved pixels for its vectorized kernel and
unpacks its output again (Gemma 3's bilinear resize too). Given the interleaved view it resizes in
half the time (the same kernel on the same pixels: the same bytes), and ``patchify`` reads any
layout; Gemma 3's and Pixtral's ``rescale_and_normalize`` makes the resized pixels channel-first before its float
arithmetic, which runs at half speed over interleaved memory.
InternVL's image processor (``crop_image_to_patches``, GOT-OCR2's) and LLaVA-OneVision's
(``_get_image_patches``) cut the resized image into crops or tiles, views of interleaved memory,
and stack them with ``torch.stack``, which transposes each one short run at a time (LLaVA-OneVision
first pads the whole resized image with zeros: one more copy). Their stand-ins deinterleave the
resized image once (``planar``: OpenCV's split, 0.2 ms for 1536x1152, else NumPy's copy) and copy
each crop's channel-first rows, LLaVA-OneVision's tiles straight from the resized image with zeros
where it pads: the same bytes, 2.4-3.2 ms less per 1280x960 image. bfloat16 and other devices stay
with torch, as the library does; ``rescale_and_normalize`` deinterleaves through ``planar`` too.
Whisper's feature extractor (Qwen2-Audio's) pads every clip with silence to its 30 s window and
runs its STFT over all of it; its stand-in runs the STFT over the frames that hear the clip and
writes the silent frames' magnitudes as the exact zeros they are.
An image processor (or feature extractor) serializes its instance attributes as its config, so these are not bound on
the instance: the instance's class becomes a subclass of the same name that overrides only
these steps (a deep copy keeps it; the config and the class name stay the library's).

Little for one thread, a lot for the pool: while one worker holds the GIL the other waits. On 2
cores two workers gave 1.64x one worker before the first two stand-ins; measured in
``benchmarks/runtime``. The stand-ins count, mark and convert with tensor and array operations.

They only ever *agree* faster. Each handles the common case (a 2-D integer tensor of ids, plain
strings without the chat template's control marker, ``return_tensors="pt"``) and hands every
other case, and every mismatch, to transformers' own method, so the answers and the error
messages are the library's. The one visible difference: given a tensor of ids,
``create_mm_token_type_ids`` answers the int64 tensor that ``BatchFeature`` would have made of the
library's lists. Each is bound to its instance with ``types.MethodType`` (a deep copy rebinds it to
the copy) and only where the class uses the library's implementation: a processor or tokenizer
that overrides a step keeps its own.
"""

from __future__ import annotations

import functools
import importlib
import types
from typing import Any, Final

from mmprep_runtime.engine import patches, planar

CHECK_SPECIAL_MM_TOKENS: Final = "_check_special_mm_tokens"
CREATE_MM_TOKEN_TYPE_IDS: Final = "create_mm_token_type_ids"
ENCODE_PLUS: Final = "_encode_plus"
PATCHIFY: Final = "patchify"
PROCESS_IMAGE: Final = "process_image"
RESCALE_AND_NORMALIZE: Final = "rescale_and_normalize"
PAD_FOR_BATCHING: Final = "_pad_for_batching"
EXTRACT_FBANK: Final = "_torch_extract_fbank_features"
CROP_IMAGE_TO_PATCHES: Final = "crop_image_to_patches"
GET_IMAGE_PATCHES: Final = "_get_image_patches"
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


def _library_class(module: str, name: str) -> type | None:
    """transformers' class ``name`` from ``transformers.models.{module}``, or None if it moved."""
    try:
        found = getattr(importlib.import_module(f"transformers.models.{module}"), name, None)
    except ImportError:  # pragma: no cover - torchvision or the class is missing
        return None
    return found if isinstance(found, type) else None


@functools.cache
def _image_processor_stand_ins() -> dict[type, type]:
    """Each library image processor class that has stand-ins -> a subclass of the same name with them."""
    pixels = {PROCESS_IMAGE: _process_image, RESCALE_AND_NORMALIZE: _rescale_and_normalize}
    patches_too = {PATCHIFY: _patchify, PROCESS_IMAGE: _process_image}
    padded_batch = {**pixels, PAD_FOR_BATCHING: _pad_for_batching}
    crops = {**pixels, CROP_IMAGE_TO_PATCHES: _crop_image_to_patches}
    tiles = {**pixels, GET_IMAGE_PATCHES: _get_image_patches}
    # By module under transformers.models and class; GLM-4.1V's is its own copy of Qwen2-VL's steps.
    image_processors: list[tuple[str, str, dict[str, Any]]] = [
        ("qwen2_vl.image_processing_qwen2_vl", "Qwen2VLImageProcessor", patches_too),
        ("glm4v.image_processing_glm4v", "Glm4vImageProcessor", patches_too),
        ("gemma3.image_processing_gemma3", "Gemma3ImageProcessor", pixels),
        ("pixtral.image_processing_pixtral", "PixtralImageProcessor", padded_batch),
        ("llava_onevision.image_processing_llava_onevision", "LlavaOnevisionImageProcessor", tiles),
        ("got_ocr2.image_processing_got_ocr2", "GotOcr2ImageProcessor", crops),
        ("idefics3.image_processing_idefics3", "Idefics3ImageProcessor", pixels),
    ]
    classes = {}
    for module, name, steps in image_processors:
        library = _library_class(module, name)
        if library is not None and all(getattr(library, step, None) is not None for step in steps):
            classes[library] = type(library.__name__, (library,), {**steps, "__module__": __name__, "__doc__": library.__doc__})
    return classes


def _numpy_dtypes() -> tuple[Any, ...]:
    """The pixel dtypes the stand-ins copy through NumPy (it has no bfloat16)."""
    import torch

    return (torch.uint8, torch.float32, torch.float16, torch.float64)


def _numpy_holds(pixels: Any, dims: int) -> bool:
    """Whether ``pixels`` is a ``dims``-dimensional CPU tensor of values NumPy can copy as they are."""
    import torch

    return (
        isinstance(pixels, torch.Tensor)
        and pixels.dim() == dims
        and pixels.device.type == "cpu"
        and not pixels.requires_grad
        and pixels.dtype in _numpy_dtypes()
    )


@functools.cache
def _feature_extractor_stand_ins() -> dict[type, type]:
    """Whisper's feature extractor (Qwen2-Audio's) -> a subclass of the same name with its stand-in."""
    library = _library_class("whisper.feature_extraction_whisper", "WhisperFeatureExtractor")
    if library is None or getattr(library, EXTRACT_FBANK, None) is None:
        return {}
    steps = {EXTRACT_FBANK: _torch_extract_fbank_features, "__module__": __name__, "__doc__": library.__doc__}
    return {library: type(library.__name__, (library,), steps)}


@functools.cache
def _tokenizers_backend() -> type | None:
    """transformers' tokenizer class over the Rust ``tokenizers``, or None if it moved."""
    try:
        from transformers import tokenization_utils_tokenizers
    except ImportError:  # pragma: no cover - the runtime extra is missing
        return None
    return getattr(tokenization_utils_tokenizers, "TokenizersBackend", None)


def _integer_id_matrix(value: Any) -> bool:
    import torch

    return (
        isinstance(value, torch.Tensor)
        and value.dim() == 2
        and not value.is_floating_point()
        and not value.is_complex()
        and value.dtype != torch.bool
    )


def _check_special_mm_tokens(self: Any, text: Any, text_inputs: Any, modalities: list[str]) -> None:
    mixin, marker = _base()  # type: ignore[misc]  # not None: apply() bound this stand-in
    library = getattr(mixin, CHECK_SPECIAL_MM_TOKENS)
    input_ids = text_inputs["input_ids"]
    plain = isinstance(text, list) and all(isinstance(sample, str) and marker not in sample for sample in text)
    if not plain or not _integer_id_matrix(input_ids) or input_ids.shape[0] != len(text):
        library(self, text, text_inputs, modalities)
        return
    for modality in modalities:
        token = getattr(self, f"{modality}_token", None)
        token_id = getattr(self, f"{modality}_token_id", None)
        if token is None or token_id is None:
            continue
        if not isinstance(token, str) or not token or type(token_id) is not int:
            library(self, text, text_inputs, modalities)
            return
        # Without the marker, the library's regex (the token not preceded by the marker) finds
        # exactly the non-overlapping occurrences that str.count counts.
        if (input_ids == token_id).sum(dim=1).tolist() != [sample.count(token) for sample in text]:
            library(self, text, text_inputs, modalities)  # it raises, with its own message
            return


def _create_mm_token_type_ids(self: Any, input_ids: Any) -> Any:
    import torch

    mixin, _ = _base()  # type: ignore[misc]  # not None: apply() bound this stand-in
    library = getattr(mixin, CREATE_MM_TOKEN_TYPE_IDS)
    if not _integer_id_matrix(input_ids):
        return library(self, input_ids)
    # int64, as ``torch.tensor`` makes of the library's lists: ids that came as a tensor were
    # asked for as tensors, and the BatchFeature around them converts the lists anyway.
    marked = torch.zeros(input_ids.shape, dtype=torch.int64)
    for modality, value in _MODALITY_TYPES:
        # The library matches with np.isin, where a None id matches nothing.
        wanted = [token_id for token_id in getattr(self, f"{modality}_token_ids") if token_id is not None]
        if any(type(token_id) is not int for token_id in wanted):
            return library(self, input_ids)
        if wanted:
            marked[torch.isin(input_ids, torch.tensor(wanted, dtype=input_ids.dtype))] = value
    return marked


def _encode_plus(self: Any, *args: Any, **kwargs: Any) -> Any:
    import numpy as np
    import torch

    library = getattr(_tokenizers_backend(), ENCODE_PLUS)
    text = kwargs.get("text")
    wants_torch = isinstance(kwargs.get("return_tensors"), str) and kwargs["return_tensors"] == "pt"
    if (
        args
        or not wants_torch
        or kwargs.get("text_pair") is not None
        or kwargs.get("is_split_into_words")
        or kwargs.get("return_overflowing_tokens")
    ):
        return library(self, *args, **kwargs)
    if isinstance(text, str):
        # A batch of one: with tensors the library keeps the batch axis for a single text too.
        text = [text]
    elif not isinstance(text, (list, tuple)) or not all(isinstance(sample, str) for sample in text):
        return library(self, *args, **kwargs)
    encoded = library(self, **{**kwargs, "text": text, "return_tensors": None})
    for key, value in list(encoded.items()):
        if not isinstance(value, list):
            continue
        try:
            matrix = np.array(value)
        except ValueError:  # ragged: the library's conversion below raises its own error
            continue
        # Only what torch.tensor would make int64 too: Python ints within int64, rows of one length.
        if matrix.dtype == np.int64 and matrix.ndim == 2:
            encoded[key] = torch.from_numpy(matrix)
    return encoded.convert_to_tensors(tensor_type="pt")


def _patchify(self: Any, images: Any, patch_size: int, merge_size: int, temporal_patch_size: int) -> tuple[Any, int, int]:
    import numpy as np
    import torch

    library = getattr(type(self).__mro__[1], PATCHIFY)
    common = _numpy_holds(images, 4) and all(type(n) is int and n > 0 for n in (patch_size, merge_size, temporal_patch_size))
    if not common:
        return library(self, images, patch_size, merge_size, temporal_patch_size)  # type: ignore[no-any-return]
    batch, channels, height, width = images.shape
    block = patch_size * merge_size
    if height % block or width % block:
        # The library's reshape raises for these; its error is the answer.
        return library(self, images, patch_size, merge_size, temporal_patch_size)  # type: ignore[no-any-return]
    grid_h, grid_w = height // patch_size, width // patch_size
    rows = images.numpy().reshape(
        batch, channels, grid_h // merge_size, merge_size, patch_size, grid_w // merge_size, merge_size, patch_size
    )
    # [batch, grid_h/merge, grid_w/merge, merge, merge, channel, patch, patch], as the library orders it.
    rows = rows.transpose(0, 2, 5, 3, 6, 1, 4, 7)
    blocks = (batch, grid_h // merge_size, grid_w // merge_size, merge_size, merge_size, channels)
    flat = np.empty((*blocks, temporal_patch_size, patch_size, patch_size), dtype=rows.dtype)
    flat[..., 0, :, :] = rows
    for repeat in range(1, temporal_patch_size):
        flat[..., repeat, :, :] = flat[..., 0, :, :]
    patches = torch.from_numpy(flat.reshape(batch, grid_h * grid_w, channels * temporal_patch_size * patch_size * patch_size))
    return patches, grid_h, grid_w


def _process_image(
    self: Any, image: Any, do_convert_rgb: Any = None, input_data_format: Any = None, device: Any = None, **kwargs: Any
) -> Any:
    import torch

    # The library's step: the class this stand-in's class derives from.
    library = getattr(type(self).__mro__[1], PROCESS_IMAGE)
    # An RGB image as a channel-first CPU tensor: the library infers the first axis as the channels
    # (the last one is none of 1, 3 or 4), keeps three channels as they are, and only makes the
    # memory contiguous. Everything else is the library's.
    rgb_first = (
        isinstance(image, torch.Tensor)
        and image.dim() == 3
        and image.shape[0] == 3
        and image.shape[-1] not in (1, 3, 4)
        and image.device.type == "cpu"
        and input_data_format is None
        and device is None
    )
    if not rgb_first:
        return library(self, image, do_convert_rgb=do_convert_rgb, input_data_format=input_data_format, device=device, **kwargs)
    return image


def _rescale_and_normalize(
    self: Any,
    images: Any,
    do_rescale: Any,
    rescale_factor: Any,
    do_normalize: Any,
    image_mean: Any,
    image_std: Any,
) -> Any:
    import torch

    library = getattr(type(self).__mro__[1], RESCALE_AND_NORMALIZE)
    # The resized images are in the interleaved memory ``process_image`` kept; the library's
    # subtraction and division (elementwise, exact per element) then run at half speed over it,
    # broadcasting the channel means across strides. Channel-first memory first: the same values.
    # Where neither step runs (uint8 pixels for the GPU) the library returns the images as they
    # are, and so does this: a copy here would be one more of every pixel.
    if (
        (do_rescale or do_normalize)
        and isinstance(images, torch.Tensor)
        and images.device.type == "cpu"
        and not images.is_contiguous()
    ):
        images = planar.channel_first(images)
    return library(self, images, do_rescale, rescale_factor, do_normalize, image_mean, image_std)


def _pad_for_batching(self: Any, pixel_values: Any, image_sizes: Any) -> Any:
    import torch

    library = getattr(type(self).__mro__[1], PAD_FOR_BATCHING)
    # Pixtral pads every image to the batch's largest and stacks them: two copies of every pixel.
    # Images that are all of that size need no padding (the library pads them by zero): one image
    # is a batch of one as it is, several are stacked once. The same values, dtype and device.
    tensors = isinstance(pixel_values, list) and all(isinstance(image, torch.Tensor) for image in pixel_values)
    if not tensors or not pixel_values or len(image_sizes) != len(pixel_values):
        return library(self, pixel_values, image_sizes)
    shape = tuple(pixel_values[0].shape)
    same = all(
        image.dim() == 3 and tuple(image.shape) == shape and tuple(int(n) for n in size) == shape[-2:]
        for image, size in zip(pixel_values, image_sizes, strict=True)
    )
    if not same:
        return library(self, pixel_values, image_sizes)
    return pixel_values[0].unsqueeze(0) if len(pixel_values) == 1 else torch.stack(pixel_values)


def _stacked_through_numpy(views: list[Any], dim: int) -> Any:
    """``torch.stack(views, dim)``, each view copied by NumPy; None where NumPy cannot hold them
    (another device, a dtype NumPy lacks, views of different shapes or dtypes).

    The views are crops of an image, each copied whole: where they are channel-first views of
    interleaved memory (the library's own crops), NumPy's transposing copy takes about 40% of
    torch's time (13 crops of 448x448: 1.0 ms against 2.6). Copies of values: the same bytes."""
    import numpy as np
    import torch

    first = views[0] if views else None
    if not isinstance(first, torch.Tensor) or not all(
        _numpy_holds(view, first.dim()) and view.dtype == first.dtype and view.shape == first.shape for view in views
    ):
        return None
    shape = tuple(first.shape)
    out = np.empty((*shape[:dim], len(views), *shape[dim:]), dtype=first.numpy().dtype)
    for index, view in enumerate(views):
        out[(slice(None),) * dim + (index,)] = view.numpy()
    return torch.from_numpy(out)


def _crop_image_to_patches(
    self: Any,
    images: Any,
    min_patches: int,
    max_patches: int,
    use_thumbnail: bool = True,
    patch_size: Any = None,
    resample: Any = None,
) -> Any:
    import torch

    # InternVL's (GOT-OCR2's) crops: the library's steps (its grid, its resizes, its crops and
    # thumbnail), stacked by ``_stacked_through_numpy`` where the library stacks with torch.
    library_class = type(self).__mro__[1]
    library = getattr(library_class, CROP_IMAGE_TO_PATCHES)
    canvas = getattr(importlib.import_module(library_class.__module__), "get_optimal_tiled_canvas", None)
    common = isinstance(images, torch.Tensor) and images.dim() == 4 and images.device.type == "cpu" and patch_size is not None
    if canvas is None or not common:
        return library(self, images, min_patches, max_patches, use_thumbnail, patch_size, resample)
    height, width = patch_size.height, patch_size.width
    columns, rows = canvas(tuple(images.shape[-2:]), (height, width), min_patches, max_patches)
    grid = type(patch_size)(height=height * rows, width=width * columns)
    resized = planar.channel_first(self.resize(images, grid, resample=resample))
    crops = [
        resized[..., row * height : (row + 1) * height, column * width : (column + 1) * width]
        for row in range(rows)
        for column in range(columns)
    ]
    if use_thumbnail and len(crops) != 1:
        crops.append(planar.channel_first(self.resize(images, patch_size, resample=resample)))
    stacked = _stacked_through_numpy(crops, 1)
    return stacked if stacked is not None else torch.stack(crops, dim=0).transpose(0, 1).contiguous()


def _get_image_patches(self: Any, image: Any, grid_pinpoints: Any, size: Any, patch_size: int, resample: Any) -> Any:
    # LLaVA-OneVision's tiles: the library resizes the image for the best grid, pads the whole of
    # it with zeros to the grid (a copy), cuts the padded image into tiles (views of interleaved
    # memory) and later stacks them, transposing each. Here the resized image is deinterleaved once
    # (``planar``) and each tile written once from what of it the tile covers, zeros elsewhere: the
    # same bytes. The library's own steps size and resize.
    library_class = type(self).__mro__[1]
    module = importlib.import_module(library_class.__module__)
    steps: list[Any] = [getattr(module, name, None) for name in ("select_best_resolution", "SizeDict", "ChannelDimension")]
    common = (
        _numpy_holds(image, 3)
        and isinstance(grid_pinpoints, list)
        and type(patch_size) is int
        and patch_size > 0
        and None not in steps
        and all(hasattr(self, name) for name in ("_resize_for_patching", "_get_padding_size"))
    )
    if common:
        best_of, size_dict, channels = steps
        best = best_of(tuple(image.shape[-2:]), grid_pinpoints)
        if not any(side % patch_size for side in best):
            resized = self._resize_for_patching(image, best, resample=resample, input_data_format=channels.FIRST)
            left, top, _, _ = self._get_padding_size(tuple(resized.shape[-2:]), best)
            overview = self.resize(image=image, size=size_dict(height=size[0], width=size[1]), resample=resample)
            if tuple(overview.shape) == (image.shape[0], patch_size, patch_size) and overview.dtype == resized.dtype:
                return list(_tiles_of_padded(resized, overview, best, (top, left), patch_size))
    tiles = getattr(library_class, GET_IMAGE_PATCHES)(self, image, grid_pinpoints, size, patch_size, resample)
    stacked = _stacked_through_numpy(tiles, 0) if isinstance(tiles, list) else None
    return tiles if stacked is None else list(stacked)


def _tiles_of_padded(resized: Any, first: Any, grid: tuple[int, int], offset: tuple[int, int], side: int) -> Any:
    """``first`` then the ``side``-square tiles, row by row, of a ``grid``-sized zero canvas with
    ``resized`` placed at ``offset`` (top, left), channel-first: each tile copied once from what of
    ``resized`` it covers, never the canvas."""
    import numpy as np
    import torch

    channels, height, width = resized.shape
    rows, columns = grid[0] // side, grid[1] // side
    # NumPy's zeros are the allocator's zeroed pages: no pass over the tiles before they are written.
    dtype = torch.empty((), dtype=resized.dtype).numpy().dtype
    out = np.zeros((1 + rows * columns, channels, side, side), dtype=dtype)
    planar.copy_into(first, out[0])
    source, (top, left) = planar.channel_first(resized).numpy(), offset
    for row in range(rows):
        for column in range(columns):
            y0, x0 = row * side, column * side
            ys, ye = max(y0, top), min(y0 + side, top + height)
            xs, xe = max(x0, left), min(x0 + side, left + width)
            if ys < ye and xs < xe:
                tile = out[1 + row * columns + column]
                tile[:, ys - y0 : ye - y0, xs - x0 : xe - x0] = source[:, ys - top : ye - top, xs - left : xe - left]
    return torch.from_numpy(out)


#: Stand-ins bound on the processor (``ProcessorMixin``'s steps).
_STAND_INS: Final = {
    CHECK_SPECIAL_MM_TOKENS: _check_special_mm_tokens,
    CREATE_MM_TOKEN_TYPE_IDS: _create_mm_token_type_ids,
}
#: Stand-ins bound on the processor's tokenizer (``TokenizersBackend``'s steps).
_TOKENIZER_STAND_INS: Final = {ENCODE_PLUS: _encode_plus}


def _torch_extract_fbank_features(self: Any, waveform: Any, device: str = "cpu") -> Any:
    """Whisper's log-mel spectrogram, its STFT run over the frames that hear a sample only.

    The extractor pads every clip with silence to its 30 s window, and the library's STFT and
    magnitudes cost two thirds of the call however short the clip. A frame that sees only silence
    (zeros, its reflected edge included) has a spectrum of exact zeros, so those frames' magnitudes
    are written as zeros; the mel projection, the logarithm and the clamp to the maximum then run
    over the whole window as the library runs them (the same shapes: the same kernels, the same
    bytes). Dither, another device or a single unbatched clip take the library's own step.
    """
    import numpy as np
    import torch

    library = super(type(self), self)._torch_extract_fbank_features
    hop, n_fft = self.hop_length, self.n_fft
    if device != "cpu" or self.dither != 0.0 or getattr(waveform, "ndim", 0) != 2:
        return library(waveform, device)
    frames = waveform.shape[-1] // hop  # the library keeps all of its 1 + length // hop but the last
    sounding = np.flatnonzero(waveform.any(axis=0))
    end = int(sounding[-1]) + 1 if sounding.size else 0
    # Frame t sees samples from t * hop - n_fft // 2 on: from this one on, silence only.
    silent_from = -(-(end + n_fft // 2) // hop)
    if silent_from + 2 >= frames or waveform.shape[-1] - end <= n_fft:
        return library(waveform, device)
    head = torch.from_numpy(np.ascontiguousarray(waveform[:, : silent_from * hop + n_fft])).to(device, torch.float32)
    stft = torch.stft(head, n_fft, hop, window=torch.hann_window(n_fft, device=device), return_complex=True)
    magnitudes = torch.zeros((waveform.shape[0], stft.shape[1], frames), dtype=torch.float32)
    magnitudes[..., :silent_from] = stft[..., :silent_from].abs() ** 2
    mel_spec = torch.from_numpy(self.mel_filters).to(device, torch.float32).T @ magnitudes
    log_spec = torch.clamp(mel_spec, min=1e-10).log10()
    max_val = log_spec.max(dim=2, keepdim=True)[0].max(dim=1, keepdim=True)[0]
    log_spec = torch.maximum(log_spec, max_val - 8.0)
    return ((log_spec + 4.0) / 4.0).numpy()


def _bind(target: Any, base: type | None, stand_ins: dict[str, Any]) -> list[str]:
    if base is None or not isinstance(target, base):
        return []
    applied = []
    for name, stand_in in stand_ins.items():
        library = getattr(base, name, None)
        if library is not None and getattr(type(target), name, None) is library:
            setattr(target, name, types.MethodType(stand_in, target))
            applied.append(name)
    return applied


def apply(processor: Any) -> tuple[str, ...]:
    """Bind the stand-ins where the processor's (and its tokenizer's) class uses the library's
    steps, and give a Qwen2-VL or Gemma 3 image processor the class with its stand-ins; their names. A bare
    tokenizer is its own tokenizer (``patches.tokenizer_of``)."""
    mixin = _base()
    applied = _bind(processor, mixin[0] if mixin else None, _STAND_INS)
    applied += _bind(patches.tokenizer_of(processor), _tokenizers_backend(), _TOKENIZER_STAND_INS)
    image_processor = getattr(processor, "image_processor", None)
    # Only the library's own class: a subclass may have its own steps (or depend on their layout).
    fast = _image_processor_stand_ins().get(type(image_processor))
    if fast is not None:
        image_processor.__class__ = fast
        applied += _image_steps(fast)
        # OpenCV (``planar``) is imported now, with the processor, off the event loop: a first import
        # takes about 0.7 s, which the first request or the first ``/v1/info`` would otherwise wait.
        planar.opencv_split_available()
    feature_extractor = getattr(processor, "feature_extractor", None)
    trimmed = _feature_extractor_stand_ins().get(type(feature_extractor))
    if trimmed is not None:
        feature_extractor.__class__ = trimmed
        applied.append(EXTRACT_FBANK)
    return tuple(applied)


def _image_steps(fast: type) -> list[str]:
    steps = (PATCHIFY, PROCESS_IMAGE, RESCALE_AND_NORMALIZE, PAD_FOR_BATCHING, CROP_IMAGE_TO_PATCHES, GET_IMAGE_PATCHES)
    return [name for name in steps if name in vars(fast)]


def applied(processor: Any) -> tuple[str, ...]:
    """The stand-ins bound on ``processor`` and its tokenizer (on a clone too: deep copies keep them)."""
    tokenizer = patches.tokenizer_of(processor)
    image_class = type(getattr(processor, "image_processor", None))
    fast_image_processor = image_class in _image_processor_stand_ins().values()
    trimmed = type(getattr(processor, "feature_extractor", None)) in _feature_extractor_stand_ins().values()
    return tuple(
        [name for name in _STAND_INS if isinstance(vars(processor).get(name), types.MethodType)]
        + [name for name in _TOKENIZER_STAND_INS if isinstance(getattr(tokenizer, "__dict__", {}).get(name), types.MethodType)]
        + (_image_steps(image_class) if fast_image_processor else [])
        + ([EXTRACT_FBANK] if trimmed else [])
    )
