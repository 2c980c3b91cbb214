"""OpenAI request bodies for the vLLM render API: parsed and checked, nothing decoded yet (pure).

``parse_chat`` turns a chat-completions body into the conversation a chat template renders (text
parts as ``{"type": "text", "text": ...}``, each image part as ``{"type": "image"}`` and each audio
part as ``{"type": "audio"}``, as vLLM hands a template that loops over content parts), the media
sources in order (inline bytes or an http(s) URL still to fetch) and the sampling fields. ``parse_completion`` does the same for a
plain prompt. Every problem is an ``errors.RequestError`` naming the field.

Fields that would change vLLM's answer in ways this server does not implement (tools, response
formats, custom templates, ...) are refused with a 400 instead of being silently ignored: an
answer that differs from vLLM's would poison its caches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from mmprep_runtime import errors
from mmprep_runtime.engine import decoding, pipeline

ROLES: Final = frozenset({"system", "user", "assistant", "developer"})

#: Sampling fields carried into ``sampling_params`` (their JSON types are checked here).
SAMPLING_FIELDS: Final[dict[str, tuple[type, ...]]] = {
    "temperature": (int, float),
    "top_p": (int, float),
    "top_k": (int,),
    "min_p": (int, float),
    "presence_penalty": (int, float),
    "frequency_penalty": (int, float),
    "repetition_penalty": (int, float),
    "seed": (int,),
    "stop": (str, list),
    "stop_token_ids": (list,),
    "n": (int,),
    "ignore_eos": (bool,),
    "min_tokens": (int,),
    "skip_special_tokens": (bool,),
    "spaces_between_special_tokens": (bool,),
    "include_stop_str_in_output": (bool,),
}

#: Accepted and without effect on the rendered request (OpenAI clients send them).
_IGNORED_FIELDS: Final = frozenset({"user", "stream_options", "logit_bias_type", "metadata", "store"})

_UNSUPPORTED_FIELDS: Final = frozenset(
    {
        "tools",
        "functions",
        "response_format",
        "chat_template",
        "chat_template_kwargs",
        "mm_processor_kwargs",
        "media_io_kwargs",
        "prompt_logprobs",
        "logit_bias",
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "use_beam_search",
        "echo",
        "suffix",
        "best_of",
        "continue_final_message",
        "documents",
        "kv_transfer_params",
        "ec_transfer_params",
        "vllm_xargs",
        "bad_words",
        "allowed_token_ids",
        "truncate_prompt_tokens",
        "prompt_embeds",
        "return_token_ids",
        "cache_salt",
        "mm_payload",
    }
)


IMAGE: Final = "image"
AUDIO: Final = "audio"


@dataclasses.dataclass(frozen=True)
class MediaSource:
    """One image or audio clip of a request: its bytes (inline) or the URL to fetch them from."""

    what: str
    modality: str = IMAGE
    data: bytes | None = None
    url: str | None = None


@dataclasses.dataclass(frozen=True)
class RenderRequest:
    """What a render job needs: the prompt (a conversation or a text), media, sampling."""

    conversation: tuple[dict[str, Any], ...] | None
    prompt: str | None
    media: tuple[MediaSource, ...]
    sampling: Mapping[str, Any]
    max_tokens: int | None
    model: str | None
    request_id: str | None
    stream: bool
    priority: int
    add_generation_prompt: bool
    chat: bool

    def fetched(self, data: Mapping[int, bytes]) -> RenderRequest:
        media = tuple(
            dataclasses.replace(source, data=data[index], url=None) if index in data else source
            for index, source in enumerate(self.media)
        )
        return dataclasses.replace(self, media=media)

    @property
    def urls(self) -> list[tuple[int, MediaSource]]:
        return [(index, source) for index, source in enumerate(self.media) if source.data is None]

    @property
    def images(self) -> tuple[MediaSource, ...]:
        return tuple(source for source in self.media if source.modality == IMAGE)

    @property
    def audio(self) -> tuple[MediaSource, ...]:
        return tuple(source for source in self.media if source.modality == AUDIO)


def _object(body: bytes) -> dict[str, Any]:
    payload = pipeline.json_object(body)
    _check_supported(payload)
    return payload


def _check_supported(payload: Mapping[str, Any]) -> None:
    unsupported = sorted(key for key in payload if key in _UNSUPPORTED_FIELDS and payload[key] not in (None, False))
    if unsupported:
        raise errors.BeyondFastPath(f"field(s) {', '.join(unsupported)} are not supported by this render server")


def _typed(payload: Mapping[str, Any], name: str, types: tuple[type, ...], what: str | None = None) -> Any:
    value = payload.get(name)
    if value is None:
        return None
    # bool is an int in Python; JSON true is not a number.
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        expected = " or ".join(t.__name__ for t in types)
        raise errors.BadRequest(f"'{what or name}' must be {expected}, got {type(value).__name__}")
    return value


def _sampling(payload: Mapping[str, Any]) -> tuple[dict[str, Any], int | None]:
    sampling = {}
    for name, types in SAMPLING_FIELDS.items():
        value = _typed(payload, name, types)
        if value is not None:
            sampling[name] = value
    if sampling.get("n", 1) < 1:
        raise errors.BadRequest(f"n must be at least 1, got {sampling['n']}.")
    max_tokens = _typed(payload, "max_completion_tokens", (int,))
    if max_tokens is None:
        max_tokens = _typed(payload, "max_tokens", (int,))
    if max_tokens is not None and max_tokens < 1:
        raise errors.BadRequest(f"'max_tokens' must be at least 1, got {max_tokens}")
    return sampling, max_tokens


def _data_uri(url: str, what: str, modality: str) -> bytes:
    header, comma, data = url.partition(",")
    if not comma or not header.startswith("data:"):
        raise errors.BadRequest(f"{what}: a data URI needs the form data:<media type>;base64,<data>")
    media_type, _, encoding = header[5:].partition(";")
    if encoding != "base64":
        raise errors.BadRequest(f"{what}: only base64 data URIs are supported")
    if media_type and not media_type.startswith(f"{modality}/"):
        expected = "an image" if modality == IMAGE else modality
        raise errors.BadMedia(f"{what}: the data URI's media type is {media_type!r}, not {expected}")
    return decoding.b64decode(data, f"{what}'s data URI")


def _url_source(part: Mapping[str, Any], key: str, what: str, modality: str) -> MediaSource:
    """An ``image_url`` or ``audio_url`` part's source."""
    value = part.get(key)
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise errors.BadRequest(f"{what}: '{key}' must be an object with a 'url' string")
    if url.startswith("data:"):
        return MediaSource(what, modality, data=_data_uri(url, what, modality))
    if url.startswith(("http://", "https://")):
        return MediaSource(what, modality, url=url)
    scheme = url.partition(":")[0] if ":" in url else url[:16]
    raise errors.BadRequest(f"{what}: {modality} URLs must be data:, http: or https:, got {scheme!r}")


