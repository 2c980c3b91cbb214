"""The GIL-light stand-ins agree with transformers exactly, on real processors, and fall back to it."""

from __future__ import annotations

import copy
import functools
import pathlib
import re

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import processing_utils

from mmprep_runtime import cli, settings
from mmprep_runtime.engine import decoding, loading, patches, stand_ins
from mmprep_runtime.settings import ModelSettings
from mmprep_runtime.sizing import Backend
from mmprep_runtime.synthetic import media, models

MARKER = processing_utils._CONTROL_TOKEN_START
QWEN = models.QWEN_IMAGE_PLACEHOLDER
LLAVA = models.LLAVA_IMAGE_TOKEN
ALL_STAND_INS = {
    stand_ins.CHECK_SPECIAL_MM_TOKENS,
    stand_ins.CREATE_MM_TOKEN_TYPE_IDS,
    stand_ins.ENCODE_PLUS,
    stand_ins.PATCHIFY,
    stand_ins.PROCESS_IMAGE,
}


def _serve_args(*extra: str):
    return cli.build_parser().parse_args(["serve", "--model", "m", *extra])


def _load(folder: pathlib.Path, *, fast: bool, backend: Backend = Backend.AUTO):
    return loading.load_processor(ModelSettings(str(folder), backend=backend, fast_paths=fast))


def _image(width: int, height: int, seed: int) -> Image.Image:
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=generator)
    return Image.fromarray(pixels.numpy())


def _same_outputs(left, right) -> None:
    assert left.keys() == right.keys()
    for key in left:
        assert type(left[key]) is type(right[key]), key
        if isinstance(left[key], torch.Tensor):
            assert left[key].dtype == right[key].dtype and torch.equal(left[key], right[key]), key
        else:
            assert left[key] == right[key], key


@pytest.mark.parametrize(
    ("kind", "backend", "placeholder"),
    [("qwen2-vl", "torchvision", QWEN), ("qwen2-vl", "pil", QWEN), ("llava", "torchvision", LLAVA)],
)
@pytest.mark.parametrize(
    "texts",
    [
        ["describe {0}"],
        ["{0} and {0}: which is brighter?"],
        ["first {0}", "second, longer text {0} with more words"],
    ],
)
def test_outputs_are_identical_with_and_without_the_stand_ins(model_factory, kind, backend, placeholder, texts):
    folder = model_factory(kind, backend=backend)
    library, library_facts = _load(folder, fast=False)
    fast, fast_facts = _load(folder, fast=True)
    assert library_facts.fast_paths == () and fast_facts.fast_paths, "the switch decides, and the facts say so"
    assert stand_ins.applied(library) == ()
    text = [t.format(placeholder) for t in texts]
    images = [_image(96 + 32 * i, 80, seed=i) for i, t in enumerate(texts) for _ in range(t.count("{0}"))]
    kwargs = {"text": text if len(text) > 1 else text[0], "images": images, "return_tensors": "pt"}
    if len(text) > 1:
        kwargs["padding"] = True
    _same_outputs(library(**kwargs), fast(**kwargs))


def test_a_deep_copy_carries_stand_ins_bound_to_the_copy(qwen_dir):
    processor, facts = _load(qwen_dir, fast=True)
    assert set(facts.fast_paths) == ALL_STAND_INS
    clone = copy.deepcopy(processor)
    assert stand_ins.applied(clone) == facts.fast_paths
    for name in (stand_ins.CHECK_SPECIAL_MM_TOKENS, stand_ins.CREATE_MM_TOKEN_TYPE_IDS):
        assert getattr(clone, name).__self__ is clone
        assert getattr(processor, name).__self__ is processor
    assert clone.tokenizer is not processor.tokenizer
    assert getattr(clone.tokenizer, stand_ins.ENCODE_PLUS).__self__ is clone.tokenizer
    assert getattr(processor.tokenizer, stand_ins.ENCODE_PLUS).__self__ is processor.tokenizer
    assert type(clone.image_processor) is type(processor.image_processor)
    assert type(clone.image_processor).__name__ == type(_load(qwen_dir, fast=False)[0].image_processor).__name__
    repr(clone)  # the processor still serializes its config (repr builds the JSON)


def _library_error(processor, *args) -> str:
    with pytest.raises(ValueError) as caught:
        processing_utils.ProcessorMixin._check_special_mm_tokens(processor, *args)
    return str(caught.value)


