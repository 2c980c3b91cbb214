"""vLLM 0.33's ``/v1/chat/completions/derender`` and ``/v1/completions/derender`` without vLLM:
an engine's token ids (whole, or one streamed event at a time) turned into OpenAI's answer with
the model's own tokenizer, byte for byte the answer vLLM's render server gives when no tool or
reasoning parser is configured.

What it answers, as vLLM does (``detokenizer`` holds the decoding rules):
- the text decoded token by token after the prompt's seed, the request's
  ``skip_special_tokens`` and ``spaces_between_special_tokens`` honoured;
- the token that stopped generation left out (the reported ``stop_reason`` id, else the
  tokenizer's or the model's EOS unless ``ignore_eos``, or one of ``stop_token_ids``) unless
  ``include_stop_str_in_output``; a stop string cut where it begins (only past ``min_tokens``);
- logprobs turned from the engine's ids into strings and bytes, cut to what the endpoint returns
  (chat: ``top_logprobs``; completions: ``logprobs + 1``), completions' ``text_offset`` kept
  absolute across a stream;
- streamed, vLLM's own ``stream_state`` (the decoding window, the logprob context, the role
  sent), so a client may carry a stream from vLLM's server to this one and back;
- ``return_token_ids``, ``kv_transfer_params`` and usage as vLLM passes them on.

What vLLM's code alone answers exactly raises ``errors.BeyondFastPath`` (vLLM's derender takes it
where vLLM is installed, a 400 naming it where it is not): a parser (the backend sends chat
derenders to vLLM whenever one is configured), prompt logprobs, engine metrics, and values
vLLM's validation would coerce. Bad bodies get vLLM's status: 400 for a wrong type or a bound
exceeded, 404 for another model.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from mmprep_runtime import errors
from mmprep_runtime.backends.model_facts import ModelFacts
from mmprep_runtime.backends.native import detokenizer, stages
from mmprep_runtime.backends.native.detokenizer import Window

#: vLLM's ``VLLM_MAX_N_SEQUENCES`` and ``ModelConfig.max_logprobs`` defaults.
MAX_SEQUENCES: Final = 16384
MAX_LOGPROBS: Final = 20
_VLLMS: Final = "vLLM's derender reads it (the mmprep-runtime-vllm image answers such a request)"
STREAM_STOP_REFUSED: Final = (
    "stop strings are not supported by streaming derender because text already sent cannot be cut. "
    "Use non-streaming derender or output_mode=text on /inference/v1/generate which holds stop strings back."
)


# -- reading the body ---------------------------------------------------------------------------


def _object(value: Any, where: str, *, optional: bool = False) -> dict[str, Any]:
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise errors.BadRequest(f"'{where}' must be an object")
    return value


def _ints(value: Any, where: str, *, optional: bool = True, minimum: int | None = None) -> list[int] | None:
    if value is None and optional:
        return None
    if not isinstance(value, list) or any(not isinstance(v, int) or isinstance(v, bool) for v in value):
        raise errors.BadRequest(f"'{where}' must be a list of integers")
    if minimum is not None and any(v < minimum for v in value):
        raise errors.BadRequest(f"'{where}' must hold integers of at least {minimum}")
    return list(value)


def _int(value: Any, where: str, default: int | None = None, *, minimum: int | None = None) -> int | None:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise errors.BadRequest(f"'{where}' must be an integer")
    if minimum is not None and value < minimum:
        raise errors.BadRequest(f"'{where}' must be at least {minimum}")
    return value


def _flag(request: dict[str, Any], name: str, default: bool) -> bool:
    value = request.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise errors.BeyondFastPath(f"'{name}' is not a JSON boolean: {_VLLMS}")
    return value


def _stream_flag(body: dict[str, Any]) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise errors.BadRequest("'stream' must be true or false")
    return stream


@dataclasses.dataclass(frozen=True)
class Rules:
    """What the original request (``chat_request`` or ``completion_request``) says about decoding."""

    skip_special: bool
    spaces_between: bool
    include_stop: bool
    ignore_eos: bool
    stop_token_ids: frozenset[int]
    stop: tuple[str, ...]
    min_tokens: int
    return_token_ids: bool
    #: How many candidates a position's logprobs keep (None: all).
    top_limit: int | None


def _rules(tokenizer: Any, request: dict[str, Any] | None, *, chat: bool) -> Rules:
    given = request or {}
    skip = _flag(given, "skip_special_tokens", True)
    spaces = _flag(given, "spaces_between_special_tokens", True)
    if skip and detokenizer.vocabulary(tokenizer).fast:
        spaces = True  # the engine's fast detokenizer always spaces when it skips
    stop = given.get("stop") or []
    stops = (stop,) if isinstance(stop, str) else tuple(stop) if isinstance(stop, list) else None
    if stops is None or any(not isinstance(s, str) for s in stops):
        raise errors.BeyondFastPath(f"'stop' is not a string or a list of strings: {_VLLMS}")
    return Rules(
        skip_special=skip,
        spaces_between=spaces,
        include_stop=_flag(given, "include_stop_str_in_output", False),
        ignore_eos=_flag(given, "ignore_eos", False),
        stop_token_ids=frozenset(_ints(given.get("stop_token_ids"), "stop_token_ids") or ()),
        stop=tuple(s for s in stops if s),
        min_tokens=_int(given.get("min_tokens"), "min_tokens", 0) or 0,
        return_token_ids=_flag(given, "return_token_ids", False),
        top_limit=_top_limit(given, chat=chat) if request is not None else None,
    )


def _top_limit(request: dict[str, Any], *, chat: bool) -> int | None:
    """The candidates per position the coupled endpoint returns, sampled token first."""
    every = bool(request.get("logprob_token_ids"))
    if chat:
        if not _flag(request, "logprobs", False):
            return None  # the request says nothing of the cut: every candidate stays
        top = _int(request.get("top_logprobs"), "top_logprobs", 0)
        return None if every or top == -1 else top or 0
    logprobs = _int(request.get("logprobs"), "logprobs")
    return None if every or logprobs is None or logprobs == -1 else max(logprobs + 1, 0)


def _original(body: dict[str, Any], field: str) -> dict[str, Any] | None:
    request = body.get(field)
    if request is None:
        return None
    request = _object(request, field)
    if field == "chat_request" and not isinstance(request.get("messages"), list):
        raise errors.BadRequest("'chat_request.messages' must be a list of messages")
    return request


def _model_name(body: dict[str, Any], model: ModelFacts) -> str:
    asked = body.get("model")
    if asked is not None and not isinstance(asked, str):
        raise errors.BadRequest("'model' must be a string")
    stages.check_model(model, asked)
    return asked or model.served_name


def _beyond_passthrough(response: dict[str, Any]) -> None:
    for field in ("prompt_logprobs", "metrics"):
        if response.get(field) is not None:
            raise errors.BeyondFastPath(f"'{field}' of a generate response is passed on by {_VLLMS}")


def _choices(response: dict[str, Any], where: str) -> list[dict[str, Any]]:
    choices = response.get("choices")
    if not isinstance(choices, list) or any(not isinstance(c, dict) for c in choices):
        raise errors.BadRequest(f"'{where}.choices' must be a list of objects")
    for at, choice in enumerate(choices):
        if _int(choice.get("index"), f"{where}.choices[{at}].index") is None:
            raise errors.BadRequest(f"'{where}.choices[{at}].index' is required")
        _ints(choice.get("token_ids"), f"{where}.choices[{at}].token_ids")
        reason = choice.get("stop_reason")
        if reason is not None and (isinstance(reason, bool) or not isinstance(reason, (int, str))):
            raise errors.BadRequest(f"'{where}.choices[{at}].stop_reason' must be an integer or a string")
        finish = choice.get("finish_reason")
        if finish is not None and not isinstance(finish, str):
            raise errors.BadRequest(f"'{where}.choices[{at}].finish_reason' must be a string")
        if choice.get("logprobs") is not None:
            _logprob_entries(choice["logprobs"], f"{where}.choices[{at}].logprobs")
    return choices


def _generate_response(value: Any, where: str, *, whole: bool) -> dict[str, Any]:
    response = _object(value, where)
    if not isinstance(response.get("request_id"), str):
        raise errors.BadRequest(f"'{where}.request_id' must be a string")
    choices = _choices(response, where)
    if whole:
        for choice in choices:
            choice.setdefault("finish_reason", "stop")  # a whole answer's default
    _ints(response.get("prompt_token_ids"), f"{where}.prompt_token_ids", minimum=0)
    usage = response.get("usage")
    if usage is not None:
        usage = _object(usage, f"{where}.usage")
        for field in ("prompt_tokens", "completion_tokens"):
            _int(usage.get(field), f"{where}.usage.{field}")
    return response


def _logprob_entries(value: Any, where: str) -> list[dict[str, Any]] | None:
    logprobs = _object(value, where)
    content = logprobs.get("content")
    if content is None:
        return None
    if not isinstance(content, list):
        raise errors.BadRequest(f"'{where}.content' must be a list")
    for at, entry in enumerate(content):
        for candidate in [entry, *((entry.get("top_logprobs") or []) if isinstance(entry, dict) else [])]:
            if (
                not isinstance(candidate, dict)
                or not isinstance(candidate.get("token_id"), int)
                or isinstance(candidate.get("token_id"), bool)
                or isinstance(candidate.get("logprob"), bool)
                or not isinstance(candidate.get("logprob"), (int, float))
            ):
                raise errors.BadRequest(f"'{where}.content[{at}]' must have an integer token_id and a number logprob")
        if not isinstance(entry.get("top_logprobs", []), list):
            raise errors.BadRequest(f"'{where}.content[{at}].top_logprobs' must be a list")
    return content


def _check_bounds(responses: Sequence[dict[str, Any]], prompts: Sequence[list[int] | None], model: ModelFacts) -> None:
    """vLLM's limits on a derender body, checked before any decoding."""
    limit = model.max_model_len
    if len(responses) > MAX_SEQUENCES:
        raise errors.BadRequest(f"generate_responses count ({len(responses)}) exceeds server maximum ({MAX_SEQUENCES}).")
    for response in responses:
        if len(response["choices"]) > MAX_SEQUENCES:
            raise errors.BadRequest(f"choices count ({len(response['choices'])}) exceeds server maximum ({MAX_SEQUENCES}).")
        for choice in response["choices"]:
            ids = choice.get("token_ids") or []
            if len(ids) > limit:
                raise errors.BadRequest(
                    f"token_ids length ({len(ids)}) in choice {choice['index']} exceeds max_model_len ({limit})."
                )
            content = (choice.get("logprobs") or {}).get("content") or []
            if len(content) > limit:
                raise errors.BadRequest(f"logprobs.content length ({len(content)}) exceeds max_model_len ({limit}).")
            if any(len(entry.get("top_logprobs") or []) > MAX_LOGPROBS for entry in content):
                raise errors.BadRequest(f"top_logprobs count exceeds max_logprobs ({MAX_LOGPROBS}).")
    for ids in prompts:
        if ids is not None and len(ids) > limit:
            raise errors.BadRequest(f"prompt_token_ids length ({len(ids)}) exceeds max_model_len ({limit}).")


