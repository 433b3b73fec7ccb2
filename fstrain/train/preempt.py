"""SIGTERM while training: save a checkpoint first when it is worth it and there is time.

A launcher stops a job with SIGTERM and, a grace period later, SIGKILL: fstrain's node watchdog
after ``launch --grace`` (15 s by default, passed to the ranks as ``FSTRAIN_GRACE_S``), torchrun
30 s after it forwards the SIGTERM, DeepSpeed's launcher 30 s after, Slurm after its
``KillWait``. The trainer keeps the signal (:class:`StopSignal`) and finishes the step it is in;
at the step's end every rank learns whether any rank got it (one all-reduce), and when one did,
all decide the same (:func:`should_save`): save when the newest checkpoint is older than this
step and the save is expected to end before the grace period does, then die of SIGTERM as
before. A save that the SIGKILL cuts short leaves only its ``step_N.tmp`` folder: the newest
whole checkpoint stays the one ``latest`` names.

When a peer died (the SIGTERM is the launcher's teardown after a failure), the step's
collectives fail instead, and the rank dies of SIGTERM at once, as it would without this.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from types import FrameType
from typing import Any, NoReturn

SAVE_MARGIN_S = 2.0  # kept free between the end of a save and the SIGKILL: exit, the launcher's own
DEFAULT_SAVE_ESTIMATE_S = 0.0  # no save measured yet: try (an interrupted save is harmless)


class StopSignal:
    """Installed for the training loop: a SIGTERM is remembered, not acted on at once."""

    def __init__(self) -> None:
        self.received_s: float | None = None  # time.monotonic() of the first SIGTERM
        self._previous: Any = None

    def __enter__(self) -> StopSignal:
        self._previous = signal.signal(signal.SIGTERM, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.received_s is None:
            self.received_s = time.monotonic()

    def since_s(self) -> float:
        """Seconds since the SIGTERM (0 when none came)."""
        return 0.0 if self.received_s is None else time.monotonic() - self.received_s


def should_save(step: int, last_saved_step: int | None, since_signal_s: float, grace_s: float,
                save_estimate_s: float) -> bool:
    """Save on SIGTERM: the newest checkpoint is older than ``step`` and a save taking
    ``save_estimate_s`` (the last one's time, 0 when none was timed) ends ``SAVE_MARGIN_S``
    before the grace period that began ``since_signal_s`` ago."""
    if last_saved_step is not None and last_saved_step >= step:
        return False
    return since_signal_s + save_estimate_s + SAVE_MARGIN_S <= grace_s


def die_of_sigterm() -> NoReturn:
    """End the process as SIGTERM's default action would (the launcher reports -15 / 143)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # the signal is delivered at once; this is never reached in practice
    os._exit(143)
