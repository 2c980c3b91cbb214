"""The vLLM render API's answer: a rendered request as the ``GenerateRequest`` vLLM's generate
server accepts, written the way vLLM's own render server writes it.

``generate_request`` builds the JSON-ready body (token ids, ``features`` with hashes,
placeholders, kwargs items and their metadata, ``sampling_params`` with vLLM's defaults and
serialization rules); ``encode_answer`` writes it with orjson and splices in each kwargs item's
base64 (megabytes that never become a Python str). The wire formats themselves are
``wire_format``'s.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, Final

import orjson

from mmprep_runtime import errors
from mmprep_runtime.backends.model_facts import ModelFacts
from mmprep_runtime.backends.native import chat_request, wire_format
from mmprep_runtime.engine.pipeline import AnswerBody, Pieces


@dataclasses.dataclass
class Rendered:
    """One request after the processor: what the answer is written from."""

    token_ids: Any  # 1-D int64 numpy array
    hashes: list[str]
    placeholders: list[dict[str, int]]
    items: list[dict[str, wire_format.KwargsElement]]
    request: chat_request.RenderRequest
    #: The modality of every item (a request's items are all images or all audio clips).
    modality: str = chat_request.IMAGE


#: ``SamplingParams.output_kind``: a rendered, non-streaming request gets only the final output.
_OUTPUT_KIND_DELTA: Final = 1
_OUTPUT_KIND_FINAL_ONLY: Final = 2


#: ``ChatCompletionRequest``'s float sampling fields with their OpenAI defaults: vLLM always
#: serializes them (msgspec omits a default only when it is the very default object).
_FLOAT_FIELDS: Final = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "min_p": 0.0,
}
#: ``SamplingParams.max_tokens``' default.
_MAX_TOKENS_DEFAULT: Final = 16
#: Fields serialized only when they differ from ``SamplingParams``' defaults.
_OTHER_DEFAULTS: Final = {
    "top_k": 0,
    "n": 1,
    "min_tokens": 0,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "include_stop_str_in_output": False,
}


def sampling_params(request: chat_request.RenderRequest, prompt_tokens: int, max_model_len: int) -> dict[str, Any]:
    """``sampling_params`` as vLLM's render serializes the ``SamplingParams`` it builds."""
    if prompt_tokens > max_model_len:
        raise errors.BadRequest(f"Input length ({prompt_tokens}) exceeds model's maximum context length ({max_model_len}).")
    room = max_model_len - prompt_tokens
    max_tokens = min(room, request.max_tokens) if request.max_tokens is not None else room
    sampling = request.sampling
    params: dict[str, Any] = {name: float(sampling.get(name, default)) for name, default in _FLOAT_FIELDS.items()}
    for name, default in _OTHER_DEFAULTS.items():
        if name in sampling and sampling[name] != default:
            params[name] = sampling[name]
    if "seed" in sampling:
        params["seed"] = sampling["seed"]
    stop = sampling.get("stop") or []
    params["stop"] = [stop] if isinstance(stop, str) else list(stop)
    params["stop_token_ids"] = list(sampling.get("stop_token_ids") or [])
    # msgspec omits a field holding its very default object, and CPython keeps one object per small
    # int: a max_tokens of 16 (SamplingParams' default) is left out of vLLM's answer.
    if max_tokens != _MAX_TOKENS_DEFAULT:
        params["max_tokens"] = max_tokens
    if "logprobs" in sampling:
        params["logprobs"] = sampling["logprobs"]
    params["output_kind"] = _OUTPUT_KIND_DELTA if request.stream else _OUTPUT_KIND_FINAL_ONLY
    params["skip_clone"] = True
    params["bad_words"] = []
    params["skip_reading_prefix_cache"] = False
    return params


#: Stands in for each kwargs item while the answer's JSON is written, then replaced by its bytes;
#: a per-process random part, so no user-supplied string (a model name) can collide with it.
_MARKER: Final = f"mmprep-kwargs-{uuid.uuid4().hex}-"


def generate_request(rendered: Rendered, model: ModelFacts, request_id: str) -> tuple[dict[str, Any], list[list[bytes]]]:
    """The ``GenerateRequest`` as a JSON-ready dict whose kwargs items are markers, and each item's
    base64 in pieces (``encode_answer`` splices them in: megabytes that never become a Python str)."""
    request = rendered.request
    body: dict[str, Any] = {
        "request_id": request_id,
        "token_ids": rendered.token_ids,
        "sampling_params": sampling_params(request, len(rendered.token_ids), model.max_model_len),
        "model": request.model,
        "stream": request.stream,
        "priority": request.priority,
    }
    blobs: list[list[bytes]] = []
    if rendered.items:
        metadata = [wire_format.metadata_item(item) for item in rendered.items]
        markers = []
        for item in rendered.items:
            markers.append(f"{_MARKER}{len(blobs)}")
            blobs.append(wire_format.kwargs_item_base64_pieces(item))
        modality = rendered.modality
        body["features"] = {
            "mm_hashes": {modality: rendered.hashes},
            "mm_placeholders": {modality: rendered.placeholders},
            "kwargs_data": {modality: markers},
            # vLLM writes none where no item keeps a field on the CPU (Pixtral's pixels alone).
            "mm_metadata": {modality: [wire_format.encode_kwargs_item(m) if m else None for m in metadata]}
            if any(metadata)
            else None,
        }
    if request.chat:
        # The template arguments the answer was rendered with, vLLM's server defaults included.
        template_kwargs = {
            "cohere_format": "cmd4",
            "add_generation_prompt": request.add_generation_prompt,
            "continue_final_message": False,
        }
        body["parse_context"] = {
            "tools": None,
            "tool_choice": "none",
            "parallel_tool_calls": True,
            "include_reasoning": True,
            "chat_template_kwargs": template_kwargs,
            "history_tool_call_cnt": 0,
        }
    return body, blobs


def encode_answer(answer: Any, blobs: list[list[bytes]]) -> AnswerBody:
    """JSON of ``answer`` with each marker string replaced by its base64 blob (as a string): the
    JSON's pieces and the blobs' pieces in order, never joined here (``pipeline.Pieces``)."""
    text = orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return text
    pieces: list[bytes] = []
    rest = text
    for index, blob in enumerate(blobs):
        before, found, rest = rest.partition(f"{_MARKER}{index}".encode())
        assert found, "every kwargs item has its marker"
        pieces += [before, *blob]
    pieces.append(rest)
    return Pieces(tuple(pieces))
