"""The hang report: what the attached launcher writes from the nodes' stacks reports, and that a
detached run's coordinator writes the same."""

from __future__ import annotations

import json
from pathlib import Path

from fstrain.io.stall import HangReports
from tests.coordinators import make_coordinator

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


def test_the_coordinator_writes_the_same_report(tmp_path: Path) -> None:
    """Attached (this machine) and detached (node 0's coordinator): one document, one set of files,
    the NCCL traces named by host in both."""
    dump = {r: (FIXTURES / f"faulthandler_gloo-allreduce-hang_rank{r}.txt").read_text() for r in (0, 1, 2)}
    payloads = {0: {"ranks": {"0": {"faulthandler": dump[0]}, "1": {"faulthandler": dump[1]}}},
                1: {"ranks": {"2": {"faulthandler": dump[2]}}, "nccl_traces": ["/runs/r/nccl_trace_rank_2"]}}
    reason = "no rank printed anything for 20 s"
    attached = HangReports(tmp_path / "attached", ["node1", "node2"])
    for rank, payload in payloads.items():
        attached.add(rank, payload)
    written = attached.write(reason, [])
    running = make_coordinator(tmp_path / "detached", nnodes=2, names=["node1", "node2"])
    running.stacks = dict(payloads)
    running.run.stall_reason = reason
    detached = running.write_hang_report([])
    assert written["nccl_traces"] == ["node2: /runs/r/nccl_trace_rank_2"]
    assert {**written, "folder": ""} == {**detached, "folder": ""}
    assert detached["folder"] == str(tmp_path / "detached" / "stacks")
    files = {side: {p.name: p.read_text() for p in (tmp_path / side / "stacks").iterdir()}
             for side in ("attached", "detached")}
    assert sorted(files["attached"]) == ["rank0.faulthandler.txt", "rank1.faulthandler.txt",
                                         "rank2.faulthandler.txt", "report.json"]  # no partial file left
    assert {**files["attached"], "report.json": ""} == {**files["detached"], "report.json": ""}
    assert json.loads(files["detached"]["report.json"]) == detached


def test_a_report_that_cannot_be_written_leaves_the_coordinator_going(tmp_path: Path) -> None:
    (tmp_path / "stacks").write_text("a file where the folder goes")
    running = make_coordinator(tmp_path, nnodes=1, names=["node1"])
    running.stacks = {0: {"ranks": {}}}
    running.run.stall_reason = "no rank printed anything for 20 s"
    document = running.write_hang_report([])
    assert document["unanswered_nodes"] == [] and "folder" not in document
