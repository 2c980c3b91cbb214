"""The vLLM render API on a real port: real processor, real sockets, real image servers.

Every bad input of the issue's list gets a 4xx in vLLM's error shape naming the problem, and a
good request right after it succeeds. Image URLs are fetched from local HTTP servers that
misbehave on purpose (404, slow, endless redirects, oversized); loopback is refused unless the
allow-list names it. Equality with vLLM's own answers is tests/compat/'s job.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from conftest import Served

from mmprep_runtime.server import state as server_state
from mmprep_runtime.settings import FetchSettings, Limits, ModelSettings, RenderSettings, ServeSettings, parse_networks
from mmprep_runtime.sizing import Device
from mmprep_runtime.synthetic import media


def _data_uri(data: bytes, media_type: str = "image/jpeg") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def _chat(*parts: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": list(parts)}], **fields}


def _image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


TEXT = {"type": "text", "text": "Describe this picture."}


def _huge_png(width: int = 40000, height: int = 40000) -> bytes:
    """A PNG whose header says 40000x40000: refused from the header, before any pixel is decoded."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b"")


class Running(Served):
    async def render(self, body: Any, path: str = "/v1/chat/completions/render") -> tuple[int, Any]:
        async with self.client.post(self.url + path, json=body) as response:
            return response.status, await response.json(content_type=None)


@pytest.fixture
async def images() -> AsyncIterator[str]:
    """Image URLs that succeed and fail in every way the issue lists."""
    photo = media.jpeg(96, 64, seed=5)

    async def ok(_: web.Request) -> web.Response:
        return web.Response(body=photo, content_type="image/jpeg")

    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response(body=photo)

    async def loop(request: web.Request) -> web.Response:
        raise web.HTTPFound(str(request.url))

    async def big(_: web.Request) -> web.Response:
        return web.Response(body=b"\xff" * 300_000, content_type="image/jpeg")

    app = web.Application()
    app.router.add_get("/photo.jpg", ok)
    app.router.add_get("/slow.jpg", slow)
    app.router.add_get("/loop.jpg", loop)
    app.router.add_get("/big.jpg", big)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    yield f"http://{host}:{port}"
    await runner.cleanup()


@pytest.fixture
def start_render(serve: Callable[[ServeSettings], Awaitable[Served]]) -> Callable[..., Awaitable[Running]]:
    async def start(
        folder, *, allowed: str = "127.0.0.1/32", normalized: bool = False, limits: Limits = Limits(), **render: Any
    ) -> Running:
        fetch = FetchSettings(allowed_networks=parse_networks(allowed), max_bytes=200_000, read_timeout_s=1.0)
        settings = ServeSettings(
            model=ModelSettings(str(folder), device=Device.CPU),
            host="127.0.0.1",
            port=0,
            processor_workers=1,
            io_workers=2,
            limits=limits,
            render=RenderSettings(normalized_pixels=normalized, fetch=fetch, **render),
        )
        served = await serve(settings)
        return Running(served.url, served.app, served.client)

    return start


def _decode_item(text: str) -> dict[str, Any]:
    import msgpack

    return msgpack.unpackb(base64.b64decode(text), raw=False)


async def test_a_chat_with_one_image_renders_a_generate_request(start_render, qwen_dir):
    running = await start_render(qwen_dir)
    status, answer = await running.render(
        _chat(
            _image(_data_uri(media.jpeg(112, 84))),
            TEXT,
        ),
    )
    assert status == 200, answer
    assert answer["request_id"].startswith("chatcmpl-")
    features = answer["features"]
    (placeholder,) = features["mm_placeholders"]["image"]
    assert placeholder["length"] == 12  # 112x84 -> 8x6 patches of 14 -> 48 / 2x2 merge
    assert set(answer["token_ids"][placeholder["offset"] : placeholder["offset"] + 12]) == {
        running.app[server_state.STATE].serving.model.image_token_id
    }
    (item,) = features["kwargs_data"]["image"]
    decoded = _decode_item(item)
    dtype, shape, _raw = decoded["pixel_values"]["data"]
    assert (dtype, shape) == ("uint8", [48, 1176])
    assert decoded["image_grid_thw"]["field"] == ["batched", {"keep_on_cpu": True}]
    assert len(features["mm_hashes"]["image"][0]) == 64
    assert answer["sampling_params"]["max_tokens"] == 32768 - len(answer["token_ids"])


