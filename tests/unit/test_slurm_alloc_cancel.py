"""A run inside a Slurm job that Slurm cancels, without a Slurm: how fstrain tells (slurmstepd's
line, the job's state) and the verdict it gives."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

import pytest

from fstrain.core.hosts.hostfile import Host
from fstrain.core.job.spec import NodeLaunch
from fstrain.core.launch.supervisor import (
    EXIT_SIGTERM,
    FROM_CANCELLED,
    FROM_LINE,
    FROM_RECORD,
    GIVE_UP,
    KILL,
    TEARDOWN,
    Decision,
    Limits,
    Supervisor,
)
from fstrain.core.runs.limits import RunLimits
from fstrain.core.runs.runstate import from_manifest
from fstrain.core.slurm.job import CANCELLED_BY_SLURM, NODE_FAILED, JobStatus, ended_by_slurm, slurm_cancel_reason
from fstrain.io.launch import RunOptions, RunOutcome, run_nodes
from fstrain.io.transport.base import Transport
from fstrain.io.transport.local import LocalRunning, LocalTransport
from tests.helpers import manifest

# -- a run that Slurm cancels -------------------------------------------------------------------

@pytest.mark.parametrize(("line", "reason"), [
    ("slurmstepd-node1: error: *** STEP 10.5 ON node1 CANCELLED AT 2026-12-01T18:14:10 ***", CANCELLED_BY_SLURM),
    ("slurmstepd: error: *** JOB 77 ON gpu07 CANCELLED AT 2026-12-01T18:14:10 ***", CANCELLED_BY_SLURM),
    ("slurmstepd: error: *** JOB 77 ON gpu07 CANCELLED AT 2026-12-01T18:14:10 DUE TO TIME LIMIT ***",
     "cancelled by Slurm (time limit)"),
    ("slurmstepd: error: *** STEP 77.1 ON gpu07 CANCELLED AT 2026-12-01T18:14:10 DUE to JOB REQUEUE ***",
     "cancelled by Slurm (job requeue)"),
    # Seen on the test Slurm: salloc without --no-kill, node3 killed, on node2 after SlurmdTimeout.
    ("slurmstepd-node2: error: *** STEP 1.1 ON node2 CANCELLED AT 2026-12-02T00:52:26 DUE TO NODE FAILURE, SEE "
     "SLURMCTLD LOG FOR DETAILS ***", NODE_FAILED),
    ("[fstrain.train] step 3 loss 2.1 *** CANCELLED AT ***", None),  # a rank's own text
    ("srun: error: node1: task 0: Exited with exit code 1", None),
])
def test_slurmstepds_cancel_line_names_the_reason(line: str, reason: str | None) -> None:
    assert slurm_cancel_reason(line) == reason


@pytest.mark.parametrize(("state", "reason"), [
    ("CANCELLED", CANCELLED_BY_SLURM),
    ("COMPLETING", "stopped by Slurm (job 14 is ending)"),  # scancel, while the job's processes end
    ("NODE_FAIL", NODE_FAILED),  # a node failed, and the job had no --no-kill
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
    run.scheduler_ends(CANCELLED_BY_SLURM, FROM_CANCELLED, 101.1)
    assert run.node_exited(0, 143, 101.2) == []
    assert run.ended and run.first_failure is None
    assert run.verdict() == ("cancelled", EXIT_SIGTERM, CANCELLED_BY_SLURM)
    # Before any node ended: the stop starts the straggler clock, and decides nothing itself.
    quiet = Supervisor(("node1", "node2"), Limits(grace_s=5, straggler_margin_s=1), now_s=100.0)
    quiet.scheduler_ends(CANCELLED_BY_SLURM, FROM_CANCELLED, 100.0)
    assert quiet.tick(103.0) == []
    assert quiet.tick(106.5) == [Decision(GIVE_UP, (0, 1))]


def test_slurms_sigterm_after_its_cancel_line_sends_nothing() -> None:
    """The order seen on the test Slurm (3 of 3 `scancel`s of a batch run): a node prints
    slurmstepd's cancel line before the launcher's own SIGTERM is handled. That SIGTERM is
    Slurm's too: it must not read as a second signal (a SIGKILL to every torchrun, exit 137)."""
    run = Supervisor(("node1", "node2"), Limits(grace_s=15), now_s=100.0)
    run.scheduler_ends(slurm_cancel_reason("slurmstepd-node2: error: *** STEP 1.2 ON node2 CANCELLED AT "
                                           "2026-12-05T03:56:30 ***") or "", FROM_LINE, 100.5)
    assert run.signalled(False, 100.6) == []
    assert run.signalled(False, 101.0) == []  # nor any later SIGTERM while Slurm ends the job
    run.scheduler_ends(CANCELLED_BY_SLURM, FROM_CANCELLED, 101.2)
    assert run.node_exited(0, 1, 102.0) == [] and run.node_exited(1, 1, 102.1) == []
    assert run.verdict() == ("cancelled", EXIT_SIGTERM, CANCELLED_BY_SLURM)
    # Ctrl-C is the user's, Slurm or not: the run is already stopping, so it kills.
    other = Supervisor(("node1",), Limits(), now_s=100.0)
    other.scheduler_ends(CANCELLED_BY_SLURM, FROM_LINE, 100.5)
    assert other.signalled(True, 101.0) == [Decision(KILL, (0,))]


