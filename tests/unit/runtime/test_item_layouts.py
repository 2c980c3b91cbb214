"""Where the native path finds each image in a rendered prompt, and which families it renders.

Gemma 3's rule is vLLM's: its image sequence ("\\n\\n", the start token, the soft tokens, the end
token, "\\n\\n") is searched for left to right after the three- and four-newline tokens the
tokenizer merges are split again, and a match reports the token it begins in. The compatibility
suite compares whole answers with vLLM's; these cases pin the rule's corners without a server.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

from mmprep_runtime.backends import model_facts
from mmprep_runtime.backends.native import item_layouts
from mmprep_runtime.engine import loading
from mmprep_runtime.settings import ModelSettings, RenderSettings
from mmprep_runtime.synthetic import models

ONE, TWO, THREE, FOUR = 10, 11, 12, 13
BOI, SOFT, EOI = 5, 7, 6
SEQUENCE = (TWO, BOI, SOFT, SOFT, EOI, TWO)


def _placeholders(ids: list[int]) -> list[dict[str, int]]:
    return item_layouts.sequence_placeholders(np.asarray(ids), SEQUENCE, (ONE, TWO, THREE, FOUR))


def test_a_sequence_between_words_is_found_where_it_begins() -> None:
    assert _placeholders([1, 2, *SEQUENCE, 3]) == [{"offset": 2, "length": 6}]


def test_a_sequence_whose_newlines_merged_with_the_text_is_found_in_the_merged_token() -> None:
    # "word\n\n\n" + image + "\n\n\nword": the tokenizer wrote the outer newlines as one token each.
    ids = [1, FOUR, BOI, SOFT, SOFT, EOI, TWO, 3]
    assert _placeholders(ids) == [{"offset": 1, "length": 6}]


def test_touching_images_share_their_merged_newlines_and_overlap() -> None:
    ids = [1, TWO, BOI, SOFT, SOFT, EOI, FOUR, BOI, SOFT, SOFT, EOI, TWO]
    found = _placeholders(ids)
    assert found == [{"offset": 1, "length": 6}, {"offset": 6, "length": 6}]
    assert found[1]["offset"] < found[0]["offset"] + found[0]["length"], "vLLM refuses these: the caller checks"


def test_a_sequence_broken_by_a_newline_merged_on_its_far_side_is_not_found() -> None:
    # "\n" + image: "\n\n\n" splits into "\n" and "\n\n", but the end's "\n\n" + "\n" does not split
    # back into "\n\n" first: vLLM finds nothing either, and the render is refused.
    assert _placeholders([1, THREE, BOI, SOFT, SOFT, EOI, THREE, 3]) == []


def test_each_gemma_item_is_one_crop_and_its_count() -> None:
    pixels = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)
    items = item_layouts.sequence_items({"pixel_values": pixels}, 2, "bfloat16")
    assert [list(item) for item in items] == [["num_patches", "pixel_values"]] * 2
    assert torch.equal(items[1]["pixel_values"].data, pixels[1:2].to(torch.bfloat16))
    assert int(items[0]["num_patches"].data) == 1 and items[0]["num_patches"].field.keep_on_cpu


def _facts(folder: pathlib.Path) -> model_facts.ModelFacts:
    processor, facts = loading.load_processor(ModelSettings(model=str(folder)))
    return model_facts.model_facts(processor, facts, RenderSettings())


def test_gemma3_renders_natively_without_pan_and_scan_only(tmp_path: pathlib.Path) -> None:
    folder = models.make_model("gemma3", tmp_path / "gemma3")
    facts = _facts(folder)
    assert facts.item_layout == model_facts.SEQUENCE
    assert len(facts.image_sequence) == 260 and facts.image_sequence.count(facts.image_sequence[2]) == 256
    config = folder / "processor_config.json"
    config.write_text(config.read_text().replace('"size"', '"do_pan_and_scan": true, "size"'))
    assert _facts(folder).item_layout is None, "several crops per image: vLLM's code renders them"


@pytest.mark.parametrize(
    ("kind", "layout"),
    [
        ("qwen2.5-vl", model_facts.GRID),
        ("glm4v", model_facts.GRID),
        ("mistral3", model_facts.ROWS),
        ("llava-onevision", model_facts.TILES),
        ("internvl", model_facts.CROPS),
        ("idefics3", model_facts.SPLIT),
    ],
)
def test_the_other_layouts_follow_the_family(tmp_path: pathlib.Path, kind: str, layout: str | None) -> None:
    assert _facts(models.make_model(kind, tmp_path / kind)).item_layout == layout


IMG, BRK, END = 7, 8, 9


def test_pixtral_rows_are_found_from_the_first_row_token_through_the_end_token() -> None:
    one = [IMG, IMG, BRK, IMG, IMG, END]
    ids = np.asarray([1, 3, *one, *one, 4, *one])
    found = item_layouts.rows_placeholders(ids, (IMG, BRK, END))
    assert found == [{"offset": 2, "length": 6}, {"offset": 8, "length": 6}, {"offset": 15, "length": 6}]
    assert item_layouts.rows_placeholders(np.asarray([1, IMG, BRK, IMG, 4]), (IMG, BRK, END)) == [], "no end: no image"


def test_each_pixtral_item_is_its_image_without_the_batchs_padding() -> None:
    pixels = torch.arange(2 * 3 * 6 * 8, dtype=torch.int64).to(torch.uint8).reshape(2, 3, 6, 8)
    items = item_layouts.rows_items({"pixel_values": pixels, "image_sizes": torch.tensor([[6, 8], [4, 2]])}, 2, None)
    assert [tuple(item["pixel_values"].data.shape) for item in items] == [(3, 6, 8), (3, 4, 2)]
    assert torch.equal(items[1]["pixel_values"].data, pixels[1, :, :4, :2]) and items[1]["pixel_values"].data.is_contiguous()


def test_a_pixtral_image_in_interleaved_memory_leaves_channel_first_with_the_same_values() -> None:
    # The decoder's memory, which the image processor keeps for uint8 pixels: (height, width, channel).
    interleaved = torch.arange(6 * 8 * 3, dtype=torch.int64).to(torch.uint8).reshape(1, 6, 8, 3).permute(0, 3, 1, 2)
    items = item_layouts.rows_items({"pixel_values": interleaved, "image_sizes": torch.tensor([[6, 8]])}, 1, None)
    pixels = items[0]["pixel_values"].data
    assert pixels.is_contiguous() and torch.equal(pixels, interleaved[0])


START, CTX, STOP = 20, 21, 22


def test_internvl_images_are_found_with_their_start_and_end_tokens() -> None:
    one, two = [START, *[CTX] * 4, STOP], [START, *[CTX] * 8, STOP]
    ids = np.asarray([1, *one, 5, *two, *one, CTX, CTX, 6])
    found = item_layouts.crops_placeholders(ids, (START, CTX, STOP))
    # A run of context tokens without its start and end tokens around it is no image's.
    assert found == [{"offset": 1, "length": 6}, {"offset": 8, "length": 10}, {"offset": 18, "length": 6}]


def test_each_internvl_item_is_its_crops_their_count_and_the_shared_context_id() -> None:
    pixels = torch.rand(3, 3, 4, 4)
    placeholders = [{"offset": 0, "length": 2 * 2 + 2}, {"offset": 9, "length": 2 + 2}]
    items = item_layouts.crops_items({"pixel_values": pixels}, placeholders, "bfloat16", CTX, 2)
    assert [int(item["image_num_patches"].data) for item in items] == [2, 1]
    assert torch.equal(items[1]["pixel_values"].data, pixels[2:3].to(torch.bfloat16))
    assert [list(item) for item in items] == [["pixel_values", "image_num_patches", "image_token_id"]] * 2
    assert items[0]["image_token_id"].field.wire() == ["shared", {"keep_on_cpu": True, "batch_size": 2}]
    assert items[0]["pixel_values"].field.wire()[1]["slices"] == [[[0, 2, None]], [[2, 3, None]]]
    with pytest.raises(item_layouts.errors.Unprocessable, match="3 crops for 4"):
        item_layouts.crops_items({"pixel_values": pixels}, [*placeholders, placeholders[1]], None, CTX, 2)


FAKE, TAG, PIX, NL = 30, 31, 32, 33


def test_idefics3_images_are_found_as_their_sequences_in_order() -> None:
    small, large = (FAKE, TAG, PIX, PIX, FAKE), (FAKE, 40, PIX, NL, NL, FAKE, TAG, PIX, FAKE)
    # The second image's sequence is searched after the first's: an earlier copy of it is text.
    ids = np.asarray([1, *large, 2, *small, 3, *large])
    found = item_layouts.ordered_placeholders(ids, [small, large])
    assert found == [{"offset": 11, "length": 5}, {"offset": 17, "length": 9}]
    # A sequence not found ends the list: the caller refuses the request.
    found = item_layouts.ordered_placeholders(ids, [large, large, small])
    assert found == [{"offset": 1, "length": 9}, {"offset": 17, "length": 9}]


def test_each_idefics3_item_is_its_tiles_their_masks_and_their_count() -> None:
    pixels, masks = torch.rand(1, 4, 3, 4, 4), torch.ones(1, 4, 4, 4, dtype=torch.bool)
    items = item_layouts.split_items({"pixel_values": pixels, "pixel_attention_mask": masks}, [3, 1], "bfloat16")
    assert [int(item["num_patches"].data) for item in items] == [3, 1]
    assert torch.equal(items[1]["pixel_values"].data, pixels[0, 3:4].to(torch.bfloat16))
    assert items[0]["pixel_attention_mask"].data.dtype == torch.bool and len(items[0]["pixel_attention_mask"].data) == 3
    assert [list(item) for item in items] == [["pixel_values", "pixel_attention_mask", "num_patches"]] * 2
    assert items[0]["num_patches"].field.wire() == ["batched", {"keep_on_cpu": True}]
    with pytest.raises(item_layouts.errors.Unprocessable, match="4 tiles for 5"):
        item_layouts.split_items({"pixel_values": pixels, "pixel_attention_mask": masks}, [3, 2], None)


def _loaded_with_images(kind: str, tmp_path: pathlib.Path) -> tuple[object, model_facts.ModelFacts, list[object]]:
    """A ``kind`` folder's processor, its model facts and three decoded JPEGs of different sizes."""
    from mmprep_runtime.engine import decoding
    from mmprep_runtime.synthetic import media

    processor, facts = loading.load_processor(ModelSettings(model=str(models.make_model(kind, tmp_path / kind))))
    sizes = [(1280, 960), (200, 150), (333, 517)]
    images = [
        decoding.decode_image(media.jpeg(w, h, seed=i), "x", max_pixels=10**8, layout=facts.image_layout)
        for i, (w, h) in enumerate(sizes)
    ]
    return processor, model_facts.model_facts(processor, facts, RenderSettings()), images


