"""`fstrain report`'s pure parts: the series read from output lines, step times and stragglers,
the events, the table "planned vs measured", and the page (every section, well-formed SVG)."""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET

import pytest

from fstrain.core.monitor.metricline import StepMetrics, format_metric_line
from fstrain.core.report import events as timeline
from fstrain.core.report.numbers import Report, as_document, build
from fstrain.core.report.page import render
from fstrain.core.report.series import Point, RankSeries, differ, rank_series, resumed_steps, step_times
from fstrain.core.report.svg import Group, Line, distribution_chart, line_chart, nice_ticks, thinned
from fstrain.core.runs.runstate import RunState
from tests.helpers import manifest

PROGRESS = ("[node1 r0] [fstrain.train] step {step}/4 loss {loss} lr 3.000e-04 tokens/s {rate} "
            "max_allocated_bytes=100.0MiB max_reserved_bytes=128.5MiB")


def metric(rank: int, step: int, step_s: float, host: str = "node1", **fields: float) -> str:
    line = format_metric_line(StepMetrics(step=step, steps=4, step_s=step_s, rank=rank, **fields))  # type: ignore[arg-type]
    return f"[{host} r{rank}] {line}"


def test_progress_lines_give_rank_0s_series_with_the_step_time_from_tokens_per_step() -> None:
    lines = [PROGRESS.format(step=1, loss="6.2807", rate="2,048"), "[node1 r1] unrelated",
             PROGRESS.format(step=2, loss="6.0930", rate="4,096")]
    (series,) = rank_series(lines, tokens_per_step=1024)
    assert (series.rank, series.host, series.source) == (0, "node1", "progress line")
    assert series.points == (Point(1, 6.2807, 2048.0, 0.5, round(128.5 * 2**20)),
                             Point(2, 6.093, 4096.0, 0.25, round(128.5 * 2**20)))


def test_metric_lines_win_over_progress_lines_and_a_resumed_step_is_reported_once() -> None:
    lines = [PROGRESS.format(step=1, loss="6.0", rate="1,000"), metric(0, 1, 0.5, loss=6.0),
             metric(1, 1, 0.6, host="node2", loss=6.0), metric(0, 2, 0.4, loss=5.0), metric(0, 2, 0.3, loss=5.5)]
    series = rank_series(lines)
    assert [(s.rank, s.host, s.source) for s in series] == [(0, "node1", "metric line"), (1, "node2", "metric line")]
    assert [p.step_s for p in series[0].points] == [0.5, 0.3]  # the later report of step 2 wins
    assert differ(series, "loss") is False and differ(series, "step_s") is True


def test_a_rank_much_slower_than_the_others_is_a_straggler() -> None:
    series = [RankSeries(rank, "h", "metric line", tuple(Point(step, step_s=s) for step, s in enumerate(times)))
              for rank, times in ((0, [9.0, 1.0, 1.02, 0.98]), (1, [9.0, 1.01, 0.99, 1.0]),
                                  (2, [9.0, 1.5, 1.45, 1.6]), (3, [9.0, 1.05, 1.0, 1.02]))]
    steps = step_times(series)
    assert [s.straggler for s in steps] == [False, False, True, False]
    assert steps[2].step_s == (1.5, 1.45, 1.6)  # the first step (one-time work) left out
    assert (steps[2].median_s, steps[2].max_s) == (1.5, 1.6)
    assert not step_times(series[:1])[0].straggler  # one rank: nothing to compare with


def test_resumes_are_restart_events() -> None:
    lines = ["[node1 r0] [fstrain.train] resumed from step 40", "[node1 r0] [fstrain.train] step 41/50 loss 1"]
    assert resumed_steps(lines) == [("node1", 40)]
    (event,) = timeline.restarts(resumed_steps(lines))
    assert (event.kind, event.where, event.time) == ("restart", "node1", None)


MANIFEST = {
    "run_id": "r1", "backend": "torchrun", "started": 100.0, "ended": 130.0, "reason": "failed", "exit_code": 7,
    "first_failure_node_rank": 1,
    "nodes": [
        {"host": "node1", "node_rank": 0, "nproc": 2, "started": 101.0, "ended": 129.0, "exit_code": 137},
        {"host": "node2", "node_rank": 1, "nproc": 2, "started": 102.0, "ended": 120.0, "exit_code": 7,
         "error": None, "failed_rank": {"rank": 3, "local_rank": 1, "exit_code": 7, "signal": None}},
    ],
}


def test_a_manifest_gives_the_start_each_node_up_the_failure_and_the_end_in_time_order() -> None:
    state = RunState("failed", 7, "rank 3 exited with 7", 130.0)
    events = timeline.from_manifest(manifest(**MANIFEST), state)
    assert [(e.time, e.kind, e.where) for e in events] == [
        (100.0, "start", ""), (101.0, "node up", "node1"), (102.0, "node up", "node2"),
        (120.0, "failure", "node2"), (129.0, "node end", "node1"), (130.0, "failure", "")]
    assert events[3].text == "exit 7: rank 3 exited with 7"
    assert events[4].text == "exit 137: stopped by the teardown after node rank 1's failure"
    assert events[5].text == "failed, exit 7 (rank 3 exited with 7)"