async def test_an_image_hashes_the_same_in_both_pixel_modes(start_render, qwen_dir):
    uint8 = await start_render(qwen_dir)
    normalized = await start_render(qwen_dir, normalized=True)
    body = _chat(_image(_data_uri(media.jpeg(56, 56))), TEXT)
    first, second = (await uint8.render(body))[1], (await uint8.render(body))[1]
    other = (await normalized.render(body))[1]
    assert first["features"]["mm_hashes"] == second["features"]["mm_hashes"]
    # vLLM applies the hand-off's processor arguments after hashing: the item is the same image.
    assert other["features"]["mm_hashes"] == first["features"]["mm_hashes"]
    dtype = _decode_item(other["features"]["kwargs_data"]["image"][0])["pixel_values"]["data"][0]
    assert dtype == "bfloat16"


async def test_models_and_health_answer_like_vllm(start_render, qwen_dir):
    running = await start_render(qwen_dir)
    async with running.client.get(running.url + "/health") as response:
        assert response.status == 200 and await response.read() == b""
    async with running.client.get(running.url + "/v1/models") as response:
        models = await response.json()
    assert models["object"] == "list" and models["data"][0]["id"] == str(qwen_dir)
    async with running.client.get(running.url + "/v1/info") as response:
        assert (await response.json())["vllm_render"]["pixels"] == "uint8"
    status, answer = await running.render({"prompt": "The quick brown fox", "max_tokens": 5}, "/v1/completions/render")
    assert status == 200 and isinstance(answer, list) and answer[0]["sampling_params"]["max_tokens"] == 5
    assert "features" not in answer[0]


async def test_the_served_name_and_context_length_can_be_set_as_vllm_does(start_render, qwen_dir):
    running = await start_render(qwen_dir, served_model_name="qwen", max_model_len=8)
    async with running.client.get(running.url + "/v1/models") as response:
        card = (await response.json())["data"][0]
    assert card["id"] == "qwen" and card["max_model_len"] == 8
    status, answer = await running.render(
        {"model": "qwen", "prompt": "one two three four five six seven eight nine ten", "max_tokens": 1}, "/v1/completions/render"
    )
    assert status == 400 and "maximum context length (8)" in str(answer), answer


def _bad_inputs(images: str) -> list[tuple[str, Any, int, str]]:
    return [
        ("a body that is not JSON", b"{not json", 400, "not valid JSON"),
        ("messages missing", {"model": "x"}, 400, "'messages'"),
        ("an unknown content part type", _chat({"type": "video_frame"}), 400, "video_frame"),
        ("an image_url without a url", _chat({"type": "image_url", "image_url": {}}), 400, "'url'"),
        (
            "more images than the placeholders",
            _chat(_image(_data_uri(media.jpeg())), {"type": "text", "text": "x <|image_pad|>"}),
            400,
            "reserved image placeholder",
        ),
        ("a data URI that is not an image", _chat(_image(_data_uri(b"hello world", "image/png")), TEXT), 400, "not an image"),
        ("a data URI that is not base64", _chat(_image("data:image/jpeg;base64,%%%"), TEXT), 400, "not valid base64"),
        ("a data URI of another media type", _chat(_image(_data_uri(b"hello", "text/plain")), TEXT), 400, "not an image"),
        ("a 40000x40000 PNG", _chat(_image(_data_uri(_huge_png(), "image/png")), TEXT), 413, "is too large"),
        ("an image URL that 404s", _chat(_image(f"{images}/missing.jpg"), TEXT), 400, "answered HTTP 404"),
        ("an image URL that times out", _chat(_image(f"{images}/slow.jpg"), TEXT), 408, "did not answer"),
        ("an image URL that redirects forever", _chat(_image(f"{images}/loop.jpg"), TEXT), 400, "redirects more than"),
        ("an image URL larger than the cap", _chat(_image(f"{images}/big.jpg"), TEXT), 413, "over the cap"),
        ("an image URL of a file: scheme", _chat(_image("file:///etc/passwd"), TEXT), 400, "data:, http: or https:"),
        (
            "an image URL at the metadata address",
            _chat(_image("http://169.254.169.254/latest/x.jpg"), TEXT),
            400,
            "not a public address",
        ),
        ("an unknown model", _chat(TEXT, model="other-model"), 404, "does not exist"),
        ("an unsupported field", _chat(TEXT, tools=[{"type": "function"}]), 400, "tools"),
    ]


