"""Typed request errors and the one place that maps them to HTTP answers.

Every way a request can fail is a subclass of ``RequestError`` carrying its HTTP status, a stable
machine-readable ``code`` (also the ``outcome`` label of the request counter) and a message naming
the problem. The HTTP layer renders all of them the same way; nothing else picks status codes.
"""

from __future__ import annotations

from typing import ClassVar


class RequestError(Exception):
    status: ClassVar[int] = 400
    code: ClassVar[str] = "bad_request"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}

    def as_json(self) -> dict[str, object]:
        return {"error": {"code": self.code, "message": self.message, "status": self.status}}


class BadRequest(RequestError):
    """Malformed request: invalid JSON, wrong types, missing fields."""


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
