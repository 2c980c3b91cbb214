"""One OpenAI request carried through the tier: rendered here, generated at an engine, derendered
here, so the answer is the one the engine's own OpenAI API gives for the same request.

- Render: the request goes to the render backend as ``/v1/chat/completions/render`` (or
  ``/v1/completions/render``) would take it; its answer is the engine's ``GenerateRequest`` (a
  list of them for completions, one per prompt). A refusal is answered as the render answered it.
- Generate: each ``GenerateRequest`` goes to an engine (``engines.EnginePool``) as it came from the
  render, ``stream`` and ``stream_options`` included. An engine's refusal (a prompt over its
  context, a bad sampling parameter) is answered as the engine wrote it: vLLM's error JSON is
  OpenAI's error shape.
- Derender: the engine's answer goes back to the render backend as ``.../derender`` takes it,
  with the prompt's token ids and the original request (its media parts left out: the derender
  reads the request's sampling, tool and parser fields, never its images, and media URLs would
  be fetched again). Streamed, each engine event is derendered as it arrives, one call each,
  carrying the ``stream_state`` the previous call returned (one per choice when ``n > 1``).

Two fields are put back as the engine's own API writes them: the answer's ``id`` (the render's
``chatcmpl-...``/``cmpl-...`` request id; the derender would answer the engine's internal
``generate-tokens-...``), and ``usage.prompt_tokens_details`` (the engine counts cached prompt
tokens; the derender, which never saw the cache, leaves them out).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any, Final

import orjson

from mmprep_runtime import errors
from mmprep_runtime.backends.native import derender
from mmprep_runtime.backends.protocol import Operation, RenderBackend, Reply
from mmprep_runtime.generation.engines import EngineFailed, EnginePool, Generation

#: Content parts that carry media (chat parts); the derender is given the text parts only.
_MEDIA_PARTS: Final = frozenset({"image_url", "video_url", "audio_url", "input_audio", "image_embeds", "image_pil"})
_JSON: Final = {"Content-Type": "application/json"}
#: ``SamplingParams.max_tokens``' default, which a render leaves out of its answer.
SAMPLING_DEFAULT_MAX_TOKENS: Final = 16


@dataclasses.dataclass(frozen=True)
class Kind:
    """Chat or completion: the routes it is rendered and derendered by, and the derender's field
    for the original request."""

    render: Operation
    derender: Operation
    request_field: str


CHAT: Final = Kind(Operation.CHAT_RENDER, Operation.CHAT_DERENDER, "chat_request")
COMPLETION: Final = Kind(Operation.COMPLETION_RENDER, Operation.COMPLETION_DERENDER, "completion_request")


class Passed(Exception):
    """An answer passed on as its maker wrote it (a render's or an engine's refusal)."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.status)
        self.reply = reply


def error_event(message: str, status: int) -> bytes:
    """A stream's error event, as vLLM's OpenAI server writes one before ``[DONE]``."""
    kind = "ServiceUnavailableError" if status in (502, 503, 504) else "BadRequestError"
    return _event({"error": {"message": message, "type": kind, "param": None, "code": status}})