def _inline_audio(part: Mapping[str, Any], what: str) -> MediaSource:
    """OpenAI's ``input_audio`` part: base64 bytes of a WAV clip (the format vLLM's decoders and
    this path agree on; another goes to vLLM's code)."""
    value = part.get("input_audio")
    if not isinstance(value, dict) or not isinstance(value.get("data"), str):
        raise errors.BadRequest(f"{what}: 'input_audio' must be an object with a 'data' string")
    if value.get("format", "wav") != "wav":
        raise errors.BeyondFastPath(f"{what}: audio in {value.get('format')!r} is decoded by vLLM's code")
    return MediaSource(f"{what}.input_audio", AUDIO, data=decoding.b64decode(value["data"], f"{what}.input_audio"))


def _content(message: Mapping[str, Any], where: str, media: list[MediaSource], reserved: tuple[str, ...]) -> Any:
    content = message.get("content")
    if content is None:
        return []
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise errors.BadRequest(f"{where}.content must be a string or a list of parts, got {type(content).__name__}")
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        what = f"{where}.content[{index}]"
        if isinstance(part, str):
            part = {"type": "text", "text": part}
        if not isinstance(part, dict):
            raise errors.BadRequest(f"{what} must be an object, got {type(part).__name__}")
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise errors.BadRequest(f"{what}: a text part needs a 'text' string")
            _check_reserved(text, what, reserved)
            parts.append({"type": "text", "text": text})
        elif kind == "image_url":
            media.append(_url_source(part, "image_url", what, IMAGE))
            parts.append({"type": "image"})
        elif kind in ("input_audio", "audio_url"):
            media.append(_inline_audio(part, what) if kind == "input_audio" else _url_source(part, kind, what, AUDIO))
            parts.append({"type": "audio"})
        else:
            raise errors.BeyondFastPath(
                f"{what}: unsupported chat content part type {kind!r}; supported: text, image_url, input_audio, audio_url"
            )
    return parts