def test_a_count_mismatch_raises_the_library_error_word_for_word(qwen_dir):
    processor, _ = _load(qwen_dir, fast=True)
    pad = processor.image_token_id
    text = [f"a {processor.image_token} b {processor.image_token}"]
    ids = {"input_ids": torch.tensor([[1, pad, 2, 3]])}  # as if truncated: one placeholder id lost
    expected = _library_error(processor, text, ids, ["image"])
    with pytest.raises(ValueError, match=re.escape(expected)):
        processor._check_special_mm_tokens(text, ids, ["image"])


@pytest.mark.parametrize(
    "case",
    ["marker before the token", "ids as lists", "matching counts"],
)
def test_the_check_agrees_with_the_library_on_every_kind_of_input(qwen_dir, case):
    processor, _ = _load(qwen_dir, fast=True)
    pad, token = processor.image_token_id, processor.image_token
    other = pad + 1000  # an id that is no placeholder
    if case == "marker before the token":
        # The library does not count a placeholder the chat template marked as user text.
        text, ids = [f"{MARKER}{token} and {token}"], {"input_ids": torch.tensor([[pad, other]])}
    elif case == "ids as lists":
        text, ids = [f"{token} {token}"], {"input_ids": [[pad, other, pad]]}
    else:
        text, ids = [f"{token}{token} x", "y"], {"input_ids": torch.tensor([[pad, pad, other], [other] * 3])}
    library = processing_utils.ProcessorMixin._check_special_mm_tokens
    assert library(processor, text, ids, ["image", "video"]) is None
    assert processor._check_special_mm_tokens(text, ids, ["image", "video"]) is None
    # and one id fewer is a mismatch for both
    fewer = {"input_ids": torch.tensor([[other] * 4] * len(text))}
    with pytest.raises(ValueError, match=re.escape(_library_error(processor, text, fewer, ["image"]))):
        processor._check_special_mm_tokens(text, fewer, ["image"])


def test_token_type_ids_agree_with_the_library_and_ignore_unset_ids(qwen_dir):
    processor, _ = _load(qwen_dir, fast=True)
    library = processing_utils.ProcessorMixin.create_mm_token_type_ids
    generator = torch.Generator().manual_seed(3)
    vocabulary = [processor.image_token_id, processor.video_token_id, *(processor.image_token_id + 1000 + i for i in range(3))]
    ids = torch.tensor(vocabulary)[torch.randint(0, len(vocabulary), (3, 50), generator=generator)]
    assert None in processor.audio_token_ids, "the Qwen2-VL processor has no audio token: None must match nothing"
    marked = processor.create_mm_token_type_ids(ids)
    # A tensor for a tensor: what BatchFeature makes of the library's lists.
    assert marked.dtype == torch.int64 and torch.equal(marked, torch.tensor(library(processor, ids)))
    assert set(marked.flatten().tolist()) == {0, 1, 2}
    assert torch.equal(processor.create_mm_token_type_ids(ids.to(torch.int32)), marked)
    assert processor.create_mm_token_type_ids(ids.tolist()) == library(processor, ids.tolist())


#: (batch, channels, height, width, patch, merge, temporal): Qwen2-VL and Qwen2.5-VL's 14-pixel
#: patches at a 1280x960 image's resized size, Qwen3-VL's 16-pixel ones, and odd shapes.
PATCHIFY_SHAPES = [
    (1, 3, 952, 1288, 14, 2, 2),
    (1, 3, 960, 1280, 16, 2, 2),
    (2, 3, 56, 84, 14, 2, 2),
    (1, 3, 28, 28, 14, 2, 1),
    (1, 1, 48, 96, 8, 3, 3),
]


@pytest.mark.parametrize("shape", PATCHIFY_SHAPES)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.float16])
def test_patchify_makes_the_library_patches(qwen_dir, shape, dtype):
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    processor, _ = _load(qwen_dir, fast=True)
    image_processor = processor.image_processor
    assert {stand_ins.PATCHIFY, stand_ins.PROCESS_IMAGE} <= set(stand_ins.applied(processor))
    *dims, patch, merge, temporal = shape
    generator = torch.Generator().manual_seed(sum(shape))
    images = torch.randint(0, 256, dims, dtype=torch.uint8, generator=generator).to(dtype)
    expected = Qwen2VLImageProcessor.patchify(image_processor, images, patch, merge, temporal)
    for given in (images, images.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)):  # CHW and a channels-last view
        patches, grid_h, grid_w = image_processor.patchify(given, patch, merge, temporal)
        assert (grid_h, grid_w) == expected[1:]
        assert patches.dtype == dtype and patches.is_contiguous() and torch.equal(patches, expected[0])


