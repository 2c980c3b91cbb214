"""Token ids to text the way vLLM 0.33's engine and derender do it, with the model's own
tokenizer and no vLLM: incremental decoding in vLLM's carried window, and one token's text for
logprobs.

Byte-equality with vLLM rests on doing the same string operations in the same order, so each
rule below is the engine's, stated as a rule rather than copied:
- **the window** (``Window``): the token strings from ``prefix_offset`` on. Each new token's text
  is the string of the window with it, less the string of the window up to ``read_offset``; a
  text that ends in U+FFFD (an unfinished UTF-8 character from byte fallback) or did not grow is
  held back, and the offsets move only when text is written. The window is then cut at
  ``prefix_offset`` so it stays a few tokens long: this is what vLLM's ``stream_state`` carries
  (``prev_tokens``, ``prefix_offset``, ``read_offset``), so a stream may move between vLLM's
  server and this one.
- **the seed**: the last seven prompt tokens, read from five before the end, so the first output
  token is spaced as it is after the prompt (SentencePiece tokenizers drop a leading space
  otherwise).
- **one token's text** (logprobs): the tokenizer's decode of that id alone, with the leading
  spaces a Metaspace tokenizer's decode strips put back; an unfinished character is completed
  from up to four preceding sampled tokens.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any, Final

#: How far before the prompt's end the seed window starts (vLLM's initial incremental offset).
SEED_OFFSET: Final = 5
#: Sampled tokens kept as context to finish a logprob token's unfinished character.
LOGPROB_CONTEXT: Final = 4
REPLACEMENT: Final = "\ufffd"


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """What decoding reads of a tokenizer on every token, read once (vLLM caches the same)."""

    size: int
    added: frozenset[str]
    special: frozenset[str]
    fast: bool
    space_marker: str | None


_VOCABULARY_ATTRIBUTE: Final = "_mmprep_vocabulary"


def vocabulary(tokenizer: Any) -> Vocabulary:
    """``tokenizer``'s ``Vocabulary``, cached on it (each worker's clone has its own)."""
    cached = getattr(tokenizer, _VOCABULARY_ATTRIBUTE, None)
    if cached is None:
        cached = Vocabulary(
            size=len(tokenizer),
            added=frozenset(tokenizer.get_added_vocab()),
            special=frozenset(tokenizer.all_special_tokens),
            fast=bool(getattr(tokenizer, "is_fast", False)),
            space_marker=_space_marker(tokenizer),
        )
        setattr(tokenizer, _VOCABULARY_ATTRIBUTE, cached)
    return cached


def _space_marker(tokenizer: Any) -> str | None:
    """The Metaspace replacement character of a SentencePiece-style pre-tokenizer, whose leading
    instances ``decode`` strips from a lone token; None for byte-level and other tokenizers."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        pre = json.loads(backend.to_str()).get("pre_tokenizer") or {}
    except Exception:  # noqa: BLE001 - a tokenizer that cannot describe itself has no marker
        return None
    for step in [pre] if pre.get("type") != "Sequence" else pre.get("pretokenizers") or []:
        if step.get("type") == "Metaspace":
            return str(step.get("replacement", "\u2581"))
    return None


@dataclasses.dataclass
class Window:
    """vLLM's incremental decoding state: the token strings still read, and two offsets in them."""

    tokens: list[str]
    prefix_offset: int
    read_offset: int


def seed(tokenizer: Any, prompt_ids: Sequence[int] | None, skip_special_tokens: bool) -> Window:
    """The window after the prompt (empty without one)."""
    if not prompt_ids:
        return Window([], 0, 0)
    tokens = _token_strings(tokenizer, list(prompt_ids[-SEED_OFFSET - 2 :]), skip_special_tokens)
    return Window(tokens, max(len(tokens) - SEED_OFFSET, 0), len(tokens))


def _token_strings(tokenizer: Any, ids: list[int], skip_special_tokens: bool) -> list[str]:
    strings = tokenizer.convert_ids_to_tokens(ids, skip_special_tokens=skip_special_tokens)
    if isinstance(strings, str):
        strings = [strings]
    return [s if s is not None else "" for s in strings]  # an id out of the vocabulary reads as ""