def test_idefics3_tokenized_once_is_what_its_processor_makes(tmp_path: pathlib.Path) -> None:
    from mmprep_runtime.backends.native import stages

    # Three sizes (three grids of tiles), one image between text and a newline.
    processor, model, images = _loaded_with_images("idefics3", tmp_path)
    text = "<|begin_of_text|>User:<image>What<image>\n<image> is it?<end_of_utterance>\nAssistant:"
    library = processor(text=[text], images=[images], return_tensors="pt", add_special_tokens=False)
    ours = stages._process_split_tokenizing_once(processor, text, images, model)
    assert set(ours) == {"input_ids", "pixel_values", "pixel_attention_mask"}
    for name in ours:
        assert torch.equal(ours[name], library[name]), name


def test_llava_onevision_tokenized_once_is_what_its_processor_makes(tmp_path: pathlib.Path) -> None:
    from mmprep_runtime.backends.native import stages

    processor, model, images = _loaded_with_images("llava-onevision", tmp_path)
    # One image (its tiles' features), and several (each its base features: the multi-image rule).
    for text, count in (("user\n<image>What?", 1), ("user\n<image>What<image>\n<image> is it?", 3)):
        library = processor(
            text=[text], images=images[:count], return_tensors="pt", add_special_tokens=False, **model.processor_kwargs
        )
        ours = stages._process_tiles_tokenizing_once(processor, text, images[:count], model, None)
        for name in ours:
            assert torch.equal(ours[name], library[name]), (count, name)
        # Normalized patch by patch straight into the model's dtype: what vLLM's cast makes of the library's batch.
        in_bf16 = stages._process_tiles_tokenizing_once(processor, text, images[:count], model, "bfloat16")
        assert in_bf16["pixel_values"].dtype == torch.bfloat16
        assert torch.equal(in_bf16["pixel_values"], library["pixel_values"].to(torch.bfloat16))