def _check_reserved(text: str, what: str, reserved: tuple[str, ...]) -> None:
    # A placeholder typed into the text would make the template's placeholders and the images
    # disagree (vLLM refuses it too): images come only from image parts.
    for token in reserved:
        if token and token in text:
            raise errors.BadRequest(f"{what}: the text contains the reserved image placeholder {token!r}")


def _logprobs(payload: Mapping[str, Any], *, chat: bool) -> int | None:
    """``SamplingParams.logprobs``: a chat's ``top_logprobs`` when its ``logprobs`` is true, a
    completion's ``logprobs``; None when not asked. Checked as vLLM's request models check them."""
    if chat:
        asked = _typed(payload, "logprobs", (bool,))
        top = _typed(payload, "top_logprobs", (int,))
        if top is not None and top < 0 and top != -1:
            raise errors.BadRequest("`top_logprobs` must be a positive value or -1.")
        if top is not None and (top == -1 or top > 0) and not asked:
            raise errors.BadRequest("when using `top_logprobs`, `logprobs` must be set to true.")
        value = (top or 0) if asked else None
    else:
        value = _typed(payload, "logprobs", (int,))
        if value is not None and value < 0 and value != -1:
            raise errors.BadRequest("`logprobs` must be a positive value or -1.")
    if value == -1:
        raise errors.BeyondFastPath("logprobs of the whole vocabulary (-1) are rendered by vLLM's code")
    return value


#: ``CompletionRequest.max_tokens``' default (a chat's is none: the room left in the context).
COMPLETION_MAX_TOKENS: Final = 16


def _common(payload: Mapping[str, Any], *, chat: bool) -> dict[str, Any]:
    sampling, max_tokens = _sampling(payload)
    if not chat and "max_tokens" not in payload:
        max_tokens = COMPLETION_MAX_TOKENS
    logprobs = _logprobs(payload, chat=chat)
    if logprobs is not None:
        sampling["logprobs"] = logprobs
    priority = _typed(payload, "priority", (int,)) or 0
    return {
        "sampling": sampling,
        "max_tokens": max_tokens,
        "model": _typed(payload, "model", (str,)),
        "request_id": _typed(payload, "request_id", (str,)),
        "stream": bool(_typed(payload, "stream", (bool,))),
        "priority": priority,
    }


def parse_chat(body: bytes, *, reserved: tuple[str, ...] = (), max_images: int = 16, max_audio: int = 4) -> RenderRequest:
    return chat_from_payload(pipeline.json_object(body), reserved=reserved, max_images=max_images, max_audio=max_audio)


def chat_from_payload(
    payload: Mapping[str, Any], *, reserved: tuple[str, ...] = (), max_images: int = 16, max_audio: int = 4
) -> RenderRequest:
    """``parse_chat`` of a body already parsed (a route that takes a chat among other forms)."""
    _check_supported(payload)
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise errors.BadRequest("'messages' must be a non-empty list of messages")
    conversation = []
    media: list[MediaSource] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise errors.BadRequest(f"{where} must be an object, got {type(message).__name__}")
        role = message.get("role")
        if role not in ROLES:
            raise errors.BadRequest(f"{where}.role must be one of {', '.join(sorted(ROLES))}, got {role!r}")
        if message.get("tool_calls"):
            raise errors.BeyondFastPath(f"{where}: tool calls are not supported by this render server")
        entry: dict[str, Any] = {"role": role, "content": _content(message, where, media, reserved)}
        name = message.get("name")
        if isinstance(name, str):
            entry["name"] = name
        conversation.append(entry)
    for modality, name, limit in ((IMAGE, "images", max_images), (AUDIO, "audio clips", max_audio)):
        count = sum(source.modality == modality for source in media)
        if count > limit:
            raise errors.BadRequest(f"the messages have {count} {name}, more than the limit of {limit}")
    add_generation_prompt = payload.get("add_generation_prompt", True)
    if not isinstance(add_generation_prompt, bool):
        raise errors.BadRequest("'add_generation_prompt' must be a boolean")
    return RenderRequest(
        conversation=tuple(conversation),
        prompt=None,
        media=tuple(media),
        add_generation_prompt=add_generation_prompt,
        chat=True,
        **_common(payload, chat=True),
    )


def parse_completion(body: bytes, *, reserved: tuple[str, ...] = ()) -> RenderRequest:
    payload = _object(body)
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise errors.BadRequest("'prompt' must be a non-empty string (one prompt per request)")
    _check_reserved(prompt, "prompt", reserved)
    return RenderRequest(
        conversation=None,
        prompt=prompt,
        media=(),
        add_generation_prompt=False,
        chat=False,
        **_common(payload, chat=False),
    )
