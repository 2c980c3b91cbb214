"""Where each image sits in a rendered prompt and what its kwargs item holds, by the family's rules.

vLLM cuts a processor's batched outputs into one item per image and finds each image's
placeholder in the prompt by rules each of its model files defines; the native path writes the
same, for these layouts (``ModelFacts.item_layout``, whose names ``model_facts`` defines):

- ``GRID`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4.1V): an image's placeholder is a run of its image token,
  as long as its patch grid; its item is its rows of ``pixel_values`` (``image_grid_thw.prod()``
  rows, flat) and its row of ``image_grid_thw`` (batched, kept on the CPU).
- ``SEQUENCE`` (Gemma 3 without pan-and-scan): every image is one fixed-size crop. vLLM replaces
  the start-of-image token with the same image sequence for each ("\\n\\n<start_of_image>", the soft
  tokens, "<end_of_image>\\n\\n", tokenized once: ``ModelFacts.image_sequence``) and reports that whole
  sequence as the placeholder. The tokenizer merges a "\\n\\n" with a neighbouring "\\n" into one
  token, so vLLM splits the three- and four-newline tokens before it searches for the sequence and
  reports the offset of the token a match begins in. An item is its row of ``pixel_values`` (flat)
  and ``num_patches`` (1, batched, kept on the CPU).
- ``ROWS`` (Pixtral: Mistral 3): an image's placeholder is its rows of image tokens, each row ended
  by a break token and the last by the image's end token; its item is its own pixels (batched),
  cut from the processor's batch, which pads every image to the largest.
- ``TILES`` (LLaVA-OneVision): an image's placeholder is a run of its image token; its item is its
  row of the processor's ``pixel_values`` (its tiles, padded to the batch's most, as vLLM keeps
  them) and of ``image_sizes`` (kept on the CPU).
- ``CROPS`` (InternVL): an image's placeholder is its start token, a run of its context token (so
  many per crop) and its end token; its item is its crops of ``pixel_values`` (flat), its number
  of crops (batched) and the context token's id (one value shared by every image), both kept on
  the CPU.
- ``SPLIT`` (Idefics3): an image's placeholder is the token sequence vLLM writes for its grid of
  tiles and its global view, found left to right; its item is its tiles of ``pixel_values`` and
  ``pixel_attention_mask`` (flat) and its ``num_patches`` (kept on the CPU).

Pure functions of the processor's outputs: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mmprep_runtime import errors
from mmprep_runtime.backends.native import wire_format
from mmprep_runtime.backends.native.wire_format import KwargsElement
from mmprep_runtime.engine import planar

Item = dict[str, KwargsElement]


def to_model_dtype(tensor: Any, dtype: str | None) -> Any:
    """A floating tensor cast to the model's dtype, as vLLM casts processor outputs (others as they are)."""
    import torch

    if dtype is None or not tensor.is_floating_point():
        return tensor
    target = getattr(torch, dtype, None)
    return tensor.to(target) if isinstance(target, torch.dtype) else tensor


def _flat_slices(sizes: Sequence[int]) -> tuple[tuple[int, int], ...]:
    slices = []
    start = 0
    for size in sizes:
        slices.append((start, start + int(size)))
        start += int(size)
    return tuple(slices)


def grid_items(outputs: Mapping[str, Any], count: int, dtype: str | None) -> list[Item]:
    """One item per image: its rows of ``pixel_values`` and its row of ``image_grid_thw``."""
    if not count:
        return []
    grid = outputs["image_grid_thw"]
    pixels = to_model_dtype(outputs["pixel_values"], dtype)
    slices = _flat_slices(grid.prod(-1).tolist())
    flat = wire_format.FlatField(slices)
    batched = wire_format.BatchedField(keep_on_cpu=True)
    return [
        {
            "pixel_values": KwargsElement(pixels[a:b], flat),
            "image_grid_thw": KwargsElement(grid[index], batched),
        }
        for index, (a, b) in enumerate(slices)
    ]


