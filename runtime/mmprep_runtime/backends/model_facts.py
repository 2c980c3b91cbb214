"""What the vLLM render API needs to know about the model beyond its processor (``ModelFacts``).

Read once at start-up (``model_facts``, from the model folder's ``config.json`` or the hub's
config): the name it is served under, its context length, its dtype, its image token, and
whether its pixels leave as uint8 for the GPU to normalize (the processor's facts say whether it
can; ``RenderSettings.normalized_pixels`` says whether to).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping
from typing import Any, Final

from mmprep_runtime.engine import loading
from mmprep_runtime.engine.loading import ProcessorFacts
from mmprep_runtime.settings import RenderSettings

#: How the native path lays out a family's images (``native.item_layouts``): Qwen2-VL's patch grids
#: (GLM-4.1V's too).
GRID: Final = "grid"
#: One fixed image sequence per image (Gemma 3 without pan-and-scan).
SEQUENCE: Final = "sequence"
#: Rows of image tokens, each ended by a break token, the last by an end token (Pixtral: Mistral 3).
ROWS: Final = "rows"
#: A run of the image token per image, its tiles batched (LLaVA-OneVision).
TILES: Final = "tiles"
#: A run of context tokens per image between its start and end tokens, its crops flat (InternVL).
CROPS: Final = "crops"
#: Each image split into rows and columns of tiles and a global view, its tiles flat (Idefics3).
SPLIT: Final = "split"


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
    #: The ids the model's generation config stops on (beside the tokenizer's EOS): derender
    #: leaves such a last token out, as the engine does.
    eos_token_ids: frozenset[int] = frozenset()
    #: ``GRID``, ``SEQUENCE``, ``ROWS`` or ``TILES``: the native path renders this model's images; None: it does not.
    item_layout: str | None = None
    #: ``SEQUENCE``: the ids vLLM puts in place of each image's start token, and the ids of one to
    #: four newlines (the tokenizer merges them; vLLM splits them again to find the sequence).
    image_sequence: tuple[int, ...] = ()
    newline_ids: tuple[int, ...] = ()
    #: ``ROWS``: the ids of the image token, the row break and the image's end.
    row_ids: tuple[int, ...] = ()
    #: ``CROPS``: the ids of the image's start token, its context token and its end token, and how
    #: many context tokens each crop takes.
    crop_ids: tuple[int, ...] = ()
    tokens_per_crop: int = 0
    #: The audio token whose runs hold each clip's features, and the rate clips are taken at;
    #: None where the native path does not render the model's audio (``NATIVE_AUDIO``).
    audio_token_id: int | None = None
    sampling_rate: int | None = None

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


def _ids(value: Any) -> frozenset[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return frozenset({value})
    if isinstance(value, list):
        return frozenset(v for v in value if isinstance(v, int) and not isinstance(v, bool))
    return frozenset()


def _generation_eos(model: str, config: Mapping[str, Any]) -> frozenset[int]:
    """The EOS ids of the folder's ``generation_config.json``, or, without one, of the model's
    config (the generation config transformers derives from it), as vLLM reads them."""
    generation = pathlib.Path(model) / "generation_config.json"
    if generation.is_file():
        try:
            return _ids(json.loads(generation.read_text()).get("eos_token_id"))
        except (OSError, ValueError, AttributeError):
            return frozenset()
    text_config = config.get("text_config") or {}
    return _ids(text_config.get("eos_token_id", config.get("eos_token_id")))


def _image_sequence(processor: Any) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Gemma 3's image sequence and newline ids as vLLM's Gemma 3 code reads them, or None where the
    native path does not render its images: pan-and-scan (several crops per image, a sequence that
    varies with the image) or a vocabulary without the newline tokens vLLM looks up."""
    image_processor = getattr(processor, "image_processor", None)
    sequence = getattr(processor, "full_image_sequence", None)
    if image_processor is None or not isinstance(sequence, str) or getattr(image_processor, "do_pan_and_scan", False):
        return None
    tokenizer = processor.tokenizer
    vocab = tokenizer.get_vocab()
    newlines = tuple(vocab.get("\n" * count) for count in range(1, 5))
    if any(token is None for token in newlines):
        return None
    return tuple(tokenizer.encode(sequence, add_special_tokens=False)), tuple(int(token) for token in newlines)


