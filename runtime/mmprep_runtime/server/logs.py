"""How the server logs: text or JSON lines, and the opt-in access log.

JSON (one object per line, ``extra`` fields included) is for log pipelines; text for people. The
access log is off by default: formatting a line per request on the event loop costs throughput
at hundreds of requests per second, and /metrics counts requests by outcome anyway. Turned on, it
writes one record per answered request with its method, path, status, time and request id.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Final

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from mmprep_runtime.logfields import STANDARD_RECORD_FIELDS

FORMATS: Final = ("text", "json")
ACCESS_LOGGER: Final = "mmprep_runtime.access"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the exception, and every extra."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update({k: v for k, v in vars(record).items() if k not in STANDARD_RECORD_FIELDS})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(level: str, log_format: str) -> None:
    """The root logger's level and format (``text`` or ``json``)."""
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {log_format!r}")
    handler = logging.StreamHandler()
    if log_format == "json":
        formatter: logging.Formatter = JsonFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))


class AccessLog(AbstractAccessLogger):
    """aiohttp's access logger, as records with fields (``extra``) rather than a formatted string."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:  # noqa: A002 - aiohttp names it
        self.logger.info(
            "%s %s %d %.1f ms",
            request.method,
            request.path,
            response.status,
            time * 1000,
            extra={
                "method": request.method,
                "path": request.path,
                "status": response.status,
                "ms": round(time * 1000, 3),
                "request_id": response.headers.get("X-Request-Id"),
            },
        )