def sequence_items(outputs: Mapping[str, Any], count: int, dtype: str | None) -> list[Item]:
    """One item per image: ``num_patches`` (one crop each) and its row of ``pixel_values``, in the
    order vLLM writes them."""
    import torch

    if not count:
        return []
    pixels = to_model_dtype(outputs["pixel_values"], dtype)
    if len(pixels) != count:
        raise errors.Unprocessable(f"the processor made {len(pixels)} crops for {count} image(s): one each was expected")
    flat = wire_format.FlatField(_flat_slices([1] * count))
    batched = wire_format.BatchedField(keep_on_cpu=True)
    one = torch.tensor(1, dtype=torch.int64)
    return [
        {"num_patches": KwargsElement(one, batched), "pixel_values": KwargsElement(pixels[index : index + 1], flat)}
        for index in range(count)
    ]


def rows_items(outputs: Mapping[str, Any], count: int, dtype: str | None) -> list[Item]:
    """One item per image: its pixels without the batch's padding (``image_sizes``), as vLLM cuts them.

    uint8 pixels left for the GPU to normalize are still in the decoder's interleaved memory (the
    image processor keeps it): ``planar`` deinterleaves them, where torch's copy to channel-first
    memory took about an eighth of Mistral 3's CPU per request. The same values."""
    if not count:
        return []
    pixels = to_model_dtype(outputs["pixel_values"], dtype)
    sizes = outputs["image_sizes"].tolist()
    batched = wire_format.BatchedField()
    return [
        {"pixel_values": KwargsElement(planar.channel_first(pixels[index, :, :height, :width]), batched)}
        for index, (height, width) in enumerate(sizes)
    ]


def tiles_items(outputs: Mapping[str, Any], count: int, dtype: str | None) -> list[Item]:
    """One item per image: its row of ``pixel_values`` and of ``image_sizes``."""
    if not count:
        return []
    pixels = to_model_dtype(outputs["pixel_values"], dtype)
    sizes = outputs["image_sizes"]
    return [
        {
            "pixel_values": KwargsElement(pixels[index], wire_format.BatchedField()),
            "image_sizes": KwargsElement(sizes[index], wire_format.BatchedField(keep_on_cpu=True)),
        }
        for index in range(count)
    ]


