"""The live view of a run (`fstrain status RUN --watch`), as values.

Each refresh brings the run's status document (its state, and per node and rank what the
nodes know: alive, last output, latest numbers, GPUs) and, where the status does not carry every
rank's numbers (:func:`numbers_in_status`), the last lines of the ranks' output, tagged
``[host rN]`` as `fstrain logs` prints them. From those, per rank: the newest numbers its lines
carry (the metric line, ``FSTRAIN_METRICS {...}``, where the rank prints it; else a progress
line, the bundled trainer's ``step 5/20 loss ... tokens/s ...`` or a program's own line that
says ``step N``: metricline.newer_step); the step time, from the metric line or else measured
between refreshes; the stragglers (fstrain/core/monitor/stragglers.py, the rule `fstrain report`
uses too) and the slowest rank; and the run's progress to its final step with an estimate
of the time left. Pure: the caller passes the time.

`status --watch --json` prints each refresh that changed something as one line, the view as a
document (:func:`view_document`, format kind ``watch``) with the run's events written since the
line before; the clock alone (the time, an age, the ETA) is no change (:func:`changed`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fstrain.core.formats import stamped
from fstrain.core.monitor.metricline import StepMetrics, StepReading, from_mapping, newer_step
from fstrain.core.monitor.stragglers import stragglers
from fstrain.core.runs.runstate import FINAL

# A tagged output line: "[node1 r3] text" (a detached run's logs, an attached or Slurm run's log files).
_TAGGED_RE = re.compile(r"^\[(\S+) r(\d+)\] ?(.*)$")
TAIL_LINES_PER_RANK = 40  # what a refresh reads of each rank's output, at most
TAIL_LINES_MAX = 4000  # and of the whole run's
RATE_WINDOW_S = 120.0  # the progress rate (and so the ETA) is measured over about this long
BEHIND_STEPS = 2  # a rank this many steps behind the furthest is the slowest (one is a read's timing)


@dataclass(frozen=True)
class WatchRow:
    """One rank's row of the live view."""

    host: str
    node_rank: int | None
    rank: int
    alive: bool | None = None  # None: not known (the run's nodes were not asked)
    step: int | None = None
    steps: int | None = None
    loss: float | None = None
    tokens_per_s: float | None = None
    step_s: float | None = None
    memory_bytes: int | None = None
    last_output_age_s: float | None = None
    gpus: Sequence[dict[str, Any]] = ()  # the node's GPUs (memory and utilisation), as status gives them
    gpus_error: str | None = None
    straggler: bool = False  # its step time is a straggler's (fstrain/core/monitor/stragglers.py)
    slowest: bool = False  # the one rank holding the others back (:func:`slowest_rank`)


@dataclass(frozen=True)
class WatchView:
    """What one refresh shows."""

    run_id: str
    state: str
    exit_code: int | None
    reason: str
    first_failure: Mapping[str, Any] | None
    rows: list[WatchRow]
    unreachable: list[str] = field(default_factory=list)  # hosts that did not answer
    step: int | None = None  # the run's step: the lowest that any reporting rank has reached
    steps: int | None = None  # the final step, where the ranks' lines say it
    eta_s: float | None = None  # the time left to the final step, at the measured rate
    slowest_rank: int | None = None
    stragglers: tuple[int, ...] = ()

    @property
    def ended(self) -> bool:
        return self.state in FINAL

    @property
    def fraction(self) -> float | None:
        """The progress to the final step, 0..1; None while it is not known."""
        if self.step is None or not self.steps:
            return None
        return min(1.0, self.step / self.steps)


def latest_samples(lines: Iterable[str]) -> dict[int, StepMetrics]:
    """Per global rank, the newest numbers among its lines (in the order written): its last
    metric line once it prints any (they carry more: step time, memory), else its last
    progress line. Lines without a rank tag (the launchers' own) are left out."""
    held: dict[int, StepReading] = {}
    for line in lines:
        match = _TAGGED_RE.match(line.rstrip("\r\n"))
        if match is None:
            continue
        rank = int(match.group(2))
        reading = newer_step(held.get(rank), match.group(3))
        if reading is not None:
            held[rank] = reading
    return {rank: reading.metrics for rank, reading in held.items()}


