"""Reading bench documents: summaries, compute against the GPU table, pairs verdicts, bar charts."""

from __future__ import annotations

from typing import Any

import pytest

from fstrain.core.bench.report import (
    analysis,
    bar_chart,
    check_document,
    collective_summaries,
    compute_rows,
    group_names,
    pair_matrix,
)
from fstrain.errors import InputError


def _row(collective: str, size: int, seconds: float, n: int, factor: float, group: int = 0) -> dict[str, Any]:
    algbw = size / seconds / 1e9
    return {"collective": collective, "size_bytes": size, "group": group, "time_us": {"median": seconds * 1e6},
            "algbw_gbps": algbw, "busbw_gbps": algbw * factor, "latency_size": size < 1 << 20}


def _compute(rank: int, name: str, tflops: float, gbps: float, device: str = "cuda:0") -> dict[str, Any]:
    return {"rank": rank, "device": device, "device_name": name,
            "matmul": {"dtype": "bfloat16", "tflops": {"median": tflops}},
            "memory": {"gbps": {"median": gbps}}}


DOC: dict[str, Any] = {
    "schema": "fstrain.bench/1",
    "ranks": [{"rank": r, "hostname": f"node{1 + r // 2}"} for r in range(4)],
    "collectives": {"scopes": [
        {"scope": "world", "groups": [[0, 1, 2, 3]], "results": [
            _row("all_reduce", 8, 40e-6, 4, 1.5), _row("all_reduce", 1 << 30, 0.01, 4, 1.5)]},
        {"scope": "intra_node", "groups": [[0, 1], [2, 3]], "results": [
            _row("all_reduce", 8, 10e-6, 2, 1.0, 0), _row("all_reduce", 8, 12e-6, 2, 1.0, 1),
            _row("all_reduce", 1 << 30, 0.005, 2, 1.0, 0), _row("all_reduce", 1 << 30, 0.008, 2, 1.0, 1)]},
    ]},
    "compute": {"per_rank": [_compute(0, "NVIDIA H200", 700, 4000), _compute(1, "NVIDIA H200", 690, 4100),
                             _compute(2, "NVIDIA H200", 500, 4050), _compute(3, "NVIDIA H200", 710, 4020)]},
    "pairs": {"links": [{"src": a, "dst": b, "samples_gbps": [0.1 if b == "node2" else 1.0]}
                        for a in ("node1", "node2", "node3") for b in ("node1", "node2", "node3") if a != b]},
}


def test_collective_summaries_take_latency_small_and_bandwidth_large_slowest_group() -> None:
    world, intra = collective_summaries(DOC)
    assert (world.scope, world.group_size, world.groups) == ("world", 4, 1)
    assert world.latency_us == pytest.approx(40)
    assert world.busbw_gbps == pytest.approx((1 << 30) / 0.01 / 1e9 * 1.5)
    assert intra.latency_us == pytest.approx(12)  # the slower group
    assert intra.busbw_gbps == pytest.approx((1 << 30) / 0.008 / 1e9)


def test_compute_rows_against_the_h200_datasheet() -> None:
    rows = compute_rows(DOC)
    assert [r.node for r in rows] == ["node1", "node1", "node2", "node2"]
    assert rows[0].peak_tflops == pytest.approx(989) and rows[0].peak_memory_gbps == pytest.approx(4800)
    assert rows[0].tflops_fraction == pytest.approx(700 / 989)
    assert [r.straggler for r in rows] == ["", "", "matmul", ""]  # 500 < 0.8 x median 695


def test_cpu_ranks_have_no_peak() -> None:
    doc = {"compute": {"per_rank": [_compute(0, "x86_64", 0.1, 5, device="cpu")]}, "ranks": []}
    (row,) = compute_rows(doc)
    assert row.peak_tflops is None and row.tflops_fraction is None and row.straggler == ""


def test_analysis_names_the_slow_host_and_the_straggler() -> None:
    result = analysis(DOC)
    assert result["pairs"]["outlier_hosts"] == ["node2"]
    assert result["compute"]["stragglers"] == [2]
    assert len(result["collectives"]) == 2


def test_check_document() -> None:
    assert check_document(DOC, "x") is DOC
    with pytest.raises(InputError, match="not an fstrain bench document") as caught:
        check_document({"losses": []}, "summary.json")
    assert caught.value.where == "summary.json"


def test_bar_chart() -> None:
    lines = bar_chart([("a", 2.0), ("long", 1.0), ("z", 0.0)], unit="GB/s", width=10, marks=["", "SLOW"])
    assert lines == [
        "a    |##########| 2 GB/s",
        "long |#####.....| 1 GB/s  SLOW",
        "z    |..........| 0 GB/s",
    ]
    assert bar_chart([], unit="x") == []


def test_groups_are_named_by_their_hosts() -> None:
    doc = {"nodes": ["n1", "n2", "n3", "n4"]}
    assert group_names(doc, {"scope": "intra_node", "groups": [[0, 1], [2, 3], [4, 5], [6, 7]]}) == doc["nodes"]
    assert group_names(doc, {"scope": "inter_node", "groups": [[0, 2, 4, 6], [1, 3, 5, 7]]}) == \
        ["local rank 0", "local rank 1"]
    assert group_names(doc, {"scope": "world", "groups": [list(range(8))]}) == ["all hosts"]


def test_pair_matrix_marks_the_slow_cells_or_the_slowest() -> None:
    links = {("n1", "n2"): 0.024, ("n2", "n1"): 0.8, ("n1", "n3"): 0.6, ("n3", "n1"): 0.7}
    lines = pair_matrix(links, ["n1", "n2", "n3"], {("n1", "n2")})
    assert len(lines) == 4  # a header and one row per sender, not a row per link
    assert lines[1].split("|")[1].split() == ["0.024*", "0.6"]
    assert lines[2].split("|")[1].split() == ["0.8", "-"]  # n2 -> n3 was not timed
    assert pair_matrix(links, ["n1", "n2", "n3"], set())[1].split("|")[1].split() == ["0.024<", "0.6"]
