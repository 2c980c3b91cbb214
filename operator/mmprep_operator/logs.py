"""Structured log lines: JSON (kopf's formatter, which keeps ``extra`` fields) or key=value text."""

from __future__ import annotations

import logging
from typing import Final

import kopf

from mmprep_runtime.logfields import STANDARD_RECORD_FIELDS


class KeyValueFormatter(logging.Formatter):
    """``time level logger message key=value ...``: greppable, one line per record."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = {
            k: v
            for k, v in vars(record).items()
            if k not in STANDARD_RECORD_FIELDS and not k.startswith("k8s_") and k != "settings"
        }
        if extras:
            line += " " + " ".join(f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}" for k, v in extras.items())
        return line


# Per-event and per-probe success lines: one for every node heartbeat and liveness check.
_CHATTY: Final = ("kopf.objects", "kopf.activities.probe", "aiohttp.access")


def configure(log_format: str, *, verbose: bool = False) -> None:
    if log_format == "json":
        kopf.configure(verbose=verbose, log_format=kopf.LogFormat.JSON)
    else:
        kopf.configure(verbose=verbose, log_format=kopf.LogFormat.FULL)
        for handler in logging.getLogger().handlers:
            handler.setFormatter(KeyValueFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    for name in _CHATTY:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.WARNING)
