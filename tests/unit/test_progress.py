"""Progress events as values (fstrain/core/progress.py): the plain lines a log gets, the
stages a run's output tells, the bench worker's and trainer's lines."""

from __future__ import annotations

import pytest

from fstrain.core.monitor.metricline import StepMetrics, format_metric_line
from fstrain.core.progress import Event, PlainLines, RunStages, bench_event, plain_line, step_event


def test_an_unknown_stage_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown progress stage"):
        Event("nap")


def test_plain_line() -> None:
    assert plain_line(Event("connect", 3, 4, "node2")) == "[connect] 3/4 node2"
    assert plain_line(Event("preflight", text="packages")) == "[preflight] packages"
    assert plain_line(Event("connect", 3, 4, "1 cannot be reached", ended=True, failed=True)) == \
        "[connect] failed 3/4 1 cannot be reached"
    assert plain_line(Event("rendezvous", ended=True)) == "[rendezvous] done"


def test_plain_lines_are_few_per_stage_whatever_the_host_count() -> None:
    plain = PlainLines()
    lines = [line for done in range(1001) for line in plain.lines(Event("hosts", done, 1000, f"h{done}"))]
    lines += plain.lines(Event("hosts", 1000, 1000, ended=True))
    assert lines == ["[hosts] 0/1000 h0", "[hosts] 250/1000 h250", "[hosts] 500/1000 h500", "[hosts] 750/1000 h750",
                     "[hosts] done 1000/1000"]


def test_an_uncounted_stage_shows_each_new_text_once() -> None:
    plain = PlainLines()
    said = [plain.lines(Event("trace", text=t)) for t in ("importing torch", "at 2 of 8 blocks", "at 2 of 8 blocks")]
    assert said == [["[trace] importing torch"], ["[trace] at 2 of 8 blocks"], []]
    assert plain.lines(Event("trace", ended=True, text="4 s")) == ["[trace] done 4 s"]
    assert plain.lines(Event("trace", text="again")) == ["[trace] again"]  # a stage that ended can begin again


def test_bench_lines() -> None:
    assert bench_event("[fstrain.bench] collectives: world all_reduce 1M (3 of 40)") == \
        Event("measure", 3, 40, "collectives: world all_reduce 1M")
    assert bench_event("[rank0]: [fstrain.bench] compute: matmul and memory copy on every rank, 1 s") == \
        Event("measure", text="compute: matmul and memory copy on every rank, 1 s")
    assert bench_event("[fstrain.bench] wrote /x/bench.json") is None
    assert bench_event("some other line (1 of 2)") is None


def test_step_lines() -> None:
    assert step_event("[fstrain.train] step 1/20 loss 6.2 lr 3e-4 tokens/s 431") == \
        Event("first step", text="step 1/20", ended=True)
    assert step_event(format_metric_line(StepMetrics(step=7))) == Event("first step", text="step 7", ended=True)
    assert step_event("[fstrain.train] rank 0/2 local 0 on vm") is None
    assert step_event("a user's line that says step 3") is None


def test_run_stages_from_the_nodes_lines() -> None:
    events: list[Event] = []
    stages = RunStages(2, events.append)
    stages.begin()
    stages.line(0, False, "torchrun: starting")  # a launcher's line: the node is not up yet
    stages.line(0, True, "[fstrain.train] rank 0/4")
    stages.line(0, True, "[fstrain.train] rank 1/4")
    stages.line(1, True, "[fstrain.train] rank 2/4")
    stages.line(0, True, "[fstrain.train] step 1/5 loss 3.0")
    stages.line(0, True, "[fstrain.train] step 2/5 loss 2.9")
    stages.end()
    assert [plain_line(e) for e in events] == [
        "[start] 0/2 waiting for each node's ranks", "[start] 1/2 node 0 up", "[start] done 2/2 node 1 up",
        "[first step] waiting for a rank's first step", "[first step] done step 1/5"]


def test_run_stages_close_what_the_run_did_not_get_through() -> None:
    events: list[Event] = []
    stages = RunStages(2, events.append)
    stages.begin()
    stages.line(0, True, "[fstrain.train] rank 0/4")
    stages.end()
    assert events[-1] == Event("start", 1, 2, "the run ended first", ended=True, failed=True)
    events.clear()
    quiet = RunStages(1, events.append)  # a program that prints no step
    quiet.begin()
    quiet.line(0, True, "hello")
    quiet.end()
    assert plain_line(events[-1]) == "[first step] done no step reported" and not events[-1].failed


def test_bench_runs_have_no_first_step_and_their_measurements_end_with_the_run() -> None:
    events: list[Event] = []
    stages = RunStages(1, events.append, first_step=False)
    stages.begin()
    stages.line(0, True, "[fstrain.bench] collectives: world all_reduce 1M (1 of 2)")
    stages.line(0, True, "[fstrain.bench] collectives: world all_reduce 2M (2 of 2)")
    stages.end()
    assert [plain_line(e) for e in events] == [
        "[start] 0/1 waiting for each node's ranks", "[start] done 1/1 node 0 up",
        "[measure] 1/2 collectives: world all_reduce 1M", "[measure] 2/2 collectives: world all_reduce 2M",
        "[measure] done"]


def test_silent_stages_ask_nothing() -> None:
    stages = RunStages(1, None)
    stages.begin()
    stages.line(0, True, "[fstrain.train] step 1/5")
    stages.end()
    assert stages.up == set()
