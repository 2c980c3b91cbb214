"""Build real processor folders offline, for tests, demos and benchmarks.

No model hub is reachable where mmprep is tested, so every processor the tests load is built here
from real transformers classes and a small byte-level BPE tokenizer trained with ``tokenizers`` on a
tiny corpus. The folders load through ``AutoProcessor.from_pretrained(folder)`` exactly like a
downloaded model would. The image processor configs are the real defaults of each class, so the
preprocessing cost per image is the real one; only the vocabulary is small.

Kinds:
- ``qwen2-vl``: Qwen2VLProcessor (image processor backend ``torchvision`` or ``pil``, video processor),
  with the model's ``config.json`` (no weights) and a chat template, so vLLM's GPU-less render
  server loads the same folder (the compatibility tests and the benchmark run both on it);
- ``llava``: LlavaProcessor over a CLIP image processor (one ``<image>`` placeholder per image);
- ``whisper``: WhisperProcessor (audio feature extractor + tokenizer);
- ``tokenizer``: a bare tokenizer (``AutoProcessor`` returns the tokenizer itself);
- ``uncloneable``: a llava-style processor shipped as remote code (``auto_map``) whose deepcopy
  raises, the way processors holding a native handle do. Loads only with ``trust_remote_code``;
- more vision-language families, each with its ``config.json`` and chat template so vLLM's render
  server loads it too (``mmprep_runtime.synthetic.families`` describes them): ``qwen2.5-vl``
  (Qwen2_5_VLProcessor), ``qwen3-vl`` (Qwen3VLProcessor), ``gemma3`` (Gemma3Processor),
  ``llava-onevision`` (LlavaOnevisionProcessor), ``idefics3`` (Idefics3Processor), ``internvl``
  (InternVLProcessor, HF format), ``glm4v`` (Glm4vProcessor, GLM-4.1V) and ``mistral3``
  (PixtralProcessor); and one audio-language family, ``qwen2-audio`` (Qwen2AudioProcessor).

Any kind may carry a sidecar ``mmprep.json`` with ``{"processor_workers": N}`` (see
``mmprep_runtime.declared``).
"""

from __future__ import annotations

import enum
import json
import pathlib
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any, Final

from mmprep_runtime import declared
from mmprep_runtime.synthetic import families

SPECIAL_TOKENS: Final = (*families.QWEN_TOKENS, "<image>")
LLAVA_IMAGE_TOKEN: Final = "<image>"
QWEN_IMAGE_PLACEHOLDER: Final = "<|vision_start|><|image_pad|><|vision_end|>"

# A few sentences are enough: the tokenizer only has to be a real trained BPE, not a good one.
_CORPUS: Final = (
    "Describe this picture in one sentence.",
    "What is written on the page of this document?",
    "A cat is sitting on a red mat next to the window.",
    "The quick brown fox jumps over the lazy dog.",
    "Transcribe the audio and summarise it.",
    "How many people are in the image, and what are they doing?",
)
_VOCAB_SIZE: Final = 600

UNCLONEABLE_MODULE: Final = "processing_uncloneable"
UNCLONEABLE_CLASS: Final = "UncloneableProcessor"

# The remote code of the ``uncloneable`` kind. It is real remote code: transformers imports it from
# the folder only when trust_remote_code is given.
_UNCLONEABLE_SOURCE: Final = textwrap.dedent(
    '''
    """A llava-style processor that cannot be deep-copied.

    It stands in for processors that hold a native handle (a session, a lock, a Rust object
    without copy support): copying them raises, so a pool cannot give each thread its own copy.
    """

    from transformers import LlavaProcessor


    class UncloneableProcessor(LlavaProcessor):
        def __deepcopy__(self, memo):
            raise TypeError(
                "UncloneableProcessor holds a native session handle that cannot be copied"
            )
    '''
).lstrip()


class Kind(str, enum.Enum):
    QWEN2_VL = "qwen2-vl"
    LLAVA = "llava"
    WHISPER = "whisper"
    TOKENIZER = "tokenizer"
    UNCLONEABLE = "uncloneable"
    QWEN2_5_VL = "qwen2.5-vl"
    QWEN3_VL = "qwen3-vl"
    GEMMA3 = "gemma3"
    LLAVA_ONEVISION = "llava-onevision"
    IDEFICS3 = "idefics3"
    INTERNVL = "internvl"
    GLM4V = "glm4v"
    MISTRAL3 = "mistral3"
    QWEN2_AUDIO = "qwen2-audio"