def numbers_in_status(status: Mapping[str, Any]) -> bool:
    """Whether ``status`` (`fstrain status --json`'s document) already carries every rank's
    newest numbers, so that a refresh need not read the ranks' output: a detached run whose
    every node answered with its view. Each node reads every line its ranks write by the rule
    the output would be read by here (metricline.newer_step) and keeps each rank's numbers
    (``progress``), so node 0 answers for all of them in one SSH session. Any other run (its
    output on this machine), or a node without a view, is read."""
    nodes = status.get("nodes") or []
    return bool(status.get("detached")) and bool(nodes) and all(node.get("reachable") for node in nodes)


def status_samples(status: Mapping[str, Any]) -> list[StepMetrics]:
    """Each rank's newest numbers as ``status`` holds them (its ``progress``)."""
    found = (from_mapping(rank.get("progress")) for node in status.get("nodes") or []
             for rank in node.get("ranks") or [])
    return [sample for sample in found if sample is not None]


def tail_lines(status: Mapping[str, Any], ranks_seen: int = 0) -> int:
    """How many of the run's last output lines a refresh reads: enough for every rank's last
    numbers (the ranks the status lists, or as many as the output showed), bounded."""
    ranks = max(ranks_seen, sum(len(node.get("ranks") or []) or 1 for node in status.get("nodes") or []))
    return max(TAIL_LINES_PER_RANK, min(TAIL_LINES_MAX, TAIL_LINES_PER_RANK * max(1, ranks)))


class Watch:
    """The live view across refreshes: it remembers when each rank reached each step it was
    seen at, to measure step times the lines do not carry and the run's rate for the ETA."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self.seen: dict[int, list[tuple[float, int]]] = {}  # rank -> (time first seen at the step, step)
        self.run_seen: list[tuple[float, int]] = []  # the run's step the same way
        self.ranks_seen: set[int] = set()  # every rank whose numbers were read

    def tail_lines(self, status: Mapping[str, Any]) -> int:
        """What the next refresh reads of the run's output (:func:`tail_lines`)."""
        return tail_lines(status, len(self.ranks_seen))

    def update(self, status: Mapping[str, Any], lines: Iterable[str], now: float) -> WatchView:
        """The view from one refresh: ``status`` (`fstrain status --json`'s document), the
        ranks' last output ``lines``, and the time ``now`` (Unix seconds)."""
        lines = list(lines)
        samples = latest_samples(lines)
        self.ranks_seen.update(samples)
        rows = []
        unreachable = []
        placed: set[int] = set()
        for node in status.get("nodes") or []:
            host = str(node.get("host"))
            if node.get("reachable") is False:
                unreachable.append(host)
            for rank in node.get("ranks") or []:
                placed.add(int(rank["rank"]))
                rows.append(self._row(host, node, rank, samples.get(int(rank["rank"])), now))
        hosts = {int(m.group(2)): m.group(1) for m in map(_TAGGED_RE.match, lines) if m is not None}
        for rank_number, sample in sorted(samples.items()):  # ranks the status does not list (attached runs)
            if rank_number not in placed:
                rows.append(self._row(hosts[rank_number], None, {"rank": rank_number}, sample, now))
        rows.sort(key=lambda r: r.rank)
        # Every rank of a run that succeeded reached its end: none held the others back.
        succeeded = status.get("state") == "succeeded"
        slowest = slowest_rank(rows) if not succeeded else None
        slow = set(row_stragglers(rows)) if not succeeded else set()
        rows = [_marked(r, r.rank in slow, r.rank == slowest) for r in rows]
        steps = max((r.steps for r in rows if r.steps), default=None)
        reached = [r.step for r in rows if r.step is not None]
        step = min(reached) if reached else None
        eta = None
        if step is not None:
            self.run_seen = _note(self.run_seen, now, step, self.window_s)
            eta = eta_s(self.run_seen, step, steps, [r.step_s for r in rows if r.step_s])
        return WatchView(str(status.get("run_id") or ""), str(status.get("state") or ""), status.get("exit_code"),
                         str(status.get("reason") or ""), status.get("first_failure"), rows, unreachable, step, steps,
                         eta, slowest, tuple(sorted(slow)))

    def _row(self, host: str, node: Mapping[str, Any] | None, rank: Mapping[str, Any], sample: StepMetrics | None,
             now: float) -> WatchRow:
        number = int(rank["rank"])
        if sample is None and rank.get("progress"):  # the nodes' own record of its last progress line
            sample = from_mapping(rank["progress"])  # step, steps, loss, tokens_per_s: a metric line's names
        step_s = None
        if sample is not None:
            self.seen[number] = _note(self.seen.get(number, []), now, sample.step, self.window_s)
            step_s = sample.step_s if sample.step_s is not None else measured_step_s(self.seen[number])
        last = rank.get("last_output_at")
        node = node or {}
        return WatchRow(
            host=host, node_rank=node.get("node_rank"), rank=number, alive=rank.get("alive"),
            step=sample.step if sample else None, steps=sample.steps if sample else None,
            loss=sample.loss if sample else None, tokens_per_s=sample.tokens_per_s if sample else None,
            step_s=step_s, memory_bytes=sample.memory_bytes if sample else None,
            last_output_age_s=max(0.0, now - float(last)) if last else None,
            gpus=node.get("gpus") or (), gpus_error=node.get("gpus_error"))


