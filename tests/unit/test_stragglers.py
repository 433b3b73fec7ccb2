"""One straggler rule (fstrain/core/monitor/stragglers.py) for both surfaces: `fstrain report`
(each rank's median step time) and `fstrain status --watch` (each rank's latest step time)
name the same ranks, with 2 ranks and with many."""

from __future__ import annotations

from fstrain.core.monitor.metricline import StepMetrics, format_metric_line
from fstrain.core.monitor.stragglers import STRAGGLER_FRACTION, stragglers
from fstrain.core.monitor.watch import Watch
from fstrain.core.report.series import rank_series, step_times

STEPS = 6


def metric_lines(step_s_by_rank: dict[int, float], steps: int = STEPS) -> list[str]:
    """Every rank's metric line for each step, each step taking the rank's step time (seconds)."""
    return [f"[node{rank // 8 + 1} r{rank}] "
            + format_metric_line(StepMetrics(step=step, steps=steps, step_s=seconds, rank=rank))
            for step in range(1, steps + 1) for rank, seconds in sorted(step_s_by_rank.items())]


def report_stragglers(step_s_by_rank: dict[int, float]) -> list[int]:
    """The ranks `fstrain report` marks as stragglers."""
    return [steps.rank for steps in step_times(rank_series(metric_lines(step_s_by_rank))) if steps.straggler]


def watch_view_of(step_s_by_rank: dict[int, float]) -> tuple[list[int], int | None]:
    """The stragglers and the slowest rank `fstrain status --watch` shows, mid-run."""
    nodes: dict[str, list[int]] = {}
    for rank in sorted(step_s_by_rank):
        nodes.setdefault(f"node{rank // 8 + 1}", []).append(rank)
    status = {"run_id": "r1", "state": "running", "exit_code": None, "reason": "", "first_failure": None,
              "nodes": [{"host": host, "node_rank": index, "reachable": True, "gpus": [], "gpus_error": None,
                         "ranks": [{"rank": r, "alive": True, "last_output_at": 100.0, "progress": None}
                                   for r in ranks]}
                        for index, (host, ranks) in enumerate(nodes.items())]}
    view = Watch().update(status, metric_lines(step_s_by_rank, steps=STEPS + 4)[: STEPS * len(step_s_by_rank)],
                          now=120.0)
    assert [r.rank for r in view.rows if r.straggler] == list(view.stragglers)
    return list(view.stragglers), view.slowest_rank


def test_two_ranks_one_20_percent_slower_is_a_straggler_in_the_report_and_in_the_watch() -> None:
    times = {0: 1.0, 1: 1.2}
    assert report_stragglers(times) == [1]  # was "no straggler": 1.2 s is within 10 % of the mean of both
    assert watch_view_of(times) == ([1], 1)
    assert stragglers(times) == [1]


def test_two_ranks_within_the_noise_are_no_straggler_on_either_surface() -> None:
    times = {0: 1.0, 1: 1.05}
    assert report_stragglers(times) == [] and watch_view_of(times) == ([], None)


def test_many_ranks_both_surfaces_name_the_same_stragglers() -> None:
    base = {rank: 1.0 + 0.01 * (rank % 3) for rank in range(32)}  # 1.00 to 1.02 s: the noise
    slow = {**base, 11: 1.15, 20: 1.3}
    assert report_stragglers(slow) == [11, 20] and watch_view_of(slow) == ([11, 20], 20)
    # 8 % over the others: noise by the one rule (the watch named it at its former 5 %).
    close = {**base, 11: 1.08}
    assert report_stragglers(close) == [] and watch_view_of(close) == ([], None)
    assert report_stragglers(base) == [] and watch_view_of(base) == ([], None)


def test_the_rule_compares_each_rank_with_the_median_of_the_others() -> None:
    assert STRAGGLER_FRACTION == 0.10
    assert stragglers({}) == [] and stragglers({4: 9.0}) == []  # nothing to compare with
    assert stragglers({0: 1.0, 1: 1.1}) == []  # exactly 10 % over: not over it
    assert stragglers({0: 1.0, 1: 1.1001}) == [1]
    # Half the ranks slow (a slower node): each is measured against the rest, fast ones the most.
    assert stragglers({0: 1.0, 1: 1.0, 2: 1.3, 3: 1.3}) == [2, 3]
    assert stragglers({0: 1.0, 1: 1.0, 2: 1.0, 3: 1.3, 4: 1.3}) == [3, 4]
    # The median of the others, computed in one sort, is that of the list without the rank.
    times = {rank: float((rank * 37) % 11) + 1.0 for rank in range(11)}
    expected = []
    for rank, seconds in times.items():
        others = sorted(v for r, v in times.items() if r != rank)
        middle = len(others) // 2
        median = others[middle] if len(others) % 2 else (others[middle - 1] + others[middle]) / 2
        if seconds > median * 1.1:
            expected.append(rank)
    assert stragglers(times) == sorted(expected)