# -- decoding -----------------------------------------------------------------------------------


def _without_stop_token(
    ids: list[int], finish: str | None, reason: int | str | None, rules: Rules, eos: int | None, model_eos: frozenset[int]
) -> tuple[list[int], int | str | None]:
    """The ids whose text is written, and the stop reason: the token that stopped generation is
    left out (a reported id, or the EOS or a stop token the host did not report)."""
    if finish != "stop" or isinstance(reason, str) or not ids:
        return ids, reason
    last = ids[-1]
    if reason is None:
        honour_eos = not rules.ignore_eos
        if honour_eos and last == eos:
            stopped = True
        elif last in rules.stop_token_ids or (honour_eos and last in model_eos):
            stopped, reason = True, last
        else:
            stopped = False
    else:
        stopped = last == reason
    if not stopped or rules.include_stop:
        return ids, reason
    return ids[:-1], reason


def _stop_string_cut(text: str, new_chars: int, stops: Sequence[str], include: bool) -> tuple[str, int] | None:
    """The stop string that completes earliest in the last ``new_chars`` of ``text`` (ties by
    list order) and where the text ends: -1 for uncut."""
    if not new_chars or not stops:
        return None
    best: tuple[str, int, int] | None = None
    for stop in stops:
        at = text.find(stop, 1 - new_chars - len(stop))
        if at != -1 and (best is None or at + len(stop) < best[2]):
            best = (stop, at, at + len(stop))
    if best is None:
        return None
    stop, at, end = best
    if include:
        return stop, -1 if end >= len(text) else end
    return stop, at