def _marked(row: WatchRow, straggler: bool, slowest: bool) -> WatchRow:
    return row if (row.straggler, row.slowest) == (straggler, slowest) else \
        replace(row, straggler=straggler, slowest=slowest)


def _note(seen: list[tuple[float, int]], now: float, step: int, window_s: float) -> list[tuple[float, int]]:
    """The observations with (now, step) added when the step is new (a step that went back, a
    restart from a checkpoint, starts them over), the oldest beyond the window dropped (one
    older than the window is kept, so the window is always spanned)."""
    if seen and step < seen[-1][1]:
        seen = []
    if not seen or step > seen[-1][1]:
        seen = [*seen, (now, step)]
    while len(seen) > 2 and now - seen[1][0] > window_s:
        seen = seen[1:]
    return seen


def measured_step_s(seen: Sequence[tuple[float, int]]) -> float | None:
    """Seconds per step between the first and the last time a new step was seen; None until
    two steps were seen."""
    if len(seen) < 2:
        return None
    (t0, s0), (t1, s1) = seen[0], seen[-1]
    return (t1 - t0) / (s1 - s0) if s1 > s0 and t1 > t0 else None


def eta_s(seen: Sequence[tuple[float, int]], step: int, steps: int | None,
          step_times_s: Sequence[float] = ()) -> float | None:
    """Seconds left to the final step: the steps left at the run's measured rate, or, before
    the rate is measured, at the slowest rank's step time (every rank waits for it). None
    without a final step or any rate; 0 once the final step is reached."""
    if not steps:
        return None
    left = max(0, steps - step)
    if left == 0:
        return 0.0
    per_step = measured_step_s(seen)
    if per_step is None and step_times_s:
        per_step = max(step_times_s)
    return left * per_step if per_step is not None else None


@dataclass(frozen=True)
class RunProgress:
    """A run's progress at one look (`fstrain runs`)."""

    step: int | None = None  # the lowest step any reporting rank reached (the live view's rule)
    steps: int | None = None  # the final step, where the ranks' lines say it
    eta_s: float | None = None  # the time left to it


