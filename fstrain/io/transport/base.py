"""The transport protocol: run one argv on one host and collect its result."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class CommandResult:
    """What one command did on one host. ``exit_code`` is None when it never finished."""

    exit_code: int | None
    stdout: str
    stderr: str
    seconds: float
    error: str | None = None  # set when the command could not run or finish (timeout, lost link)

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_code == 0


class Transport(Protocol):
    """Runs commands on one host. One transport holds one connection, reused by every command."""

    host: str

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
    ) -> CommandResult:
        """Run ``argv`` to completion, feeding ``stdin``; never raises for a failed command."""
        ...

    def close(self) -> None: ...


def quote_argv(argv: Sequence[str]) -> str:
    """Quote an argv list for a POSIX shell, once: every argument reaches the program literally."""
    if not argv:
        raise ValueError("empty command")
    return shlex.join(argv)

