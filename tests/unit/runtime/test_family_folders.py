"""Every family folder ``make-model`` builds loads through this virtualenv's transformers (the
native path's and the probe's), and its chat template places the family's image and video
markers; that vLLM renders each one the same as mmprep is ``tests/compat``'s."""

from __future__ import annotations

import pathlib

import pytest

from mmprep_runtime import testing_families, testing_models

SYSTEM = {"role": "system", "content": [{"type": "text", "text": "Answer in one sentence."}]}


@pytest.mark.parametrize("kind", list(testing_families.FAMILIES))
def test_the_folder_loads_and_its_template_places_the_media(kind: str, tmp_path: pathlib.Path) -> None:
    from transformers import AutoProcessor

    folder = testing_models.make_model(kind, tmp_path / kind)
    processor = AutoProcessor.from_pretrained(str(folder))
    chat = testing_families.FAMILIES[kind].chat
    parts = [{"type": "image"}, *([{"type": "video"}] if chat.video else []), {"type": "text", "text": "What?"}]
    prompt = processor.apply_chat_template([SYSTEM, {"role": "user", "content": parts}], tokenize=False)
    assert chat.image in prompt
    if chat.video:
        assert chat.video in prompt
    assert "Answer in one sentence." in prompt