@dataclasses.dataclass(frozen=True)
class _Decoder:
    """One request's decoding: the tokenizer, the request's rules, the model's stop tokens."""

    tokenizer: Any
    rules: Rules
    model_eos: frozenset[int]

    @property
    def eos(self) -> int | None:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return eos if isinstance(eos, int) else None

    def stop_token_dropped(self, choice: dict[str, Any]) -> tuple[list[int], int | str | None]:
        eos = self.eos
        model_eos = self.model_eos | ({eos} if eos is not None else set())
        return _without_stop_token(
            list(choice.get("token_ids") or ()),
            choice.get("finish_reason"),
            choice.get("stop_reason"),
            self.rules,
            eos,
            model_eos,
        )

    def seed(self, prompt_ids: Sequence[int] | None) -> Window:
        return detokenizer.seed(self.tokenizer, prompt_ids, self.rules.skip_special)

    def advance(self, window: Window, ids: Sequence[int]) -> str:
        return detokenizer.advance(self.tokenizer, window, ids, self.rules.skip_special, self.rules.spaces_between)

    def whole_text(self, choice: dict[str, Any], seed: Window) -> tuple[str, int | str | None]:
        """A whole choice's text and stop reason, as the engine writes them."""
        reported = choice.get("stop_reason")
        finish = choice.get("finish_reason")
        ids, reason = self.stop_token_dropped(choice)
        if finish != "stop" or isinstance(reported, int):
            stops: Sequence[str] = ()
        elif isinstance(reported, str):
            stops = (reported,)
        else:
            stops = self.rules.stop
        window = dataclasses.replace(seed, tokens=list(seed.tokens))
        head = self.advance(window, ids[: self.rules.min_tokens])
        tail = self.advance(window, ids[self.rules.min_tokens :])
        text = head + tail
        cut = _stop_string_cut(text, len(tail), stops, self.rules.include_stop)
        if cut is None:
            return text, reason
        reason, end = cut
        return (text if end == -1 else text[:end]), reason

    def logprobs(self, value: dict[str, Any], context: Sequence[int] = ()) -> dict[str, Any]:
        """The engine's integer-id logprobs in OpenAI's chat shape (token strings and bytes)."""
        content = value.get("content")
        if content is None:
            return {"content": None}
        limit = self.rules.top_limit
        seen = list(context)
        resolved = []
        for entry in content:
            tops = entry.get("top_logprobs") or []
            tops = tops if limit is None else tops[:limit]
            texts = detokenizer.token_texts(self.tokenizer, [entry["token_id"], *(t["token_id"] for t in tops)])
            (token, token_bytes), *top_texts = [
                self._finished(t, text, seen) for t, text in zip([entry, *tops], texts, strict=False)
            ]
            resolved.append(
                {
                    "token": token,
                    "logprob": float(entry["logprob"]),
                    "bytes": token_bytes,
                    "top_logprobs": [
                        {"token": text, "logprob": float(top["logprob"]), "bytes": text_bytes}
                        for top, (text, text_bytes) in zip(tops, top_texts, strict=True)
                    ],
                }
            )
            seen.append(entry["token_id"])
        return {"content": resolved}

    def _finished(
        self, candidate: dict[str, Any], text: tuple[str, list[int] | None], seen: list[int]
    ) -> tuple[str, list[int] | None]:
        if not text[0].endswith(detokenizer.REPLACEMENT):
            return text
        finished = detokenizer.completed(candidate["token_id"], seen, self.tokenizer)
        return finished, list(finished.encode("utf-8"))


