"""Progress of long work (launch, bench, doctor, plan --trace), as typed events.

The work says where it is with :class:`Event` values given to a :class:`Reporter`: a stage
(``connect``, ``preflight``, ...) begins, advances (``done`` of ``total``: hosts answered, nodes
started, measurements taken), and ends. A reporter is also called with a plain line, for what
is said once (the plan a launch trains with, the run's id). The CLI decides how events
show: a live display on a terminal, plain lines otherwise (:class:`PlainLines` turns events into
those, a few per stage, never one per host of a thousand), always on stderr.

Pure: the reporter that writes lives in fstrain/cli/progress_output.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from fstrain.core.monitor.metricline import read_step

# The stages, in the order a launch meets them; bench, doctor and plan --trace use their own.
STAGES = {
    "connect": "connecting",  # one connection per host
    "preflight": "preflight",  # interpreter, packages, working directory on every host
    "rendezvous": "rendezvous",  # the master address every node reaches, and its port
    "start": "starting nodes",  # each node up: its watchdog answered (detached), a rank printed (attached)
    "first step": "first step",  # the first training step reported by any rank
    "measure": "measuring",  # bench: the suites' measurements
    "hosts": "hosts answered",  # doctor: every host probed
    "trace": "tracing",  # plan --trace: the memory trace of each plan
}
PLAIN_EVERY = 0.25  # plain lines: a counted stage says where it is each quarter of the way


@dataclass(frozen=True)
class Event:
    """Where a stage is: ``done`` of ``total`` (None: not counted), ``text`` what it does now,
    ``ended`` once it is over (``failed``: it ended badly)."""

    stage: str
    done: int | None = None
    total: int | None = None
    text: str = ""
    ended: bool = False
    failed: bool = False

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"unknown progress stage {self.stage!r}")

    @property
    def title(self) -> str:
        return STAGES[self.stage]


class Reporter(Protocol):
    """What long work reports to: ``reporter(line)`` for a line said once, ``reporter.event(e)``
    for where a stage is."""

    def __call__(self, line: str) -> None: ...

    def event(self, event: Event) -> None: ...


class Silent:
    """A reporter that shows nothing (the API's callers that want no output)."""

    def __call__(self, line: str) -> None:
        return None

    def event(self, event: Event) -> None:
        return None


def plain_line(event: Event) -> str:
    """An event as one line: ``[connect] 3/4 node2``, ``[first step] done step 1/20``."""
    count = f"{event.done}/{event.total}" if event.done is not None and event.total else \
        f"{event.done}" if event.done is not None else ""
    words = " ".join(w for w in (("failed" if event.failed else "done") if event.ended else "", count, event.text)
                     if w)
    return f"[{event.stage}] {words}".rstrip()


class PlainLines:
    """Turns a stream of events into the few lines worth printing in a log: a stage's first
    event, each PLAIN_EVERY of the way on a counted stage (each new text on an uncounted
    one), and its end."""

    def __init__(self) -> None:
        self.shown: dict[str, float | str] = {}  # stage -> the fraction (counted) or the text last shown

    def lines(self, event: Event) -> list[str]:
        last = self.shown.get(event.stage)
        if event.ended:
            self.shown.pop(event.stage, None)
            return [plain_line(event)]
        fraction = event.done / event.total if event.done is not None and event.total else None
        mark: float | str = fraction if fraction is not None else event.text
        if last is None:
            self.shown[event.stage] = mark
            return [plain_line(event)]
        if isinstance(mark, str):
            worth = mark != last
        else:  # the end has its own line
            worth = mark < 1 and (isinstance(last, str) or mark - last >= PLAIN_EVERY)
        if worth:
            self.shown[event.stage] = mark
            return [plain_line(event)]
        return []


# The bench worker's rank-0 lines: "[fstrain.bench] collectives: intra allreduce 1M (3 of 40)",
# "[fstrain.bench] pairs: round 2: sample 1 of 5 of 6 links".
_OF_RE = re.compile(r"\((\d+) of (\d+)\)\s*$")
_BENCH_TAG = "[fstrain.bench] "


def bench_event(text: str) -> Event | None:
    """A bench worker's progress line as an event of the ``measure`` stage (counted where the
    line counts); None for any other line."""
    at = text.find(_BENCH_TAG)
    if at < 0:
        return None
    what = text[at + len(_BENCH_TAG):].strip()
    if what.startswith(("wrote ", "error")):
        return None
    counted = _OF_RE.search(what)
    if counted is None:
        return Event("measure", text=what)
    return Event("measure", int(counted.group(1)), int(counted.group(2)), what[:counted.start()].strip())


def step_event(text: str) -> Event | None:
    """A rank's line that reports a training step (the metric line, or the trainer's progress
    line) as the end of the ``first step`` stage; None for any other line."""
    reading = read_step(text)
    if reading is None:
        return None
    step, steps = reading.metrics.step, reading.metrics.steps
    return Event("first step", text=f"step {step}" + (f"/{steps}" if steps else ""), ended=True)


class RunStages:
    """The stages of a started run, from what its nodes print: each node up (the first line
    of one of its ranks), the first training step (a metric or progress line), and the bench
    worker's measurements; every stage still open is closed at the run's end."""

    def __init__(self, nodes: int, report: Callable[[Event], None] | None, first_step: bool = True,
                 on_first_step: Callable[[int], None] | None = None) -> None:
        self.report = report
        self.first_step = first_step  # a training job: its first step is a stage
        self.on_first_step = on_first_step  # told the step of the first step line (the run's events)
        self.total = nodes
        self.up: set[int] = set()
        self.open: set[str] = set()
        self.stepped = False

    def _say(self, event: Event) -> None:
        if self.report is None:
            return
        if event.ended:
            self.open.discard(event.stage)
        else:
            self.open.add(event.stage)
        self.report(event)

    def begin(self) -> None:
        self._say(Event("start", 0, self.total, "waiting for each node's ranks"))

    def line(self, node_rank: int, ranked: bool, text: str) -> None:
        if self.on_first_step is not None and self.first_step and not self.stepped:
            reading = read_step(text)
            if reading is not None:
                self.on_first_step(reading.metrics.step)
                self.on_first_step = None
        if self.report is None:
            return
        if ranked and node_rank not in self.up:
            self.up.add(node_rank)
            every = len(self.up) == self.total
            self._say(Event("start", len(self.up), self.total, f"node {node_rank} up", ended=every))
            if every and self.first_step and not self.stepped:
                self._say(Event("first step", text="waiting for a rank's first step"))
        if self.first_step and not self.stepped:
            stepped = step_event(text)
            if stepped is not None:
                self.stepped = True
                self._say(stepped)
        measured = bench_event(text)
        if measured is not None:
            self._say(measured)

    def end(self) -> None:
        """The run has ended: nodes that never came up failed to start; a program that prints
        no step (not every program does) and the measurements are simply over."""
        for stage in sorted(self.open):
            if stage == "start":
                self._say(Event(stage, len(self.up), self.total, "the run ended first", ended=True, failed=True))
            else:
                self._say(Event(stage, ended=True, text="no step reported" if stage == "first step" else ""))