def _decoded(width: int, height: int, seed: int, how: str) -> torch.Tensor:
    """An RGB image as the native path hands it over: a channel-first view of decoded memory."""
    if how == "jpeg":
        return decoding.decode_image(
            media.jpeg(width, height, seed=seed), "image", max_pixels=10**8, layout=decoding.ImageLayout.TENSOR
        )
    pixels = torch.from_numpy(np.array(_image(width, height, seed))).permute(2, 0, 1)
    return pixels if how == "interleaved" else pixels.contiguous()


@pytest.mark.parametrize("normalize", [False, True], ids=["uint8 out", "normalized"])
@pytest.mark.parametrize("how", ["jpeg", "interleaved", "channel-first"])
def test_the_image_processor_makes_the_library_outputs_from_decoded_tensors(qwen_dir, how, normalize):
    library = _load(qwen_dir, fast=False)[0].image_processor
    fast = _load(qwen_dir, fast=True)[0].image_processor
    # A 1280x960 photo, one scaled up to the minimum, one cut by the maximum, odd sizes.
    images = [_decoded(w, h, seed, how) for seed, (w, h) in enumerate([(1280, 960), (40, 30), (2000, 1500), (333, 517)])]
    kwargs = {} if normalize else {"do_normalize": False, "do_rescale": False}
    for batch in ([images[0]], images):
        _same_outputs(library(images=batch, return_tensors="pt", **kwargs), fast(images=batch, return_tensors="pt", **kwargs))


IMAGE_STAND_INS = {
    "gemma3": {stand_ins.PROCESS_IMAGE, stand_ins.RESCALE_AND_NORMALIZE},
    "glm4v": {stand_ins.PROCESS_IMAGE, stand_ins.PATCHIFY},
    "mistral3": {stand_ins.PROCESS_IMAGE, stand_ins.RESCALE_AND_NORMALIZE, stand_ins.PAD_FOR_BATCHING},
    "llava-onevision": {stand_ins.PROCESS_IMAGE, stand_ins.RESCALE_AND_NORMALIZE, stand_ins.GET_IMAGE_PATCHES},
    "internvl": {stand_ins.PROCESS_IMAGE, stand_ins.RESCALE_AND_NORMALIZE, stand_ins.CROP_IMAGE_TO_PATCHES},
    "idefics3": {stand_ins.PROCESS_IMAGE, stand_ins.RESCALE_AND_NORMALIZE},
}


@pytest.mark.parametrize("kind", sorted(IMAGE_STAND_INS))
@pytest.mark.parametrize("how", ["jpeg", "interleaved", "channel-first"])
def test_other_families_image_processors_make_the_library_outputs_from_decoded_tensors(tmp_path, kind, how):
    folder = models.make_model(kind, tmp_path / kind)
    library = _load(folder, fast=False)[0].image_processor
    processor, facts = _load(folder, fast=True)
    assert IMAGE_STAND_INS[kind] <= set(facts.fast_paths)
    images = [_decoded(w, h, seed, how) for seed, (w, h) in enumerate([(1280, 960), (40, 30), (333, 517), (1280, 960)])]
    # One image, images of one size (Pixtral's batch needs no padding), and of several sizes.
    # InternVL's processor asks its image processor for crops.
    calls = [{}, {"crop_to_patches": True}] if kind == "internvl" else [{}]
    for batch in ([images[0]], [images[0], images[3]], images):
        for kwargs in [{**call, **skip} for call in calls for skip in ({}, {"do_normalize": False, "do_rescale": False})]:
            ours = processor.image_processor(images=batch, return_tensors="pt", **kwargs)
            _same_outputs(library(images=batch, return_tensors="pt", **kwargs), ours)


