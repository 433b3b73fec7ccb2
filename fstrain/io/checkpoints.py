"""What a run's checkpoint folder holds, read on a host over its transport: the recovery loop
asks it at each attempt's start and end, to say whether a restart made progress."""

from __future__ import annotations

import json

from fstrain.core.job.spec import SCRIPT_FLAGS
from fstrain.core.launch.recovery import Checkpoints, checkpoint_step
from fstrain.io.transport.base import Transport

# Each entry's name and modification time (a missing folder: none); stdlib only, any Python 3.
_LIST = ("import json, os, sys\n"
         "d = sys.argv[1]\n"
         "names = os.listdir(d) if os.path.isdir(d) else []\n"
         "print(json.dumps([[n, os.stat(os.path.join(d, n)).st_mtime] for n in names]))\n")


def read_checkpoints(transport: Transport, python: str, directory: str, timeout_s: float = 30) -> Checkpoints:
    """The newest step (the bundled trainer's ``step_N`` folders) and the newest modification
    time in ``directory``; nothing known (an empty value) where the host cannot tell."""
    result = transport.run([python, *SCRIPT_FLAGS, "-c", _LIST, directory], timeout_s=timeout_s)
    if not result.ok:
        return Checkpoints()
    try:
        entries = [(str(name), float(mtime)) for name, mtime in json.loads(result.stdout)]
    except (ValueError, TypeError):
        return Checkpoints()
    names = [name for name, _ in entries if not name.startswith(".") and not name.endswith(".tmp")]
    mtimes = [mtime for name, mtime in entries if name in names]
    return Checkpoints(checkpoint_step(names), max(mtimes) if mtimes else None)