def _completion_logprobs(chat_shaped: dict[str, Any], source: dict[str, Any], offset: int = 0) -> dict[str, Any]:
    """Chat-shaped logprobs as completions' parallel lists, ``text_offset`` from ``offset``."""
    out: dict[str, list[Any]] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    for entry, given in zip(chat_shaped["content"] or (), source.get("content") or (), strict=False):
        out["text_offset"].append(offset)
        out["tokens"].append(entry["token"])
        out["token_logprobs"].append(entry["logprob"])
        out["top_logprobs"].append(
            {t["token"]: t["logprob"] for t in entry["top_logprobs"]} if given.get("top_logprobs") else None
        )
        offset += len(entry["token"])
    return out


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


# -- whole answers ------------------------------------------------------------------------------


def chat(tokenizer: Any, body: dict[str, Any], model: ModelFacts) -> dict[str, Any]:
    """``/v1/chat/completions/derender``'s answer to a whole generate response."""
    generated = _generate_response(body.get("generate_response"), "generate_response", whole=True)
    prompt_ids = _ints(body.get("prompt_token_ids"), "prompt_token_ids", minimum=0)
    prompt_tokens = _int(body.get("prompt_tokens"), "prompt_tokens", 0) or 0
    request = _original(body, "chat_request")
    _beyond_passthrough(generated)
    decoder = _Decoder(tokenizer, _rules(tokenizer, request, chat=True), model.eos_token_ids)
    name = _model_name(body, model)
    _check_bounds([generated], [prompt_ids], model)
    seed = decoder.seed(prompt_ids if prompt_ids is not None else generated.get("prompt_token_ids"))
    choices = []
    for choice in generated["choices"]:
        if not choice.get("token_ids"):
            raise errors.BadRequest(f"choice {choice['index']} has empty or null token_ids")
        logprobs = decoder.logprobs(choice["logprobs"]) if choice.get("logprobs") is not None else None
        text, reason = decoder.whole_text(choice, seed)
        message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None}
        choices.append(
            {
                "index": choice["index"],
                "message": {**message, "function_call": None, "reasoning": None},
                "logprobs": logprobs,
                "finish_reason": choice.get("finish_reason") or "stop",
                "stop_reason": reason,
                "token_ids": choice["token_ids"] if decoder.rules.return_token_ids else None,
                "routed_experts": None,
                "weight_versions": None,
            }
        )
    completion_tokens = sum(len(c.get("token_ids") or ()) for c in generated["choices"])
    return {
        "id": generated["request_id"],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": name,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": _usage(prompt_tokens, completion_tokens),
        "prompt_logprobs": None,
        "prompt_token_ids": generated.get("prompt_token_ids") if decoder.rules.return_token_ids else None,
        "prompt_text": None,
        "kv_transfer_params": generated.get("kv_transfer_params"),
        "ec_transfer_params": None,
        "metrics": None,
    }