def _row_ids(processor: Any) -> tuple[int, ...]:
    """Pixtral's image, row-break and end token ids, or () where any is missing."""
    names = [getattr(processor, name, None) for name in ("image_token", "image_break_token", "image_end_token")]
    if not all(isinstance(name, str) for name in names):
        return ()
    ids = processor.tokenizer.convert_tokens_to_ids(names)
    unknown = processor.tokenizer.unk_token_id
    return tuple(int(i) for i in ids) if all(isinstance(i, int) and i != unknown for i in ids) else ()


def _crops(processor: Any) -> tuple[tuple[int, ...], int] | None:
    """InternVL's start, context and end token ids and its context tokens per crop, or None where
    the processor does not say them all."""
    found = [getattr(processor, name, None) for name in ("start_image_token_id", "image_token_id", "end_image_token_id")]
    per_crop = getattr(processor, "image_seq_length", None)
    ids = tuple(i for i in found if type(i) is int)
    if len(ids) != 3 or type(per_crop) is not int or per_crop <= 0:
        return None
    unknown = processor.tokenizer.unk_token_id
    return (ids, per_crop) if unknown not in ids and len(set(ids)) == 3 else None


#: Processors whose audio the native path renders: one run of the audio token per clip, the
#: clip's Whisper features batched (vLLM's Qwen2-Audio fields).
NATIVE_AUDIO: Final = frozenset({"Qwen2AudioProcessor"})


def _audio_token_id(processor: Any, facts: ProcessorFacts) -> int | None:
    if facts.processor_class not in NATIVE_AUDIO or not facts.sampling_rate:
        return None
    token_id = getattr(processor, "audio_token_id", None)
    return token_id if type(token_id) is int and token_id != processor.tokenizer.unk_token_id else None


@dataclasses.dataclass(frozen=True)
class _Layout:
    name: str | None = None
    image_sequence: tuple[int, ...] = ()
    newline_ids: tuple[int, ...] = ()
    row_ids: tuple[int, ...] = ()
    crop_ids: tuple[int, ...] = ()
    tokens_per_crop: int = 0


def _item_layout(processor: Any, facts: ProcessorFacts) -> _Layout:
    if facts.processor_class == "PixtralProcessor":
        rows = _row_ids(processor)
        return _Layout(ROWS, row_ids=rows) if rows else _Layout()
    if facts.processor_class in loading.DEVICE_NORMALIZE_PROCESSORS:
        return _Layout(GRID)
    if facts.processor_class == "LlavaOnevisionProcessor":
        return _Layout(TILES)
    if facts.processor_class == "Idefics3Processor":
        return _Layout(SPLIT)
    if facts.processor_class == "InternVLProcessor":
        crops = _crops(processor)
        return _Layout(CROPS, crop_ids=crops[0], tokens_per_crop=crops[1]) if crops else _Layout()
    if facts.processor_class == "Gemma3Processor" and (found := _image_sequence(processor)) is not None:
        return _Layout(SEQUENCE, *found)
    return _Layout()


def model_facts(processor: Any, facts: ProcessorFacts, settings: RenderSettings) -> ModelFacts:
    config = _model_config(facts.model)
    text_config = config.get("text_config") or config
    max_len = (
        settings.max_model_len or text_config.get("max_position_embeddings") or config.get("max_position_embeddings") or 2048
    )
    token_id = getattr(processor, "image_token_id", None)
    if token_id is None and facts.image_token:
        token_id = processor.tokenizer.convert_tokens_to_ids(facts.image_token)
    layout = _item_layout(processor, facts)
    return ModelFacts(
        model_id=facts.model,
        served_name=settings.served_model_name or facts.model,
        max_model_len=int(max_len),
        dtype=_torch_dtype_name(config),
        image_token_id=token_id,
        device_normalize=not settings.normalized_pixels and facts.normalizes_on_device,
        expands_by_grid=layout.name == GRID
        and token_id is not None
        and hasattr(getattr(processor, "image_processor", None), "merge_size"),
        eos_token_ids=_generation_eos(facts.model, config),
        item_layout=layout.name,
        image_sequence=layout.image_sequence,
        newline_ids=layout.newline_ids,
        row_ids=layout.row_ids,
        crop_ids=layout.crop_ids,
        tokens_per_crop=layout.tokens_per_crop,
        audio_token_id=_audio_token_id(processor, facts),
        sampling_rate=facts.sampling_rate,
    )
