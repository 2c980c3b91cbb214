"""vLLM's streamed chat derender with a parser, resumed where this process left it instead of
replayed from the first token.

vLLM's parser state cannot travel in ``stream_state``, so vLLM 0.33 carries every output id there
and, on each call, builds a fresh parser and steps it through all of them again before the new
ones (``OnlineDerenderer._derender_chat_stream_parsed``): a call at token n costs O(n), a stream
O(n²) (13 ms a call by token 1,000 on the benchmark's machine, as much again as the new token's own
work a hundred times over).

In mmprep's render processes the parser and the decode window a call ends with are kept, under a
digest of everything they were built from: the request (less its random ``request_id``), the
prompt ids, and the output ids with their chunking, all of which the client sends back in
``stream_state``. The next call whose state has the same digest continues with them: vLLM's own
function runs on it with nothing to replay, and the ids it leaves out of the state it returns are
put back. A state this process did not write (a stream begun elsewhere, or changed by the
client), a call after a finish, and anything kept longer than ``_FORGET_AFTER_S`` take vLLM's
replay, so every answer is the one vLLM's server gives; the compatibility tests compare them, and
``tests/compat/parsed_stream_check.py`` runs both functions side by side on one derenderer.

How the kept objects reach vLLM's function without copying it: three of the names it calls are
wrapped (``install``). Within a resumed call, on its thread only, the stream processor constructor
returns the kept processor and the seed of the decode window returns the kept window; within any
call, the last window it decodes to is noted, to be kept with the processor.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import threading
import time
from typing import Any, Final

import orjson

logger = logging.getLogger(__name__)

#: Streams kept per process: a parser and a decode window each (kilobytes).
_KEPT_STREAMS: Final = 4096
_FORGET_AFTER_S: Final = 300.0


@dataclasses.dataclass
class _Stream:
    processor: Any
    window: Any
    kept_at: float


class _Kept:
    """Live streams by digest, each taken by the one call that continues it."""

    def __init__(self) -> None:
        self._streams: collections.OrderedDict[bytes, _Stream] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.resumed = 0
        self.replayed = 0

    def take(self, digest: bytes) -> _Stream | None:
        with self._lock:
            stream = self._streams.pop(digest, None)
            if stream is not None and time.monotonic() - stream.kept_at > _FORGET_AFTER_S:
                stream = None
            if stream is None:
                self.replayed += 1
            else:
                self.resumed += 1
            return stream

    def keep(self, digest: bytes, processor: Any, window: Any) -> None:
        with self._lock:
            self._streams[digest] = _Stream(processor, window, time.monotonic())
            while len(self._streams) > _KEPT_STREAMS:
                self._streams.popitem(last=False)

    def __len__(self) -> int:
        return len(self._streams)


KEPT: Final = _Kept()


class _Call(threading.local):
    """What a parsed stream call on this thread resumes (``stream``) and ends with."""

    stream: _Stream | None = None
    noting: bool = False
    processor: Any = None
    window: Any = None


_CALL: Final = _Call()


def _digest(request: Any, prompt_ids: Any, output_ids: Any, chunk_lengths: Any) -> bytes:
    # The request as vLLM parsed it, so two spellings of one body are one stream; its request_id
    # is made at random per call when the client sends none.
    text = request.model_dump_json(exclude={"request_id"})
    return hashlib.blake2b(orjson.dumps([text, prompt_ids, output_ids, chunk_lengths]), digest_size=16).digest()


def install() -> bool:
    """Wrap vLLM's parsed stream derender (see the module's text); False, and nothing changed, when
    vLLM's code is not the shape this was written against. Call it before vLLM builds its
    derenderer: the derenderer binds the method when it is made."""
    try:
        from vllm.renderers import online_derenderer as module
    except ImportError as exc:
        logger.info("parsed streams are replayed as vLLM replays them: %s", exc)
        return False
    derenderer = getattr(module, "OnlineDerenderer", None)
    names = ("_derender_chat_stream_parsed", "_detokenize_delta")
    if derenderer is None or not all(callable(getattr(derenderer, n, None)) for n in names):
        logger.info("parsed streams are replayed as vLLM replays them: its derenderer is not the shape expected")
        return False
    if not callable(getattr(module, "ChatStreamProcessor", None)) or not callable(getattr(module, "_seed_stream_state", None)):
        logger.info("parsed streams are replayed as vLLM replays them: its derenderer is not the shape expected")
        return False
    if getattr(derenderer._derender_chat_stream_parsed, "mmprep_resumes", False):
        return True
    replaying = derenderer._derender_chat_stream_parsed
    decode_delta = derenderer._detokenize_delta
    make_processor = module.ChatStreamProcessor
    seed_window = module._seed_stream_state

    def stream_processor(*args: Any, **kwargs: Any) -> Any:
        processor = _CALL.stream.processor if _CALL.stream is not None else make_processor(*args, **kwargs)
        if _CALL.noting:
            _CALL.processor = processor
        return processor

    def seed(*args: Any, **kwargs: Any) -> Any:
        window = _CALL.stream.window if _CALL.stream is not None else seed_window(*args, **kwargs)
        if _CALL.noting:
            _CALL.window = window
        return window

    def detokenize_delta(self: Any, *args: Any, **kwargs: Any) -> Any:
        text, window = decode_delta(self, *args, **kwargs)
        if _CALL.noting:
            _CALL.window = window
        return text, window

    def derender_chat_stream_parsed(
        self: Any,
        parser_cls: Any,
        model: str,
        generate_chunk: Any,
        state: Any,
        chat_request: Any,
        prompt_tokens: int | None,
        prompt_token_ids: list[int] | None,
    ) -> Any:
        stream = None
        if state.output_token_ids:
            stream = KEPT.take(_digest(chat_request, prompt_token_ids, state.output_token_ids, state.output_chunk_lens))
        given = state if stream is None else state.model_copy(update={"output_token_ids": [], "output_chunk_lens": []})
        _CALL.stream, _CALL.noting, _CALL.processor, _CALL.window = stream, True, None, None
        try:
            chunk, updated = replaying(
                self, parser_cls, model, generate_chunk, given, chat_request, prompt_tokens, prompt_token_ids
            )
            processor, window = _CALL.processor, _CALL.window
        finally:
            _CALL.stream, _CALL.noting, _CALL.processor, _CALL.window = None, False, None, None
        if stream is not None:
            updated = updated.model_copy(
                update={
                    "output_token_ids": [*state.output_token_ids, *updated.output_token_ids],
                    "output_chunk_lens": [*state.output_chunk_lens, *updated.output_chunk_lens],
                }
            )
        # A finished choice stepped its parser with the finish: a replay would not have, so it
        # is never continued.
        finished = any(choice.finish_reason is not None for choice in generate_chunk.choices)
        if not finished and processor is not None and window is not None and updated.output_token_ids:
            digest = _digest(chat_request, prompt_token_ids, updated.output_token_ids, updated.output_chunk_lens)
            KEPT.keep(digest, processor, window)
        return chunk, updated

    derender_chat_stream_parsed.mmprep_resumes = True  # type: ignore[attr-defined]
    derender_chat_stream_parsed.__wrapped__ = replaying  # type: ignore[attr-defined]
    derenderer._derender_chat_stream_parsed = derender_chat_stream_parsed
    derenderer._detokenize_delta = detokenize_delta
    module.ChatStreamProcessor = stream_processor
    module._seed_stream_state = seed
    return True