def _event(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


DONE: Final = b"data: [DONE]\n\n"


def without_media(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` with every media part left out of its messages (a shallow copy; the request
    itself is not changed)."""
    messages = request.get("messages")
    if not isinstance(messages, list):
        return request
    kept = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            parts = [p for p in content if not (isinstance(p, dict) and p.get("type") in _MEDIA_PARTS)]
            message = {**message, "content": parts}
        kept.append(message)
    return {**request, "messages": kept}


def _cached_details(usages: list[Any]) -> dict[str, Any] | None:
    """The engines' ``prompt_tokens_details`` summed over their answers (None when none gave it)."""
    details = [u.get("prompt_tokens_details") for u in usages if isinstance(u, dict)]
    given = [d for d in details if isinstance(d, dict)]
    if not given:
        return None
    cached = sum(int(d.get("cached_tokens") or 0) for d in given)
    return {**given[0], "cached_tokens": cached}


def _cut_at_stop_string(choice: dict[str, Any]) -> None:
    """The text of a choice the engine stopped on a stop string, cut where the string begins, as
    the engine's own API answers it (the engine reports the string; vLLM 0.32's derender leaves
    it in). Generation stops at the string's first appearance, so the first one is where to cut."""
    stop = choice.get("stop_reason")
    if choice.get("finish_reason") != "stop" or not isinstance(stop, str) or not stop:
        return
    message = choice.get("message")
    holder: dict[str, Any] = message if isinstance(message, dict) else choice
    key = "content" if isinstance(message, dict) else "text"
    text = holder.get(key)
    if isinstance(text, str) and (at := text.find(stop)) >= 0:
        holder[key] = text[:at]


def _tool_calls_finish(choice: dict[str, Any], request: dict[str, Any]) -> None:
    """``finish_reason: "tool_calls"`` for a choice whose tools the parser found, as the engine's
    own API answers a request that let the model choose its tools (``tool_choice`` auto, the
    default, or required); vLLM 0.32's whole derender leaves ``stop``."""
    message = choice.get("message")
    called = isinstance(message, dict) and bool(message.get("tool_calls"))
    if called and choice.get("finish_reason") == "stop" and request.get("tool_choice", "auto") in ("auto", "required"):
        choice["finish_reason"] = "tool_calls"


def _logprob_bytes(choice: Any) -> None:
    """Every chat logprob with its ``bytes``, as the engine's own API writes them: vLLM's derender
    leaves them null for an id the tokenizer has no token for (a padded vocabulary's), the
    engine writes the empty token's bytes."""
    logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    for entry in content or ():
        for candidate in [entry, *(entry.get("top_logprobs") or ())]:
            if candidate.get("bytes") is None and isinstance(candidate.get("token"), str):
                candidate["bytes"] = list(candidate["token"].encode("utf-8", errors="replace"))


def _drop_stop_token(choices: list[Any]) -> None:
    """The last event of a choice the engine ended on a stop token (its EOS, or one of
    ``stop_token_ids``) carries that token's id; the engine's own stream never writes its text,
    and vLLM 0.32's streamed derender would (its whole derender drops it): leave it out."""
    for choice in choices:
        ids = choice.get("token_ids") if isinstance(choice, dict) else None
        if choice.get("finish_reason") == "stop" and not isinstance(choice.get("stop_reason"), str) and ids:
            choice["token_ids"] = ids[:-1]


def _answer_id(rendered: list[dict[str, Any]]) -> str:
    """The id the engine's own API gives the answer: the render's request id (for completions of
    several prompts, the render numbered them ``-0``, ``-1``, ...: the base id)."""
    first = str(rendered[0].get("request_id", ""))
    if len(rendered) > 1 and first.endswith("-0"):
        return first[:-2]
    return first


@dataclasses.dataclass(frozen=True)
class Rendered:
    """What the render answered: one ``GenerateRequest`` per prompt."""

    kind: Kind
    original: dict[str, Any]
    requests: list[dict[str, Any]]
    request_id: str | None

    @property
    def stream(self) -> bool:
        return bool(self.original.get("stream"))


class Chain:
    def __init__(
        self, renderer: RenderBackend, engines: EnginePool, tokenizer: Any = None, *, counts_reasoning: bool = False
    ) -> None:
        self.renderer = renderer
        self.engines = engines
        #: A reasoning parser is configured: a chat's usage carries its reasoning tokens, as the
        #: engine's own API writes them (``completion_tokens_details``).
        self.counts_reasoning = counts_reasoning
        #: The model's tokenizer, to resolve a streamed chat's logprobs where the installed
        #: vLLM's derender leaves them out (``_StreamState.fill_logprobs``); None: never filled.
        self.tokenizer = tokenizer

    async def render(self, kind: Kind, body: bytes, original: dict[str, Any], request_id: str | None) -> Rendered:
        """The render of ``body``; ``Passed`` with the render's own answer when it refuses."""
        reply = await self.renderer.call(kind.render, body, request_id)
        if reply.status != 200:
            raise Passed(reply)
        answer = orjson.loads(reply.body)
        requests = answer if isinstance(answer, list) else [answer]
        if not requests or not all(isinstance(r, dict) for r in requests):
            raise errors.InternalError("the render answered no generate request")
        for request in requests:
            sampling = request.get("sampling_params")
            if isinstance(sampling, dict) and "max_tokens" not in sampling:
                # The render leaves out a max_tokens equal to SamplingParams' default (16: its
                # serializer omits defaults), and the engine reads an absent one as "up to the
                # context length": a request for 16 tokens would get thousands. Said, it holds.
                sampling["max_tokens"] = SAMPLING_DEFAULT_MAX_TOKENS
        return Rendered(kind, original, requests, request_id)

    def _derender_body(self, rendered: Rendered, **fields: Any) -> bytes:
        body = {
            "model": rendered.original.get("model"),
            rendered.kind.request_field: without_media(rendered.original),
            **fields,
        }
        return orjson.dumps(body)

    async def _derender(self, rendered: Rendered, body: bytes) -> dict[str, Any]:
        reply = await self.renderer.call(rendered.kind.derender, body, rendered.request_id)
        if reply.status != 200:
            raise Passed(reply)
        answer: dict[str, Any] = orjson.loads(reply.body)
        return answer

    async def _generate_whole(self, request: dict[str, Any]) -> dict[str, Any]:
        async with self.engines.generate(orjson.dumps(request), _JSON) as generation:
            body = await generation.read()
            if generation.status != 200:
                raise Passed(Reply(generation.status, _as_error_json(body, generation.status)))
        try:
            answer: dict[str, Any] = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise EngineFailed(f"the engine {generation.engine.url} answered something that is not JSON") from None
        return answer

    async def whole(self, rendered: Rendered) -> bytes:
        """The whole answer (JSON) of a request that did not ask to stream."""
        answers = await asyncio.gather(*(self._generate_whole(r) for r in rendered.requests))
        prompts = [list(r["token_ids"]) for r in rendered.requests]
        if rendered.kind is CHAT:
            body = self._derender_body(
                rendered,
                stream=False,
                generate_response=answers[0],
                prompt_tokens=len(prompts[0]),
                prompt_token_ids=prompts[0],
            )
        else:
            body = self._derender_body(
                rendered,
                stream=False,
                generate_responses=answers,
                prompt_tokens=[len(p) for p in prompts],
                prompt_token_ids=prompts,
            )
        answer = await self._derender(rendered, body)
        answer["id"] = _answer_id(rendered.requests)
        for choice in answer.get("choices") or ():
            if not rendered.original.get("include_stop_str_in_output"):
                _cut_at_stop_string(choice)
            if rendered.kind is CHAT:
                _tool_calls_finish(choice, rendered.original)
                _logprob_bytes(choice)
        details = _cached_details([a.get("usage") for a in answers])
        if details is not None and isinstance(answer.get("usage"), dict):
            answer["usage"]["prompt_tokens_details"] = details
        if rendered.kind is CHAT and isinstance(answer.get("usage"), dict):
            outputs = [list(c.get("token_ids") or ()) for c in answers[0].get("choices") or ()]
            reasoning = await self._reasoning_details(rendered, outputs)
            if reasoning is not None:
                answer["usage"]["completion_tokens_details"] = reasoning
        return orjson.dumps(answer)

    async def _reasoning_details(self, rendered: Rendered, outputs: list[list[int]]) -> dict[str, int] | None:
        """``completion_tokens_details`` of a chat whose choices generated ``outputs``, as the
        engine's own API counts them with its reasoning parser; None where none is configured."""
        if not self.counts_reasoning:
            return None
        counts = await self.renderer.reasoning_tokens(without_media(rendered.original), outputs)
        return None if counts is None else {"reasoning_tokens": sum(counts)}

    async def open_stream(self, rendered: Rendered) -> AsyncIterator[bytes]:
        """Start generating a streamed request (one engine stream per prompt of a completion);
        once every engine answered 200 (a refusal is ``Passed`` before any byte went to the
        client), the server-sent events to send on, ``[DONE]`` last. The caller closes them
        (``aclose``) when it stops early: that closes the engines' streams, and the engines stop
        generating."""
        opened: list[Any] = []
        generations: list[Generation] = []
        try:
            for request in rendered.requests:
                if request.get("stream_options") is None and rendered.original.get("stream_options") is not None:
                    # The native render leaves the options out (its answer is vLLM's non-streamed
                    # render's); the engine reads them from here: a usage event only when asked for.
                    request = {**request, "stream_options": rendered.original["stream_options"]}
                opening = self.engines.generate(orjson.dumps(request), _JSON)
                generation = await opening.__aenter__()
                opened.append(opening)
                generations.append(generation)
                if generation.status != 200:
                    raise Passed(Reply(generation.status, _as_error_json(await generation.read(), generation.status)))
        except BaseException:
            await _close_all(opened)
            raise
        return self._events(rendered, generations, opened)

    async def _events(self, rendered: Rendered, generations: list[Generation], opened: list[Any]) -> AsyncIterator[bytes]:
        stream = _StreamState(rendered)
        # vLLM's streamed derender refuses stop strings: it is asked without them, and the text
        # is held back and cut here as the engine's own stream does.
        derendered = dataclasses.replace(rendered, original=_without_stop(rendered.original)) if stream.stops else rendered
        try:
            async for prompt, data in _merged([g.events() for g in generations]):
                event = orjson.loads(data)
                if not isinstance(event, dict) or "error" in event:
                    yield b"data: " + data + b"\n\n"  # the engine's own error event, as it wrote it
                    continue
                choices = event.get("choices") or []
                index = int(choices[0].get("index", 0)) if choices else stream.last[prompt]
                sampled = [list(c.get("token_ids") or ()) for c in choices]
                _drop_stop_token(choices)
                body = self._derender_body(
                    derendered,
                    stream=True,
                    generate_chunk=event,
                    stream_state=stream.states.get((prompt, index)),
                    prompt_tokens=len(stream.prompts[prompt]),
                    prompt_token_ids=stream.prompts[prompt],
                )
                try:
                    answer = await self._derender(derendered, body)
                except Passed as passed:
                    yield b"data: " + _as_error_json(passed.reply.body, passed.reply.status) + b"\n\n" + DONE
                    return
                stream.states[(prompt, index)], stream.last[prompt] = answer["stream_state"], index
                if stream.fills_logprobs and self.tokenizer is not None:
                    stream.fill_logprobs(self.tokenizer, answer["chunk"], choices, sampled, prompt)
                counted = self.counts_reasoning and rendered.kind is CHAT
                if counted:
                    for choice, ids in zip(choices, sampled, strict=True):
                        stream.outputs.setdefault((prompt, int(choice.get("index", 0))), []).extend(ids)
                chunk = stream.chunk(answer["chunk"], prompt, index, choices, event.get("usage"))
                if counted and chunk is not None and not choices and isinstance(chunk.get("usage"), dict):
                    reasoning = await self._reasoning_details(rendered, list(stream.outputs.values()))
                    if reasoning is not None:
                        chunk["usage"]["completion_tokens_details"] = reasoning
                if chunk is not None:
                    yield _event(chunk)
        except errors.RequestError as exc:
            # The engine stopped mid-answer (or a derender could not be made): the client is told
            # so, in the stream, rather than seeing it end as if it were complete.
            yield error_event(exc.message, exc.status) + DONE
            return
        finally:
            await _close_all(opened)
        usage = stream.usage_chunk()
        if usage is not None:
            yield _event(usage)
        yield DONE


class _StreamState:
    """What a streamed answer carries from event to event: each choice's derender state and
    stop-string holdback (by prompt and choice), and, for a completion of several prompts, the
    usage of each prompt's stream, written once at the end as the engine's own API writes it."""

    def __init__(self, rendered: Rendered) -> None:
        self.answer_id = _answer_id(rendered.requests)
        self.prompts = [list(r["token_ids"]) for r in rendered.requests]
        self.several = len(self.prompts) > 1
        n = rendered.original.get("n")
        self.choices_per_prompt = n if isinstance(n, int) and n > 0 else 1
        self.states: dict[tuple[int, int], Any] = {}
        self.last = [0] * len(self.prompts)
        self.stops = stop_strings(rendered.original)
        self.include_stop = bool(rendered.original.get("include_stop_str_in_output"))
        self.held: dict[tuple[int, int], StopHoldback] = {}
        self.usage_chunks: list[dict[str, Any]] = []
        self.engine_usages: list[Any] = []
        # vLLM 0.32's streamed chat derender with a parser leaves logprobs out; 0.33's resolves
        # them (and hides them with the reasoning): the same rule fills them where missing.
        original = self.original = rendered.original
        self.fills_logprobs = (
            rendered.kind is CHAT and bool(original.get("logprobs")) and original.get("include_reasoning") is not False
        )
        self.logprob_context: dict[tuple[int, int], list[int]] = {}
        #: Each choice's output ids so far, for the reasoning-token count of the usage event
        #: (kept only where a reasoning parser counts them).
        self.outputs: dict[tuple[int, int], list[int]] = {}

    def fill_logprobs(
        self,
        tokenizer: Any,
        chunk: dict[str, Any],
        engine_choices: list[Any],
        sampled: list[list[int]],
        prompt: int,
    ) -> None:
        """The engine's logprobs, resolved, on each derendered choice that has none."""
        for engine_choice, choice, ids in zip(engine_choices, chunk.get("choices") or (), sampled, strict=False):
            key = (prompt, int(engine_choice.get("index", 0)))
            context = self.logprob_context.get(key, [])
            if choice.get("logprobs") is None and isinstance(engine_choice.get("logprobs"), dict):
                choice["logprobs"] = derender.chat_logprobs(tokenizer, self.original, engine_choice["logprobs"], context)
            self.logprob_context[key] = derender.logprob_context(context, ids)

    def chunk(
        self, chunk: dict[str, Any], prompt: int, index: int, engine_choices: list[Any], engine_usage: Any
    ) -> dict[str, Any] | None:
        """The derendered ``chunk`` as the engine's own stream writes it; None for a prompt's usage
        event of several, kept for the end."""
        chunk["id"] = self.answer_id
        written = chunk.get("choices") or []
        for choice in written:
            _logprob_bytes(choice)
        if self.stops:
            for engine_choice, choice in zip(engine_choices, written, strict=False):
                holdback = self.held.setdefault((prompt, index), StopHoldback(self.stops, self.include_stop))
                holdback.apply(choice, engine_choice)
        if self.several:
            # The engine's API numbers the choices of prompt p as p * n + i.
            for choice in written:
                if isinstance(choice, dict) and isinstance(choice.get("index"), int):
                    choice["index"] += prompt * self.choices_per_prompt
            if not written and isinstance(chunk.get("usage"), dict):
                self.usage_chunks.append(chunk)
                self.engine_usages.append(engine_usage)
                return None
        details = _cached_details([engine_usage])
        if details is not None and isinstance(chunk.get("usage"), dict):
            chunk["usage"]["prompt_tokens_details"] = details
        if isinstance(chunk.get("usage"), dict) and chunk["usage"].get("completion_tokens_details", {}) is None:
            # The engine's stream leaves unset usage details out; the reasoning count, where a
            # parser is configured, is written in their place (``_reasoning_details``).
            del chunk["usage"]["completion_tokens_details"]
        return chunk

    def usage_chunk(self) -> dict[str, Any] | None:
        """One usage chunk for the prompts' streams: their counts summed."""
        if not self.usage_chunks:
            return None
        chunk = self.usage_chunks[-1]
        usages = [c["usage"] for c in self.usage_chunks]
        chunk["usage"] = {
            key: sum(int(u.get(key) or 0) for u in usages) for key in ("prompt_tokens", "completion_tokens", "total_tokens")
        }
        details = _cached_details(self.engine_usages)
        if details is not None:
            chunk["usage"]["prompt_tokens_details"] = details
        return chunk


async def _close_all(opened: list[Any]) -> None:
    for opening in opened:
        await opening.__aexit__(None, None, None)


async def _merged(streams: list[AsyncIterator[bytes]]) -> AsyncIterator[tuple[int, bytes]]:
    """The items of ``streams`` as each arrives, with the number of the stream it came from; the
    first error of any stream is raised here."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    arrived: asyncio.Queue[tuple[int, bytes | None, Exception | None]] = asyncio.Queue()

    async def pump(number: int, stream: AsyncIterator[bytes]) -> None:
        try:
            async for item in stream:
                await arrived.put((number, item, None))
            await arrived.put((number, None, None))
        except Exception as exc:  # noqa: BLE001 - raised to the reader, in its order
            await arrived.put((number, None, exc))

    pumps = [asyncio.create_task(pump(number, stream)) for number, stream in enumerate(streams)]
    try:
        running = len(pumps)
        while running:
            number, got, error = await arrived.get()
            if error is not None:
                raise error
            if got is None:
                running -= 1
                continue
            yield number, got
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


def stop_strings(request: dict[str, Any]) -> list[str]:
    """The request's ``stop`` strings (OpenAI's field: one string or a list)."""
    stop = request.get("stop")
    listed = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    return [s for s in listed if isinstance(s, str) and s]


def _without_stop(request: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in request.items() if k != "stop"}


class StopHoldback:
    """One streamed choice's text as the engine's own stream writes it for a request with stop
    strings: the last ``longest - 1`` characters are held back until the next event (a stop string
    may be completing), and the choice's last event cuts the text where the stop string the engine
    stopped on begins (after it with ``include_stop_str_in_output``, which holds nothing back).
    The engine stops at a string's first appearance, and what was written never reached into one
    that later completed: so its first appearance in the whole text is where to cut."""

    def __init__(self, stops: list[str], include: bool) -> None:
        self.hold = 0 if include else max(len(s) for s in stops) - 1
        self.include = include
        self.text = ""
        self.written = 0

    def next_text(self, delta: str, finish_reason: Any, stop_reason: Any) -> str:
        """What to write for this event's ``delta``; ``finish_reason`` set on the choice's last."""
        self.text += delta
        end = len(self.text)
        if finish_reason is None:
            end = max(end - self.hold, self.written)
        elif finish_reason == "stop" and isinstance(stop_reason, str) and stop_reason:
            at = self.text.find(stop_reason)
            if at >= 0:
                end = at + len(stop_reason) if self.include else at
        written = self.text[self.written : end] if end > self.written else ""
        self.written = max(self.written, end)
        return written

    def apply(self, choice: Any, engine_choice: Any) -> None:
        """Hold back and cut the text of a derendered chunk's ``choice`` (a chat delta's content or
        a completion's text), by its engine event's finish and stop reasons."""
        if not isinstance(choice, dict) or not isinstance(engine_choice, dict):
            return
        delta = choice.get("delta")
        holder, key = (delta, "content") if isinstance(delta, dict) else (choice, "text")
        given = holder.get(key)
        written = self.next_text(
            given if isinstance(given, str) else "", engine_choice.get("finish_reason"), engine_choice.get("stop_reason")
        )
        if isinstance(given, str) or written:
            holder[key] = written


def _as_error_json(body: bytes, status: int) -> bytes:
    """``body`` when it is JSON (vLLM's error answers are), else an OpenAI-shaped error around it."""
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        message = body.decode("utf-8", "replace")[:1000] or f"HTTP {status}"
        return orjson.dumps({"error": {"message": message, "type": "EngineError", "param": None, "code": status}})
    return body