def test_crops_and_tiles_numpy_cannot_hold_are_stacked_by_torch(tmp_path):
    from transformers.image_utils import SizeDict
    from transformers.models.got_ocr2.image_processing_got_ocr2 import GotOcr2ImageProcessor
    from transformers.models.llava_onevision.image_processing_llava_onevision import LlavaOnevisionImageProcessor

    crops = _load(models.make_model("internvl", tmp_path / "internvl"), fast=True)[0].image_processor
    size = SizeDict(height=448, width=448)
    interleaved = torch.rand((2, 500, 700, 3)).to(torch.bfloat16).permute(0, 3, 1, 2)  # NumPy has no bfloat16
    for images in (interleaved, interleaved.float()):
        ours = crops.crop_image_to_patches(images, 1, 12, patch_size=size)
        theirs = GotOcr2ImageProcessor.crop_image_to_patches(crops, images, 1, 12, patch_size=size)
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs) and ours.is_contiguous()
    tiles = _load(models.make_model("llava-onevision", tmp_path / "ov"), fast=True)[0].image_processor
    pinpoints = tiles.image_grid_pinpoints
    for image in (interleaved[0], interleaved[0].float()):
        ours = tiles._get_image_patches(image, pinpoints, size=(384, 384), patch_size=384, resample=None)
        theirs = LlavaOnevisionImageProcessor._get_image_patches(tiles, image, pinpoints, (384, 384), 384, None)
        assert len(ours) == len(theirs) and all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    assert stand_ins._stacked_through_numpy([torch.zeros(3, 4, 4), torch.zeros(3, 4, 5)], 0) is None


def test_process_image_leaves_other_inputs_to_the_library(qwen_dir):
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    fast = _load(qwen_dir, fast=True)[0].image_processor
    library = functools.partial(Qwen2VLImageProcessor.process_image, fast)
    interleaved = torch.randint(0, 256, (20, 30, 3), dtype=torch.uint8)
    gray = torch.randint(0, 256, (1, 20, 30), dtype=torch.uint8)
    for image, options in [
        (interleaved, {}),  # the channels last: the library permutes it
        (gray, {"do_convert_rgb": True}),  # one channel: the library makes three
        (np.zeros((20, 30, 3), dtype=np.uint8), {}),
        (_image(30, 20, 0), {"do_convert_rgb": True}),
        (interleaved.permute(2, 0, 1), {"input_data_format": "channels_first"}),
    ]:
        ours, theirs = fast.process_image(image, **options), library(image, **options)
        assert torch.equal(ours, theirs) and ours.is_contiguous(), type(image)


def test_patchify_leaves_what_it_does_not_cut_to_the_library(qwen_dir):
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    image_processor = _load(qwen_dir, fast=True)[0].image_processor
    uneven = torch.zeros((1, 3, 30, 28), dtype=torch.uint8)  # 30 rows: no whole 28-row block
    with pytest.raises(RuntimeError) as library_error:
        Qwen2VLImageProcessor.patchify(image_processor, uneven, 14, 2, 2)
    with pytest.raises(RuntimeError, match=re.escape(str(library_error.value))):
        image_processor.patchify(uneven, 14, 2, 2)
    bf16 = torch.rand((1, 3, 28, 28)).to(torch.bfloat16)  # NumPy has no bfloat16
    library = Qwen2VLImageProcessor.patchify(image_processor, bf16, 14, 2, 2)[0]
    assert torch.equal(image_processor.patchify(bf16, 14, 2, 2)[0], library)


def test_a_class_with_its_own_steps_keeps_them():
    class OwnSteps(processing_utils.ProcessorMixin):
        def _check_special_mm_tokens(self, text, text_inputs, modalities):
            return "own"

    processor = object.__new__(OwnSteps)
    assert stand_ins.apply(processor) == (stand_ins.CREATE_MM_TOKEN_TYPE_IDS,)
    assert processor._check_special_mm_tokens([], {}, []) == "own"
    assert stand_ins.apply(object()) == (), "not a transformers processor: nothing to bind"


def test_the_switch_comes_from_the_flag_then_the_env():
    assert settings.serve_settings_from_args(_serve_args(), {}).model.fast_paths is True
    assert settings.serve_settings_from_args(_serve_args(), {"MMPREP_FAST_PATHS": "off"}).model.fast_paths is False
    flagged = settings.serve_settings_from_args(_serve_args("--no-fast-paths"), {"MMPREP_FAST_PATHS": "1"})
    assert flagged.model.fast_paths is False
    with pytest.raises(settings.SettingsError, match="MMPREP_FAST_PATHS must be one of"):
        settings.serve_settings_from_args(_serve_args(), {"MMPREP_FAST_PATHS": "maybe"})


def test_the_info_lists_the_stand_ins_in_use(started, qwen_dir, tokenizer_dir):
    assert set(started(qwen_dir).info()["fast_paths"]) == ALL_STAND_INS
    # A bare tokenizer is no ProcessorMixin, but it is its own tokenizer.
    assert started(tokenizer_dir).info()["fast_paths"] == [stand_ins.ENCODE_PLUS]