def test_detached_views_give_each_node_a_stall_and_a_node_not_reached() -> None:
    views = [{"node": {"started": 11.0, "ended": 20.0, "exit_code": 124, "nproc": 2}, "run": {"stall": {"x": 1}}},
             None]
    state = RunState("stalled", 124, "no output for 5 s", 21.0)
    events = timeline.from_views(10.0, ["node1", "node2"], views, state)
    assert [(e.kind, e.where) for e in events] == [("start", ""), ("node up", "node1"), ("failure", "node1"),
                                                    ("failure", "node2"), ("stall", "")]
    assert events[-1].text == "stalled, exit 124 (no output for 5 s)"


def test_an_events_file_is_the_timeline_one_entry_per_event() -> None:
    from fstrain.core.runs.runevents import RunEvent

    recorded = [RunEvent("started", 100.0, "r1", hosts=("node1", "node2"), text="run r1 started on 2 nodes"),
                RunEvent("first_step", 110.0, "r1", step=1, text="first step reported: step 1"),
                RunEvent("failure", 120.0, "r1", host="node2", rank=3, exit_code=7, text="rank 3 on node2 exited 7"),
                RunEvent("blame", 121.0, "r1", verdict="hardware", suspects=("node2",), text="verdict hardware"),
                RunEvent("excluded", 122.0, "r1", host="node2", text="node2 is left out of attempt 2"),
                RunEvent("attempt", 125.0, "r1", 2, hosts=("node1",), text="attempt 2 started on 1 node"),
                RunEvent("resumed", 125.5, "r1", 2, step=4, text="resumes from step 4"),
                RunEvent("finished", 150.0, "r1", 2, state="succeeded", exit_code=0, text="run succeeded")]
    events = timeline.from_run_events(list(reversed(recorded)))
    assert [(e.time, e.kind, e.where) for e in events] == [
        (100.0, "start", ""), (110.0, "first step", ""), (120.0, "failure", "node2"), (121.0, "blame", ""),
        (122.0, "excluded", "node2"), (125.0, "restart", ""), (125.5, "restart", ""), (150.0, "end", "")]
    stalled = timeline.from_run_events([RunEvent("finished", 1.0, "r", state="stalled", exit_code=124)])
    assert [e.kind for e in stalled] == ["stall"]
    # Each node's start and end come from the manifest or the node views: the file has the decisions.
    nodes = [timeline.Event(101.0, "node up", "node1", "up"), timeline.Event(149.0, "node end", "node1", "0"),
             timeline.Event(120.0, "failure", "node2", "a second failure, from the manifest")]
    merged = timeline.from_run_events(recorded, nodes=[timeline.Event(100.0, "node up", "node2", "up"), *nodes])
    assert [(e.time, e.kind) for e in merged][:4] == [(100.0, "start"), (100.0, "node up"), (101.0, "node up"),
                                                      (110.0, "first step")]
    assert (149.0, "node end", "node1") in [(e.time, e.kind, e.where) for e in merged]
    assert len(merged) == len(recorded) + 3  # only the nodes' own kinds are taken
    # A start recorded after the first node came up (node 0's coordinator writes it) is that node's time.
    late = timeline.from_run_events(recorded, nodes=[timeline.Event(90.0, "node up", "node1", "up")])
    assert [(e.time, e.kind) for e in late][:2] == [(90.0, "start"), (90.0, "node up")]


PLAN = {"cluster": {"gpu": "h100-sxm", "gpu_memory_bytes": 80 * 2**30},
        "predicted": {"memory": {"peak": 2 * 2**30}, "tokens_per_s": 10000.0, "step_time_s": 0.1}}
SUMMARY = {"device": "cuda", "tokens_per_s": 8000.0, "tokens_per_step": 1000, "world_size": 4,
           "peak_memory_max_over_ranks": {"max_allocated_bytes": 2 * 2**30, "max_reserved_bytes": 3 * 2**30}}


def test_the_table_compares_the_plans_prediction_with_the_summary() -> None:
    report = build("r1", "attached", RunState("succeeded", 0), series=[], events=[], plan=PLAN, summary=SUMMARY)
    rows = {row.name: row for row in report.table}
    assert (rows["memory"].planned, rows["memory"].measured, rows["memory"].error) == (2 * 2**30, 3 * 2**30, 0.5)
    assert rows["tokens/s"].error == pytest.approx(-0.2)
    assert rows["step time"].measured == 1000 / 8000 and rows["step time"].error == pytest.approx(0.25)
    assert report.card_bytes == 80 * 2**30 and report.planned_memory_bytes == 2 * 2**30
    assert report.notes == ()


