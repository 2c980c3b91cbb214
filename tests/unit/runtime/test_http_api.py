"""The HTTP API end to end on a real port: real processors, real sockets, a real client.

Every bad input gets its 4xx JSON error naming the problem, and a good request right after it
succeeds: the pool keeps serving.
"""

from __future__ import annotations

import io
import json
import struct
import zlib

import pytest
from conftest import QWEN_TEXT, b64

from mmprep_runtime.engine import core as engine_module
from mmprep_runtime.settings import Limits
from mmprep_runtime.sizing import Backend
from mmprep_runtime.synthetic.media import jpeg as jpeg_bytes
from mmprep_runtime.synthetic.media import png as png_bytes
from mmprep_runtime.synthetic.media import wav as wav_bytes


async def test_qwen_end_to_end_json_and_safetensors(start_server, qwen_dir):
    from safetensors.torch import load

    running = await start_server(qwen_dir, workers=2)
    assert await running.json("/healthz") == (200, {"status": "ok"})
    assert await running.json("/readyz") == (200, {"ready": True})
    payload = {"text": QWEN_TEXT, "images": [b64(jpeg_bytes(112, 84))]}
    status, headers, body = await running.post(payload)
    assert status == 200, body
    answer = json.loads(body)
    tensors = answer["tensors"]
    assert tensors["pixel_values"]["dtype"] == "float32" and tensors["pixel_values"]["shape"][1] == 1176
    assert tensors["image_grid_thw"]["shape"] == [1, 3]
    assert len(answer["input_ids"][0]) == tensors["input_ids"]["shape"][1]

    status, headers, body = await running.post(payload, query="?format=safetensors")
    assert status == 200 and headers["Content-Type"] == "application/octet-stream"
    loaded = load(body)
    assert list(loaded["pixel_values"].shape) == tensors["pixel_values"]["shape"]
    status, headers, body = await running.post(payload, headers={"Accept": "application/octet-stream"})
    assert status == 200 and load(body)["input_ids"].tolist() == answer["input_ids"]

    status, info = await running.json("/v1/info")
    assert status == 200
    assert info["processor_class"] == "Qwen2VLProcessor" and info["path"] == "cpu"
    assert info["workers"]["processor"] == 2 and info["workers"]["reason"] == "Explicit"
    assert info["cloneable"] is True and info["clone_seconds"] >= 0

    async with running.client.get(f"{running.url}/metrics") as response:
        metrics = await response.text()
    assert 'mmprep_requests_total{outcome="ok"} 3.0' in metrics
    assert "mmprep_processor_workers 2.0" in metrics
    assert "mmprep_processing_seconds_count" in metrics and "mmprep_queue_wait_seconds_bucket" in metrics
    assert "mmprep_clone_seconds " in metrics and "mmprep_workers_busy_fraction" in metrics


async def test_pil_backend_serves_the_same_shapes(start_server, qwen_dir):
    running = await start_server(qwen_dir, backend=Backend.PIL)
    status, _, body = await running.post({"text": QWEN_TEXT, "images": [b64(png_bytes(112, 84))]})
    assert status == 200, body
    assert (await running.json("/v1/info"))[1]["image_processor_class"] == "Qwen2VLImageProcessorPil"


async def test_llava_whisper_and_a_bare_tokenizer_are_served(start_server, llava_dir, whisper_dir, tokenizer_dir):
    llava = await start_server(llava_dir)
    status, _, body = await llava.post({"text": "what is <image>?", "images": [b64(jpeg_bytes())]})
    assert status == 200, body
    assert json.loads(body)["tensors"]["pixel_values"]["shape"] == [1, 3, 224, 224]

    whisper = await start_server(whisper_dir)
    status, _, body = await whisper.post({"text": "hello", "audio": [b64(wav_bytes(rate=8000))]})
    assert status == 200, body
    assert json.loads(body)["tensors"]["input_features"]["shape"] == [1, 80, 3000]

    bare = await start_server(tokenizer_dir)
    status, _, body = await bare.post({"text": "a cat on a mat"})
    assert status == 200, body
    assert json.loads(body)["input_ids"]
    status, _, body = await bare.post({"text": "x", "images": [b64(jpeg_bytes())]})
    assert status == 422 and b"takes no images" in body