TOKENIZER_CALLS = {
    "one text": (["a few words {0}"], {}),
    "one text, as a str": ("a few words {0}", {}),
    "a batch, padded": (["short {0}", "a much longer text with many more words {0} {0}"], {"padding": True}),
    "a batch, truncated": (["one two three four five six seven {0}"] * 2, {"truncation": True, "max_length": 4}),
    "with the special tokens mask": (["words {0}"], {"return_special_tokens_mask": True}),
    "without special tokens": (["words {0}"], {"add_special_tokens": False}),
}


@pytest.mark.parametrize("case", sorted(TOKENIZER_CALLS))
def test_the_tokenizer_stand_in_gives_the_library_tensors(qwen_dir, tokenizer_dir, case):
    texts, extra = TOKENIZER_CALLS[case]
    for folder in (qwen_dir, tokenizer_dir):
        library, _ = _load(folder, fast=False)
        fast, _ = _load(folder, fast=True)
        library, fast = patches.tokenizer_of(library), patches.tokenizer_of(fast)  # a bare tokenizer is its own
        assert stand_ins.ENCODE_PLUS in vars(fast) and stand_ins.ENCODE_PLUS not in vars(library)
        text = texts.format(QWEN) if isinstance(texts, str) else [t.format(QWEN) for t in texts]
        _same_outputs(library(text, return_tensors="pt", **extra), fast(text, return_tensors="pt", **extra))


def test_the_tokenizer_stand_in_leaves_every_other_call_to_the_library(qwen_dir, monkeypatch):
    from transformers import tokenization_utils_tokenizers

    library, _ = _load(qwen_dir, fast=False)
    fast, _ = _load(qwen_dir, fast=True)
    library, fast = library.tokenizer, fast.tokenizer
    ragged = ["short", "a much longer text with many more words"]
    with pytest.raises(ValueError) as expected:
        library(ragged, return_tensors="pt")
    with pytest.raises(ValueError, match=re.escape(str(expected.value))):
        fast(ragged, return_tensors="pt")
    seen = []
    original = tokenization_utils_tokenizers.TokenizersBackend._encode_plus

    def recording(self, *args, **kwargs):
        seen.append(kwargs.get("return_tensors"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(tokenization_utils_tokenizers.TokenizersBackend, "_encode_plus", recording)
    for call in (
        lambda t: t("words", return_tensors="np"),
        lambda t: t("words"),
        lambda t: t("words", "a pair", return_tensors="pt"),
        lambda t: t(
            ["one", "two"],
            return_tensors="pt",
            padding=True,
            return_overflowing_tokens=True,
            truncation=True,
            max_length=3,
            stride=1,
        ),
    ):
        seen.clear()
        left, right = call(library), call(fast)
        assert seen[0] == seen[1], "the stand-in passed the call on as it came"
        assert left.keys() == right.keys()
        for key in left:
            assert str(left[key]) == str(right[key]), key
    seen.clear()
    fast("words", return_tensors="pt")
    assert seen == [None], "the common case: lists from the library, converted by the stand-in"


@pytest.mark.parametrize("seconds", [(0.01,), (0.5,), (2.5,), (10.0,), (29.9,), (30.0,), (35.0,), (0.5, 2.5), ()])
def test_whispers_trimmed_stft_makes_the_library_features(tmp_path, seconds):
    processor, _ = loading.load_processor(ModelSettings(model=str(models.make_model("qwen2-audio", tmp_path / "audio"))))
    extractor = processor.feature_extractor
    assert stand_ins.EXTRACT_FBANK in stand_ins.applied(processor)
    library = type(extractor).__mro__[1]
    rng = np.random.default_rng(len(seconds))
    # The extractor's own batch: each clip (or a silent one) padded with zeros to its 30 s window.
    waveform = np.zeros((max(len(seconds), 1), extractor.n_samples), np.float32)
    for row, length in enumerate(seconds):
        clip = rng.standard_normal(int(length * extractor.sampling_rate)).astype(np.float32)[: extractor.n_samples]
        waveform[row, : len(clip)] = clip * 0.1
    ours = extractor._torch_extract_fbank_features(waveform)
    assert np.array_equal(ours, library._torch_extract_fbank_features(extractor, waveform))
    # Dither (random per call) and a single unbatched clip are the library's own.
    assert np.array_equal(
        extractor._torch_extract_fbank_features(waveform[0]), library._torch_extract_fbank_features(extractor, waveform[0])
    )
