"""The transport protocol: run one argv on one host and collect its result."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from fstrain.errors import TransportError


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



class RunningCommand(Protocol):
    """A command started with ``Transport.start``: stdin stays open, output arrives as lines."""

    host: str

    def write(self, data: bytes) -> bool:
        """Send to the command's stdin; False when the link or the process is gone."""
        ...

    def close_stdin(self) -> None: ...

    def lines(self) -> Iterator[tuple[str, str]]:
        """``(stream, line)`` pairs, stream being "stdout" or "stderr", whole lines without the
        newline, until both streams end. Blocks; call from one thread."""
        ...

    def wait(self) -> tuple[int | None, str | None]:
        """``(exit code, None)``, or ``(None, why)`` when no exit status came back."""
        ...

    def close(self) -> None: ...


def start_command(transport: object, argv: Sequence[str]) -> RunningCommand:
    """``argv`` started on ``transport`` with its stdin kept open (its ``start``); a
    TransportError where the transport cannot stream (a fake one)."""
    start = getattr(transport, "start", None)
    if start is None:
        raise TransportError("this transport cannot stream", "", str(getattr(transport, "host", "")))
    running: RunningCommand = start(argv)
    return running


MAX_PENDING_LINES = 1000  # per command, read but not yet consumed


def merged_lines(readers: dict[str, Callable[[], bytes]]) -> Iterator[tuple[str, str]]:
    """Read several line streams at once (one thread each) and yield ``(stream, line)``."""
    import queue
    import threading

    # Bounded: when the consumer is slow, the readers stop reading and the writer blocks
    # (back-pressure) instead of the lines piling up in memory.
    events: queue.Queue[tuple[str, str | None]] = queue.Queue(maxsize=MAX_PENDING_LINES)

    def pump(name: str, readline: Callable[[], bytes]) -> None:
        try:
            while True:
                raw = readline()
                if not raw:
                    break
                events.put((name, raw.decode("utf-8", "replace").rstrip("\r\n")))
        except (OSError, EOFError, ValueError):
            pass
        finally:
            events.put((name, None))

    for name, readline in readers.items():
        threading.Thread(target=pump, args=(name, readline), daemon=True, name=f"fstrain-{name}").start()
    open_streams = len(readers)
    while open_streams:
        name, line = events.get()
        if line is None:
            open_streams -= 1
            continue
        yield name, line
