"""The live view's values (fstrain/core/monitor/watch.py): rows from the status document and the
ranks' output, the step time, the slowest rank, the ETA."""

from __future__ import annotations

from typing import Any

import pytest

from fstrain.core.monitor.metricline import StepMetrics, format_metric_line
from fstrain.core.monitor.watch import (
    TAIL_LINES_MAX,
    TAIL_LINES_PER_RANK,
    Watch,
    WatchRow,
    changed,
    eta_s,
    latest_samples,
    measured_step_s,
    numbers_in_status,
    progress_from,
    progress_now,
    slowest_rank,
    status_samples,
    tail_lines,
    view_document,
)


def metric(host: str, rank: int, step: int, **values: Any) -> str:
    return f"[{host} r{rank}] " + format_metric_line(StepMetrics(step=step, **values)) + "\n"


def status(*nodes: tuple[str, list[int]], state: str = "running", **extra: Any) -> dict[str, Any]:
    return {"run_id": "r1", "state": state, "exit_code": None, "reason": "", "first_failure": None,
            "nodes": [{"host": host, "node_rank": index, "reachable": True,
                       "ranks": [{"rank": r, "alive": True, "last_output_at": 100.0, "progress": None} for r in ranks],
                       "gpus": [], "gpus_error": None}
                      for index, (host, ranks) in enumerate(nodes)], **extra}


def test_metric_lines_win_over_progress_lines_per_rank() -> None:
    lines = [
        "[node1 r0] [fstrain.train] step 3/20 loss 4.5000 lr 1.000e-04 tokens/s 1,200 cpu=1MiB\n",
        metric("node1", 0, 2, steps=20, loss=4.6, step_s=0.5, memory_bytes=3 << 30),
        "[node1 r0] [fstrain.train] step 4/20 loss 4.4000 lr 1.000e-04 tokens/s 1,300\n",
        "[node2 r1] [fstrain.train] step 4/20 loss 4.4000 lr 1.000e-04 tokens/s 1,300\n",
        "[node2] torchrun: a launcher line without a rank\n",
        "[node2 r1] some other line\n",
    ]
    samples = latest_samples(lines)
    assert samples[0].step == 2 and samples[0].step_s == 0.5  # the metric line
    assert samples[0].memory_bytes == 3 << 30
    assert samples[1].step == 4 and samples[1].steps == 20 and samples[1].step_s is None  # the progress line
    assert samples[1].loss == 4.4 and samples[1].tokens_per_s == 1300
    assert set(samples) == {0, 1}


def test_the_latest_metric_line_of_a_rank_counts() -> None:
    samples = latest_samples([metric("h", 3, 5, loss=2.0), metric("h", 3, 6, loss=1.5), "[h r3] not a number\n"])
    assert samples[3].step == 6 and samples[3].loss == 1.5


def test_rows_merge_status_and_output_and_measure_the_step_time_between_refreshes() -> None:
    watch = Watch()
    doc = status(("node1", [0, 1]), ("node2", [2, 3]))
    progress = "[node1 r0] [fstrain.train] step {}/10 loss 3.0 lr 1e-4 tokens/s 100\n"
    first = watch.update(doc, [progress.format(2)], now=110.0)
    assert [(r.host, r.rank, r.node_rank) for r in first.rows] == [
        ("node1", 0, 0), ("node1", 1, 0), ("node2", 2, 1), ("node2", 3, 1)]
    assert first.rows[0].step == 2 and first.rows[0].step_s is None and first.rows[0].last_output_age_s == 10.0
    assert first.rows[1].step is None and first.step == 2 and first.steps == 10 and first.fraction == 0.2
    assert first.eta_s is None  # one observation: no rate yet
    second = watch.update(doc, [progress.format(6)], now=118.0)
    assert second.rows[0].step_s == pytest.approx(2.0)  # 4 steps in 8 s
    assert second.eta_s == pytest.approx(8.0)  # 4 steps left at 2 s each
    assert not second.ended and second.slowest_rank is None


def test_the_nodes_progress_record_is_the_fallback_when_the_tail_has_no_numbers() -> None:
    doc = status(("node1", [0]))
    doc["nodes"][0]["ranks"][0]["progress"] = {"step": 7, "steps": 9, "loss": 1.0, "tokens_per_s": 5.0}
    view = Watch().update(doc, [], now=100.0)
    assert view.rows[0].step == 7 and view.step == 7 and view.steps == 9


