"""vLLM's ``/tokenize`` and ``/detokenize`` answered by the native backend, with or without vLLM.

As vLLM 0.33's ``ServingTokenization`` answers them:
- the completion form tokenizes ``prompt`` with the model's tokenizer, special tokens added unless
  ``add_special_tokens`` is false, with no length limit (its ``TokenizeParams`` has no
  ``max_total_tokens``; mmprep's own ``max_text_chars`` still holds);
- the chat form's ids are the chat render's prompt (``stages.render``: the template, each image
  fetched under mmprep's URL rules, decoded and expanded to its placeholder tokens);
- ``/detokenize`` is the tokenizer's plain ``decode`` of the ids, special tokens kept, as vLLM's
  renderer decodes a prompt.

Only the fields of vLLM's request models are read (``TokenizeCompletionRequest``,
``TokenizeChatRequest``, ``DetokenizeRequest``); vLLM ignores any other, and so does this. What
would change vLLM's answer and is not implemented here (a chat template, tools, a continued final
message, processor kwargs, special tokens added to a chat), and values vLLM's validation coerces
(``"true"`` for a boolean, ``"5"`` for an id), raise ``errors.BeyondFastPath``: vLLM answers them
where it is installed, a 400 naming the field where it is not. Never a different answer.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

import orjson

from mmprep_runtime import errors
from mmprep_runtime.backends.native import chat_request, stages
from mmprep_runtime.engine import patches, pipeline

#: The fields of vLLM's ``TokenizeChatRequest`` that reach its render: a chat form's body is
#: rendered from these alone (the chat parser refuses the ones it does not implement).
_CHAT_FIELDS: Final = frozenset(
    {
        "model",
        "messages",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template",
        "chat_template_kwargs",
        "media_io_kwargs",
        "mm_processor_kwargs",
        "tools",
    }
)
#: ``DetokenizeRequest.tokens``: ``list[Annotated[int, Field(ge=0, le=2**63 - 1)]]``.
_MAX_TOKEN_ID: Final = 2**63 - 1
_VLLMS: Final = "vLLM's validation reads it (the mmprep-runtime-vllm image answers such a request)"


def _flag(payload: dict[str, Any], name: str, default: bool) -> bool:
    """A boolean field; ``null`` is the default only where vLLM's model says ``bool | None``."""
    value = payload.get(name, default)
    if value is None and name == "return_token_strs":
        return default
    if not isinstance(value, bool):
        raise errors.BeyondFastPath(f"'{name}' is not a JSON boolean: {_VLLMS}")
    return value


def _model(payload: dict[str, Any]) -> str | None:
    asked = payload.get("model")
    if asked is not None and not isinstance(asked, str):
        raise errors.BadRequest(f"'model' must be a string, got {type(asked).__name__}")
    return asked


@dataclasses.dataclass(frozen=True)
class TokenizeRequest:
    """One of the two forms: a chat to render (``chat``), or a prompt to tokenize."""

    chat: chat_request.RenderRequest | None
    prompt: str | None
    add_special_tokens: bool
    token_strs: bool


@dataclasses.dataclass(frozen=True)
class Tokenized:
    ids: list[int]
    token_strs: list[str] | None