async def test_every_bad_input_gets_a_clear_4xx_and_the_next_request_succeeds(start_render, qwen_dir, images):
    running = await start_render(qwen_dir, limits=Limits(max_image_pixels=5_000_000))
    good = _chat(_image(f"{images}/photo.jpg"), TEXT)
    for case, body, expected, fragment in _bad_inputs(images):
        if isinstance(body, bytes):
            async with running.client.post(
                running.url + "/v1/chat/completions/render", data=body, headers={"Content-Type": "application/json"}
            ) as response:
                status, answer = response.status, await response.json()
        else:
            status, answer = await running.render(body)
        assert status == expected, (case, answer)
        error = answer["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == expected, (case, error)
        assert fragment in error["message"], (case, error)
        good_status, good_answer = await running.render(good)
        assert good_status == 200, (f"after {case}", good_answer)


async def test_loopback_urls_are_refused_unless_allowed(start_render, qwen_dir, images):
    running = await start_render(qwen_dir, allowed="")
    status, answer = await running.render(_chat(_image(f"{images}/photo.jpg"), TEXT))
    assert status == 400 and "127.0.0.1 is not a public address" in answer["error"]["message"], answer
    status, answer = await running.render(_chat(_image(images.replace("127.0.0.1", "localhost") + "/photo.jpg"), TEXT))
    assert status == 400 and "not a public address" in answer["error"]["message"], answer


async def test_preprocess_offers_uint8_pixels(start_render, qwen_dir):
    running = await start_render(qwen_dir)
    body = {
        "text": "look <|vision_start|><|image_pad|><|vision_end|>",
        "images": [base64.b64encode(media.jpeg(56, 56)).decode()],
    }
    async with running.client.post(running.url + "/v1/preprocess?pixels=uint8", json=body) as response:
        answer = await response.json()
    assert answer["tensors"]["pixel_values"]["dtype"] == "uint8"
    async with running.client.post(running.url + "/v1/preprocess", json=body) as response:
        assert (await response.json())["tensors"]["pixel_values"]["dtype"] == "float32"


async def test_a_processor_without_vllms_item_layout_or_a_chat_template_renders_plain_prompts_only(start_render, llava_dir):
    running = await start_render(llava_dir)
    status, answer = await running.render(_chat(_image(_data_uri(media.jpeg(56, 56))), TEXT))
    assert status == 400 and "does not render LlavaProcessor's images" in answer["error"]["message"], answer
    status, answer = await running.render(_chat(TEXT))
    assert status == 400 and "no chat template" in answer["error"]["message"], answer
    status, answer = await running.render({"prompt": "The quick brown fox"}, "/v1/completions/render")
    assert status == 200 and answer[0]["token_ids"] and "features" not in answer[0], answer


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/messages/render", {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses/render", {"input": "hi"}),
        ("/tokenizer_info", None),
    ],
)
async def test_without_vllm_the_routes_beyond_render_say_which_image_serves_them(start_render, qwen_dir, path, body):
    # This environment has no vLLM: the native path renders, and refuses what needs vLLM's code.
    running = await start_render(qwen_dir)
    if body is None:
        async with running.client.get(running.url + path) as response:
            status, answer = response.status, await response.json(content_type=None)
    else:
        status, answer = await running.render(body, path)
    assert status == 501, answer
    assert answer["error"]["type"] == "NotImplementedError" and answer["error"]["code"] == 501
    assert path in answer["error"]["message"] and "mmprep-runtime-vllm" in answer["error"]["message"]
    status, _ = await running.render({"prompt": "The quick brown fox", "max_tokens": 5}, "/v1/completions/render")
    assert status == 200, "the pool keeps serving"