def test_ranks_only_in_the_output_get_rows_and_the_run_step_is_the_lowest() -> None:
    doc = {"run_id": "a", "state": "running", "nodes": [{"host": "h", "node_rank": 0, "ranks": []}]}
    view = Watch().update(doc, [metric("h", 0, 9, steps=10), metric("h", 1, 8, steps=10)], now=1.0)
    assert [(r.host, r.rank, r.step) for r in view.rows] == [("h", 0, 9), ("h", 1, 8)] and view.step == 8


def test_ended_view_and_unreachable_hosts() -> None:
    doc = status(("node1", [0]), state="failed", exit_code=3, reason="rank 0 failed")
    doc["nodes"][0]["reachable"] = False
    view = Watch().update(doc, [], now=1.0)
    assert view.ended and view.exit_code == 3 and view.unreachable == ["node1"] and view.fraction is None


def rows(*values: tuple[int | None, float | None]) -> list[WatchRow]:
    return [WatchRow("h", 0, rank, step=step, step_s=seconds) for rank, (step, seconds) in enumerate(values)]


def test_slowest_rank_is_the_one_behind_then_the_one_with_the_longest_step() -> None:
    assert slowest_rank(rows((10, 1.0), (8, 1.0), (10, 1.0))) == 1  # two steps behind
    assert slowest_rank(rows((10, 1.0), (9, 1.0), (10, 1.0))) is None  # one step is a read's timing
    assert slowest_rank(rows((10, 1.0), (10, 1.5), (10, 1.0), (10, 1.01))) == 1
    assert slowest_rank(rows((10, 1.0), (10, 1.02), (10, 1.0))) is None  # within 10 %
    assert slowest_rank(rows((10, None), (10, None))) is None
    assert slowest_rank(rows((10, 1.0), (None, None))) is None  # one rank reports


def test_the_view_marks_the_slowest_row() -> None:
    lines = [metric("h", 0, 5, step_s=1.0), metric("h", 1, 5, step_s=2.0)]
    view = Watch().update(status(("h", [0, 1])), lines, now=200.0)
    assert view.slowest_rank == 1 and [r.slowest for r in view.rows] == [False, True]


def test_a_run_that_succeeded_has_no_slowest_rank() -> None:
    """Step times measured between refreshes differ at the end too; nobody held anyone back."""
    lines = [metric("h", 0, 16, step_s=1.0), metric("h", 1, 16, step_s=2.0)]
    view = Watch().update(status(("h", [0, 1]), state="succeeded", exit_code=0), lines, now=200.0)
    assert view.slowest_rank is None and not any(r.slowest for r in view.rows)
    stalled = Watch().update(status(("h", [0, 1]), state="stalled", exit_code=124), lines, now=200.0)
    assert stalled.slowest_rank == 1  # a run that did not end well still names it


def test_eta() -> None:
    assert eta_s([(0.0, 0), (10.0, 5)], 5, 15) == pytest.approx(20.0)
    assert eta_s([(0.0, 5)], 5, 15, [0.5, 2.0]) == pytest.approx(20.0)  # the slowest rank's step time
    assert eta_s([(0.0, 5)], 5, 15) is None
    assert eta_s([(0.0, 5)], 5, None, [1.0]) is None
    assert eta_s([(0.0, 15)], 15, 15) == 0.0
    assert measured_step_s([(0.0, 1), (3.0, 1)]) is None


def test_a_step_that_goes_back_starts_the_rate_over_and_old_observations_leave_the_window() -> None:
    watch = Watch(window_s=10.0)
    doc = status(("h", [0]))
    for now, step in ((0.0, 1), (5.0, 2), (20.0, 12), (25.0, 13)):
        watch.update(doc, [metric("h", 0, step, steps=100)], now=now)
    assert watch.seen[0][0] == (5.0, 2)  # the window spanned by one older observation
    watch.update(doc, [metric("h", 0, 3, steps=100)], now=30.0)  # resumed from a checkpoint
    assert watch.seen[0] == [(30.0, 3)]


