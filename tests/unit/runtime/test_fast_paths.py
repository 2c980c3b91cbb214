"""The GIL-light stand-ins agree with transformers exactly, on real processors, and fall back to it."""

from __future__ import annotations

import copy
import pathlib
import re

import pytest
import torch
from PIL import Image
from transformers import processing_utils

from mmprep_runtime import cli, fast_paths, loading, settings, testing_models
from mmprep_runtime.policy import Backend

MARKER = processing_utils._CONTROL_TOKEN_START
QWEN = testing_models.QWEN_IMAGE_PLACEHOLDER
LLAVA = testing_models.LLAVA_IMAGE_TOKEN


def _serve_args(*extra: str):
    return cli.build_parser().parse_args(["serve", "--model", "m", *extra])


def _load(folder: pathlib.Path, *, fast: bool, backend: Backend = Backend.AUTO):
    return loading.load_processor(loading.ModelSettings(str(folder), backend=backend, fast_paths=fast))


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
    assert fast_paths.applied(library) == ()
    text = [t.format(placeholder) for t in texts]
    images = [_image(96 + 32 * i, 80, seed=i) for i, t in enumerate(texts) for _ in range(t.count("{0}"))]
    kwargs = {"text": text if len(text) > 1 else text[0], "images": images, "return_tensors": "pt"}
    if len(text) > 1:
        kwargs["padding"] = True
    _same_outputs(library(**kwargs), fast(**kwargs))


def test_a_deep_copy_carries_stand_ins_bound_to_the_copy(qwen_dir):
    processor, facts = _load(qwen_dir, fast=True)
    assert set(facts.fast_paths) == {fast_paths.CHECK_SPECIAL_MM_TOKENS, fast_paths.CREATE_MM_TOKEN_TYPE_IDS}
    clone = copy.deepcopy(processor)
    assert fast_paths.applied(clone) == facts.fast_paths
    for name in facts.fast_paths:
        assert getattr(clone, name).__self__ is clone
        assert getattr(processor, name).__self__ is processor
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
    assert marked == library(processor, ids)
    assert {value for row in marked for value in row} == {0, 1, 2}
    assert processor.create_mm_token_type_ids(ids.tolist()) == library(processor, ids.tolist())


def test_a_class_with_its_own_steps_keeps_them():
    class OwnSteps(processing_utils.ProcessorMixin):
        def _check_special_mm_tokens(self, text, text_inputs, modalities):
            return "own"

    processor = object.__new__(OwnSteps)
    assert fast_paths.apply(processor) == (fast_paths.CREATE_MM_TOKEN_TYPE_IDS,)
    assert processor._check_special_mm_tokens([], {}, []) == "own"
    assert fast_paths.apply(object()) == (), "not a transformers processor: nothing to bind"


def test_the_switch_comes_from_the_flag_then_the_env():
    assert settings.serve_settings_from_args(_serve_args(), {}).model.fast_paths is True
    assert settings.serve_settings_from_args(_serve_args(), {"MMPREP_FAST_PATHS": "off"}).model.fast_paths is False
    flagged = settings.serve_settings_from_args(_serve_args("--no-fast-paths"), {"MMPREP_FAST_PATHS": "1"})
    assert flagged.model.fast_paths is False
    with pytest.raises(settings.SettingsError, match="MMPREP_FAST_PATHS must be one of"):
        settings.serve_settings_from_args(_serve_args(), {"MMPREP_FAST_PATHS": "maybe"})


def test_the_info_lists_the_stand_ins_in_use(started, qwen_dir, tokenizer_dir):
    assert set(started(qwen_dir).info()["fast_paths"]) == {
        fast_paths.CHECK_SPECIAL_MM_TOKENS, fast_paths.CREATE_MM_TOKEN_TYPE_IDS,
    }
    assert started(tokenizer_dir).info()["fast_paths"] == [], "a bare tokenizer is not a ProcessorMixin"
