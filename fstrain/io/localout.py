"""Local output that may fail without failing the job: stdout read by ``| head`` (EPIPE),
stdout or the run directory on a full disk (ENOSPC, EFBIG).

Losing fstrain's local copy of the output must never stop a healthy job: the first failure of
each destination is said once on stderr, later writes to it are dropped, and the job, the other
destinations and the final summary carry on. The exit code stays the job's.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import TextIO


def warn(message: str) -> None:
    """One line on stderr; silent if stderr itself is gone."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"warning: {message}\n")
        sys.stderr.flush()


def describe(exc: OSError) -> str:
    return exc.strerror or str(exc)


class GuardedStream:
    """A text stream (stdout) whose first write failure is reported once; then it is dropped.

    When the stream is the process's stdout or stderr, its file descriptor is pointed at
    /dev/null after the failure, so the interpreter's own flush at exit does not fail again
    (and turn the job's exit code into 120)."""

    def __init__(self, stream: TextIO, name: str, report: Callable[[str], None] = warn) -> None:
        self.stream = stream
        self.name = name
        self.report = report
        self.lost: str | None = None

    def write(self, text: str) -> int:
        if self.lost is None:
            try:
                return self.stream.write(text)
            except (OSError, ValueError) as exc:
                self._fail(exc)
        return len(text)

    def flush(self) -> None:
        if self.lost is None:
            try:
                self.stream.flush()
            except (OSError, ValueError) as exc:
                self._fail(exc)

    def isatty(self) -> bool:
        with contextlib.suppress(OSError, ValueError):
            return self.stream.isatty()
        return False

    def _fail(self, exc: BaseException) -> None:
        self.lost = describe(exc) if isinstance(exc, OSError) else str(exc)
        silence(self.stream)
        self.report(f"cannot write to {self.name} ({self.lost}); the job keeps running, its output "
                    "is still written to the run directory's logs")


def silence(stream: TextIO) -> None:
    """Point ``stream``'s descriptor at /dev/null and drop what it still buffers."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    with contextlib.suppress(OSError, ValueError):
        stream.flush()  # what was pending now goes to /dev/null


@contextlib.contextmanager
def stdout_may_fail(name: str = "stdout") -> Iterator[None]:
    """Around a final write to stdout (the JSON document, the summary): a failure is said once."""
    try:
        yield
    except OSError as exc:
        silence(sys.stdout)
        warn(f"cannot write to {name} ({describe(exc)})")
