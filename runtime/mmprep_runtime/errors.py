"""Typed request errors and the one place that maps them to HTTP answers.

Every way a request can fail is a subclass of ``RequestError`` carrying its HTTP status, a stable
machine-readable ``code`` (also the ``outcome`` label of the request counter) and a message naming
the problem. The HTTP layer renders all of them the same way; nothing else picks status codes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import ClassVar

#: Every error class's HTTP status by its code, filled as each class is defined (some are defined
#: in the modules that raise them, e.g. ``fetching``), for ``outcome_class``.
_STATUS_BY_CODE: dict[str, int] = {}


class RequestError(Exception):
    status: ClassVar[int] = 400
    code: ClassVar[str] = "bad_request"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in vars(cls) or cls.code not in _STATUS_BY_CODE:  # a code's own class sets its status
            _STATUS_BY_CODE[cls.code] = cls.status

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}

    def as_json(self) -> dict[str, object]:
        return {"error": {"code": self.code, "message": self.message, "status": self.status}}


class BadRequest(RequestError):
    """Malformed request: invalid JSON, wrong types, missing fields."""


class BeyondFastPath(BadRequest):
    """A request the native fast path does not render exactly as vLLM would (a field, a content
    part or a modality it does not implement). Where the general path runs beside it, the request
    goes there instead; without one, it is this 400."""

    code = "beyond_fast_path"


class NeedsVllm(RequestError):
    """A route the native path has no exact answer for (derender, tokenize, the Anthropic and
    Responses renders), in a server without vLLM installed to answer it. Where vLLM is
    installed, the general path answers it instead."""

    status = 501
    code = "needs_vllm"


class BadMedia(RequestError):
    """An image or audio item is not decodable: bad base64, not an image, truncated."""

    code = "bad_media"


class MediaTooLarge(RequestError):
    """A decoded item exceeds the pixel or duration cap (decompression bombs end here)."""

    status = 413
    code = "media_too_large"


class BodyTooLarge(RequestError):
    status = 413
    code = "body_too_large"


class UnsupportedMediaType(RequestError):
    status = 415
    code = "unsupported_media_type"


class NotAcceptable(RequestError):
    status = 406
    code = "not_acceptable"


class Unprocessable(RequestError):
    """Well-formed but inconsistent with the processor: placeholders vs images, no image support,
    or the processor rejected the input."""

    status = 422
    code = "unprocessable"


class Overloaded(RequestError):
    status = 429
    code = "overloaded"


class NotReady(RequestError):
    status = 503
    code = "not_ready"


class ShuttingDown(NotReady):
    """The drain's window is over: retry on another pod (``server.drain`` says why not serve it)."""

    code = "shutting_down"


class DeadlineExceeded(RequestError):
    status = 504
    code = "deadline_exceeded"


class ProcessorFailed(RequestError):
    """The processor raised something that is not about the input: a bug or a broken model."""

    status = 500
    code = "processor_error"


class InternalError(RequestError):
    """A bug in mmprep itself; the log has the traceback."""

    status = 500
    code = "internal_error"


@contextlib.contextmanager
def processor_call() -> Iterator[None]:
    """Turns what a processor call raises into the request's error; the worker lives on.

    Processors signal bad input with ValueError, TypeError, KeyError or IndexError, and their
    message names the problem (422). Anything else is a bug or a broken model (500). A request
    error raised inside the call (a check between processor steps) keeps its own answer.
    """
    try:
        yield
    except RequestError:
        raise
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise Unprocessable(f"the processor rejected the input: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - fails this request, never the worker
        raise ProcessorFailed(f"the processor failed: {type(exc).__name__}: {exc}") from None


# --------------------------------------------------------------------- outcome classes
#: The request histogram's ``outcome`` label. Served answers are kept apart from refusals, so a
#: flood of fast 429s cannot hide the latency of the requests that were served.
OK, REJECTED, CLIENT_ERROR, SERVER_ERROR = "ok", "rejected", "client_error", "server_error"
OUTCOME_CLASSES = (OK, REJECTED, CLIENT_ERROR, SERVER_ERROR)
#: Not an error class: the client went away before its answer (nginx calls that 499).
CLIENT_GONE = "client_gone"


def outcome_class(code: str) -> str:
    """The class of an answer from its ``code`` (the request counter's label): ``ok``;
    ``rejected`` when the server refused to take the request on (429 overloaded, 503 not ready);
    ``client_error`` for the rest of 4xx and a client that left; ``server_error`` for 5xx."""
    if code == OK:
        return OK
    if code == CLIENT_GONE:
        return CLIENT_ERROR
    status = _STATUS_BY_CODE.get(code, 500)
    if status in (Overloaded.status, NotReady.status):
        return REJECTED
    return CLIENT_ERROR if status < 500 else SERVER_ERROR
