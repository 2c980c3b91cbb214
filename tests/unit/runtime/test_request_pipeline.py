"""The pipeline's mapping of processor failures: bad input is 422, anything else 500, never a crash."""

from __future__ import annotations

import pytest

from mmprep_runtime import errors, loading, pipeline


def _facts(**overrides) -> loading.ProcessorFacts:
    values = dict(
        model="m", processor_class="P", tokenizer_class="T", image_processor_class=None,
        fast_image_processor=False, backend=None, feature_extractor_class=None, sampling_rate=None,
        image_token=None, declared_workers=None,
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

    from mmprep_runtime import testing_media
    from mmprep_runtime.settings import Limits

    image = base64.b64encode(testing_media.png(100, 100)).decode()
    body = ('{"text": "", "images": ["%s", "%s", "%s"]}' % (image, image, image)).encode()
    facts = _facts(image_processor_class="I")
    assert len(pipeline.decode_request(body, facts, Limits(max_request_pixels=30_000)).images) == 3
    with pytest.raises(errors.MediaTooLarge, match="images up to images\\[2\\] have 30000 pixels"):
        pipeline.decode_request(body, facts, Limits(max_request_pixels=29_999))
    with pytest.raises(errors.MediaTooLarge, match="images\\[1\\]"):
        pipeline.decode_request(body, _facts(image_processor_class="I", fast_image_processor=True),
                                Limits(max_request_pixels=15_000))