def advance(tokenizer: Any, window: Window, ids: Sequence[int], skip_special_tokens: bool, spaces_between: bool) -> str:
    """The text ``ids`` add after ``window`` (updated in place), one token at a time."""
    vocab = vocabulary(tokenizer)
    plain = vocab.fast or not vocab.added
    parts = []
    for token_id in ids:
        new = _token_strings(tokenizer, [token_id], skip_special_tokens) if 0 <= token_id < vocab.size else [""]
        prefix, read = window.prefix_offset, window.read_offset
        start = min(prefix, read, len(window.tokens))
        tokens = window.tokens[start:] + new
        if plain:
            before = tokenizer.convert_tokens_to_string(tokens[prefix - start : read - start])
            after = tokenizer.convert_tokens_to_string(tokens[prefix - start :])
        else:
            before = _joined(tokenizer, vocab, tokens[prefix - start : read - start], skip_special_tokens, spaces_between)
            after = _joined(tokenizer, vocab, tokens[prefix - start :], skip_special_tokens, spaces_between)
        count = len(window.tokens) + len(new)
        if len(after) > len(before) and not after.endswith(REPLACEMENT):
            parts.append(after[len(before) :])
            prefix, read = read, count
        # Everything before the prefix offset is never read again: cut it, rebase the offsets.
        window.tokens = (window.tokens + new)[prefix:]
        window.read_offset = read - prefix
        window.prefix_offset = 0
    return "".join(parts)


def _joined(tokenizer: Any, vocab: Vocabulary, tokens: list[str], skip_special_tokens: bool, spaces_between: bool) -> str:
    """A slow tokenizer's string of ``tokens`` with its added tokens kept whole (transformers'
    own rule for slow tokenizers, which vLLM follows)."""
    texts: list[str] = []
    run: list[str] = []
    for token in tokens:
        if skip_special_tokens and token in vocab.special:
            continue
        if token in vocab.added:
            if run:
                texts.append(tokenizer.convert_tokens_to_string(run))
                run = []
            texts.append(token)
        else:
            run.append(token)
    if run:
        texts.append(tokenizer.convert_tokens_to_string(run))
    return (" " if spaces_between else "").join(texts)


def token_texts(tokenizer: Any, ids: Sequence[int]) -> list[tuple[str, list[int] | None]]:
    """Each id's own text and its UTF-8 bytes, as logprobs show them (``("", None)`` for an id
    with no vocabulary entry)."""
    pieces = tokenizer.convert_ids_to_tokens(list(ids))
    marker = vocabulary(tokenizer).space_marker
    out: list[tuple[str, list[int] | None]] = []
    for token_id, piece in zip(ids, pieces, strict=True):
        if piece is None:
            out.append(("", None))
            continue
        text = tokenizer.decode([token_id]) or ""
        if marker is not None:
            text = _leading_spaces_restored(piece, text, marker)
        out.append((text, list(text.encode("utf-8", errors="replace"))))
    return out


def _leading_spaces_restored(piece: str, text: str, marker: str) -> str:
    markers = len(piece) - len(piece.lstrip(marker))
    missing = markers - (len(text) - len(text.lstrip(" ")))
    return " " * missing + text if missing > 0 else text


def completed(token_id: int, context: Sequence[int], tokenizer: Any) -> str:
    """The text of ``token_id`` whose own decode ends in an unfinished character, finished with
    up to ``LOGPROB_CONTEXT`` preceding sampled ids: the text the shortest context that decodes
    cleanly adds after the context's own clean part; "" when none does."""
    for size in range(1, min(len(context), LOGPROB_CONTEXT) + 1):
        before = list(context[-size:])
        whole = tokenizer.decode([*before, token_id])
        if whole.endswith(REPLACEMENT):
            continue
        clean = len(before)
        while clean > 0 and tokenizer.decode([before[clean - 1]]).endswith(REPLACEMENT):
            clean -= 1
        prefix = tokenizer.decode(before[:clean]) if clean else ""
        if whole.startswith(prefix):
            return str(whole[len(prefix) :])
        common = 0
        for a, b in zip(prefix, whole, strict=False):
            if a != b:
                break
            common += 1
        return str(whole[common:])
    return ""