def crops_items(
    outputs: Mapping[str, Any], placeholders: Sequence[Mapping[str, int]], dtype: str | None, context_id: int, per_crop: int
) -> list[Item]:
    """One item per image: its crops of ``pixel_values``, its ``image_num_patches`` (how many crops
    its placeholder holds: ``per_crop`` context tokens each) and the shared ``image_token_id``, in
    the order vLLM writes them."""
    import torch

    if not placeholders:
        return []
    pixels = to_model_dtype(outputs["pixel_values"], dtype)
    crops = torch.tensor([(placeholder["length"] - 2) // per_crop for placeholder in placeholders], dtype=torch.int64)
    if int(crops.sum()) != len(pixels):
        raise errors.Unprocessable(f"the processor made {len(pixels)} crops for {int(crops.sum())} in the prompt")
    slices = _flat_slices(crops.tolist())
    flat = wire_format.FlatField(slices)
    batched = wire_format.BatchedField(keep_on_cpu=True)
    shared = KwargsElement(torch.tensor(context_id), wire_format.SharedField(len(placeholders), keep_on_cpu=True))
    return [
        {
            "pixel_values": KwargsElement(pixels[a:b], flat),
            "image_num_patches": KwargsElement(crops[index], batched),
            "image_token_id": shared,
        }
        for index, (a, b) in enumerate(slices)
    ]


def crops_placeholders(token_ids: np.ndarray[Any, Any], crop_ids: Sequence[int]) -> list[dict[str, int]]:
    """``[{"offset", "length"}]`` of each image: its start token, its run of context tokens and its
    end token (a run without both around it is no image's)."""
    start, context, end = crop_ids
    found = []
    for run in wire_format.placeholder_runs(token_ids, context):
        before, after = run["offset"] - 1, run["offset"] + run["length"]
        if before >= 0 and after < len(token_ids) and token_ids[before] == start and token_ids[after] == end:
            found.append({"offset": before, "length": run["length"] + 2})
    return found


def split_items(outputs: Mapping[str, Any], counts: Sequence[int], dtype: str | None) -> list[Item]:
    """One item per image: its tiles (``counts`` of them) of the prompt's ``pixel_values`` and
    ``pixel_attention_mask`` and its ``num_patches``."""
    import torch

    if not counts:
        return []
    pixels = to_model_dtype(outputs["pixel_values"], dtype)[0]  # one prompt: its batch axis goes
    masks = outputs["pixel_attention_mask"][0]
    if sum(counts) != len(pixels) or len(masks) != len(pixels):
        raise errors.Unprocessable(f"the processor made {len(pixels)} tiles for {sum(counts)} in the prompt")
    slices = _flat_slices(counts)
    flat = wire_format.FlatField(slices)
    batched = wire_format.BatchedField(keep_on_cpu=True)
    patches = torch.tensor(list(counts), dtype=torch.int64)
    return [
        {
            "pixel_values": KwargsElement(pixels[a:b], flat),
            "pixel_attention_mask": KwargsElement(masks[a:b], flat),
            "num_patches": KwargsElement(patches[index], batched),
        }
        for index, (a, b) in enumerate(slices)
    ]


def audio_items(outputs: Mapping[str, Any], count: int, dtype: str | None) -> list[Item]:
    """One item per clip: its row of the batch's ``input_features`` and ``feature_attention_mask``."""
    features = to_model_dtype(outputs["input_features"], dtype)
    masks = outputs["feature_attention_mask"]
    if len(features) != count or len(masks) != count:
        raise errors.Unprocessable(f"the processor made features of {len(features)} clips for {count} in the prompt")
    batched = wire_format.BatchedField()
    return [
        {
            "input_features": KwargsElement(features[index], batched),
            "feature_attention_mask": KwargsElement(masks[index], batched),
        }
        for index in range(count)
    ]


def ordered_placeholders(token_ids: np.ndarray[Any, Any], sequences: Sequence[Sequence[int]]) -> list[dict[str, int]]:
    """``[{"offset", "length"}]`` of each of ``sequences`` (one per image, in order), each found
    after the one before it as vLLM finds a processor's replacements; a sequence not found ends the
    list."""
    ids = token_ids.tolist()
    found = []
    start = 0
    for sequence in sequences:
        target = list(sequence)
        match = None
        while target:
            try:
                begin = ids.index(target[0], start)
            except ValueError:
                break
            if ids[begin : begin + len(target)] == target:
                match = begin
                break
            start = begin + 1
        if match is None:
            break
        found.append({"offset": match, "length": len(target)})
        start = match + len(target)
    return found


def rows_placeholders(token_ids: np.ndarray[Any, Any], row_ids: Sequence[int]) -> list[dict[str, int]]:
    """``[{"offset", "length"}]`` of each image's rows: from its first image or break token through
    its end token (an image that follows another begins after the other's end token)."""
    image, row_break, end = row_ids
    is_row = np.isin(token_ids, (image, row_break))
    is_end = token_ids == end
    continues = np.concatenate(([False], is_row[:-1]))  # a row token or a break before: same image
    starts = np.flatnonzero((is_row | is_end) & ~continues)
    ends = np.flatnonzero(is_end)
    if len(starts) != len(ends) or np.any(starts > ends):
        return []
    return [{"offset": int(start), "length": int(stop - start + 1)} for start, stop in zip(starts, ends, strict=True)]


def sequence_placeholders(
    token_ids: np.ndarray[Any, Any], sequence: Sequence[int], newlines: Sequence[int]
) -> list[dict[str, int]]:
    """``[{"offset", "length"}]`` of each image ``sequence`` in ``token_ids``, found as vLLM finds it:
    left to right, matches not overlapping, with the three- and four-newline tokens (``newlines``:
    the ids of one to four newlines) split into a one- and a two-newline or two two-newline tokens."""
    one, two, three, four = newlines
    ids = token_ids.tolist()
    split: list[int] = []
    origin: list[int] = []
    for index, token in enumerate(ids):
        parts = (one, two) if token == three else (two, two) if token == four else (token,)
        split.extend(parts)
        origin.extend([index] * len(parts))
    target = list(sequence)
    found = []
    start = 0
    while target:
        try:
            begin = split.index(target[0], start)
        except ValueError:
            break
        if split[begin : begin + len(target)] == target:
            found.append({"offset": origin[begin], "length": len(target)})
            start = begin + len(target)
        else:
            start = begin + 1
    return found
