"""`launch --slurm` batch jobs as a Slurm admin expects them, as values: nothing left by a refused
sbatch, and a job cancelled while pending, and no `pending (None)`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fstrain.core.slurm.job import (
    JobStatus,
    parse_scontrol_job,
)
from fstrain.core.slurm.state import slurm_run_state
from tests.helpers import REPO, run_fstrain

FIXTURES = REPO / "tests" / "fixtures" / "slurm-runs"
NO_SLURM = {"SLURM_JOB_ID": "", "SLURM_JOB_NODELIST": ""}


# -- a refused sbatch, a job cancelled while pending, the first state ----------------------------


def fake_sbatch(folder: Path) -> dict[str, str]:
    """An sbatch that refuses as Slurm does for a partition that does not exist."""
    folder.mkdir()
    (folder / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: invalid partition specified: nope' >&2\n"
                                   "echo 'sbatch: error: Batch job submission failed: Invalid partition name "
                                   "specified' >&2\nexit 1\n")
    (folder / "sbatch").chmod(0o755)
    return {**NO_SLURM, "PATH": f"{folder}:{Path(sys.executable).parent}:/usr/bin:/bin"}


def test_a_refused_sbatch_leaves_nothing_behind(tmp_path: Path) -> None:
    env = {**fake_sbatch(tmp_path / "bin"), "HOME": str(tmp_path / "home")}
    result = run_fstrain("launch", "--slurm", "--partition", "nope", "--env", "A=1", "--run-dir",
                         str(tmp_path / "run"), "--", "true", env=env)
    assert result.returncode != 0 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: sbatch: sbatch refused the job: Batch job submission failed: "
                                    "Invalid partition name specified")
    assert not (tmp_path / "run").exists()
    assert not (tmp_path / "home" / ".fstrain" / "launched").is_dir() or \
        not list((tmp_path / "home" / ".fstrain" / "launched").iterdir())
    # A folder that was there stays, with what was in it; only what the launch wrote goes.
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    again = run_fstrain("launch", "--slurm", "--partition", "nope", "--run-dir", str(tmp_path / "mine"), "--",
                        "true", env=env)
    assert again.returncode != 0
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


def test_a_job_cancelled_while_pending_has_no_exit_code(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from fstrain.cli.slurm import report_job

    cancelled = parse_scontrol_job(json.loads((FIXTURES / "cancelled-pending.json").read_text())["output"])
    state = slurm_run_state(cancelled, None)
    assert (state.state, state.exit_code, state.reason) == ("stopped", None, "cancelled before it started (CANCELLED)")
    assert report_job(cancelled.job_id, cancelled, tmp_path, json_output=False) == 143
    assert "Slurm job 1: CANCELLED before it started" in capsys.readouterr().err


def test_the_first_state_printed_is_never_pending_none(capsys: pytest.CaptureFixture[str]) -> None:
    from fstrain.cli.slurm import _say_state

    # Right after sbatch, before the scheduler looked at it (Slurm 22.05 on the test cluster).
    fresh = parse_scontrol_job("JobId=9 JobName=x JobState=PENDING Reason=None ExitCode=0:0 RunTime=00:00:00 "
                               "TimeLimit=00:10:00 NodeList=(null) NumNodes=2")
    assert (fresh.reason, fresh.nodes) == ("", "")
    _say_state(fresh)
    _say_state(JobStatus("9", "PENDING", 0, 0, "Priority"))
    assert capsys.readouterr().err.splitlines() == ["Slurm job 9: pending", "Slurm job 9: pending (Priority)"]