def test_llava_onevision_tiles_of_images_with_different_counts_are_padded_with_zeros_as_the_library_pads(
    tmp_path: pathlib.Path,
) -> None:
    from mmprep_runtime.backends.native import stages

    processor, model, images = _loaded_with_images("llava-onevision", tmp_path)
    library = processor.image_processor(images=images, return_tensors="pt")
    ours = stages._tiles_in_dtype(processor.image_processor, images, model, "bfloat16")
    assert ours is not None
    counts = [int((tiles != 0).flatten(1).any(1).sum()) for tiles in library["pixel_values"]]
    assert len(set(counts)) > 1, "the three sizes make different tile counts"
    assert torch.equal(ours["pixel_values"], library["pixel_values"].to(torch.bfloat16))
    for name in ("image_sizes", "batch_num_images"):
        assert torch.equal(ours[name], library[name]), name
    # An image processor that does not pad: the library's own call answers (and refuses the ragged batch itself).
    processor.image_processor.do_pad = False
    assert stages._tiles_in_dtype(processor.image_processor, images, model, "bfloat16") is None
    assert stages._tiles_in_dtype(processor.image_processor, images[:1], model, "bfloat16") is not None


def test_internvl_tokenized_once_is_what_its_processor_makes(tmp_path: pathlib.Path) -> None:
    from mmprep_runtime.backends.native import stages

    processor, model, images = _loaded_with_images("internvl", tmp_path)
    text = "<|im_start|>user\n<IMG_CONTEXT>What<IMG_CONTEXT>\n<IMG_CONTEXT> is it?<|im_end|>"
    library = processor(text=[text], images=images, return_tensors="pt", add_special_tokens=False)
    for dtype in (None, "bfloat16"):
        ours = stages._process_crops_tokenizing_once(processor, text, images, model, dtype)
        assert torch.equal(ours["input_ids"], library["input_ids"])
        expected = library["pixel_values"] if dtype is None else library["pixel_values"].to(torch.bfloat16)
        assert ours["pixel_values"].dtype == expected.dtype and torch.equal(ours["pixel_values"], expected), dtype


def test_gemma3_in_the_models_dtype_is_what_its_processor_makes(tmp_path: pathlib.Path) -> None:
    from mmprep_runtime.backends.native import stages

    processor, model, images = _loaded_with_images("gemma3", tmp_path)
    text = "<start_of_turn>user\n<start_of_image>What<start_of_image>\n<start_of_image> is it?<end_of_turn>\n"
    library = processor(text=[text], images=images, return_tensors="pt", add_special_tokens=False, **model.processor_kwargs)
    for dtype in (None, "bfloat16"):
        ours = stages._process_sequence_in_dtype(processor, text, images, model, dtype)
        assert set(ours) == {"input_ids", "pixel_values"}
        assert torch.equal(ours["input_ids"], library["input_ids"])
        expected = library["pixel_values"] if dtype is None else library["pixel_values"].to(torch.bfloat16)
        assert ours["pixel_values"].dtype == expected.dtype and torch.equal(ours["pixel_values"], expected), dtype
