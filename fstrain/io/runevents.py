"""RUN_DIR/events.jsonl on this machine: the one writer and the one reader of a run's events
(the record: fstrain/core/runs/runevents.py; docs/observability.md#events).

The writer appends one line per event and flushes it before returning: a reader (`fstrain
status --watch --json`, an experiment tracker) sees each event as soon as it is written, and
the file is never rewritten. A writer that died mid-line leaves a partial last line: the next
write starts on a line of its own, and the reader skips the broken line. Losing the file (a
full disk) never stops the run: the first failure is said once on stderr.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fstrain import __version__
from fstrain.core.runs.runevents import EVENTS_FILE, RunEvent, parse_lines

if TYPE_CHECKING:
    from fstrain.core.hosts.hostfile import Host
    from fstrain.io.transport.base import Transport

MAX_EVENTS_BYTES = 16 * 2**20  # a run writes a few lines per attempt: more is not an events file


@dataclass
class EventLog:
    """The writer of one run's events file. Picklable (a path and a run id: it opens the file
    for each line), so the recovery keeper's hand-off may carry it."""

    path: Path
    run_id: str
    failed: bool = field(default=False, compare=False)  # a write failed once: said, then dropped

    @classmethod
    def in_folder(cls, run_dir: Path, run_id: str) -> EventLog:
        return cls(run_dir / EVENTS_FILE, run_id)

    def write(self, kind: str, attempt: int = 1, text: str = "", at: float | None = None,
              **values: Any) -> RunEvent:
        """Append the event (now, unless ``at``) as one flushed line; the event written."""
        event = RunEvent(kind, time.time() if at is None else at, self.run_id, attempt, text, **values)
        self.append(event)
        return event

    def append(self, event: RunEvent) -> None:
        import json
        import os

        from fstrain.io.localout import describe, warn

        line = json.dumps(event.to_dict(__version__)) + "\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a+b") as handle:
                if handle.tell() > 0:  # a writer that died mid-line: this line starts on its own
                    handle.seek(-1, os.SEEK_END)
                    if handle.read(1) != b"\n":
                        line = "\n" + line
                handle.write(line.encode())
                handle.flush()
        except OSError as exc:
            if not self.failed:
                warn(f"cannot write {self.path} ({describe(exc)}); the run goes on without its events file")
            self.failed = True


@dataclass(frozen=True)
class EventsRead:
    """What an events file holds: its events in order, and the lines skipped (cut short)."""

    events: tuple[RunEvent, ...]
    skipped: int = 0


def read_events(path: Path) -> EventsRead | None:
    """The run's events; None where the file does not exist (a run started by an fstrain
    without it, or one whose writer has not written yet). A newer format: an InputError."""
    from fstrain.io.userfiles import read_text_bounded

    if not path.is_file():
        return None
    text = read_text_bounded(path, "run events file", limit_bytes=MAX_EVENTS_BYTES)
    events, skipped = parse_lines(text.splitlines(), str(path))
    return EventsRead(tuple(events), skipped)


def fetch_events(connect: Callable[[Host], Transport], host: Host, path: str,
                 timeout_s: float = 60) -> EventsRead | None:
    """The events file at ``path`` on ``host`` (a detached run's node 0, where its coordinator
    writes it); None where there is none or the host cannot be read. A newer format: an InputError."""
    from fstrain.errors import FstrainError

    try:
        transport = connect(host)
    except FstrainError:
        return None
    try:
        result = transport.run(["cat", "--", path], timeout_s=timeout_s)
    finally:
        transport.close()
    if not result.ok:
        return None
    events, skipped = parse_lines(result.stdout.splitlines(), f"{host.label()}:{path}")
    return EventsRead(tuple(events), skipped)
