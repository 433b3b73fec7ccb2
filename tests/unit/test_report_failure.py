"""A failed run's report shows the failing rank's last lines (fstrain/core/report/excerpt.py):
from the manifest of an attached or Slurm run, from the nodes' records of a detached one; on the
page, in the --json document."""

from __future__ import annotations

from typing import Any

from fstrain.core.report import excerpt
from fstrain.core.report.numbers import as_document, build
from fstrain.core.report.page import render
from fstrain.core.runs.runstate import RunState
from tests.helpers import manifest

FAILED = RunState("failed", 7, "rank 3 (local rank 1) on node2 exited with 7", 130.0)
RANK_3_LINES = ["[node2 r3] step 2 done", "[node2 r3] Traceback (most recent call last):",
                '[node2 r3]   File "train.py", line 9, in <module>', "[node2 r3] ValueError: bad batch <7>"]


def failed_manifest(node2_lines: list[str], failed_rank: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "run_id": "r1", "backend": "torchrun", "started": 100.0, "ended": 130.0, "reason": "failed", "exit_code": 7,
        "first_failure_node_rank": 1, "first_failure": failed_rank,
        "nodes": [
            {"host": "node1", "node_rank": 0, "nproc": 2, "started": 101.0, "ended": 129.0, "exit_code": 143,
             "last_lines": ["[node1 r0] step 2 done", "[node1 r1] step 2 done"]},
            {"host": "node2", "node_rank": 1, "nproc": 2, "started": 102.0, "ended": 120.0, "exit_code": 7,
             "last_lines": node2_lines, "failed_rank": failed_rank},
        ],
    }


def test_an_attached_runs_report_shows_the_failing_ranks_last_lines() -> None:
    failure = excerpt.from_manifest(manifest(**failed_manifest(
        RANK_3_LINES, {"rank": 3, "local_rank": 1, "exit_code": 7, "signal": None})))
    assert failure is not None
    assert (failure.host, failure.node_rank, failure.rank, failure.exit_code, failure.own) == ("node2", 1, 3, 7, True)
    assert failure.lines == tuple(RANK_3_LINES)
    assert failure.heading == "rank 3 on node2 (exit 7) failed; its last lines"
    report = build("r1", "attached", FAILED, series=[], events=[], plan=None, summary=None, failure=failure)
    page = render(report, "0.1.0")
    assert page.index('data-section="failure"') < page.index('data-section="table"')  # first of all
    assert "[node2 r3] ValueError: bad batch &lt;7&gt;" in page  # escaped, whole
    assert "rank 3 on node2 (exit 7) failed; its last lines" in page
    document = as_document(report)["failure"]
    assert document["lines"] == RANK_3_LINES and document["rank"] == 3 and document["heading"] == failure.heading


def test_where_the_launcher_did_not_tell_the_rank_apart_the_nodes_lines_are_shown_as_such() -> None:
    mixed = ["[node2 r2] step 2 done", "[node2 r3] Killed", "[node2] torchrun: a child failed"]
    failure = excerpt.from_manifest(manifest(**failed_manifest(mixed, None)))
    assert failure is not None and failure.lines == tuple(mixed) and not failure.own and failure.rank is None
    assert failure.heading == "a rank on node2 (exit 7) failed; the last lines of node rank 1 (all its ranks')"


def test_a_run_without_a_recorded_failure_has_no_excerpt() -> None:
    ok = manifest(run_id="r2", reason="ok", exit_code=0, started=1.0, ended=2.0,
                  nodes=[{"host": "node1", "node_rank": 0, "nproc": 1, "started": 1.0, "ended": 2.0, "exit_code": 0,
                          "last_lines": ["[node1 r0] done"]}])
    assert excerpt.from_manifest(ok) is None and excerpt.from_manifest(None) is None
    report = build("r2", "attached", RunState("succeeded", 0), series=[], events=[], plan=None, summary=None)
    assert 'data-section="failure"' not in render(report, "0.1.0") and as_document(report)["failure"] is None


def test_a_detached_runs_failing_rank_is_picked_out_of_its_nodes_last_lines() -> None:
    final = {"state": "failed", "exit_code": 7, "first_failure_node_rank": 1, "first_failure_host": "node2",
             "first_failure": {"rank": 3, "local_rank": 1, "exit_code": 7, "signal": None}}
    node2 = {"rank_offset": 2, "exit_code": 7, "failure": {"rank": 3, "local_rank": 1, "exit_code": 7},
             "final": final,
             "last_lines": ["[local0]:step 2 done", "[local1]:Traceback (most recent call last):",
                            '[local1]:  File "train.py", line 9, in <module>',
                            "[local0]:waiting at the all-reduce", "[local1]:ValueError: bad batch",
                            "torchrun: a child failed"]}
    views = [{"node": {"rank_offset": 0, "exit_code": 143, "final": final, "last_lines": ["[local0]:step 2 done"]}},
             {"node": node2}]
    failure = excerpt.from_views(["node1", "node2"], views)
    assert failure is not None and (failure.host, failure.node_rank, failure.rank, failure.own) == ("node2", 1, 3, True)
    assert failure.lines == ("[node2 r3] Traceback (most recent call last):",
                             '[node2 r3]   File "train.py", line 9, in <module>', "[node2 r3] ValueError: bad batch")
    # The rank's own lines left the node's short tail: the node's lines, tagged as `fstrain logs` tags them.
    node2["last_lines"] = ["[local0]:step 2 done", "torchrun: a child failed"]
    fallback = excerpt.from_views(["node1", "node2"], views)
    assert fallback is not None and not fallback.own
    assert fallback.lines == ("[node2 r2] step 2 done", "[node2] torchrun: a child failed")
    # A node not reached, or no failure recorded: none.
    assert excerpt.from_views(["node1", "node2"], [views[0], None]) is None
    assert excerpt.from_views(["node1"], [{"node": {"exit_code": 0, "last_lines": ["x"]}}]) is None
