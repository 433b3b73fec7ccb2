"""The attached launcher's hang report: what it writes from the nodes' stacks reports."""

from __future__ import annotations

import json
from pathlib import Path

from fstrain.io.stall import HangReports

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "stacks"


def test_writes_every_rank_and_names_the_odd_one(tmp_path: Path) -> None:
    reports = HangReports(tmp_path)
    dump = {r: (FIXTURES / f"faulthandler_gloo-allreduce-hang_rank{r}.txt").read_text() for r in (0, 1, 2)}
    reports.add(0, {"ranks": {"0": {"faulthandler": dump[0]}, "1": {"faulthandler": dump[1]}}})
    reports.add(1, {"ranks": {"2": {"faulthandler": dump[2]}}, "nccl_traces": []})
    document = reports.write("no rank printed anything for 20 s", [])
    assert document["odd_ranks"] == [1] and document["unanswered_nodes"] == []
    assert json.loads((tmp_path / "stacks" / "report.json").read_text()) == document == reports.document
    assert (tmp_path / "stacks" / "rank1.faulthandler.txt").read_text() == dump[1]


def test_a_silent_node_is_named_as_unanswered(tmp_path: Path) -> None:
    reports = HangReports(tmp_path)
    reports.add(0, {"ranks": {}})
    assert reports.write("no rank printed anything for 20 s", [1])["unanswered_nodes"] == [1]
