"""The recovery keeper's process (``python -m fstrain.api.keeper_process``), started by
fstrain/api/keeper.py ``start_keeper``: the hand-off read from stdin, then the attempts
(fstrain/api/launch.py ``keep``). Its stdout and stderr are RUN_DIR/keeper.log.
"""

from __future__ import annotations

import os
import signal
import sys
import threading


def main() -> int:
    """The keeper: read the hand-off, detach stdin, run the attempts; SIGTERM asks for the end."""
    from fstrain.io.keeper import detach_stdin, read_hand_off

    prepared, first, first_job = read_hand_off(sys.stdin.buffer)  # written by the launching fstrain
    detach_stdin()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    print(f"recovery keeper of run {prepared.run_id} (pid {os.getpid()}) follows attempt 1", file=sys.stderr,
          flush=True)
    from fstrain.api.launch import keep

    driven = keep(prepared, first, first_job, stop)
    print(f"run {prepared.run_id} ended: {driven.outcome.reason}, exit code {driven.outcome.exit_code}",
          file=sys.stderr, flush=True)
    return driven.outcome.exit_code


if __name__ == "__main__":
    from fstrain.errors import FstrainError

    try:
        sys.exit(main())
    except FstrainError as exc:
        print(f"recovery keeper: {exc.one_line()}", file=sys.stderr, flush=True)
        sys.exit(1)
