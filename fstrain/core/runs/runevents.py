"""A run's events as they happen, for machines: one typed record, :class:`RunEvent`, one JSON
object per line of ``RUN_DIR/events.jsonl`` (docs/observability.md#events).

The process that makes a run's decisions writes them, live, appending one line per event
(fstrain/io/runevents.py ``EventLog``): an attached launch (and the batch job's launch of a
Slurm run, in ``RUN_DIR/job-<job id>``), the recovery keeper of a detached run with a recovery
policy (fstrain/api/keeper.py), and for a detached run without one node 0's coordinator, in
node 0's run directory (fstrain/io/remote/coordinator.py, which writes these lines itself: it
runs where fstrain need not be installed). Each line carries the format version of kind
``events`` (fstrain/core/formats.py), the event's ``kind``, when (``time``, Unix seconds on the
writer's clock), the run, the attempt (1 for the first) and a line in words (``text``); then
the fields of its kind only (:data:`FIELDS`):

- ``started``: the run's first attempt starts its nodes; ``hosts``.
- ``first_step``: a rank of the attempt reported its first training step; ``step``.
- ``failure``: the attempt's first failure; ``host``, ``rank`` (global; None when not known),
  ``exit_code``, ``signal`` (the signal's name where a signal killed the rank).
- ``blame``: who the attempt's failure was put on and why; ``verdict`` (fstrain/core/launch/
  blame.py: ``hardware``, ``application``, ``unknown``), ``suspects`` (hosts), ``evidence``
  (the verdict's reason), ``tested`` (per tested host: what its test found).
- ``excluded``: a host left out of the next attempt; ``host``, ``evidence``.
- ``attempt``: a later attempt starts (a restart, or a new world after an exclusion); ``hosts``.
- ``resumed``: the attempt starts from a checkpoint; ``step`` (the checkpoint's).
- ``finished``: the run has ended; ``state`` (succeeded, failed, stalled, ...), ``exit_code``.

Pure (values in, values out): the writer and the reader are fstrain/io/runevents.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fstrain.core.formats import check_format, stamped
from fstrain.core.runs import fields
from fstrain.errors import InputError

EVENTS_FILE = "events.jsonl"

STARTED = "started"
FIRST_STEP = "first_step"
FAILURE = "failure"
BLAME = "blame"
EXCLUDED = "excluded"
ATTEMPT = "attempt"
RESUMED = "resumed"
FINISHED = "finished"

# Each kind -> the fields its line carries besides format, kind, time, run_id, attempt and text.
FIELDS: dict[str, tuple[str, ...]] = {
    STARTED: ("hosts",),
    FIRST_STEP: ("step",),
    FAILURE: ("host", "rank", "exit_code", "signal"),
    BLAME: ("verdict", "suspects", "evidence", "tested"),
    EXCLUDED: ("host", "evidence"),
    ATTEMPT: ("hosts",),
    RESUMED: ("step",),
    FINISHED: ("state", "exit_code"),
}
KINDS = tuple(FIELDS)


@dataclass(frozen=True)
class RunEvent:
    """One event of a run. Fields outside its kind's (:data:`FIELDS`) stay at their defaults
    and are not written."""

    kind: str
    time: float  # Unix seconds, the writer's clock
    run_id: str
    attempt: int = 1  # 1 for the first attempt
    text: str = ""  # the event in words, one line
    hosts: tuple[str, ...] = ()  # started, attempt: the attempt's hosts, in node rank order
    host: str | None = None  # failure: where; excluded: which
    rank: int | None = None  # failure: the global rank that failed first (None: not known)
    exit_code: int | None = None  # failure: the rank's (or its node's) code; finished: the run's
    signal: str | None = None  # failure: the signal that killed the rank (SIGKILL, ...)
    step: int | None = None  # first_step: the step reported; resumed: the checkpoint's step
    state: str | None = None  # finished: the run's final state
    verdict: str | None = None  # blame: the verdict's kind (hardware, application, unknown)
    suspects: tuple[str, ...] = ()  # blame: the hosts it points at
    evidence: str = ""  # blame: the verdict's reason; excluded: why the host is left out
    tested: Mapping[str, str] = field(default_factory=dict)  # blame: per tested host, what its test found

    def __post_init__(self) -> None:
        if self.kind not in FIELDS:
            raise InputError(f"unknown run event kind {self.kind!r}", f"use one of {', '.join(KINDS)}", "RunEvent")

    def to_dict(self, writer: str = "") -> dict[str, Any]:
        """The event's line as a document: its format version first, then its kind's fields."""
        document: dict[str, Any] = {"kind": self.kind, "time": self.time, "run_id": self.run_id,
                                    "attempt": self.attempt}
        for name in FIELDS[self.kind]:
            value = getattr(self, name)
            document[name] = list(value) if isinstance(value, tuple) else dict(value) \
                if isinstance(value, Mapping) else value
        document["text"] = self.text
        return stamped(document, "events", writer)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> RunEvent:
        """The event a line holds; an InputError naming ``where`` for a newer format or a field
        of the wrong kind."""
        if not isinstance(data, Mapping):
            raise InputError(f"a run event must be a JSON object, got {type(data).__name__}", fields.HINT, where)
        check_format(data, "events", where)
        kind = fields.text(data, "kind", where)
        if kind not in FIELDS:
            raise InputError(f"unknown run event kind {kind!r}", f"this fstrain reads {', '.join(KINDS)}", where)
        when = fields.number(data, "time", where)
        if when is None:
            raise InputError("time is missing", fields.HINT, where)
        tested = fields.strings(data, "tested", where)
        return cls(kind, when, fields.text(data, "run_id", where),
                   attempt=fields.optional_integer(data, "attempt", where) or 1,
                   text=str(data.get("text") or ""),
                   hosts=_names(data, "hosts", where), host=fields.optional_text(data, "host"),
                   rank=fields.optional_integer(data, "rank", where),
                   exit_code=fields.optional_integer(data, "exit_code", where),
                   signal=fields.optional_text(data, "signal"), step=fields.optional_integer(data, "step", where),
                   state=fields.optional_text(data, "state"), verdict=fields.optional_text(data, "verdict"),
                   suspects=_names(data, "suspects", where), evidence=str(data.get("evidence") or ""),
                   tested=tested)


def _names(data: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    return tuple(str(name) for name in fields.items(data, key, where))


def parse_lines(lines: Sequence[str], where: str) -> tuple[list[RunEvent], int]:
    """The events of an events file's lines, and how many lines were skipped: a line that is no
    complete JSON object (the last line of a writer that died mid-write) is skipped, not an
    error; a line of a newer format, or a wrong field, is an InputError naming its line."""
    import json

    events: list[RunEvent] = []
    skipped = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        events.append(RunEvent.from_dict(data, f"{where}:{number}"))
    return events, skipped


def attempt_hosts(events: Sequence[RunEvent]) -> tuple[str, ...]:
    """The hosts of the run's latest attempt, in node rank order: those of its last ``started``
    or ``attempt`` event; () before any."""
    for event in reversed(events):
        if event.kind in (STARTED, ATTEMPT):
            return event.hosts
    return ()
