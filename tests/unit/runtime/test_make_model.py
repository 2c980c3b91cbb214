"""make-model builds folders that load through AutoProcessor as the real classes, quickly."""

from __future__ import annotations

import copy
import json
import pathlib

import pytest

from mmprep_runtime import cli, declared
from mmprep_runtime.synthetic import models


def _load(folder: pathlib.Path, *, trust_remote_code: bool = False):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(folder), trust_remote_code=trust_remote_code)


@pytest.mark.parametrize(
    ("kind", "processor_class", "part", "part_class"),
    [
        ("qwen2-vl", "Qwen2VLProcessor", "image_processor", "Qwen2VLImageProcessor"),
        ("llava", "LlavaProcessor", "image_processor", "CLIPImageProcessor"),
        ("whisper", "WhisperProcessor", "feature_extractor", "WhisperFeatureExtractor"),
    ],
)
def test_each_kind_loads_as_its_real_processor_classes(model_factory, kind, processor_class, part, part_class):
    processor = _load(model_factory(kind))
    assert type(processor).__name__ == processor_class
    assert type(getattr(processor, part)).__name__ == part_class
    assert processor.tokenizer("a cat on a mat")["input_ids"]


def test_bare_tokenizer_kind_loads_as_a_tokenizer(tokenizer_dir):
    processor = _load(tokenizer_dir)
    assert not hasattr(processor, "tokenizer")
    assert processor("a cat on a mat")["input_ids"]


def test_uncloneable_kind_needs_remote_code_and_refuses_deepcopy(uncloneable_dir):
    with pytest.raises(ValueError, match="custom code"):
        _load(uncloneable_dir)
    processor = _load(uncloneable_dir, trust_remote_code=True)
    assert type(processor).__name__ == models.UNCLONEABLE_CLASS
    with pytest.raises(TypeError, match="cannot be copied"):
        copy.deepcopy(processor)


def test_qwen_processor_expands_the_image_placeholder(qwen_dir):
    from PIL import Image

    processor = _load(qwen_dir)
    out = processor(
        text=f"look {models.QWEN_IMAGE_PLACEHOLDER}",
        images=[Image.new("RGB", (112, 112))],
        return_tensors="pt",
    )
    assert out["pixel_values"].shape[1] == 1176
    assert (out["input_ids"] == processor.image_token_id).sum() == out["image_grid_thw"].prod() // 4


def test_declared_workers_land_in_the_sidecar(tmp_path):
    out = models.make_model("llava", tmp_path / "m", declared_workers=5)
    assert json.loads((out / declared.SIDECAR_NAME).read_text()) == {declared.SIDECAR_KEY: 5}
    assert declared.declaration_of(out, "LlavaProcessor").processor_workers == 5


def test_cli_builds_a_folder_and_prints_its_path(tmp_path, capsys):
    assert cli.main(["make-model", "--kind", "qwen2-vl", "--backend", "pil", "--out", str(tmp_path / "q")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "q")
    config = json.loads((tmp_path / "q" / "processor_config.json").read_text())
    assert config["image_processor"]["image_processor_type"] == "Qwen2VLImageProcessorPil"


def test_cli_refuses_an_unknown_kind_and_a_non_empty_folder(tmp_path, capsys):
    assert cli.main(["make-model", "--kind", "gpt", "--out", str(tmp_path / "x")]) == cli.EXIT_USAGE
    assert "unknown model kind 'gpt'" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "file").write_text("x")
    assert cli.main(["make-model", "--kind", "llava", "--out", str(tmp_path / "full")]) == cli.EXIT_USAGE
    assert "not an empty folder" in capsys.readouterr().err


def test_a_model_declares_thread_safety_and_io_workers_in_its_sidecar(tmp_path):
    out = models.make_model("llava", tmp_path / "m", declared_io_workers=6, thread_safe=False)
    assert json.loads((out / declared.SIDECAR_NAME).read_text()) == {"io_workers": 6, "thread_safe": False}
    assert declared.declaration_of(out, "LlavaProcessor") == declared.Declaration(None, 6, False)
    # The built-in count still applies where the sidecar names none.
    assert declared.declaration_of(out, "Qwen2VLProcessor").processor_workers == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"thread_safety": False}, "unknown key"),
        ({"thread_safe": "no"}, "true or false"),
        ({"io_workers": 0}, "between"),
    ],
)
def test_a_sidecar_that_says_something_wrong_is_refused(tmp_path, content, message):
    (tmp_path / declared.SIDECAR_NAME).write_text(json.dumps(content))
    with pytest.raises(declared.DeclarationError, match=message):
        declared.read_sidecar(tmp_path)
