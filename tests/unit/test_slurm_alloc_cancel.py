"""A run inside a Slurm job that Slurm cancels, without a Slurm: how fstrain tells (slurmstepd's
line, the job's state) and the verdict it gives."""

from __future__ import annotations

import pytest

from fstrain.core.launch.runstate import from_manifest
from fstrain.core.launch.supervisor import EXIT_SIGTERM, GIVE_UP, TEARDOWN, Decision, Limits, Supervisor
from fstrain.core.slurm.job import CANCELLED_BY_SLURM, JobStatus, ended_by_slurm, slurm_cancel_reason

# -- a run that Slurm cancels -------------------------------------------------------------------

@pytest.mark.parametrize(("line", "reason"), [
    ("slurmstepd-node1: error: *** STEP 10.5 ON node1 CANCELLED AT 2026-12-01T18:14:10 ***", CANCELLED_BY_SLURM),
    ("slurmstepd: error: *** JOB 77 ON gpu07 CANCELLED AT 2026-12-01T18:14:10 ***", CANCELLED_BY_SLURM),
    ("slurmstepd: error: *** JOB 77 ON gpu07 CANCELLED AT 2026-12-01T18:14:10 DUE TO TIME LIMIT ***",
     "cancelled by Slurm (time limit)"),
    ("slurmstepd: error: *** STEP 77.1 ON gpu07 CANCELLED AT 2026-12-01T18:14:10 DUE to JOB REQUEUE ***",
     "cancelled by Slurm (job requeue)"),
    ("[fstrain.train] step 3 loss 2.1 *** CANCELLED AT ***", None),  # a rank's own text
    ("srun: error: node1: task 0: Exited with exit code 1", None),
])
def test_slurmstepds_cancel_line_names_the_reason(line: str, reason: str | None) -> None:
    assert slurm_cancel_reason(line) == reason


@pytest.mark.parametrize(("state", "reason"), [
    ("CANCELLED", CANCELLED_BY_SLURM),
    ("COMPLETING", "stopped by Slurm (job 14 is ending)"),  # scancel, while the job's processes end
    ("RUNNING", None), ("COMPLETED", None), ("FAILED", None),
])
def test_the_jobs_state_says_whether_slurm_ended_it(state: str, reason: str | None) -> None:
    assert ended_by_slurm(JobStatus("14", state, 0, 0)) == reason
    assert ended_by_slurm(None) is None


def test_a_cancel_while_nodes_fail_is_the_verdict_not_a_node_failure() -> None:
    """Slurm SIGTERMs every node's processes: the nodes end (any code) and the run's verdict is
    Slurm's; nothing more is sent to the nodes (no second SIGTERM), and no node is blamed."""
    run = Supervisor(("node1", "node2"), Limits(grace_s=5), now_s=100.0)
    assert run.node_exited(1, 1, 101.0) == [Decision(TEARDOWN, (0,))]  # node2's step ended first
    run.ended_outside("cancelled", CANCELLED_BY_SLURM, EXIT_SIGTERM, 101.1)
    assert run.node_exited(0, 143, 101.2) == []
    assert run.ended and run.first_failure is None
    assert run.verdict() == ("cancelled", EXIT_SIGTERM, CANCELLED_BY_SLURM)
    # Before any node ended: the stop starts the straggler clock, and decides nothing itself.
    quiet = Supervisor(("node1", "node2"), Limits(grace_s=5, straggler_margin_s=1), now_s=100.0)
    quiet.ended_outside("cancelled", CANCELLED_BY_SLURM, EXIT_SIGTERM, 100.0)
    assert quiet.tick(103.0) == []
    assert quiet.tick(106.5) == [Decision(GIVE_UP, (0, 1))]


def test_a_cancelled_run_is_stopped_in_the_run_list() -> None:
    state = from_manifest({"reason": "cancelled", "exit_code": 143, "detail": CANCELLED_BY_SLURM})
    assert (state.state, state.exit_code) == ("stopped", 143)