def test_tail_is_bounded_by_the_ranks() -> None:
    assert tail_lines(status(("h", [0, 1]))) == 2 * TAIL_LINES_PER_RANK
    assert tail_lines({"nodes": []}) == TAIL_LINES_PER_RANK
    assert tail_lines(status(("h", list(range(10_000))))) == TAIL_LINES_MAX
    watch = Watch()  # an attached run: its status lists no ranks, its output shows them
    attached = {"nodes": [{"host": "h", "ranks": []}]}
    watch.update(attached, [metric("h", r, 1) for r in range(8)], now=1.0)
    assert watch.tail_lines(attached) == 8 * TAIL_LINES_PER_RANK


def test_the_watch_document_changes_with_the_run_not_with_the_clock() -> None:
    """`status --watch --json`: a line for what changed; the time, a rank's age and the ETA
    moving alone are no change, a new step, a new state or a new event are."""
    watch = Watch()
    first = view_document(watch.update(status(("node1", [0])), [metric("node1", 0, 2, steps=10, step_s=1.0)],
                                       100.0), 100.0)
    assert (first["format"], first["run_id"], first["step"], first["steps"], first["fraction"]) == (1, "r1", 2, 10,
                                                                                                    0.2)
    assert first["ranks"][0] == {"host": "node1", "node_rank": 0, "rank": 0, "alive": True, "step": 2, "steps": 10,
                                 "loss": None, "tokens_per_s": None, "step_s": 1.0, "memory_bytes": None,
                                 "last_output_age_s": 0.0, "straggler": False, "slowest": False}
    assert changed(None, first)
    later = view_document(watch.update(status(("node1", [0])), [metric("node1", 0, 2, steps=10, step_s=1.0)],
                                       105.0), 105.0)
    assert later["time"] != first["time"] and later["ranks"][0]["last_output_age_s"] == 5.0
    assert not changed(first, later)
    stepped = view_document(watch.update(status(("node1", [0])), [metric("node1", 0, 3, steps=10, step_s=1.0)],
                                         106.0), 106.0)
    assert changed(later, stepped) and stepped["step"] == 3
    ended = view_document(watch.update(status(("node1", [0]), state="failed", exit_code=1),
                                       [metric("node1", 0, 3, steps=10, step_s=1.0)], 107.0), 107.0)
    assert changed(stepped, ended) and ended["ended"] is True
    assert changed(ended, view_document(watch.update(status(("node1", [0]), state="failed", exit_code=1), [], 108.0),
                                        108.0, [{"kind": "finished"}]))


def test_progress_at_one_look_measures_the_rate_since_the_first_step() -> None:
    lines = [metric("node1", 0, 30, steps=100), metric("node1", 1, 31, steps=100)]
    # Step 10 at t=100, step 30 (the lowest rank's) at t=140: 2 s a step, 70 steps left.
    shown = progress_now(lines, 140.0, (100.0, 10))
    assert (shown.step, shown.steps, shown.eta_s) == (30, 100, 140.0)
    # No rate (the first step is the one shown): the slowest rank's step time.
    slow = [metric("node1", 0, 5, steps=10, step_s=2.0), metric("node1", 1, 5, steps=10, step_s=3.0)]
    shown = progress_now(slow, 140.0, (140.0, 5))
    assert (shown.step, shown.steps, shown.eta_s) == (5, 10, 15.0)
    assert progress_now(["[node1 r0] hello\n"], 1.0, None).step is None


def test_only_a_detached_run_whose_every_node_answered_carries_the_numbers_in_its_status() -> None:
    live = status(("node1", [0]), ("node2", [1]), detached=True)
    assert numbers_in_status(live)
    live["nodes"][1]["reachable"] = False  # node 0 holds no view of node2: its output is read
    assert not numbers_in_status(live)
    assert not numbers_in_status(status(("node1", [0]), detached=False))  # an attached run: files here
    assert not numbers_in_status(status(detached=True))  # no node known yet
    carried = status(("node1", [0, 1]), detached=True)
    carried["nodes"][0]["ranks"][0]["progress"] = {"step": 30, "steps": 100, "step_s": 2.0, "memory_bytes": None}
    carried["nodes"][0]["ranks"][1]["progress"] = {"step": 31, "steps": 100}
    assert [m.step for m in status_samples(carried)] == [30, 31]
    lines = [metric("node1", 0, 30, steps=100, step_s=2.0), metric("node1", 1, 31, steps=100)]
    assert progress_from(status_samples(carried), 140.0, (100.0, 10)) == progress_now(lines, 140.0, (100.0, 10))
