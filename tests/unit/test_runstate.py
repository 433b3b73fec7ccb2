"""A run's state from what its nodes report (fstrain/core/runs/runstate.py), as values."""

from __future__ import annotations

from typing import Any

from fstrain.core.runs.runstate import RunState, from_host_records, from_manifest, from_nodes
from tests.helpers import manifest


def view(alive: bool, run: dict[str, Any] | None = None, final: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"watchdog_alive": alive, "run": run, "node": {"final": final} if final else {}}


def test_while_running_node_0s_record_decides() -> None:
    assert from_nodes([view(True, {"state": "starting"}), view(True)]).state == "starting"
    assert from_nodes([view(True, {"state": "running"}), None]).state == "running"
    assert from_nodes([view(True, None), view(True)]).state == "starting"  # no record written yet


def test_a_decided_end_shows_while_the_nodes_are_torn_down() -> None:
    decided = from_nodes([view(True, {"state": "failed", "exit_code": 7, "reason": "the job on node2 exited with 7"})])
    assert decided == RunState("failed", 7, "the job on node2 exited with 7")


def test_any_nodes_final_record_decides_after_the_end() -> None:
    final = {"state": "failed", "exit_code": 7, "reason": "x", "ended": 12.0}
    assert from_nodes([None, view(False, final=final)]) == RunState("failed", 7, "x", 12.0)


def test_a_vanished_coordinator_is_lost() -> None:
    assert from_nodes([view(False, {"state": "running"}), view(True)]).state == "lost"
    assert from_nodes([None, view(True)]).state == "lost"
    # Reasons name the coordinator's host, not a node number.
    named = from_nodes([None, view(True)], ["gpu-a", "gpu-b"])
    assert named.reason == "gpu-a (the coordinator's host) cannot be reached"
    assert from_nodes([view(False), view(True)], ["gpu-a", "gpu-b"]).reason == \
        "the coordinator (gpu-a's watchdog) is gone without a record"
    assert from_nodes([view(False, {"state": "stopped", "exit_code": 143})]).state == "stopped"


def test_attached_runs_from_their_manifest() -> None:
    assert from_manifest(manifest(reason="ok", exit_code=0, ended=5.0)) == RunState("succeeded", 0, "ok", 5.0)
    assert from_manifest(manifest(reason="interrupted", exit_code=130)).state == "stopped"
    assert from_manifest(manifest(reason="stalled", exit_code=124)).state == "stalled"


def test_runs_found_on_the_hosts() -> None:
    final = {"state": "stopped", "exit_code": 143, "reason": "stop", "ended": 3.0}
    assert from_host_records(None, [{"watchdog_alive": False, "final": final}]) == RunState("stopped", 143, "stop", 3.0)
    assert from_host_records({"state": "running"}, [{"watchdog_alive": True}]).state == "running"
    assert from_host_records(None, [{"watchdog_alive": False}]).state == "lost"


def test_first_failure_from_the_final_record_or_node_0s_live_one() -> None:
    from fstrain.core.runs.runstate import first_failure

    failed = {"first_failure_node_rank": 1, "first_failure_host": "node2", "reason": "rank 3 on node2 exited with 7",
              "first_failure": {"rank": 3, "local_rank": 1, "exit_code": 7, "signal": None}}
    expected = {"rank": 3, "local_rank": 1, "exit_code": 7, "signal": None, "node_rank": 1, "host": "node2",
                "reason": "rank 3 on node2 exited with 7"}
    assert first_failure([{"node": {}}, {"node": {"final": failed}}]) == expected  # any node's copy
    assert first_failure([{"node": {}, "run": failed}, None]) == expected  # node 0's, while it tears down
    lost = {"first_failure_node_rank": 1, "first_failure_host": "node2", "first_failure": None, "reason": "lost"}
    assert first_failure([{"node": {}, "run": lost}]) == {"node_rank": 1, "host": "node2", "reason": "lost"}
    assert first_failure([{"node": {}, "run": {"state": "running", "first_failure_node_rank": None}}, None]) is None
    assert first_failure([None, None]) is None
