"""The pipeline's mapping of processor failures: bad input is 422, anything else 500, never a crash."""

from __future__ import annotations

import json

import pytest

from mmprep_runtime import errors
from mmprep_runtime.engine import loading, pipeline
from mmprep_runtime.settings import ModelSettings


def _facts(**overrides) -> loading.ProcessorFacts:
    values = dict(
        model="m",
        processor_class="P",
        tokenizer_class="T",
        image_processor_class=None,
        fast_image_processor=False,
        backend=None,
        feature_extractor_class=None,
        sampling_rate=None,
        image_token=None,
        declared_workers=None,
    )
    values.update(overrides)
    return loading.ProcessorFacts(**values)


def _raising(exc: Exception):
    def processor(*args, **kwargs):
        raise exc

    return processor


def test_a_processor_value_error_is_a_422_with_its_message():
    with pytest.raises(errors.Unprocessable, match="rejected the input: ValueError: too small") as caught:
        pipeline.process(_raising(ValueError("too small")), pipeline.PreprocessRequest("x"), _facts())
    assert caught.value.status == 422


def test_any_other_processor_failure_is_a_500_with_its_message():
    with pytest.raises(errors.ProcessorFailed, match="RuntimeError: CUDA out of memory") as caught:
        pipeline.process(_raising(RuntimeError("CUDA out of memory")), pipeline.PreprocessRequest("x"), _facts())
    assert caught.value.status == 500


def test_text_over_the_limit_is_refused_before_any_work():
    from mmprep_runtime.settings import Limits

    with pytest.raises(errors.BadRequest, match="more than the limit of 10"):
        pipeline.decode_request(b'{"text": "' + b"x" * 11 + b'"}', _facts(), Limits(max_text_chars=10))


def test_too_many_images_are_refused_before_decoding():
    from mmprep_runtime.settings import Limits

    body = b'{"text": "", "images": ["a", "b", "c"]}'
    with pytest.raises(errors.BadRequest, match="3 items, more than the limit of 2"):
        pipeline.decode_request(body, _facts(image_processor_class="I"), Limits(max_images=2))


def test_the_pixels_of_all_images_together_are_capped():
    import base64

    from mmprep_runtime.settings import Limits
    from mmprep_runtime.synthetic import media

    image = base64.b64encode(media.png(100, 100)).decode()
    body = json.dumps({"text": "", "images": [image, image, image]}).encode()
    facts = _facts(image_processor_class="I")
    assert len(pipeline.decode_request(body, facts, Limits(max_request_pixels=30_000)).images) == 3
    with pytest.raises(errors.MediaTooLarge, match="images up to images\\[2\\] have 30000 pixels"):
        pipeline.decode_request(body, facts, Limits(max_request_pixels=29_999))
    with pytest.raises(errors.MediaTooLarge, match="images\\[1\\]"):
        pipeline.decode_request(
            body, _facts(image_processor_class="I", fast_image_processor=True), Limits(max_request_pixels=15_000)
        )


@pytest.mark.parametrize(("kind", "backend"), [("qwen2-vl", "pil"), ("llava", "pil"), ("qwen2-vl", "torchvision")])
def test_the_layout_images_are_decoded_to_changes_nothing_in_the_answer(model_factory, kind, backend):
    """Decoding straight to the processor's own layout (decoding.ImageLayout) is exact: the same
    tensors as handing the processor the PIL images, for a JPEG and a PNG in one request."""
    import base64
    import dataclasses

    import torch

    from mmprep_runtime.engine import decoding
    from mmprep_runtime.settings import Limits
    from mmprep_runtime.synthetic import media, models

    processor, facts = loading.load_processor(ModelSettings(str(model_factory(kind, backend=backend))))
    expected_layout = decoding.ImageLayout.ARRAY if backend == "pil" else decoding.ImageLayout.TENSOR
    assert facts.image_layout is expected_layout
    token = models.QWEN_IMAGE_PLACEHOLDER if kind == "qwen2-vl" else models.LLAVA_IMAGE_TOKEN
    body = {
        "text": f"first {token} then {token}",
        "images": [
            base64.b64encode(media.jpeg(120, 90, seed=3)).decode(),
            base64.b64encode(media.png(64, 48)).decode(),
        ],
    }
    request = pipeline.decode_request(json.dumps(body).encode(), facts, Limits())
    assert type(request.images[0]).__name__ == ("ndarray" if backend == "pil" else "Tensor")
    as_pil = dataclasses.replace(
        request, images=tuple(decoding.decode_image(base64.b64decode(item), "image", max_pixels=10**6) for item in body["images"])
    )
    ours, reference = pipeline.process(processor, request, facts), pipeline.process(processor, as_pil, facts)
    assert ours.keys() == reference.keys()
    for name in ours:
        assert ours[name].dtype == reference[name].dtype and torch.equal(ours[name], reference[name]), name
