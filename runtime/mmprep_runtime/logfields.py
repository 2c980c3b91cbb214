"""The standard LogRecord attribute names: what a JSON log line leaves out of its extras (one
definition for both programs)."""

from __future__ import annotations

import logging
from typing import Final

#: Every attribute a plain ``LogRecord`` has, and what formatting adds: the rest came as ``extra``.
STANDARD_RECORD_FIELDS: Final[frozenset[str]] = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}