def _png_bomb(side: int = 30000) -> bytes:
    """A real decompression bomb: a 30000x30000 1-bit PNG of about 100 KB."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" * (1 + side // 8)
    compressor = zlib.compressobj(9)
    data = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def _medium_png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (3000, 2000), (1, 2, 3)).save(buffer, format="PNG")
    return buffer.getvalue()


BAD_INPUTS = [
    ("invalid JSON", {"data": b'{"text": "x",'}, 400, "not valid JSON"),
    ("JSON that is not UTF-8", {"data": b'{"text": "\xff"}'}, 400, "not valid JSON"),
    ("not an object", {"payload": ["text"]}, 400, "must be a JSON object"),
    ("missing text", {"payload": {"images": []}}, 400, "missing 'text'"),
    ("text of the wrong type", {"payload": {"text": 5}}, 400, "'text' must be a string"),
    ("images of the wrong type", {"payload": {"text": "x", "images": 7}}, 400, "must be a list"),
    ("image item of the wrong type", {"payload": {"text": QWEN_TEXT, "images": [1]}}, 400, "images[0]"),
    ("unknown field", {"payload": {"text": "x", "imgs": []}}, 400, "unknown field(s) imgs"),
    ("base64 that is not base64", {"payload": {"text": QWEN_TEXT, "images": ["%%%"]}}, 400, "not valid base64"),
    ("base64 that is not an image", {"payload": {"text": QWEN_TEXT, "images": [b64(b"hello world")]}}, 400, "not an image"),
    (
        "a truncated image",
        {"payload": {"text": QWEN_TEXT, "images": [b64(jpeg_bytes(200, 150)[:700])]}},
        400,
        "could not be decoded",
    ),
    ("a decompression bomb", {"payload": {"text": QWEN_TEXT, "images": [b64(_png_bomb())]}}, 413, "too large"),
    (
        "an image over the pixel cap",
        {"payload": {"text": QWEN_TEXT, "images": [b64(_medium_png())]}},
        413,
        "over the limit of 5000000",
    ),
    (
        "more images than placeholders",
        {"payload": {"text": QWEN_TEXT, "images": [b64(jpeg_bytes()), b64(jpeg_bytes())]}},
        422,
        "1 image placeholder(s)",
    ),
    (
        "more placeholders than images",
        {"payload": {"text": QWEN_TEXT + QWEN_TEXT, "images": [b64(jpeg_bytes())]}},
        422,
        "2 image placeholder(s)",
    ),
    ("audio to an image processor", {"payload": {"text": "x", "audio": [b64(wav_bytes())]}}, 422, "takes no audio"),
    (
        "an image the processor rejects",
        {"payload": {"text": QWEN_TEXT, "images": [b64(png_bytes(2, 600))]}},
        422,
        "processor rejected the input",
    ),
    ("a body over the size limit", {"data": b'{"text": "' + b"x" * 300_000 + b'"}'}, 413, "over the limit"),
    (
        "an unsupported content type",
        {"data": b"text=x", "headers": {"Content-Type": "text/plain"}},
        415,
        "Content-Type must be application/json",
    ),
    ("an unknown answer format", {"payload": {"text": "x"}, "query": "?format=xml"}, 400, "format must be"),
    ("an unacceptable Accept", {"payload": {"text": "x"}, "headers": {"Accept": "image/png"}}, 406, "cannot answer"),
]


@pytest.fixture(params=[True, False], ids=["decode-on-worker", "decode-on-io-pool"])
def decode_on_worker(request, monkeypatch) -> bool:
    """Both places a request can be decoded, whatever this machine's CPU count would choose."""
    monkeypatch.setattr(engine_module, "should_decode_on_worker", lambda *args: request.param)
    return request.param


async def test_both_decoding_places_give_the_same_answers(start_server, qwen_dir, decode_on_worker):
    from safetensors.torch import load

    running = await start_server(qwen_dir, workers=2)
    assert (await running.json("/v1/info"))[1]["decode_on_worker"] is decode_on_worker
    payload = {"text": QWEN_TEXT, "images": [b64(jpeg_bytes(112, 84))]}
    status, _, body = await running.post(payload)
    assert status == 200, body
    answer = json.loads(body)
    assert answer["tensors"]["pixel_values"]["shape"] == [48, 1176]  # 112x84 -> 8x6 patches of 14
    status, _, body = await running.post(payload, query="?format=safetensors")
    assert status == 200 and load(body)["input_ids"].tolist() == answer["input_ids"]
    async with running.client.get(f"{running.url}/metrics") as response:
        assert "mmprep_decode_seconds_count 2.0" in await response.text()


async def test_every_bad_input_gets_a_clear_4xx_and_the_pool_keeps_serving(start_server, qwen_dir, decode_on_worker):
    running = await start_server(qwen_dir, limits=Limits(max_body_bytes=200_000, max_image_pixels=5_000_000))
    assert running.state.engine is not None and running.state.engine.decode_on_worker is decode_on_worker
    good = {"text": QWEN_TEXT, "images": [b64(jpeg_bytes(56, 56))]}
    for case, request, expected_status, fragment in BAD_INPUTS:
        status, _headers, body = await running.post(
            request.get("payload"),
            data=request.get("data"),
            headers=request.get("headers"),
            query=request.get("query", ""),
        )
        assert status == expected_status, (case, body)
        error = json.loads(body)["error"]
        assert fragment in error["message"], (case, error)
        assert error["status"] == expected_status
        good_status, _, good_body = await running.post(good)
        assert good_status == 200, (f"after {case}", good_body)
    status, _ = await running.json("/readyz")
    assert status == 200


async def test_a_chunked_body_is_read_whole_and_held_to_the_size_limit(start_server, qwen_dir):
    """Without a Content-Length the body is read by aiohttp's own reader, which enforces the limit."""
    running = await start_server(qwen_dir, limits=Limits(max_body_bytes=200_000))
    good = json.dumps({"text": QWEN_TEXT, "images": [b64(jpeg_bytes(56, 56))]}).encode()

    def chunked(data: bytes):
        async def pieces():
            for start in range(0, len(data), 1000):
                yield data[start : start + 1000]

        return pieces()

    sized = await running.post(data=good)
    status, _headers, body = await running.post(data=chunked(good))
    assert status == 200, body
    assert body == sized[2]
    status, _, body = await running.post(data=chunked(b'{"text": "' + b"x" * 300_000 + b'"}'))
    assert status == 413 and b"body is over the limit of 200000 bytes" in body, body  # the chunked branch
    assert (await running.post(data=good))[0] == 200
