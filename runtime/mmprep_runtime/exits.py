"""The runtime's exit codes: a contract with the operator, which reads them from a container's
last termination to say why a pool's pods do not run. Import-light (no dependencies)."""

from __future__ import annotations

from typing import Final

#: The processor could not be loaded or started.
EXIT_LOAD_FAILED: Final = 1
#: Bad command-line arguments or settings in the environment.
EXIT_USAGE: Final = 2
#: The CUDA device cannot be used: missing, failing, or a bad device setting.
EXIT_DEVICE_FAILED: Final = 3

#: Kubernetes keeps at most this much of a termination message (the exit reason, the probe's and
#: the calibration's answers): whatever is written there must fit whole.
TERMINATION_MESSAGE_MAX_BYTES: Final = 4096
