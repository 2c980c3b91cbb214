"""The runtime's exit codes: a contract with the operator, which reads them from a container's
last termination to say why a pool's pods do not run. Import-light (no dependencies)."""

from __future__ import annotations

import logging
import pathlib
from typing import Final

logger = logging.getLogger(__name__)

#: The processor could not be loaded or started.
EXIT_LOAD_FAILED: Final = 1
#: Bad command-line arguments or settings in the environment.
EXIT_USAGE: Final = 2
#: The CUDA device cannot be used: missing, failing, or a bad device setting.
EXIT_DEVICE_FAILED: Final = 3

#: Kubernetes keeps at most this much of a termination message (the exit reason, the probe's and
#: the calibration's answers): whatever is written there must fit whole.
TERMINATION_MESSAGE_MAX_BYTES: Final = 4096


class ModelLoadError(RuntimeError):
    """The processor cannot be loaded (the message says which model and why): the command exits
    ``EXIT_LOAD_FAILED``. Defined here, below the engine, so the device module can refine it
    (``cuda.CudaUnavailable``) without importing the loader."""


def write_termination_message(path: str | None, message: str) -> bool:
    """Leave ``message`` where Kubernetes reads the container's termination message (``path``, its
    ``terminationMessagePath``; nothing to do when None), cut to what Kubernetes keeps.

    False, with a warning saying why, when the file cannot be written: the answer is then lost to
    the operator, and the command's exit status says so.
    """
    if not path:
        return True
    try:
        pathlib.Path(path).write_bytes(message.encode(errors="replace")[:TERMINATION_MESSAGE_MAX_BYTES])
    except OSError as exc:
        logger.warning("cannot write the termination message to %s: %s", path, exc)
        return False
    return True