class ModelBuildError(ValueError):
    """The folder cannot be built as asked (bad kind, bad backend, existing non-empty folder)."""


def write_tokenizer(
    out: pathlib.Path,
    processor_class: str | None = None,
    *,
    special_tokens: tuple[str, ...] = SPECIAL_TOKENS,
    eos_token: str = "<|endoftext|>",
    named_tokens: Mapping[str, str] | None = None,
    plain_tokens: Iterable[str] = (),
) -> None:
    """Train a byte-level BPE on a tiny corpus; write it as a tokenizers-backed transformers tokenizer.

    ``special_tokens`` come first in the vocabulary (ids 0, 1, ...); ``named_tokens`` become tokenizer
    attributes (``tokenizer.image_token`` and ``tokenizer.image_token_id``), which some processors read;
    ``plain_tokens`` are added as whole, non-special tokens.

    The files are written directly rather than through transformers' ``save_pretrained``: importing
    the processor classes pulls in torch and takes seconds, and building a folder must stay fast.
    A unit test loads every kind through ``AutoProcessor`` and checks the classes it gets.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    raw = Tokenizer(models.BPE(unk_token=None))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE,
        special_tokens=list(special_tokens),
        # The full byte alphabet makes every input encodable, as with real byte-level BPEs.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(list(_CORPUS) * 4, trainer)
    raw.add_tokens([AddedToken(token, normalized=False, special=False) for token in plain_tokens])
    raw.save(str(out / "tokenizer.json"))
    config: dict[str, Any] = {
        "backend": "tokenizers",
        "tokenizer_class": "TokenizersBackend",
        "eos_token": eos_token,
        "pad_token": eos_token,
        # A mapping names the tokens (tokenizer attributes); a list only marks them special.
        "extra_special_tokens": dict(named_tokens) if named_tokens else [t for t in special_tokens if t != eos_token],
        "model_max_length": 32768,
    }
    if processor_class is not None:
        config["processor_class"] = processor_class
    _write_json(out / "tokenizer_config.json", config)


def _write_json(path: pathlib.Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def _image_processor_type(family: str, backend: str) -> str:
    # transformers v5 names the PIL backend classes with a ``Pil`` suffix; the plain name is the
    # torchvision ("fast") class.
    return family if backend == "torchvision" else f"{family}Pil"


# Sub-processor configs name only their class: every other value is the class's own default, so
# the per-image cost is that of the real processor.
def _qwen2_vl_config(backend: str) -> dict[str, Any]:
    return {
        "processor_class": "Qwen2VLProcessor",
        "image_processor": {"image_processor_type": _image_processor_type("Qwen2VLImageProcessor", backend)},
        "video_processor": {"video_processor_type": "Qwen2VLVideoProcessor"},
    }


# Qwen2-VL's chat shape: a default system turn, one <|im_start|>role ... <|im_end|> block per message,
# each image part a vision block. It loops over the content parts, so chat front ends (vLLM's
# among them) hand it OpenAI-style part lists.
QWEN_CHAT_TEMPLATE: Final = (
    "{%- for message in messages -%}\n"
    "{%- if loop.first and message['role'] != 'system' -%}\n"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif -%}\n"
    "<|im_start|>{{ message['role'] }}\n"
    "{%- if message['content'] is string %}\n{{ message['content'] }}<|im_end|>\n"
    "{% else %}\n"
    "{% for part in message['content'] -%}\n"
    "{%- if part['type'] == 'image' or part['type'] == 'image_url' -%}\n"
    "<|vision_start|><|image_pad|><|vision_end|>\n"
    "{%- elif part['type'] == 'text' -%}\n"
    "{{ part['text'] }}\n"
    "{%- endif -%}\n"
    "{%- endfor %}<|im_end|>\n"
    "{% endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "<|im_start|>assistant\n"
    "{% endif -%}\n"
)


def _qwen2_vl_model_config(out: pathlib.Path) -> dict[str, Any]:
    """The model config a serving stack reads beside the processor: architecture, the special token
    ids (from the tokenizer just trained) and the vision tower's patch geometry. A small text tower:
    nothing loads weights from it."""
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    return {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "torch_dtype": "bfloat16",
        "vocab_size": _VOCAB_SIZE,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
        "bos_token_id": vocab["<|endoftext|>"],
        "eos_token_id": vocab["<|im_end|>"],
        "image_token_id": vocab["<|image_pad|>"],
        "video_token_id": vocab["<|video_pad|>"],
        "vision_start_token_id": vocab["<|vision_start|>"],
        "vision_end_token_id": vocab["<|vision_end|>"],
        "vision_config": {
            "depth": 1,
            "embed_dim": 64,
            "hidden_size": 64,
            "mlp_ratio": 2,
            "num_heads": 2,
            "in_chans": 3,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    }


def _llava_config(backend: str, processor_class: str = "LlavaProcessor") -> dict[str, Any]:
    return {
        "processor_class": processor_class,
        "image_processor": {"image_processor_type": _image_processor_type("CLIPImageProcessor", backend)},
        "image_token": LLAVA_IMAGE_TOKEN,
        "patch_size": 14,
        "num_additional_image_tokens": 0,
        "vision_feature_select_strategy": "default",
    }


def _whisper_config() -> dict[str, Any]:
    return {
        "processor_class": "WhisperProcessor",
        "feature_extractor": {"feature_extractor_type": "WhisperFeatureExtractor"},
    }


def _write_family(family: families.Family, out: pathlib.Path, backend: str) -> None:
    """A family's folder: tokenizer, processor config, model config (ids from the new vocabulary), chat template."""
    processor_config = family.processor(backend)
    write_tokenizer(
        out,
        processor_config["processor_class"],
        special_tokens=family.special_tokens,
        eos_token=family.eos_token,
        named_tokens=family.named_tokens,
        plain_tokens=family.plain_tokens,
    )
    _write_json(out / "processor_config.json", processor_config)
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    vocab = {**tokenizer["model"]["vocab"], **{t["content"]: t["id"] for t in tokenizer["added_tokens"]}}
    _write_json(out / "config.json", family.model(vocab))
    (out / "chat_template.jinja").write_text(families.chat_template(family.chat))