def test_a_cpu_run_without_a_prediction_says_so_and_labels_its_memory_as_cpu() -> None:
    summary = {**SUMMARY, "device": "cpu", "peak_memory_max_over_ranks": {"max_rss_bytes": 400 * 2**20}}
    report = build("r1", "attached", RunState("succeeded", 0), series=[], events=[],
                   plan={"cluster": {"gpu": "cpu", "gpu_memory_bytes": 0}, "predicted": {}}, summary=summary)
    rows = {row.name: row for row in report.table}
    assert rows["memory"].measured == 400 * 2**20 and rows["memory"].planned is None and rows["memory"].error is None
    assert report.memory_label.startswith("CPU peak RSS") and report.card_bytes is None
    assert any("no prediction" in note for note in report.notes)


def memory_chart_title(report: Report) -> str:
    chart = re.search(r'<svg [^>]*data-chart="memory".*?</svg>', render(report, "0.1.0"), flags=re.S)
    assert chart is not None
    title = re.search(r'font-weight="bold">([^<]*)</text>', chart.group())
    assert title is not None
    return html.unescape(title.group(1))


def test_the_memory_chart_names_what_the_data_says_was_measured_not_the_plans_gpu() -> None:
    """A CPU run planned for H100s, with no summary yet (still running, or failed): its progress
    lines print the process's max_rss_bytes, so its memory is CPU RSS, with no card to compare."""
    cpu = ("[node1 r0] [fstrain.train] step {step}/4 loss 6.0 lr 3.000e-04 tokens/s 1,000 "
           "max_rss_bytes=412.0MiB")
    series = rank_series([cpu.format(step=step) for step in (1, 2)], tokens_per_step=1000)
    assert series[0].memory_key == "max_rss_bytes"
    report = build("r1", "detached", RunState("running", None), series=series, events=[], plan=PLAN, summary=None)
    assert (report.device, report.card_bytes) == ("cpu", None)
    assert memory_chart_title(report).startswith("CPU peak RSS") and "GPU" not in report.memory_label
    # A program's own metric lines do not say of which device their memory_bytes is.
    own = build("r2", "attached", RunState("failed", 7), series=rank_series([metric(0, 1, 0.1, memory_bytes=2**30)]),
                events=[], plan=None, summary=None)
    assert own.device is None and "GPU" not in own.memory_label and "CPU" not in own.memory_label
    # The trainer's progress lines on a GPU print the allocator's peaks.
    gpu = build("r3", "attached", RunState("running", None), plan=PLAN, summary=None, events=[],
                series=rank_series([PROGRESS.format(step=1, loss="6.0", rate="1,000")], tokens_per_step=1000))
    assert gpu.device == "cuda" and memory_chart_title(gpu).startswith("GPU memory")
    assert gpu.card_bytes == 80 * 2**30


def test_the_page_has_every_section_well_formed_svg_and_no_script_or_link() -> None:
    series = rank_series([metric(0, s, 0.1 * s, loss=5.0 / s, tokens_per_s=1000.0 * s, memory_bytes=2**30)
                          for s in range(1, 5)] +
                         [metric(1, s, 0.2 * s, host="node2", loss=5.0 / s, tokens_per_s=900.0 * s,
                                 memory_bytes=2**30 + 5) for s in range(1, 5)])
    state = RunState("failed", 7, "rank 3 exited with 7", 130.0)
    report = build("r<1>", "attached", state, series=series, events=timeline.from_manifest(manifest(**MANIFEST), state),
                   plan=PLAN, summary=SUMMARY)
    page = render(report, "0.1.0")
    for section in ("table", "loss", "tokens", "step-times", "memory", "timeline"):
        assert f'data-section="{section}"' in page
    for svg in re.findall(r"<svg .*?</svg>", page, flags=re.S):
        ET.fromstring(svg)  # well-formed: the run id's "<" is escaped
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert 'data-row="memory"' in page and "+50.0 %" in page
    assert "straggler" in page and page.count('data-event="') == len(report.events)
    document = as_document(report)
    assert document["schema"] == "fstrain.report/1" and document["step_times"][1]["straggler"] is True
    assert document["planned_vs_measured"][0]["measured"] == 3 * 2**30


def test_ticks_cover_the_range_with_round_steps() -> None:
    assert nice_ticks(0.0, 0.93) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(5.0, 5.0)[0] <= 5.0 <= nice_ticks(5.0, 5.0)[-1]


def test_a_long_run_on_many_ranks_draws_a_bounded_page() -> None:
    assert thinned(list(range(10)), 4) == [0, 3, 6, 9] and thinned([1, 2], 4) == [1, 2]
    lines = [Line(f"rank {r}", tuple((float(s), 1.0 / s) for s in range(1, 20001))) for r in range(64)]
    chart = line_chart("loss", "loss", lines, "step", "loss")
    ET.fromstring(chart)
    assert chart.count("<path") == 64 and chart.count("<circle") == 0  # no marker per point at this length
    assert max(len(p) for p in re.findall(r' d="([^"]*)"', chart)) < 20 * 1000 and "and more" in chart
    groups = [Group(f"rank {r}", tuple(0.1 for _ in range(5000)), r == 3) for r in range(8)]
    assert distribution_chart("step-times", "t", groups, "s", "straggler").count("<circle") == 8 * 300