def completion(tokenizer: Any, body: dict[str, Any], model: ModelFacts) -> dict[str, Any]:
    """``/v1/completions/derender``'s answer to the whole generate responses of its prompts."""
    given = body.get("generate_responses")
    if not isinstance(given, list):
        raise errors.BadRequest("'generate_responses' must be a list")
    responses = [_generate_response(r, f"generate_responses[{at}]", whole=True) for at, r in enumerate(given)]
    prompt_counts = _ints(body.get("prompt_tokens"), "prompt_tokens")
    prompts_given = body.get("prompt_token_ids")
    if prompts_given is not None and not isinstance(prompts_given, list):
        raise errors.BadRequest("'prompt_token_ids' must be a list of token id lists")
    prompts = [_ints(p, f"prompt_token_ids[{at}]", minimum=0) for at, p in enumerate(prompts_given or [])]
    request = _original(body, "completion_request")
    for response in responses:
        _beyond_passthrough(response)
    decoder = _Decoder(tokenizer, _rules(tokenizer, request, chat=False), model.eos_token_ids)
    name = _model_name(body, model)
    if not responses:
        raise errors.BadRequest("generate_responses must not be empty")
    _check_bounds(responses, prompts, model)
    counts = prompt_counts if prompt_counts is not None else [0] * len(responses)
    seeds = prompts if prompts_given is not None else [None] * len(responses)
    choices: list[dict[str, Any]] = []
    completion_tokens = prompt_tokens = 0
    for response, count, prompt_ids in zip(responses, counts, seeds, strict=False):
        seed = decoder.seed(prompt_ids if prompt_ids is not None else response.get("prompt_token_ids"))
        for choice in response["choices"]:
            if not choice.get("token_ids"):
                raise errors.BadRequest(
                    f"choice {choice['index']} in response {response['request_id']} has empty or null token_ids"
                )
            text, reason = decoder.whole_text(choice, seed)
            logprobs = None
            if choice.get("logprobs") is not None:
                logprobs = _completion_logprobs(decoder.logprobs(choice["logprobs"]), choice["logprobs"])
            ids_back = decoder.rules.return_token_ids
            choices.append(
                {
                    "index": len(choices),
                    "text": text,
                    "logprobs": logprobs,
                    "finish_reason": choice.get("finish_reason"),
                    "stop_reason": reason,
                    "token_ids": choice["token_ids"] if ids_back else None,
                    "prompt_logprobs": None,
                    "prompt_token_ids": response.get("prompt_token_ids") if ids_back else None,
                    "routed_experts": None,
                    "weight_versions": None,
                }
            )
            completion_tokens += len(choice["token_ids"])
        prompt_tokens += count
    kv = responses[0].get("kv_transfer_params")
    return {
        "id": responses[0]["request_id"],
        "object": "text_completion",
        "created": int(time.time()),
        "model": name,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": _usage(prompt_tokens, completion_tokens),
        "kv_transfer_params": kv if all(r.get("kv_transfer_params") == kv for r in responses) else None,
        "ec_transfer_params": None,
        "metrics": None,
    }


