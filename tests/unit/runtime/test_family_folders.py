"""Every family folder ``make-model`` builds loads through this virtualenv's transformers (the
native path's and the probe's), and its chat template places the family's image, video
and audio markers; that vLLM renders each one the same as mmprep is ``tests/compat``'s."""

from __future__ import annotations

import pathlib

import pytest

from mmprep_runtime.synthetic import families, models

SYSTEM = {"role": "system", "content": [{"type": "text", "text": "Answer in one sentence."}]}


@pytest.mark.parametrize("kind", list(families.FAMILIES))
def test_the_folder_loads_and_its_template_places_the_media(kind: str, tmp_path: pathlib.Path) -> None:
    from transformers import AutoProcessor

    folder = models.make_model(kind, tmp_path / kind)
    processor = AutoProcessor.from_pretrained(str(folder))
    chat = families.FAMILIES[kind].chat
    media = {"image": chat.image, "video": chat.video, "audio": chat.audio}
    taken = [modality for modality, placeholder in media.items() if placeholder]
    assert taken, f"{kind} takes no media"
    parts = [*({"type": t} for t in taken), {"type": "text", "text": "What?"}]
    prompt = processor.apply_chat_template([SYSTEM, {"role": "user", "content": parts}], tokenize=False)
    for modality in taken:
        assert media[modality] in prompt, (modality, prompt)
    assert "Answer in one sentence." in prompt
