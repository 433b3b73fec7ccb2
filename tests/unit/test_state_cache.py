"""RUN_DIR/state.json: one typed record for every kind of run, read back as written, and the
two shapes written before it (detached, Slurm) read as the same record."""

from __future__ import annotations

from pathlib import Path

from fstrain.core.runs.runrecord import StateCache
from fstrain.core.runs.runstate import RunState
from fstrain.io.runs import read_state_cache, write_state_cache


def test_each_kind_of_run_reads_back_what_it_wrote(tmp_path: Path) -> None:
    detached = StateCache("failed", 7, "rank 3 (local rank 1) on node2 exited with 7", 120.0, 121.0,
                          first_failure={"rank": 3, "host": "node2"}, nodes=({"node_rank": 0, "reachable": True},))
    slurm = StateCache("stopped", 143, "cancelled by Slurm (scancel)", 130.0, 131.0,
                       job={"job_id": "14", "state": "CANCELLED", "hosts": ["node1"]}, settled=True,
                       stop_requested=True)
    for cache in (detached, slurm):
        write_state_cache(tmp_path / "state.json", cache)
        assert read_state_cache(tmp_path / "state.json") == cache
    assert slurm.run_state() == RunState("stopped", 143, "cancelled by Slurm (scancel)", 130.0)


def test_the_two_older_shapes_read_as_one_record() -> None:
    old_detached = {"format": 1, "state": "running", "exit_code": None, "reason": "", "ended": None, "at": 5.0,
                    "first_failure": None, "nodes": [{"node_rank": 0}, "junk"]}
    old_slurm = {"format": 1, "state": "succeeded", "exit_code": 0, "reason": "", "ended": 9.0, "at": 9.5,
                 "settled": True, "stop_requested": False, "job": {"job_id": "3"}}
    assert StateCache.from_dict(old_detached) == StateCache("running", at=5.0, nodes=({"node_rank": 0},))
    assert StateCache.from_dict(old_slurm) == StateCache("succeeded", 0, "", 9.0, 9.5, job={"job_id": "3"},
                                                         settled=True)


def test_an_unreadable_cache_is_none(tmp_path: Path) -> None:
    assert read_state_cache(tmp_path / "missing.json") is None
    (tmp_path / "cut.json").write_text('{"state": "runn')
    assert read_state_cache(tmp_path / "cut.json") is None
    assert StateCache.from_dict({"format": 99, "state": "running"}) is None  # a newer fstrain's
    assert StateCache.from_dict({"format": 1, "state": "running", "exit_code": "seven"}) is None
    assert StateCache.from_dict(["state"]) is None
