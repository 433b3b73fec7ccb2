"""Stdlib-only scripts that fstrain sends to remote hosts (fstrain need not be installed there).

Each is a plain module in this folder, so it is linted and type-checked like the rest, and is
sent as source text over the SSH channel's stdin.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fstrain.core.job.spec import SCRIPT_FLAGS


@cache
def source(name: str) -> str:
    """The source text of ``fstrain/io/remote/<name>.py``."""
    return (Path(__file__).resolve().parent / f"{name}.py").read_text()


# Runs a script sent as one JSON-encoded line on stdin, leaving the rest of stdin to the script
# (``python - ...`` would read stdin to its end before running anything).
LINE_BOOTSTRAP = (
    "import sys,json;exec(compile(json.loads(sys.stdin.readline()),'fstrain-remote','exec'),{'__name__':'__main__'})"
)


def line_script(python: str, *args: str) -> list[str]:
    """The command that runs the script LINE_BOOTSTRAP reads from stdin (:func:`as_line`) with
    ``args``: ``[python, -S, -u, -c, LINE_BOOTSTRAP, *args]``."""
    return [python, *SCRIPT_FLAGS, "-c", LINE_BOOTSTRAP, *args]


def as_line(name: str) -> bytes:
    """The script ``name`` as the one line LINE_BOOTSTRAP reads."""
    import json

    return (json.dumps(source(name)) + "\n").encode()
