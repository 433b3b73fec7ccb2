"""How progress shows (fstrain/core/progress.py's events): on stderr, always.

- stderr a terminal: a live display (rich's Progress), a row per stage under way, with a bar
  where the stage is counted; it is drawn only while some stage is under way, so the lines a
  run prints afterwards are not interleaved with it;
- otherwise: a few plain lines per stage (PlainLines), for logs.

Nothing here writes to stdout: ``--json`` keeps its one document there.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

from fstrain.cli.output import console
from fstrain.core.progress import Event, PlainLines

if TYPE_CHECKING:
    from rich.console import Console


class PlainReporter:
    """Plain lines on stderr."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self.plain = PlainLines()
        self.lock = threading.Lock()

    def __call__(self, line: str) -> None:
        with self.lock:
            out = self.stream or sys.stderr
            out.write(line + "\n")
            out.flush()

    def event(self, event: Event) -> None:
        with self.lock:
            lines = self.plain.lines(event)
        for line in lines:
            self(line)

    def routed(self, stream: TextIO) -> TextIO:
        return stream


class TerminalReporter:
    """rich's Progress on the stderr console while a stage is under way."""

    def __init__(self, out: Console) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = out
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=30),
                                 TextColumn("{task.fields[count]}"), TimeElapsedColumn(),
                                 TextColumn("{task.fields[text]}", markup=False), console=out, transient=True,
                                 redirect_stdout=False, redirect_stderr=False)
        self.tasks: dict[str, Any] = {}
        self.lock = threading.RLock()
        self.shown = False

    def __call__(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False)

    def event(self, event: Event) -> None:
        with self.lock:
            task = self.tasks.get(event.stage)
            count = f"{event.done}/{event.total}" if event.done is not None and event.total else ""
            if task is None and not event.ended:
                task = self.tasks[event.stage] = self.progress.add_task(event.title, total=event.total, count=count,
                                                                        text=event.text)
                if not self.shown:
                    self.progress.start()
                    self.shown = True
            elif task is not None and not event.ended:
                self.progress.update(task, total=event.total, completed=event.done or 0, count=count,
                                     text=event.text)
            if event.ended:
                if task is not None:
                    self.progress.remove_task(task)
                    del self.tasks[event.stage]
                if event.failed:
                    self(f"{event.title}: {event.text}".rstrip(": "))
                if not self.tasks:
                    self.stop()

    def stop(self) -> None:
        with self.lock:
            if self.shown:
                self.progress.stop()
                self.shown = False
            for task in list(self.tasks.values()):
                self.progress.remove_task(task)
            self.tasks.clear()

    def routed(self, stream: TextIO) -> TextIO:
        """``stream`` (the ranks' lines) as it must be written while the display is drawn: a
        line to a terminal goes above the display then, not through it."""
        return _Routed(stream, self)  # type: ignore[return-value]


class _Routed:
    """A stream that, while the display is drawn and the stream is a terminal, prints through
    the display's console (rich's FileProxy: above the live rows, colours kept)."""

    def __init__(self, stream: TextIO, reporter: TerminalReporter) -> None:
        from rich.file_proxy import FileProxy

        self.stream = stream
        self.reporter = reporter
        self.proxy = FileProxy(reporter.console, stream)
        self.terminal = _isatty(stream)

    def write(self, text: str) -> int:
        if self.terminal and self.reporter.shown:
            with self.reporter.lock:
                if self.reporter.shown:
                    self.proxy.write(text)
                    return len(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.proxy.flush()
        self.stream.flush()

    def isatty(self) -> bool:
        return self.terminal


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False


Reporter = PlainReporter | TerminalReporter


@contextmanager
def progress_reporter() -> Iterator[Reporter]:
    """The reporter for this process's stderr: live on a terminal, plain lines otherwise; the
    live display is gone once the block ends (on an error too)."""
    out = console()
    if not out.is_terminal:
        yield PlainReporter()
        return
    reporter = TerminalReporter(out)
    try:
        yield reporter
    finally:
        reporter.stop()