def test_outside_slurm_a_second_sigterm_kills() -> None:
    run = Supervisor(("node1", "node2"), Limits(grace_s=15), now_s=100.0)
    assert run.signalled(False, 101.0) == [Decision(TEARDOWN, (0, 1))]
    assert run.verdict()[:2] == ("terminated", EXIT_SIGTERM)
    assert run.signalled(False, 102.0) == [Decision(KILL, (0, 1))]


@pytest.mark.parametrize(("first", "then", "verdict"), [
    # the record's plain CANCELLED replaces a line's reason; its COMPLETING does not
    (("cancelled by Slurm (time limit)", FROM_LINE), (CANCELLED_BY_SLURM, FROM_CANCELLED), CANCELLED_BY_SLURM),
    (("cancelled by Slurm (time limit)", FROM_LINE), ("stopped by Slurm (job 4 is ending)", FROM_RECORD),
     "cancelled by Slurm (time limit)"),
    ((NODE_FAILED, FROM_RECORD), ("cancelled by Slurm (time limit)", FROM_LINE), "cancelled by Slurm (time limit)"),
])
def test_which_of_slurms_words_is_the_verdict(first: tuple[str, str], then: tuple[str, str], verdict: str) -> None:
    run = Supervisor(("node1",), Limits(), now_s=100.0)
    run.scheduler_ends(*first, 101.0)
    run.scheduler_ends(*then, 102.0)
    assert run.verdict() == ("cancelled", EXIT_SIGTERM, verdict)


def test_a_stop_the_user_asked_keeps_its_verdict_when_slurm_ends_the_job() -> None:
    run = Supervisor(("node1",), Limits(), now_s=100.0)
    run.signalled(True, 101.0)
    run.scheduler_ends(CANCELLED_BY_SLURM, FROM_CANCELLED, 102.0)
    assert run.verdict()[:2] == ("interrupted", 130)


def test_a_cancelled_run_is_stopped_in_the_run_list() -> None:
    state = from_manifest(manifest(reason="cancelled", exit_code=143, detail=CANCELLED_BY_SLURM))
    assert (state.state, state.exit_code) == ("stopped", 143)


class NodeStandIn:
    """A node whose "watchdog" is a script: what a Slurm step's stream shows on scancel."""

    def __init__(self, host: str, script: str) -> None:
        self.host, self.script = host, script

    def start(self, argv: Sequence[str]) -> LocalRunning:
        return LocalTransport(self.host).start([sys.executable, "-c", self.script])

    def close(self) -> None:
        """Nothing to close."""


CANCEL_LINE = "slurmstepd-{host}: error: *** STEP 5.{rank} ON {host} CANCELLED AT 2026-12-01T18:14:10 ***"
# torchrun's code after its SIGTERM; node2's step ends first, as under load.
STEP_ENDS = "import sys, time; time.sleep({delay}); sys.stderr.write({line!r} + '\\n'); sys.exit(1)"


def drive(tmp_path: Path, ended_by_slurm: Callable[[], str | None] | None, line: bool) -> RunOutcome:
    hosts = [Host("node1"), Host("node2")]
    launches = [NodeLaunch(host, rank, 1, ("torchrun",)) for rank, host in enumerate(hosts)]
    scripts = {h.name: STEP_ENDS.format(delay=0.5 + 0.5 * (h.name == "node1"),
                                        line=CANCEL_LINE.format(host=h.name, rank=i) if line else "")
               for i, h in enumerate(hosts)}
    options = RunOptions(run_id="r1", run_dir=tmp_path / "run", limits=RunLimits(grace_s=5), out=io.StringIO(),
                         ended_by_slurm=ended_by_slurm)

    def connect(host: Host) -> Transport:
        return cast("Transport", NodeStandIn(host.name, scripts[host.name]))  # streams only: no `run`

    return run_nodes(launches, connect, "python3", options)


@pytest.mark.parametrize(("inside", "line", "slurm_says", "expected"), [
    (True, True, None, ("cancelled", 143, CANCELLED_BY_SLURM, None)),  # slurmstepd's line on the first node
    (True, False, CANCELLED_BY_SLURM, ("cancelled", 143, CANCELLED_BY_SLURM, None)),  # the job's state at the end
    (True, False, None, ("failed", 1, "the job on node2 exited with 1", 1)),  # Slurm did not end it
    (False, True, None, ("failed", 1, "the job on node2 exited with 1", 1)),  # over SSH the line is only text
])
def test_a_run_that_slurm_cancels_is_reported_as_cancelled(tmp_path: Path, inside: bool, line: bool,
                                                           slurm_says: str | None,
                                                           expected: tuple[str, int, str, int | None]) -> None:
    outcome = drive(tmp_path, (lambda: slurm_says) if inside else None, line)
    assert (outcome.reason, outcome.exit_code, outcome.detail, outcome.first_failure) == expected
    assert [n.exit_code for n in outcome.nodes] == [1, 1]