@dataclasses.dataclass(frozen=True)
class TokenizeApi:
    """``POST /tokenize`` on the engine: the chat form's stages are the chat render's."""

    render: stages.RenderApi
    large_answer: bool = False

    def decode(self, body: bytes) -> TokenizeRequest:
        payload = pipeline.json_object(body)
        stages.check_model(self.render.model, _model(payload))
        token_strs = _flag(payload, "return_token_strs", False)
        if "messages" in payload:
            return self._chat_form(payload, token_strs)
        prompt = payload.get("prompt")
        if not isinstance(prompt, str):
            raise errors.BadRequest("'prompt' must be a string, or 'messages' a list of messages")
        limit = self.render.limits.max_text_chars
        if len(prompt) > limit:
            raise errors.BadRequest(f"the prompt has {len(prompt)} characters, more than the limit of {limit}")
        return TokenizeRequest(None, prompt, _flag(payload, "add_special_tokens", True), token_strs)

    def _chat_form(self, payload: dict[str, Any], token_strs: bool) -> TokenizeRequest:
        if "prompt" in payload:
            raise errors.BeyondFastPath(f"a body with both 'prompt' and 'messages': {_VLLMS}")
        if payload["messages"] == []:
            raise errors.BeyondFastPath(f"an empty 'messages' list: {_VLLMS}")
        if _flag(payload, "add_special_tokens", False):
            raise errors.BeyondFastPath(
                "'add_special_tokens' on a chat is tokenized by vLLM's code, which this server does not have"
            )
        _flag(payload, "add_generation_prompt", True)
        chat_fields = {key: value for key, value in payload.items() if key in _CHAT_FIELDS}
        limits = self.render.limits
        chat = chat_request.chat_from_payload(
            chat_fields, reserved=self.render.reserved, max_images=limits.max_images, max_audio=limits.max_audio_items
        )
        return TokenizeRequest(self.render.checked(chat), None, False, token_strs)

    def needs_fetch(self, request: TokenizeRequest) -> bool:
        return request.chat is not None and bool(request.chat.urls)

    async def fetch(self, request: TokenizeRequest) -> TokenizeRequest:
        assert request.chat is not None
        return dataclasses.replace(request, chat=await self.render.fetch(request.chat))

    def process(self, processor: Any, request: TokenizeRequest) -> Tokenized:
        tokenizer = patches.tokenizer_of(processor)
        if request.chat is not None:
            ids = self.render.process(processor, request.chat).token_ids.tolist()
        else:
            ids = list(tokenizer(request.prompt, add_special_tokens=request.add_special_tokens)["input_ids"])
        return Tokenized(ids, list(tokenizer.convert_ids_to_tokens(ids)) if request.token_strs else None)

    def encode(self, tokenized: Tokenized) -> bytes:
        max_model_len = self.render.model.max_model_len
        answer = {"count": len(tokenized.ids), "max_model_len": max_model_len, "tokens": tokenized.ids}
        return orjson.dumps({**answer, "token_strs": tokenized.token_strs})


@dataclasses.dataclass(frozen=True)
class DetokenizeApi:
    """``POST /detokenize`` on the engine (each worker decodes with its own tokenizer)."""

    render: stages.RenderApi
    large_answer: bool = False

    def decode(self, body: bytes) -> list[int]:
        payload = pipeline.json_object(body)
        stages.check_model(self.render.model, _model(payload))
        tokens = payload.get("tokens")
        if not isinstance(tokens, list):
            raise errors.BadRequest("'tokens' must be a list of token ids")
        for index, token in enumerate(tokens):
            if not isinstance(token, int) or isinstance(token, bool):
                raise errors.BeyondFastPath(f"tokens[{index}] is not a JSON integer: {_VLLMS}")
            if not 0 <= token <= _MAX_TOKEN_ID:
                raise errors.BadRequest(f"tokens[{index}] must be from 0 to {_MAX_TOKEN_ID}, got {token}")
        return tokens

    def needs_fetch(self, request: list[int]) -> bool:
        return False

    async def fetch(self, request: list[int]) -> list[int]:
        return request

    def process(self, processor: Any, request: list[int]) -> str:
        tokenizer = patches.tokenizer_of(processor)
        vocabulary = len(tokenizer)
        beyond = next((token for token in request if token >= vocabulary), None)
        if beyond is not None:
            # What a tokenizer does with an id it has no token for differs by tokenizer (skipped,
            # or an error): vLLM's answer is its own.
            raise errors.BeyondFastPath(f"token id {beyond} is not in the vocabulary of {vocabulary}: {_VLLMS}")
        return str(tokenizer.decode(request))

    def encode(self, prompt: str) -> bytes:
        return orjson.dumps({"prompt": prompt})