async def test_without_vllm_the_derenders_are_answered_natively_whole_and_streamed(start_render, qwen_dir):
    text = "A cat sits on the mat."
    # vLLM's answers are compared in the compatibility suite; here: the routes answer through the
    # app (on the engine's pool), and a bad body is a 400 after which the pool serves on.
    running = await start_render(qwen_dir)
    status, tokenized = await running.render({"prompt": text, "add_special_tokens": False}, "/tokenize")
    assert status == 200, tokenized
    ids = tokenized["tokens"]
    whole = {"generate_response": {"request_id": "r", "choices": [{"index": 0, "token_ids": ids, "finish_reason": "length"}]}}
    status, answer = await running.render(whole, "/v1/chat/completions/derender")
    assert status == 200 and answer["choices"][0]["message"]["content"] == text, answer
    chunk = {"request_id": "r", "choices": [{"index": 0, "token_ids": ids}]}
    status, answer = await running.render({"stream": True, "generate_chunk": chunk}, "/v1/completions/derender")
    assert status == 200 and answer["chunk"]["choices"][0]["text"] == text and answer["stream_state"]["read_offset"] >= 0, answer
    status, answer = await running.render({"generate_response": "nope"}, "/v1/chat/completions/derender")
    assert status == 400 and answer["error"]["code"] == 400, answer
    status, _ = await running.render(whole, "/v1/chat/completions/derender")
    assert status == 200, "the pool keeps serving"


async def test_an_api_key_guards_the_paths_vllm_guards(start_render, qwen_dir):
    running = await start_render(qwen_dir, api_key="s3cret")
    completion = {"prompt": "The quick brown fox", "max_tokens": 5}

    async def post(path: str, body: Any, authorization: str | None) -> tuple[int, Any]:
        headers = {"Authorization": authorization} if authorization is not None else {}
        async with running.client.post(running.url + path, json=body, headers=headers) as response:
            return response.status, await response.json(content_type=None)

    for wrong in (None, "Bearer nope", "Basic s3cret", "s3cret"):
        assert await post("/v1/completions/render", completion, wrong) == (401, {"error": "Unauthorized"}), wrong
    assert (await post("/v1/completions/render", completion, "Bearer s3cret"))[0] == 200
    async with running.client.get(running.url + "/v1/models") as response:
        assert response.status == 401
    async with running.client.get(running.url + "/v1/models", headers={"Authorization": "bearer s3cret"}) as response:
        assert response.status == 200
    # vLLM leaves /tokenize and the probes open.
    assert (await post("/tokenize", {"prompt": "hi"}, None))[0] == 200
    async with running.client.get(running.url + "/health") as response:
        assert response.status == 200


