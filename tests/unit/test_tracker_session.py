"""The tracker session (fstrain/io/trackers.py) with a tracker whose server goes away mid-run and
comes back: said once as it fails and once as it answers again (with what was lost), the run's
lines never held up, the end sent once it answers; the run's events read from its events file
as the writer appends them."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from fstrain.core.monitor.metricline import StepMetrics, format_metric_line
from fstrain.core.track.calls import Point
from fstrain.io.runevents import EventLog
from fstrain.io.trackers import TrackerSession


class FlakyTracker:
    """A tracker that refuses every batch holding a step in ``down_steps`` (its server gone)."""

    name = "Flaky"

    def __init__(self, down_steps: set[int]) -> None:
        self.down_steps = down_steps
        self.sent: list[tuple[str, int, float]] = []
        self.opened: list[Mapping[str, str]] = []
        self.closed: list[str] = []
        self.refused = 0  # points refused
        self.event_calls: list[tuple[list[str], dict[str, str]]] = []

    def open(self, params: Mapping[str, str], tags: Mapping[str, str]) -> str:
        self.opened.append(dict(params))
        return f"Flaky: run {len(self.opened)} opened"

    def points(self, points: Sequence[Point]) -> None:
        if any(p.step in self.down_steps for p in points):
            self.refused += len(points)
            raise ConnectionError("[Errno 111] Connection refused\nand more lines of the response")
        self.sent += [(p.key, p.step, p.value) for p in points]

    def events(self, lines: Sequence[str], tags: Mapping[str, str]) -> None:
        self.event_calls.append(([json.loads(line)["kind"] for line in lines], dict(tags)))

    def close(self, status: str, tags: Mapping[str, str]) -> None:
        self.closed.append(status)


def _until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the session did not get there in time"
        time.sleep(0.01)


def _line(step: int) -> str:
    return f"[node1 r1] {format_metric_line(StepMetrics(step=step, loss=float(step)))}"


def test_a_tracker_that_fails_mid_run_is_said_once_and_the_run_goes_on() -> None:
    tracker = FlakyTracker(down_steps={2, 3})
    said: list[str] = []
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            said.append(line)

    told: list[str] = []
    session = TrackerSession([tracker], "r7", say, told.append)
    session.start({"backend": "torchrun"}, {"fstrain.run_id": "r7"})
    session.line(_line(1))
    _until(lambda: tracker.sent == [("rank1/loss", 1, 1.0)])
    session.line(_line(2))
    _until(lambda: len(said) == 1)
    session.line(_line(3))
    session.line("[node1 r1] an ordinary line")
    _until(lambda: tracker.refused == 2)
    assert said == ["Flaky: cannot log run r7 ([Errno 111] Connection refused); the run goes on, and what follows "
                    "is sent once Flaky answers again"]
    session.line(_line(4))
    _until(lambda: ("rank1/loss", 4, 4.0) in tracker.sent)
    session.finish("FINISHED", {"fstrain.exit_code": "0"})
    assert said[1:] == ["Flaky answers again; 2 step numbers of run r7 were not logged"]
    assert tracker.opened == [{"backend": "torchrun"}] and tracker.closed == ["FINISHED"]
    assert told == ["Flaky: run 1 opened"]  # where the run is, said once and not as a warning
    assert tracker.sent == [("rank1/loss", 1, 1.0), ("rank1/loss", 4, 4.0)]


def test_a_tracker_that_never_opened_is_opened_once_it_answers() -> None:
    class LateTracker(FlakyTracker):
        def __init__(self) -> None:
            super().__init__(set())
            self.refusals = 1

        def open(self, params: Mapping[str, str], tags: Mapping[str, str]) -> str:
            if self.refusals:
                self.refusals -= 1
                raise TimeoutError("read timed out")
            return super().open(params, tags)

    tracker = LateTracker()
    said: list[str] = []
    session = TrackerSession([tracker], "r8", said.append, lambda line: None)
    session.start({"backend": "deepspeed"}, {})
    session.line(_line(1))
    session.finish("FAILED", {})
    assert said == ["Flaky: cannot log run r8 (timed out); the run goes on, and what follows is sent once "
                    "Flaky answers again", "Flaky answers again"]
    assert tracker.opened == [{"backend": "deepspeed"}] and tracker.sent == [("rank1/loss", 1, 1.0)]
    assert tracker.closed == ["FAILED"]


def test_the_runs_events_are_read_from_its_file_as_they_are_written_and_at_the_end(tmp_path: Path) -> None:
    log = EventLog.in_folder(tmp_path, "r9")
    tracker = FlakyTracker(set())
    session = TrackerSession([tracker], "r9", tell=lambda line: None, events_path=log.path)
    log.write("started", 1, "attempt 1 on node1", hosts=("node1",))  # before the run's parameters
    session.start({"backend": "torchrun"}, {})
    _until(lambda: tracker.event_calls == [(["started"], {"fstrain.attempts": "1", "fstrain.failures": "0",
                                                           "fstrain.last_event": "attempt 1 on node1"})])
    log.write("failure", 1, "rank 0 on node1 exited with 3", host="node1", rank=0, exit_code=3)
    log.write("finished", 1, "failed", state="failed", exit_code=3)  # read at the end, if not before
    session.finish("FAILED", {})
    assert tracker.event_calls[-1] == (["started", "failure", "finished"], {
        "fstrain.attempts": "1", "fstrain.failures": "1", "fstrain.last_event": "failed",
        "fstrain.state": "failed", "fstrain.exit_code": "3"})
    assert tracker.closed == ["FAILED"]