# -- streams ------------------------------------------------------------------------------------

#: vLLM's ``DerenderStreamState``, its fields in order with their defaults.
_STATE_DEFAULTS: Final[dict[str, Any]] = {
    "prev_tokens": [],
    "prefix_offset": 0,
    "read_offset": 0,
    "role_sent": False,
    "logprob_context_token_ids": [],
    "logprob_text_offset": 0,
    "output_token_ids": [],
    "output_chunk_lens": [],
    "tools_streamed": False,
    "last_tool_call_ids": [],
}


def _state(value: Any) -> dict[str, Any] | None:
    """A carried ``stream_state``, checked as vLLM's model checks it (None: the first call)."""
    if value is None:
        return None
    given = _object(value, "stream_state")
    state = {key: given.get(key, default) for key, default in _STATE_DEFAULTS.items()}
    if not isinstance(state["prev_tokens"], list) or any(not isinstance(t, str) for t in state["prev_tokens"]):
        raise errors.BadRequest("'stream_state.prev_tokens' must be a list of strings")
    for field in ("prefix_offset", "read_offset", "logprob_text_offset"):
        _int(state[field], f"stream_state.{field}", minimum=0)
    for field in ("role_sent", "tools_streamed"):
        if not isinstance(state[field], bool):
            raise errors.BadRequest(f"'stream_state.{field}' must be true or false")
    _ints(state["logprob_context_token_ids"], "stream_state.logprob_context_token_ids", optional=False)
    if len(state["logprob_context_token_ids"]) > detokenizer.LOGPROB_CONTEXT:
        raise errors.BadRequest(f"'stream_state.logprob_context_token_ids' holds at most {detokenizer.LOGPROB_CONTEXT} ids")
    _ints(state["output_token_ids"], "stream_state.output_token_ids", optional=False)
    _ints(state["output_chunk_lens"], "stream_state.output_chunk_lens", optional=False, minimum=1)
    if not isinstance(state["last_tool_call_ids"], list) or any(not isinstance(t, str) for t in state["last_tool_call_ids"]):
        raise errors.BadRequest("'stream_state.last_tool_call_ids' must be a list of strings")
    return state


def _with_window(state: dict[str, Any], window: Window) -> dict[str, Any]:
    return {**state, "prev_tokens": window.tokens, "prefix_offset": window.prefix_offset, "read_offset": window.read_offset}


