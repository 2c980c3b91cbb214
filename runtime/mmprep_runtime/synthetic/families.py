"""The model families ``models`` builds beyond Qwen2-VL (vision-language, and one
audio-language family): what each folder holds.

Each family is data: its processor class and sub-processor configs, the special tokens its
tokenizer needs (trained into the small BPE first, so their ids are small), the tokenizer
attributes the processor reads (``image_token``, ``boi_token``...), its chat format and the
model ``config.json`` a serving stack reads beside the processor (architecture, token ids, the
vision tower's geometry; small text and vision dims, no weights). ``models`` writes the
files; this module only describes them, so it imports nothing heavy.

Sub-processor configs name the class and only the values the published checkpoints set apart
from the class defaults (sizes, means, patch sizes), so the per-image cost is the real model's.
Each family's ``config.json`` agrees with its processor: vLLM recomputes the number of placeholder
tokens from the config and refuses a request where it differs from what the HF processor produced.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any, Final

Vocab = Mapping[str, int]

# Small text and vision towers: nothing loads weights from them, vLLM's render server only reads them.
_HIDDEN: Final = 64
_HEADS: Final = 2


@dataclasses.dataclass(frozen=True)
class ChatFormat:
    """A chat template in parts: per-role turn openers and closers, the image, video and audio
    placeholders (empty: the family does not take that modality).

    The template it renders loops over the content parts, so chat front ends (vLLM's among them)
    hand it OpenAI-style part lists, for every role, the system one included.
    """

    start: str
    user: tuple[str, str]
    assistant: tuple[str, str]
    system: tuple[str, str]
    generation: str
    image: str
    video: str = ""
    default_system: str = ""
    audio: str = ""


@dataclasses.dataclass(frozen=True)
class Family:
    processor: Callable[[str], dict[str, Any]]
    model: Callable[[Vocab], dict[str, Any]]
    chat: ChatFormat
    special_tokens: tuple[str, ...]
    eos_token: str = "<|endoftext|>"
    named_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict)
    plain_tokens: tuple[str, ...] = ()


def _lit(text: str) -> str:
    """A Jinja expression printing ``text`` verbatim (whitespace control never eats it)."""
    return "{{ " + json.dumps(text) + " }}"


def _part(types: tuple[str, ...], placeholder: str) -> str:
    test = " or ".join(f"part['type'] == '{t}'" for t in types)
    return f"{{%- elif {test} -%}}{_lit(placeholder)}" if placeholder else ""


def _content(chat: ChatFormat) -> str:
    return (
        "{%- if message['content'] is string -%}{{ message['content'] }}"
        "{%- else -%}{%- for part in message['content'] -%}"
        "{%- if false -%}"
        f"{_part(('image', 'image_url'), chat.image)}"
        f"{_part(('video', 'video_url'), chat.video)}"
        f"{_part(('audio', 'input_audio', 'audio_url'), chat.audio)}"
        "{%- elif part['type'] == 'text' -%}{{ part['text'] }}"
        "{%- endif -%}{%- endfor -%}{%- endif -%}"
    )


def _by_role(chat: ChatFormat, side: int) -> str:
    return (
        f"{{%- if message['role'] == 'system' -%}}{_lit(chat.system[side])}"
        f"{{%- elif message['role'] == 'assistant' -%}}{_lit(chat.assistant[side])}"
        f"{{%- else -%}}{_lit(chat.user[side])}{{%- endif -%}}"
    )


def chat_template(chat: ChatFormat) -> str:
    default = ""
    if chat.default_system:
        opener, closer = chat.system
        default = f"{{%- if messages[0]['role'] != 'system' -%}}{_lit(opener + chat.default_system + closer)}{{%- endif -%}}"
    return (
        f"{_lit(chat.start)}{default}"
        "{%- for message in messages -%}"
        f"{_by_role(chat, 0)}{_content(chat)}{_by_role(chat, 1)}"
        "{%- endfor -%}"
        f"{{%- if add_generation_prompt -%}}{_lit(chat.generation)}{{%- endif -%}}\n"
    )


def vocab_size(vocab: Vocab) -> int:
    return max(vocab.values()) + 1


def _text(model_type: str, vocab: Vocab, **extra: Any) -> dict[str, Any]:
    """A one-layer text tower of ``model_type``."""
    return {
        "model_type": model_type,
        "vocab_size": vocab_size(vocab),
        "hidden_size": _HIDDEN,
        "intermediate_size": 2 * _HIDDEN,
        "num_hidden_layers": 1,
        "num_attention_heads": _HEADS,
        "num_key_value_heads": 1,
        "head_dim": _HIDDEN // _HEADS,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "bfloat16",
        **extra,
    }


def _vision(**geometry: Any) -> dict[str, Any]:
    """A one-layer vision tower with the real ``geometry`` (patch, image and merge sizes)."""
    return {
        "hidden_size": _HIDDEN,
        "intermediate_size": 2 * _HIDDEN,
        "num_hidden_layers": 1,
        "num_attention_heads": _HEADS,
        **geometry,
    }


def _model(architecture: str, model_type: str, **fields: Any) -> dict[str, Any]:
    return {"architectures": [architecture], "model_type": model_type, "torch_dtype": "bfloat16", **fields}


def _image_processor(family: str, backend: str, **real: Any) -> dict[str, Any]:
    # transformers v5 names the PIL backend classes with a ``Pil`` suffix; the plain name is the
    # torchvision ("fast") class.
    return {"image_processor_type": family if backend == "torchvision" else f"{family}Pil", **real}


# ---------------------------------------------------------------------------------------- Qwen

_CHATML: Final = {
    "user": ("<|im_start|>user\n", "<|im_end|>\n"),
    "assistant": ("<|im_start|>assistant\n", "<|im_end|>\n"),
    "system": ("<|im_start|>system\n", "<|im_end|>\n"),
}
#: Qwen's chat and vision special tokens (the ``qwen2-vl`` kind's too: ``models``).
QWEN_TOKENS: Final = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)


#: The markers vLLM's Hermes tool parser and Qwen3 reasoning parser look for, whole tokens (not
#: special, as in Qwen's own tokenizers): a folder with them can be served with those parsers.
QWEN_PARSER_TOKENS: Final = ("<tool_call>", "</tool_call>", "<think>", "</think>")


def _qwen_chat(default_system: str = "") -> ChatFormat:
    return ChatFormat(
        start="",
        generation="<|im_start|>assistant\n",
        image="<|vision_start|><|image_pad|><|vision_end|>",
        video="<|vision_start|><|video_pad|><|vision_end|>",
        default_system=default_system,
        user=_CHATML["user"],
        assistant=_CHATML["assistant"],
        system=_CHATML["system"],
    )


def _qwen_ids(vocab: Vocab) -> dict[str, int]:
    return {
        "image_token_id": vocab["<|image_pad|>"],
        "video_token_id": vocab["<|video_pad|>"],
        "vision_start_token_id": vocab["<|vision_start|>"],
        "vision_end_token_id": vocab["<|vision_end|>"],
    }


def _qwen_text(model_type: str, vocab: Vocab, mrope_section: list[int]) -> dict[str, Any]:
    return _text(
        model_type,
        vocab,
        rope_theta=1000000.0,
        rope_scaling={"rope_type": "default", "mrope_section": mrope_section},
        bos_token_id=vocab["<|endoftext|>"],
        eos_token_id=vocab["<|im_end|>"],
    )


def _qwen2_5_vl_processor(backend: str) -> dict[str, Any]:
    # Qwen2.5-VL's published preprocessor config: Qwen2-VL's classes, min/max pixels 3136/12845056.
    # Kept: a 12-megapixel photo becomes ~15.6k tokens and costs ~0.6 s on one CPU core (~1 s through
    # vLLM's render server, its 100 MB answer included), not seconds; Qwen3-VL about the same, GLM-4.1V less.
    size = {"shortest_edge": 3136, "longest_edge": 12845056}
    return {
        "processor_class": "Qwen2_5_VLProcessor",
        "image_processor": _image_processor("Qwen2VLImageProcessor", backend, size=size),
        "video_processor": {"video_processor_type": "Qwen2VLVideoProcessor"},
    }


def _qwen2_5_vl_model(vocab: Vocab) -> dict[str, Any]:
    vision = {
        "depth": 1,
        "hidden_size": _HIDDEN,
        "intermediate_size": 2 * _HIDDEN,
        "num_heads": _HEADS,
        "out_hidden_size": _HIDDEN,
        "in_channels": 3,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [0],
        "tokens_per_second": 2,
    }
    return _model(
        "Qwen2_5_VLForConditionalGeneration",
        "qwen2_5_vl",
        text_config=_qwen_text("qwen2_5_vl_text", vocab, [4, 6, 6]),
        vision_config=vision,
        **_qwen_ids(vocab),
    )


def _qwen3_vl_processor(backend: str) -> dict[str, Any]:
    # Qwen3-VL's published preprocessor config: Qwen2-VL's image class with 16-pixel patches, mean and
    # std 0.5, and 65536..16777216 pixels; its own video class with its defaults.
    image = _image_processor(
        "Qwen2VLImageProcessor",
        backend,
        patch_size=16,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        size={"shortest_edge": 65536, "longest_edge": 16777216},
    )
    return {
        "processor_class": "Qwen3VLProcessor",
        "image_processor": image,
        "video_processor": {"video_processor_type": "Qwen3VLVideoProcessor"},
    }


def _qwen3_vl_model(vocab: Vocab) -> dict[str, Any]:
    vision = {
        "depth": 1,
        "hidden_size": _HIDDEN,
        "intermediate_size": 2 * _HIDDEN,
        "num_heads": _HEADS,
        "out_hidden_size": _HIDDEN,
        "in_channels": 3,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [0],
    }
    return _model(
        "Qwen3VLForConditionalGeneration",
        "qwen3_vl",
        text_config=_qwen_text("qwen3_vl_text", vocab, [8, 4, 4]),
        vision_config=vision,
        **_qwen_ids(vocab),
    )


# -------------------------------------------------------------------------------------- Gemma 3

_GEMMA_TOKENS: Final = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
)
_GEMMA_IMAGE_TOKENS: Final = 256


def _gemma3_processor(backend: str) -> dict[str, Any]:
    # Gemma 3's published preprocessor config: 896x896 (the class defaults to 224), pan-and-scan off.
    image = _image_processor("Gemma3ImageProcessor", backend, size={"height": 896, "width": 896})
    return {"processor_class": "Gemma3Processor", "image_processor": image, "image_seq_length": _GEMMA_IMAGE_TOKENS}


def _gemma3_model(vocab: Vocab) -> dict[str, Any]:
    text = _text(
        "gemma3_text",
        vocab,
        sliding_window=512,
        max_position_embeddings=131072,
        bos_token_id=vocab["<bos>"],
        eos_token_id=vocab["<eos>"],
        pad_token_id=vocab["<pad>"],
    )
    vision = _vision(model_type="siglip_vision_model", image_size=896, patch_size=14, vision_use_head=False)
    return _model(
        "Gemma3ForConditionalGeneration",
        "gemma3",
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=_GEMMA_IMAGE_TOKENS,
        boi_token_index=vocab["<start_of_image>"],
        eoi_token_index=vocab["<end_of_image>"],
        image_token_index=vocab["<image_soft_token>"],
    )


# Gemma has no system role: its template folds the system text into a user turn.
_GEMMA_CHAT: Final = ChatFormat(
    start="<bos>",
    user=("<start_of_turn>user\n", "<end_of_turn>\n"),
    assistant=("<start_of_turn>model\n", "<end_of_turn>\n"),
    system=("<start_of_turn>user\n", "<end_of_turn>\n"),
    generation="<start_of_turn>model\n",
    image="<start_of_image>",
)


# ------------------------------------------------------------------------------ LLaVA-OneVision

_ONEVISION_TOKENS: Final = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>")
_SIGLIP_384: Final = {"model_type": "siglip_vision_model", "image_size": 384, "patch_size": 14, "vision_use_head": False}


def _onevision_processor(backend: str) -> dict[str, Any]:
    # llava-onevision-qwen2-*-ov-hf: 384x384 tiles (anyres up to 2304x2304), mean and std 0.5.
    half = [0.5, 0.5, 0.5]
    image = _image_processor("LlavaOnevisionImageProcessor", backend, image_mean=half, image_std=half)
    return {
        "processor_class": "LlavaOnevisionProcessor",
        "image_processor": image,
        "video_processor": {"video_processor_type": "LlavaOnevisionVideoProcessor", "image_mean": half, "image_std": half},
        "num_image_tokens": 729,
        "vision_feature_select_strategy": "full",
        "vision_aspect_ratio": "anyres_max_9",
        "image_token": "<image>",
        "video_token": "<video>",
    }


def _onevision_pinpoints() -> list[list[int]]:
    sides = range(384, 2305, 384)
    return [[h, w] for h in sides for w in sides]


def _onevision_model(vocab: Vocab) -> dict[str, Any]:
    text = _text("qwen2", vocab, bos_token_id=vocab["<|endoftext|>"], eos_token_id=vocab["<|im_end|>"])
    return _model(
        "LlavaOnevisionForConditionalGeneration",
        "llava_onevision",
        text_config=text,
        vision_config=_vision(**_SIGLIP_384),
        image_token_index=vocab["<image>"],
        video_token_index=vocab["<video>"],
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        vision_aspect_ratio="anyres_max_9",
        image_grid_pinpoints=_onevision_pinpoints(),
    )


# ------------------------------------------------------------------------------------- Idefics3

_IDEFICS3_TOKENS: Final = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *(f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)),
)


def _idefics3_processor(backend: str) -> dict[str, Any]:
    # The class defaults are Idefics3-8B's: 364-pixel tiles of an image resized to at most 1456 pixels.
    return {
        "processor_class": "Idefics3Processor",
        "image_processor": _image_processor("Idefics3ImageProcessor", backend),
        "image_seq_len": 169,
    }


def _idefics3_model(vocab: Vocab) -> dict[str, Any]:
    text = _text("llama", vocab, bos_token_id=vocab["<|begin_of_text|>"], eos_token_id=vocab["<end_of_utterance>"])
    return _model(
        "Idefics3ForConditionalGeneration",
        "idefics3",
        text_config=text,
        vision_config=_vision(model_type="idefics3_vision", image_size=364, patch_size=14),
        image_token_id=vocab["<image>"],
        scale_factor=2,
    )


_IDEFICS3_CHAT: Final = ChatFormat(
    start="<|begin_of_text|>",
    user=("User:", "<end_of_utterance>\n"),
    assistant=("Assistant:", "<end_of_utterance>\n"),
    system=("System:", "<end_of_utterance>\n"),
    generation="Assistant:",
    image="<image>",
)


# ------------------------------------------------------------------------------------- InternVL

_INTERNVL_TOKENS: Final = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>")


def _internvl_processor(backend: str) -> dict[str, Any]:
    # InternVL3-*-hf: 448x448 tiles, 1 to 12 of them plus a thumbnail, ImageNet mean and std.
    real = {
        "size": {"height": 448, "width": 448},
        "crop_to_patches": True,
        "min_patches": 1,
        "max_patches": 12,
        "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225],
    }
    video = {"video_processor_type": "InternVLVideoProcessor", **{k: real[k] for k in ("size", "image_mean", "image_std")}}
    return {
        "processor_class": "InternVLProcessor",
        "image_processor": _image_processor("GotOcr2ImageProcessor", backend, **real),
        "video_processor": video,
        "image_seq_length": 256,
    }


def _internvl_model(vocab: Vocab) -> dict[str, Any]:
    text = _text("qwen2", vocab, bos_token_id=vocab["<|endoftext|>"], eos_token_id=vocab["<|im_end|>"])
    vision = _vision(model_type="internvl_vision", image_size=[448, 448], patch_size=[14, 14])
    return _model(
        "InternVLForConditionalGeneration",
        "internvl",
        text_config=text,
        vision_config=vision,
        image_token_id=vocab["<IMG_CONTEXT>"],
        downsample_ratio=0.5,
        projector_hidden_act="gelu",
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )


# ---------------------------------------------------------------------------------------- GLM-4.1V

_GLM_TOKENS: Final = (
    "<|endoftext|>",
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|image|>",
    "<|video|>",
)


def _glm4v_processor(backend: str) -> dict[str, Any]:
    # GLM-4.1V-9B-Thinking: images of 12544..9633792 pixels (the class defaults to 11760000), 14-pixel
    # patches. vLLM reads the video size from the raw config (its warm-up fails without it).
    size = {"shortest_edge": 12544, "longest_edge": 9633792}
    video = {"video_processor_type": "Glm4vVideoProcessor", "size": {"shortest_edge": 12544, "longest_edge": 47040000}}
    return {
        "processor_class": "Glm4vProcessor",
        "image_processor": _image_processor("Glm4vImageProcessor", backend, size=size),
        "video_processor": video,
    }


def _glm4v_model(vocab: Vocab) -> dict[str, Any]:
    text = _text(
        "glm4v_text",
        vocab,
        partial_rotary_factor=0.5,
        rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3]},
        eos_token_id=vocab["<|endoftext|>"],
    )
    vision = {
        "depth": 1,
        "hidden_size": _HIDDEN,
        "intermediate_size": 2 * _HIDDEN,
        "num_heads": _HEADS,
        "out_hidden_size": _HIDDEN,
        "in_channels": 3,
        "image_size": 336,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "rms_norm_eps": 1e-5,
    }
    return _model(
        "Glm4vForConditionalGeneration",
        "glm4v",
        text_config=text,
        vision_config=vision,
        image_token_id=vocab["<|image|>"],
        video_token_id=vocab["<|video|>"],
        image_start_token_id=vocab["<|begin_of_image|>"],
        image_end_token_id=vocab["<|end_of_image|>"],
        video_start_token_id=vocab["<|begin_of_video|>"],
        video_end_token_id=vocab["<|end_of_video|>"],
    )


_GLM_CHAT: Final = ChatFormat(
    start="[gMASK]<sop>",
    user=("<|user|>\n", ""),
    assistant=("<|assistant|>\n", ""),
    system=("<|system|>\n", ""),
    generation="<|assistant|>\n",
    image="<|begin_of_image|><|image|><|end_of_image|>",
    video="<|begin_of_video|><|video|><|end_of_video|>",
)


# ------------------------------------------------------------------------------------- Mistral 3

_MISTRAL_TOKENS: Final = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[IMG]",
    "[IMG_BREAK]",
    "[IMG_END]",
)


def _mistral3_processor(backend: str) -> dict[str, Any]:
    # Mistral-Small-3.1's published config: 14-pixel patches merged 2x2, images up to 1540 pixels.
    image = _image_processor(
        "PixtralImageProcessor", backend, size={"longest_edge": 1540}, patch_size={"height": 14, "width": 14}
    )
    return {"processor_class": "PixtralProcessor", "image_processor": image, "patch_size": 14, "spatial_merge_size": 2}


def _mistral3_model(vocab: Vocab) -> dict[str, Any]:
    text = _text("mistral", vocab, bos_token_id=vocab["<s>"], eos_token_id=vocab["</s>"], rope_theta=1000000000.0)
    vision = _vision(model_type="pixtral", image_size=1540, patch_size=14, head_dim=_HIDDEN // _HEADS, rope_theta=10000.0)
    return _model(
        "Mistral3ForConditionalGeneration",
        "mistral3",
        text_config=text,
        vision_config=vision,
        image_token_index=vocab["[IMG]"],
        spatial_merge_size=2,
        vision_feature_layer=-1,
        projector_hidden_act="gelu",
        multimodal_projector_bias=False,
    )


_MISTRAL_CHAT: Final = ChatFormat(
    start="<s>",
    user=("[INST]", "[/INST]"),
    assistant=("", "</s>"),
    system=("[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"),
    generation="",
    image="[IMG]",
)


# ---------------------------------------------------------------------------------- Qwen2-Audio

_QWEN_AUDIO_TOKENS: Final = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_bos|>", "<|audio_eos|>", "<|AUDIO|>")


def _qwen2_audio_processor(backend: str) -> dict[str, Any]:
    # Qwen2-Audio-7B-Instruct's published feature extractor: Whisper's class with 128 mel bins (30 s
    # windows of 16 kHz audio). No image processor: the family takes audio and text only.
    del backend
    return {
        "processor_class": "Qwen2AudioProcessor",
        "feature_extractor": {
            "feature_extractor_type": "WhisperFeatureExtractor",
            "feature_size": 128,
            "return_attention_mask": True,
        },
    }


def _qwen2_audio_model(vocab: Vocab) -> dict[str, Any]:
    audio = {
        "model_type": "qwen2_audio_encoder",
        "num_mel_bins": 128,
        "encoder_layers": 1,
        "encoder_attention_heads": _HEADS,
        "encoder_ffn_dim": 2 * _HIDDEN,
        "d_model": _HIDDEN,
        "max_source_positions": 1500,
    }
    text = _text("qwen2", vocab, bos_token_id=vocab["<|endoftext|>"], eos_token_id=vocab["<|im_end|>"])
    return _model(
        "Qwen2AudioForConditionalGeneration",
        "qwen2_audio",
        text_config=text,
        audio_config=audio,
        audio_token_index=vocab["<|AUDIO|>"],
    )


FAMILIES: Final[Mapping[str, Family]] = {
    "qwen2.5-vl": Family(
        _qwen2_5_vl_processor,
        _qwen2_5_vl_model,
        _qwen_chat("You are a helpful assistant."),
        QWEN_TOKENS,
        plain_tokens=QWEN_PARSER_TOKENS,
    ),
    "qwen3-vl": Family(_qwen3_vl_processor, _qwen3_vl_model, _qwen_chat(), QWEN_TOKENS),
    "gemma3": Family(
        _gemma3_processor,
        _gemma3_model,
        _GEMMA_CHAT,
        _GEMMA_TOKENS,
        eos_token="<eos>",
        named_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"},
        # vLLM's Gemma 3 code looks up these runs of newlines in the vocabulary: Gemma's has them.
        plain_tokens=tuple("\n" * n for n in range(1, 5)),
    ),
    "llava-onevision": Family(
        _onevision_processor,
        _onevision_model,
        dataclasses.replace(_qwen_chat(), image="<image>", video="<video>"),
        _ONEVISION_TOKENS,
        plain_tokens=QWEN_PARSER_TOKENS,
    ),
    "idefics3": Family(_idefics3_processor, _idefics3_model, _IDEFICS3_CHAT, _IDEFICS3_TOKENS, eos_token="<end_of_utterance>"),
    "internvl": Family(
        _internvl_processor,
        _internvl_model,
        dataclasses.replace(_qwen_chat(), image="<IMG_CONTEXT>", video="<video>"),
        _INTERNVL_TOKENS,
        named_tokens={
            "start_image_token": "<img>",
            "end_image_token": "</img>",
            "context_image_token": "<IMG_CONTEXT>",
            "video_token": "<video>",
        },
    ),
    "glm4v": Family(_glm4v_processor, _glm4v_model, _GLM_CHAT, _GLM_TOKENS),
    "mistral3": Family(_mistral3_processor, _mistral3_model, _MISTRAL_CHAT, _MISTRAL_TOKENS, eos_token="</s>"),
    "qwen2-audio": Family(
        _qwen2_audio_processor,
        _qwen2_audio_model,
        dataclasses.replace(_qwen_chat(), image="", video="", audio="<|audio_bos|><|AUDIO|><|audio_eos|>"),
        _QWEN_AUDIO_TOKENS,
        plain_tokens=QWEN_PARSER_TOKENS,
    ),
}
