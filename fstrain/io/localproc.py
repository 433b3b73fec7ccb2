"""Processes on this machine that fstrain started (a run's launcher, a recovery keeper): found by
pid, and signalled only while their command line still says they are ours (a pid is reused)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def process_alive(pid: int) -> bool:
    """Alive and not a zombie (an exited process its parent has not reaped yet)."""
    if pid <= 0:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] != "Z"


def command_line(pid: int) -> bytes:
    """The process's argv, NUL-separated; empty when it is gone (or not ours to read)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def terminate_if_ours(pid: int, marker: bytes, times: int = 1) -> bool:
    """SIGTERM (``times`` times, half a second apart: a second one is a launcher's "force") to
    ``pid`` if it is alive and its command line holds ``marker``; whether it was sent."""
    if marker not in command_line(pid) or not process_alive(pid):
        return False
    for attempt in range(times):
        if attempt:
            time.sleep(0.5)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return attempt > 0
    return True


def wait_gone(pid: int, timeout_s: float, poll_s: float = 0.2) -> bool:
    """Whether ``pid`` ended within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(poll_s)
    return not process_alive(pid)