def make_model(
    kind: Kind | str,
    out: pathlib.Path | str,
    *,
    backend: str = "torchvision",
    declared_workers: int | None = None,
    declared_io_workers: int | None = None,
    thread_safe: bool = True,
) -> pathlib.Path:
    """Write a processor folder of ``kind`` into ``out`` (created; must be empty if it exists)."""
    try:
        kind = Kind(kind)
    except ValueError:
        raise ModelBuildError(f"unknown model kind {kind!r}; choose one of {', '.join(k.value for k in Kind)}") from None
    if backend not in ("torchvision", "pil"):
        raise ModelBuildError(f"backend must be 'torchvision' or 'pil', got {backend!r}")
    out = pathlib.Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ModelBuildError(f"{out} exists and is not an empty folder")
    out.mkdir(parents=True, exist_ok=True)

    family = families.FAMILIES.get(kind.value)
    if family is not None:
        _write_family(family, out, backend)
        _declare(out, declared.Declaration(declared_workers, declared_io_workers, thread_safe))
        return out
    processor_config: dict[str, Any] | None
    if kind is Kind.QWEN2_VL:
        processor_config = _qwen2_vl_config(backend)
    elif kind is Kind.LLAVA:
        processor_config = _llava_config(backend)
    elif kind is Kind.WHISPER:
        processor_config = _whisper_config()
    elif kind is Kind.TOKENIZER:
        processor_config = None
    elif kind is Kind.UNCLONEABLE:
        processor_config = _llava_config(backend, UNCLONEABLE_CLASS)
        processor_config["auto_map"] = {"AutoProcessor": f"{UNCLONEABLE_MODULE}.{UNCLONEABLE_CLASS}"}
        (out / f"{UNCLONEABLE_MODULE}.py").write_text(_UNCLONEABLE_SOURCE)
    else:
        raise ModelBuildError(f"no builder for kind {kind.value!r}")
    write_tokenizer(out, processor_config["processor_class"] if processor_config else None)
    if processor_config is not None:
        _write_json(out / "processor_config.json", processor_config)
    if kind is Kind.QWEN2_VL:
        _write_json(out / "config.json", _qwen2_vl_model_config(out))
        (out / "chat_template.jinja").write_text(QWEN_CHAT_TEMPLATE)

    _declare(out, declared.Declaration(declared_workers, declared_io_workers, thread_safe))
    return out


def _declare(out: pathlib.Path, declaration: declared.Declaration) -> None:
    if declaration != declared.Declaration():
        declared.write_sidecar(out, declaration)