def _context_tail(context: Sequence[int], ids: Sequence[int]) -> list[int]:
    return [*context, *ids][-detokenizer.LOGPROB_CONTEXT :]


@dataclasses.dataclass(frozen=True)
class _StreamCall:
    """One streamed derender call, read: the event, the carried state (seeded on the first call)."""

    name: str
    event: dict[str, Any]
    decoder: _Decoder
    state: dict[str, Any]
    prompt_tokens: int | None

    def usage(self) -> dict[str, Any] | None:
        usage = self.event.get("usage")
        if usage is None:
            return None
        prompt = self.prompt_tokens if self.prompt_tokens is not None else usage.get("prompt_tokens") or 0
        return _usage(prompt, usage.get("completion_tokens") or 0)

    def step(self, state: dict[str, Any], choice: dict[str, Any]) -> tuple[Window, str, int | str | None, dict[str, Any] | None]:
        """One choice of the event after ``state``: the window it leaves, its text, its stop
        reason, and its logprobs in a chat's shape (None when the engine sent none)."""
        text_ids, reason = self.decoder.stop_token_dropped(choice)
        window = _carried_window(state)
        text = self.decoder.advance(window, text_ids)
        logprobs = None
        if choice.get("logprobs") is not None:
            logprobs = self.decoder.logprobs(choice["logprobs"], self.state["logprob_context_token_ids"])
        return window, text, reason, logprobs

    def chunk(self, kind: str, choices: list[dict[str, Any]], tail: dict[str, Any]) -> dict[str, Any]:
        """The derendered event: vLLM's stream response fields, ``tail`` (each kind's own) last."""
        head = {"id": self.event["request_id"], "object": kind, "created": int(time.time()), "model": self.name}
        return {**head, "choices": choices, "usage": self.usage(), "system_fingerprint": None, **tail}


def _stream_call(tokenizer: Any, body: dict[str, Any], model: ModelFacts, field: str, *, chat: bool) -> _StreamCall:
    event = _generate_response(body.get("generate_chunk"), "generate_chunk", whole=False)
    state = _state(body.get("stream_state"))
    prompt_ids = _ints(body.get("prompt_token_ids"), "prompt_token_ids", minimum=0)
    prompt_tokens = _int(body.get("prompt_tokens"), "prompt_tokens")
    request = _original(body, field)
    if event.get("metrics") is not None:
        raise errors.BeyondFastPath(f"'metrics' of a generate event is passed on by {_VLLMS}")
    decoder = _Decoder(tokenizer, _rules(tokenizer, request, chat=chat), model.eos_token_ids)
    name = _model_name(body, model)
    if request is not None and request.get("stop"):
        raise errors.BadRequest(STREAM_STOP_REFUSED)
    what = "derender_chat_stream" if chat else "derender_completion_stream"
    if len(event["choices"]) > 1:
        raise errors.BadRequest(f"{what} expects at most one choice per chunk (got {len(event['choices'])}).")
    limit = model.max_model_len
    if chat:
        prior = len(state["output_token_ids"]) if state is not None else 0
        delta = sum(len(c.get("token_ids") or ()) for c in event["choices"])
        if len(prompt_ids or ()) + prior + delta > limit:
            raise errors.BadRequest(
                f"prompt_token_ids length ({len(prompt_ids or ())}) plus output_token_ids length ({prior}) plus delta "
                f"({delta}) exceeds max_model_len ({limit})."
            )
    elif prompt_ids is not None and len(prompt_ids) > limit:
        raise errors.BadRequest(f"prompt_token_ids length ({len(prompt_ids)}) exceeds max_model_len ({limit}).")
    if state is None:
        window = decoder.seed(prompt_ids if prompt_ids is not None else event.get("prompt_token_ids"))
        state = _with_window(dict(_STATE_DEFAULTS), window)
    return _StreamCall(name, event, decoder, state, prompt_tokens)


def _carried_window(state: dict[str, Any]) -> Window:
    return Window(list(state["prev_tokens"]), state["prefix_offset"], state["read_offset"])