def progress_now(lines: Iterable[str], now: float, since: tuple[float, int] | None) -> RunProgress:
    """The run's progress from its ranks' last output ``lines`` at ``now``, the time left at
    the rate since ``since`` ((Unix seconds, step): the attempt's first step, from its events
    file, else its start at step 0); at the slowest rank's step time where no rate is measured
    (:func:`eta_s`)."""
    return progress_from(list(latest_samples(lines).values()), now, since)


def progress_from(samples: Sequence[StepMetrics], now: float, since: tuple[float, int] | None) -> RunProgress:
    """:func:`progress_now` from each rank's newest numbers, however they were read."""
    if not samples:
        return RunProgress()
    step = min(m.step for m in samples)
    steps = max((m.steps for m in samples if m.steps), default=None)
    seen = [since, (now, step)] if since is not None else []
    return RunProgress(step, steps, eta_s(seen, step, steps, [m.step_s for m in samples if m.step_s]))


def row_stragglers(rows: Sequence[WatchRow]) -> list[int]:
    """The ranks whose latest step time makes them stragglers, by the rule `fstrain report`
    uses (fstrain/core/monitor/stragglers.py: over 10 % above the other ranks' median)."""
    return stragglers({r.rank: r.step_s for r in rows if r.step is not None and r.step_s is not None})


def slowest_rank(rows: Sequence[WatchRow]) -> int | None:
    """The rank holding the others back: one at least BEHIND_STEPS steps behind the furthest
    (the furthest behind), else the straggler with the longest step time (:func:`row_stragglers`).
    None while fewer than two ranks report numbers, or none stands out."""
    reporting = [(r.step, r.rank) for r in rows if r.step is not None]
    if len(reporting) < 2:
        return None
    behind_step, behind_rank = min(reporting)
    if max(step for step, _ in reporting) - behind_step >= BEHIND_STEPS:
        return behind_rank
    seconds = {r.rank: r.step_s for r in rows if r.step_s is not None}
    return max(row_stragglers(rows), key=lambda rank: (seconds[rank], -rank), default=None)


# What moves with the clock, not with the run: left out when two documents are compared.
CLOCK_FIELDS = ("time", "eta_s")
CLOCK_ROW_FIELDS = ("last_output_age_s",)
_ROW_FIELDS = ("host", "node_rank", "rank", "alive", "step", "steps", "loss", "tokens_per_s", "step_s",
               "memory_bytes", "last_output_age_s", "straggler", "slowest")


def view_document(view: WatchView, now: float, events: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """One line of `status --watch --json`: the view at ``now`` (Unix seconds), a row per rank
    (its GPUs are `status --json`'s), and ``events``, the run's events written since the last line."""
    return stamped({
        "time": now, "run_id": view.run_id, "state": view.state, "exit_code": view.exit_code,
        "reason": view.reason, "ended": view.ended, "step": view.step, "steps": view.steps,
        "fraction": view.fraction, "eta_s": None if view.eta_s is None else round(view.eta_s, 1),
        "first_failure": dict(view.first_failure) if view.first_failure else None,
        "unreachable": list(view.unreachable), "slowest_rank": view.slowest_rank,
        "stragglers": list(view.stragglers),
        "ranks": [{name: getattr(row, name) for name in _ROW_FIELDS} for row in view.rows],
        "events": [dict(event) for event in events],
    }, "watch")


def changed(previous: Mapping[str, Any] | None, document: Mapping[str, Any]) -> bool:
    """Whether ``document`` says something ``previous`` did not (the first always does)."""
    if previous is None or document.get("events"):
        return True
    return _steady(previous) != _steady(document)


def _steady(document: Mapping[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in document.items() if k not in CLOCK_FIELDS and k != "events"}
    kept["ranks"] = [{k: v for k, v in row.items() if k not in CLOCK_ROW_FIELDS} for row in kept.get("ranks") or []]
    return kept