async def test_without_vllm_tokenize_and_detokenize_answer_as_the_tokenizer_and_the_chat_render_do(
    start_render, qwen_dir, images
):
    from transformers import AutoTokenizer

    running = await start_render(qwen_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(qwen_dir))
    prompt = "The quick brown fox <|im_end|> jumps."
    status, answer = await running.render({"prompt": prompt, "return_token_strs": True}, "/tokenize")
    ids = tokenizer(prompt)["input_ids"]
    assert status == 200, answer
    assert answer == {
        "count": len(ids),
        "max_model_len": answer["max_model_len"],
        "tokens": ids,
        "token_strs": tokenizer.convert_ids_to_tokens(ids),
    }
    config = json.loads((qwen_dir / "config.json").read_text())
    assert answer["max_model_len"] == (config.get("text_config") or config)["max_position_embeddings"]
    status, answer = await running.render({"prompt": prompt, "add_special_tokens": False}, "/tokenize")
    assert answer["tokens"] == tokenizer(prompt, add_special_tokens=False)["input_ids"] and answer["token_strs"] is None
    # The chat form counts what the chat render sends: the template, and each image's placeholders.
    for chat in (_chat(TEXT), _chat(_image(f"{images}/photo.jpg"), TEXT, add_generation_prompt=False)):
        status, rendered = await running.render(chat)
        assert status == 200, rendered
        status, answer = await running.render({**chat, "max_tokens": "ignored, as vLLM's tokenize ignores it"}, "/tokenize")
        assert status == 200, answer
        assert answer["tokens"] == rendered["token_ids"] and answer["count"] == len(rendered["token_ids"])
    status, answer = await running.render({"tokens": ids}, "/detokenize")
    assert (status, answer) == (200, {"prompt": tokenizer.decode(ids)}) and answer["prompt"] == prompt


