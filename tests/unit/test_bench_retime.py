"""A verdict stands only when the re-time confirms it: pairs, compute and intra-node collectives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fstrain.core.bench.checks import bench_checks
from fstrain.core.bench.pairs import analyze_links, link_table, retime_links
from fstrain.core.bench.report import analysis, compute_rows, node_outliers, pairs_verdict, slow_groups

NODES = ["n1", "n2", "n3", "n4"]


def _records(gbps: dict[tuple[str, str], float], default: float = 1.0) -> list[dict[str, Any]]:
    return [{"src": a, "dst": b, "samples_gbps": [gbps.get((a, b), default)]}
            for a in NODES for b in NODES if a != b]


def _pairs(first: list[dict[str, Any]], *retimes: list[dict[str, Any]]) -> dict[str, Any]:
    return {"schema": "fstrain.bench/1", "nodes": NODES,
            "pairs": {"size": "16M", "links": first, "retimes": [{"links": r} for r in retimes]}}


def test_retime_takes_the_slow_link_its_ends_and_the_median_links() -> None:
    table = link_table(_records({("n1", "n2"): 0.3, ("n4", "n3"): 1.05}))
    wanted = retime_links(table)
    assert ("n1", "n2") in wanted
    # Out of n1 and into n2: what tells n1's way out from n2's way in from the link itself.
    assert {("n1", "n3"), ("n1", "n4"), ("n3", "n2"), ("n4", "n2")} <= set(wanted)
    assert len(wanted) == 5 + 2  # and the two links nearest the median
    assert retime_links(link_table(_records({}))) == []


def test_a_link_slow_once_and_fast_when_timed_again_is_not_named() -> None:
    first = _records({("n2", "n1"): 0.5})
    again = [{"src": a, "dst": b, "samples_gbps": [1.0]} for a, b in retime_links(link_table(first))]
    assert analyze_links(link_table(first)).outlier_hosts == ["n2", "n1"]  # one pass alone blamed them
    verdict = pairs_verdict(_pairs(first, again))
    assert verdict is not None and verdict.outlier_hosts == [] and verdict.slow_links == []


def test_a_slow_host_confirmed_by_the_re_time_is_named() -> None:
    first = _records({(a, "n3"): 0.05 for a in NODES})
    again = [{"src": a, "dst": b, "samples_gbps": [0.05 if b == "n3" else 1.1]}
             for a, b in retime_links(link_table(first))]
    verdict = pairs_verdict(_pairs(first, again))
    assert verdict is not None and verdict.outlier_hosts == ["n3"]
    assert [(h.host, h.direction, h.slow_links) for h in verdict.hosts] == [("n3", "in", 3)]


def test_a_link_the_re_time_never_saw_cannot_be_named() -> None:
    # n4 -> n1 sits just above the threshold; the re-timed links come back faster, the median
    # rises past it: it was not confirmed, so it is not named.
    first = _records({("n2", "n3"): 0.2, ("n4", "n1"): 0.72})
    again = [{"src": a, "dst": b, "samples_gbps": [1.4]} for a, b in retime_links(link_table(first))]
    assert ("n4", "n1") not in {(r["src"], r["dst"]) for r in again}
    verdict = pairs_verdict(_pairs(first, again))
    assert verdict is not None and verdict.slow_links == []


def _compute(rank: int, tflops: float) -> dict[str, Any]:
    return {"rank": rank, "device": "cpu", "device_name": "x86_64",
            "matmul": {"dtype": "float32", "tflops": {"median": tflops}}, "memory": {"gbps": {"median": 10.0}}}


def test_a_straggler_stands_only_when_the_re_time_finds_it_slow_again() -> None:
    first = [_compute(r, t) for r, t in enumerate([1.0, 1.0, 0.4, 1.0])]
    ranks = [{"rank": r, "hostname": NODES[r]} for r in range(4)]
    passing = {"ranks": ranks, "compute": {"per_rank": first, "retime": [_compute(r, 1.0) for r in range(4)]}}
    assert [r.straggler for r in compute_rows(passing)] == ["", "", "", ""]
    assert compute_rows(passing)[2].tflops == 1.0  # the best pass
    confirmed = {"ranks": ranks, "compute": {"per_rank": first, "retime": first}}
    assert [r.straggler for r in compute_rows(confirmed)] == ["", "", "matmul", ""]
    assert analysis(confirmed)["outlier_hosts"] == ["n3"]


def _intra(busbw: list[float], retime: list[float] | None = None) -> dict[str, Any]:
    def rows(values: list[float]) -> list[dict[str, Any]]:
        return [{"collective": "all_reduce", "size_bytes": 1 << 24, "requested_bytes": 1 << 24, "group": g,
                 "time_us": {"median": 100.0}, "algbw_gbps": b, "busbw_gbps": b} for g, b in enumerate(values)]

    scope: dict[str, Any] = {"scope": "intra_node", "groups": [[0, 1], [2, 3], [4, 5], [6, 7]],
                             "results": rows(busbw)}
    if retime is not None:
        scope["retime"] = rows(retime)
    return {"schema": "fstrain.bench/1", "nodes": NODES, "collectives": {"scopes": [scope]}}


def test_a_slow_node_collective_is_named_by_host_when_confirmed() -> None:
    assert slow_groups(_intra([10, 10, 2, 10])["collectives"]["scopes"][0]["results"]) == {"all_reduce": [2]}
    (node,) = node_outliers(_intra([10, 10, 2, 10], [10, 9, 2.5, 10]))
    assert (node.host, node.collective, node.busbw_gbps, node.median_gbps) == ("n3", "all_reduce", 2, 10)
    assert node_outliers(_intra([10, 10, 2, 10], [10, 9, 10, 10])) == []
    checks = bench_checks(_intra([10, 10, 2, 10], [10, 10, 10, 10]), NODES)
    assert [c.verdict for c in checks if c.id == "bench.collectives"] == ["ok"]



def test_no_second_re_time_once_every_slow_link_was_re_timed() -> None:
    table = link_table(_records({(a, "n3"): 0.05 for a in NODES}))
    first = retime_links(table)
    assert retime_links(table, confirmed=first) == []
    assert retime_links(table, confirmed=first[:1]) == first  # a slow link not yet re-timed


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bench"


def test_a_link_at_the_pace_of_its_yardsticks_in_the_re_time_is_not_named() -> None:
    """A healthy 3-host run on the loaded test cluster (2026-12-01): node1 -> node2's best was 62 %
    of a median raised by a few fast first-pass bursts; re-timed beside its yardsticks it ran at
    their pace (0.367 against a re-time median of 0.462 GB/s)."""
    document = json.loads((FIXTURES / "even-3-hosts-loaded.json").read_text())
    verdict = pairs_verdict(document)
    assert verdict is not None and verdict.outlier_hosts == [] and verdict.slow_links == []
