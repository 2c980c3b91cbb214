"""Media decoding: every way an item can be bad is a typed error naming it; good items come back usable."""

from __future__ import annotations

import base64
import io
import wave

import numpy as np
import pytest
from PIL import Image

from mmprep_runtime import errors
from mmprep_runtime.engine import decoding
from mmprep_runtime.synthetic import media


def test_a_data_url_is_accepted_like_plain_base64():
    raw = media.png(8, 8)
    assert decoding.b64decode("data:image/png;base64," + base64.b64encode(raw).decode(), "x") == raw


def test_a_grayscale_png_comes_back_as_rgb():
    buffer = io.BytesIO()
    Image.new("L", (10, 6), 128).save(buffer, format="PNG")
    image = decoding.decode_image(buffer.getvalue(), "images[0]", max_pixels=100)
    assert (image.mode, image.size) == ("RGB", (10, 6))


def test_the_pixel_cap_is_checked_before_decoding():
    with pytest.raises(errors.MediaTooLarge, match="images\\[3\\] is 10x6 = 60 pixels, over the limit of 59"):
        decoding.decode_image(media.png(10, 6), "images[3]", max_pixels=59)


def test_an_image_format_outside_the_allowed_list_is_refused():
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, format="PPM")
    with pytest.raises(errors.BadMedia, match="unsupported image format PPM"):
        decoding.decode_image(buffer.getvalue(), "images[0]", max_pixels=100)


def _wav(samples: np.ndarray, rate: int, width: int, channels: int = 1) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(width)
        out.setframerate(rate)
        out.writeframes(samples.tobytes())
    return buffer.getvalue()


def test_stereo_8_bit_audio_is_mixed_down_and_resampled():
    stereo = np.full((8000, 2), 255, dtype=np.uint8)  # 1 s at 8 kHz, near full scale
    audio = decoding.decode_wav(_wav(stereo, 8000, 1, channels=2), "audio[0]", target_rate=16000, max_seconds=5)
    assert audio.dtype == np.float32 and audio.shape == (16000,)
    assert audio.max() == pytest.approx(127 / 128)


def test_audio_over_the_duration_cap_is_refused():
    with pytest.raises(errors.MediaTooLarge, match=r"lasts 2\.0 s"):
        decoding.decode_wav(media.wav(2.0), "audio[0]", target_rate=16000, max_seconds=1)


def test_bytes_that_are_not_wav_are_refused():
    with pytest.raises(errors.BadMedia, match="audio\\[0\\] is not a PCM WAV file"):
        decoding.decode_wav(b"RIFF....nope", "audio[0]", target_rate=16000, max_seconds=5)


def test_24_bit_audio_is_refused_with_the_supported_widths():
    with pytest.raises(errors.BadMedia, match="24-bit samples"):
        decoding.decode_wav(_wav(np.zeros(30, dtype=np.uint8), 16000, 3), "audio[0]", target_rate=16000, max_seconds=5)


@pytest.mark.parametrize("encode", [media.jpeg, media.png])
def test_every_layout_gives_the_same_pixels_as_pil(encode):
    import torch

    data = encode(40, 30)
    pil = decoding.decode_image(data, "images[0]", max_pixels=10_000)
    hwc = np.array(pil)
    tensor = decoding.decode_image(data, "images[0]", max_pixels=10_000, layout=decoding.ImageLayout.TENSOR)
    assert tensor.dtype == torch.uint8 and tuple(tensor.shape) == (3, 30, 40)
    assert torch.equal(tensor, torch.from_numpy(hwc).permute(2, 0, 1))
    array = decoding.decode_image(data, "images[0]", max_pixels=10_000, layout=decoding.ImageLayout.ARRAY)
    if encode is media.jpeg:
        assert isinstance(array, np.ndarray) and array.dtype == np.uint8 and array.flags.c_contiguous
        assert np.array_equal(array, hwc)
    else:  # only JPEGs skip PIL: anything else reaches the processor as the PIL image it was decoded to
        assert isinstance(array, Image.Image) and np.array_equal(np.array(array), hwc)
    for image in (pil, tensor, array):
        assert decoding.image_size(image) == (40, 30)


def test_a_jpeg_with_a_side_a_channel_count_could_be_stays_a_pil_image():
    # HWC (4, 40, 3): a processor could take the 4 rows for RGBA channels.
    image = decoding.decode_image(media.jpeg(40, 4), "images[0]", max_pixels=10_000, layout=decoding.ImageLayout.ARRAY)
    assert isinstance(image, Image.Image) and image.size == (40, 4)


@pytest.mark.parametrize("layout", [decoding.ImageLayout.TENSOR, decoding.ImageLayout.ARRAY])
def test_a_truncated_jpeg_is_refused_by_the_tensor_decoder_too(layout):
    data = media.jpeg(200, 150)
    with pytest.raises(errors.BadMedia, match=r"images\[1\] could not be decoded: .*truncated"):
        decoding.decode_image(data[: len(data) // 2], "images[1]", max_pixels=10**6, layout=layout)
