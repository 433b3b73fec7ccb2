"""The recovery keeper's process on this machine (fstrain/api/keeper.py says what it does):
started in a session of its own and handed its work on stdin.

The hand-off is one JSON line, the format stamp (kind ``handoff``, the writer's version), then
the pickled objects. The line is read and checked first: a keeper of another fstrain refuses in
one line before anything is unpickled. Pickle is used only because both ends are the same
installed fstrain, one process to its own child over a pipe; nothing pickled is ever written to
disk.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any, BinaryIO

from fstrain.core.formats import check_format, stamped
from fstrain.errors import InputError

WHERE = "the recovery keeper's stdin"


def spawn_keeper(module: str, hand_off: Any, log: Path, writer: str) -> int:
    """``python -m module`` in a session of its own, its output appended to ``log``, given
    ``hand_off``; its pid."""
    with log.open("ab") as out:
        keeper = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    assert keeper.stdin is not None
    with keeper.stdin:
        keeper.stdin.write(hand_off_bytes(hand_off, writer))
    return keeper.pid


def hand_off_bytes(hand_off: Any, writer: str) -> bytes:
    head = json.dumps(stamped({"kind": "handoff"}, "handoff", writer)).encode()
    return head + b"\n" + pickle.dumps(hand_off)


def read_hand_off(stream: BinaryIO) -> Any:
    """What ``spawn_keeper`` handed over, once its stamp is one this fstrain reads."""
    head = stream.readline()
    try:
        document = json.loads(head)
    except ValueError:
        raise InputError(f"the hand-off does not start with its format line (read {head[:60]!r})",
                         "start the keeper from the same fstrain that runs it", WHERE) from None
    check_format(document, "handoff", WHERE)
    return pickle.loads(stream.read())  # from the fstrain that started this process, on its stdin


def detach_stdin() -> None:
    """stdin from /dev/null from now on (the hand-off's pipe is done)."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