@pytest.mark.parametrize(
    ("path", "body", "expected", "words"),
    [
        ("/tokenize", {"prompt": 5}, 400, "'prompt' must be a string"),
        ("/tokenize", {"prompt": "hi", "model": "other"}, 404, "does not exist"),
        ("/tokenize", {"prompt": "hi", "add_special_tokens": "yes"}, 400, "mmprep-runtime-vllm"),
        ("/tokenize", _chat(TEXT, tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
        ("/tokenize", _chat(TEXT, add_special_tokens=True), 400, "add_special_tokens"),
        ("/tokenize", _chat({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}), 400, "data:, http: or https:"),
        ("/detokenize", {"tokens": "1 2"}, 400, "'tokens' must be a list"),
        ("/detokenize", {"tokens": [1, -1]}, 400, "tokens[1] must be from 0"),
        ("/detokenize", {"tokens": ["1"]}, 400, "mmprep-runtime-vllm"),
        ("/detokenize", {"tokens": [10**9]}, 400, "not in the vocabulary"),
    ],
)
async def test_a_bad_tokenize_or_detokenize_is_a_4xx_saying_why_and_the_pool_keeps_serving(
    start_render, qwen_dir, path, body, expected, words
):
    running = await start_render(qwen_dir)
    status, answer = await running.render(body, path)
    assert status == expected and words in answer["error"]["message"], answer
    assert (await running.render({"tokens": [1, 2]}, "/detokenize"))[0] == 200


def _wav(seconds: float = 0.5, *, rate: int = 16000, channels: int = 1) -> bytes:
    import io
    import wave

    samples = (np.arange(int(rate * seconds) * channels, dtype=np.int64) * 37 % 65536 - 32768).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(samples.tobytes())
    return out.getvalue()


def _clip(data: bytes, form: str = "wav") -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": form}}


def test_a_pcm_clip_decodes_to_what_soundfile_gives_and_others_go_to_vllms_decoders() -> None:
    from mmprep_runtime import errors
    from mmprep_runtime.backends.native import stages

    clip = _wav(0.25)
    samples = stages.decode_clip(clip, "clip", 16000, Limits())
    pcm = np.frombuffer(clip[44:], dtype="<i2")
    # libsndfile's 16-bit to float conversion: the sample over 32768, exact in float32.
    assert samples.dtype == np.float32 and np.array_equal(samples, pcm.astype(np.float64) / 32768)
    assert samples.min() == -1.0
    for other in (_wav(0.25, channels=2), _wav(0.25, rate=8000)):
        with pytest.raises(errors.BeyondFastPath, match="decoded by vLLM's code"):
            stages.decode_clip(other, "clip", 16000, Limits())
    with pytest.raises(errors.MediaTooLarge, match=r"over the limit of 0\.1 s"):
        stages.decode_clip(clip, "clip", 16000, Limits(max_audio_seconds=0.1))


async def test_a_chat_with_audio_clips_renders_each_as_a_run_of_audio_tokens(start_render, model_factory):
    running = await start_render(model_factory("qwen2-audio"))
    status, answer = await running.render(_chat(_clip(_wav(0.5)), TEXT, _clip(_wav(2.0))))
    assert status == 200, answer
    features = answer["features"]
    model = running.app[server_state.STATE].serving.model
    short, long = features["mm_placeholders"]["audio"]
    # Whisper's 10 ms frames, then (n - 1) // 2 + 1 and (n - 2) // 2 + 1 (the encoder's two
    # strides): 0.5 s -> 50 frames -> 25 -> 12 tokens; 2 s -> 200 -> 100 -> 50.
    assert (short["length"], long["length"]) == (12, 50), features["mm_placeholders"]
    assert set(answer["token_ids"][long["offset"] : long["offset"] + long["length"]]) == {model.audio_token_id}
    first = _decode_item(features["kwargs_data"]["audio"][0])
    assert list(first) == ["input_features", "feature_attention_mask"]
    assert first["input_features"]["field"] == ["batched", {"keep_on_cpu": False}]
    assert len(set(features["mm_hashes"]["audio"])) == 2 and "image" not in features["mm_hashes"]


def _bad_audio() -> list[tuple[str, Any, int, str]]:
    truncated = _wav(1.0)[:30]
    return [
        ("a stereo clip (vLLM downmixes it)", _chat(_clip(_wav(channels=2)), TEXT), 400, "decoded by vLLM's code"),
        ("a clip at another rate (vLLM resamples it)", _chat(_clip(_wav(rate=8000)), TEXT), 400, "decoded by vLLM's code"),
        ("a clip cut inside its header", _chat(_clip(truncated), TEXT), 400, "not a PCM WAV file"),
        ("a clip over the length limit", _chat(_clip(_wav(1.5)), TEXT), 413, "over the limit of 1 s"),
        ("an MP3 clip", _chat(_clip(b"ID3", "mp3"), TEXT), 400, "audio in 'mp3'"),
        ("input_audio without data", _chat({"type": "input_audio", "input_audio": {}}), 400, "'data' string"),
        ("a data URI that is not audio", _chat({"type": "audio_url", "audio_url": {"url": _data_uri(b"x")}}), 400, "not audio"),
        ("more clips than the limit", _chat(*[_clip(_wav(0.1))] * 3, TEXT), 400, "3 audio clips, more than the limit of 2"),
    ]


async def test_every_bad_audio_clip_gets_a_clear_4xx_and_the_next_clip_renders(start_render, model_factory):
    running = await start_render(model_factory("qwen2-audio"), limits=Limits(max_audio_seconds=1.0, max_audio_items=2))
    for case, body, expected, fragment in _bad_audio():
        status, answer = await running.render(body)
        assert status == expected and fragment in answer["error"]["message"], (case, answer)
        good_status, good_answer = await running.render(_chat(_clip(_wav(0.5)), TEXT))
        assert good_status == 200 and good_answer["features"]["mm_placeholders"]["audio"], (f"after {case}", good_answer)


async def test_audio_to_a_model_without_a_native_audio_path_is_left_to_vllms_code(start_render, qwen_dir):
    running = await start_render(qwen_dir)
    status, answer = await running.render(_chat(_clip(_wav()), TEXT))
    assert status == 400 and answer["error"]["type"] == "BadRequestError", answer
    assert "does not render Qwen2VLProcessor's audio" in answer["error"]["message"], answer
