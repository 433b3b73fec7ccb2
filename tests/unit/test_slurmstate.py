"""A Slurm run's state as values: Slurm's JobState (real scontrol output) and the run's manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fstrain.core.runs.manifest import Manifest
from fstrain.core.slurm.job import JobStatus, parse_run_time_s, parse_scontrol_job
from fstrain.core.slurm.state import slurm_run_state
from tests.helpers import manifest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm-runs"


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.stem)
def test_captured_scontrol_output_maps_to_the_run_state(path: Path) -> None:
    case = json.loads(path.read_text())
    recorded = manifest(**case["manifest"]) if case["manifest"] else None
    state = slurm_run_state(parse_scontrol_job(case["output"]), recorded, stop_requested=case["stop_requested"])
    assert {"state": state.state, "exit_code": state.exit_code} == case["expected"]


def test_captured_output_gives_nodes_run_time_and_reason() -> None:
    running = parse_scontrol_job(json.loads((FIXTURES / "running.json").read_text())["output"])
    assert (running.nodes, running.num_nodes, running.run_time_s) == ("node[1-2]", 2, 3)
    pending = parse_scontrol_job(json.loads((FIXTURES / "pending-begintime.json").read_text())["output"])
    assert (pending.nodes, pending.reason) == ("", "BeginTime")
    assert slurm_run_state(pending, None).reason == "waiting in Slurm's queue (BeginTime)"
    timeout = parse_scontrol_job(json.loads((FIXTURES / "timeout.json").read_text())["output"])
    assert timeout.run_time_s == 87 and "time limit" in slurm_run_state(timeout, None).reason


def job(state: str, exit_code: int = 0, signal: int = 0) -> JobStatus:
    return JobStatus("42", state, exit_code, signal)


ENDED_OK = {"started": 100.0, "ended": 160.0, "reason": "ok", "exit_code": 0}


def ended_ok(**changes: object) -> Manifest:
    return manifest(**{**ENDED_OK, **changes})


def test_a_job_slurm_forgot_takes_its_end_from_the_manifest_or_is_lost() -> None:
    state = slurm_run_state(None, ended_ok())
    assert (state.state, state.exit_code, state.ended) == ("succeeded", 0, 160.0)
    failed = slurm_run_state(None, ended_ok(reason="failed", exit_code=7))
    assert (failed.state, failed.exit_code) == ("failed", 7)
    lost = slurm_run_state(None, None)
    assert lost.state == "lost" and "no final manifest" in lost.reason
    # A manifest the launcher wrote at the start (no end yet) does not decide.
    assert slurm_run_state(None, manifest(started=100.0, ended=None)).state == "lost"
    stopped = slurm_run_state(None, ended_ok(reason="terminated", exit_code=143), stop_requested=True)
    assert (stopped.state, stopped.exit_code, stopped.reason) == ("stopped", 143, "fstrain stop")


@pytest.mark.parametrize(("slurm", "state"), [
    ("PENDING", "pending"), ("REQUEUED", "pending"), ("CONFIGURING", "starting"), ("RUNNING", "running"),
    ("COMPLETING", "running"), ("SUSPENDED", "running"), ("NODE_FAIL", "failed"), ("OUT_OF_MEMORY", "failed"),
    ("PREEMPTED", "stopped"), ("BOOT_FAIL", "failed"), ("DEADLINE", "failed"),
])
def test_each_slurm_state_has_its_run_state(slurm: str, state: str) -> None:
    assert slurm_run_state(job(slurm), None).state == state


def test_the_manifest_refines_the_end_slurm_reports() -> None:
    stalled = slurm_run_state(job("FAILED", 124), ended_ok(reason="stalled", exit_code=124))
    assert (stalled.state, stalled.exit_code, stalled.ended) == ("stalled", 124, 160.0)
    # Slurm's code is the script's; the manifest names the failing rank's own.
    failed = slurm_run_state(job("FAILED", 1), ended_ok(reason="failed", exit_code=139))
    assert (failed.state, failed.exit_code) == ("failed", 139)
    # The time limit's early warning: fstrain stopped it, Slurm says FAILED 143.
    warned = slurm_run_state(job("FAILED", 143), ended_ok(reason="terminated", exit_code=143))
    assert (warned.state, warned.exit_code, warned.reason) == ("failed", 143, "terminated")
    # Slurm's success stands, with the end time from the manifest.
    done = slurm_run_state(job("COMPLETED"), ended_ok())
    assert (done.state, done.exit_code, done.ended) == ("succeeded", 0, 160.0)


def test_stop_requested_marks_only_an_ended_run_stopped() -> None:
    assert slurm_run_state(job("RUNNING"), None, stop_requested=True).state == "running"
    killed = slurm_run_state(job("FAILED", 0, 9), None, stop_requested=True)
    assert (killed.state, killed.exit_code) == ("stopped", 137)


def test_an_unknown_slurm_state_follows_whether_slurm_calls_it_final() -> None:
    assert slurm_run_state(job("SOMETHING_NEW"), None).state == "running"
    assert slurm_run_state(job("REVOKED"), None).state == "stopped"
    assert slurm_run_state(job("SPECIAL_EXIT", 3), None).state == "failed"


@pytest.mark.parametrize(("text", "seconds"), [
    ("00:00:03", 3), ("01:02:03", 3723), ("2-00:00:01", 172801), ("05:07", 307), ("Unknown", None), ("", None),
    ("1-x:00:00", None), ("1:2:3:4", None),
])
def test_run_time(text: str, seconds: int | None) -> None:
    assert parse_run_time_s(text) == seconds