def chat_stream(tokenizer: Any, body: dict[str, Any], model: ModelFacts) -> dict[str, Any]:
    """One streamed event of ``/v1/chat/completions/derender``: ``{chunk, stream_state}``."""
    call = _stream_call(tokenizer, body, model, "chat_request", chat=True)
    decoder, before = call.decoder, call.state
    state = before
    choices = []
    for choice in call.event["choices"]:
        ids = list(choice.get("token_ids") or ())
        window, text, reason, logprobs = call.step(state, choice)
        role = None if state["role_sent"] else "assistant"
        state = {
            **_with_window(state, window),
            "role_sent": True,
            "logprob_context_token_ids": _context_tail(before["logprob_context_token_ids"], ids),
        }
        choices.append(
            {
                "index": choice["index"],
                "delta": {"role": role, "content": text or None, "reasoning": None},
                "logprobs": logprobs,
                "finish_reason": choice.get("finish_reason"),
                "stop_reason": reason,
                "token_ids": choice.get("token_ids") if decoder.rules.return_token_ids else None,
                "weight_versions": None,
            }
        )
    prompt_ids = call.event.get("prompt_token_ids") if decoder.rules.return_token_ids else None
    tail = {"prompt_token_ids": prompt_ids, "prompt_text": None, "metrics": None, "kv_transfer_params": None}
    return {"chunk": call.chunk("chat.completion.chunk", choices, tail), "stream_state": state}


def completion_stream(tokenizer: Any, body: dict[str, Any], model: ModelFacts) -> dict[str, Any]:
    """One streamed event of ``/v1/completions/derender``: ``{chunk, stream_state}``."""
    call = _stream_call(tokenizer, body, model, "completion_request", chat=False)
    decoder, before = call.decoder, call.state
    state = before
    choices = []
    ids_back = decoder.rules.return_token_ids
    for choice in call.event["choices"]:
        ids = list(choice.get("token_ids") or ())
        window, text, reason, chat_shaped = call.step(state, choice)
        logprobs = None
        offset = before["logprob_text_offset"] + len(text)
        if chat_shaped is not None:
            logprobs = _completion_logprobs(chat_shaped, choice["logprobs"], before["logprob_text_offset"])
            if logprobs["tokens"]:
                offset = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
        state = {
            **_with_window(state, window),
            "logprob_context_token_ids": _context_tail(before["logprob_context_token_ids"], ids),
            "logprob_text_offset": offset,
        }
        choices.append(
            {
                "index": choice["index"],
                "text": text,
                "logprobs": logprobs,
                "finish_reason": choice.get("finish_reason"),
                "stop_reason": reason,
                "prompt_token_ids": call.event.get("prompt_token_ids") if ids_back else None,
                "token_ids": choice.get("token_ids") if ids_back else None,
                "weight_versions": None,
            }
        )
    tail = {"metrics": None, "kv_transfer_params": None}
    return {"chunk": call.chunk("text_completion", choices, tail), "stream_state": state}


def chat_logprobs(tokenizer: Any, request: dict[str, Any], logprobs: dict[str, Any], context: Sequence[int]) -> dict[str, Any]:
    """One streamed event's engine logprobs in a chat's shape, as vLLM 0.33's derender resolves
    them: for a front whose installed vLLM (0.32) leaves a parsed stream's logprobs out."""
    return _Decoder(tokenizer, _rules(tokenizer, request, chat=True), frozenset()).logprobs(logprobs, context)


def logprob_context(context: Sequence[int], ids: Sequence[int]) -> list[int]:
    """The sampled ids a stream's next logprobs are finished with (the last four)."""
    return _context_tail(context, ids)


Derender = Callable[[Any, dict[str, Any], ModelFacts], dict[str, Any]]


def chat_any(tokenizer: Any, body: dict[str, Any], model: ModelFacts) -> dict[str, Any]:
    """The chat derender route: whole or streamed, as the body's ``stream`` says."""
    return (chat_stream if _stream_flag(body) else chat)(tokenizer, body, model)


def completion_any(tokenizer: Any, body: dict[str, Any], model: ModelFacts) -> dict[str, Any]:
    """The completion derender route: whole or streamed, as the body's ``stream`` says."""
    return (completion_stream if _stream_flag(body) else completion)(tokenizer, body, model)
