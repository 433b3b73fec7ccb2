"""The recovery policy on values: what follows a failed attempt, who is blamed from how the
nodes ended, checkpoints and their progress, the attempt's line; and its flags' checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from fstrain.core.launch.blame import Verdict
from fstrain.core.launch.recovery import (
    Attempt,
    Checkpoints,
    Policy,
    attempt_banner,
    checkpoint_step,
    decide,
    describe_attempt,
    steps_lost,
)
from fstrain.errors import InputError
from fstrain.io.launch import NodeState
from tests.helpers import run_fstrain

HOSTS = ("n1", "n2", "n3", "n4")
LOST_N3 = Verdict("hardware", ("n3",), "n3 stopped answering")


def test_stop_never_restarts() -> None:
    assert decide(Policy(), 0, HOSTS, (), LOST_N3).action == "stop"


def test_restart_keeps_the_hosts_and_exclude_takes_the_suspect_out() -> None:
    restarted = decide(Policy("restart", 2), 0, HOSTS, (), LOST_N3)
    assert (restarted.action, restarted.hosts, restarted.excluded) == ("restart", HOSTS, ())
    excluded = decide(Policy("exclude", 2), 0, HOSTS, (), LOST_N3, ("n3",))
    assert (excluded.action, excluded.hosts, excluded.excluded) == ("restart", ("n1", "n2", "n4"), ("n3",))
    cleared = decide(Policy("exclude", 2), 0, HOSTS, (), LOST_N3, ())  # the tests found nothing against n3
    assert (cleared.hosts, cleared.excluded) == (HOSTS, ()) and "no host found guilty" in cleared.why


def test_a_spare_takes_the_excluded_hosts_place_and_rank() -> None:
    chosen = decide(Policy("exclude", 2), 0, HOSTS, ("s1", "s2"), LOST_N3, ("n3",))
    assert chosen.hosts == ("n1", "n2", "s1", "n4") and chosen.spares_used == ("s1",)


def test_an_application_error_is_never_restarted() -> None:
    chosen = decide(Policy("exclude", 5), 0, HOSTS, (), Verdict("application", (), "every rank exited 1"))
    assert chosen.action == "stop" and "no restart" in chosen.why


def test_budget_and_min_nodes_end_the_run() -> None:
    spent = decide(Policy("restart", 1), 1, HOSTS, (), LOST_N3)
    assert spent.action == "stop" and "restart budget is spent (1 of --max-restarts 1)" in spent.why
    small = decide(Policy("exclude", 3, min_nodes=4), 0, HOSTS, (), LOST_N3, ("n3",))
    assert small.action == "stop" and "3 nodes left after excluding n3, fewer than --min-nodes 4" in small.why


def test_policy_values_are_checked() -> None:
    with pytest.raises(InputError, match="--on-failure must be one of stop, restart, exclude"):
        Policy("retry")
    with pytest.raises(InputError, match="--min-nodes >= 1"):
        Policy("exclude", 1, 0)


def test_checkpoints_and_progress() -> None:
    assert checkpoint_step(["step_0000003", "step_0000012", "latest", "step_0000006.tmp"]) == 12
    assert checkpoint_step([]) is None
    # transformers', torchtitan's, DeepSpeed's, Megatron-LM's, Lightning's names for step 40
    for names in (["checkpoint-20", "checkpoint-40", "runs", "tmp-checkpoint-60"], ["step-40", "step-20"],
                  ["global_step40", "latest", "zero_to_fp32.py"], ["iter_0000040", "latest_checkpointed_iteration.txt"],
                  ["epoch=0-step=20.ckpt", "epoch=1-step=40.ckpt", "last.ckpt"]):
        assert checkpoint_step(names) == 40, names
    assert checkpoint_step(["checkpoint_3", "step=4.tmp"]) is None  # Accelerate's count of saves is no step
    assert Checkpoints(6).newer_than(Checkpoints(3)) and not Checkpoints(3).newer_than(Checkpoints(3))
    assert Checkpoints(None, 20.0).newer_than(Checkpoints(None, 10.0))
    assert not Checkpoints().newer_than(Checkpoints())
    assert steps_lost(8, 6) == 2 and steps_lost(2, None) == 2 and steps_lost(None, 6) is None


def test_attempt_lines() -> None:
    assert attempt_banner(2, ["n1", "n2"]) == "==== attempt 2 (hosts n1,n2) ===="
    attempt = Attempt(1, HOSTS, 0.0, 5.0, 255, "lost", verdict=LOST_N3, excluded=("n3",), next_action="restart",
                      last_checkpoint=6, steps_lost=2)
    line = describe_attempt(attempt.to_dict())
    assert line == ("attempt 1: n1,n2,n3,n4; lost (exit 255); verdict hardware: n3 stopped answering; excluded n3; "
                    "last checkpoint step 6; 2 steps lost; then restarted")


def test_detached_recovery_is_accepted_and_stays_refused_inside_an_allocation() -> None:
    result = run_fstrain("launch", "--dry-run", "--hosts", "a,b", "--nproc-per-node", "1", "--detach",
                         "--on-failure", "restart", "--", "python3", "t.py")
    assert result.returncode == 0, result.stderr
    inside = run_fstrain("launch", "--detach", "--on-failure", "exclude", "--", "true",
                         env={"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_NNODES": "2"})
    assert inside.returncode == 2 and inside.stderr.count("\n") == 1
    assert "--detach cannot outlive the terminal inside a Slurm allocation" in inside.stderr


def test_unknown_policy_is_one_line() -> None:
    result = run_fstrain("launch", "--dry-run", "--hosts", "a,b", "--on-failure", "retry", "--", "python3", "t.py")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "--on-failure must be one of stop, restart, exclude" in result.stderr


def test_recovery_keeps_torchrun_static_and_dry_run_shows_it() -> None:
    result = run_fstrain("launch", "--dry-run", "--hosts", "a,b", "--nproc-per-node", "1", "--on-failure", "restart",
                         "--max-restarts", "3",
                         "--", "python3", "t.py")
    assert result.returncode == 0, result.stderr
    assert "--max-restarts 0" in result.stdout or "--max-restarts=0" in result.stdout


def test_last_step_reads_the_attempts_part_of_each_log(tmp_path: Path) -> None:
    from fstrain.api.driver import last_step

    log = tmp_path / "node1.log"
    log.write_text("[node1 r0] [fstrain.train] step 9/20 loss 2.0000 lr 1e-3 tokens/s 100\n==== attempt 2 ====\n")
    offset = log.stat().st_size
    with log.open("a") as handle:
        handle.write("[node1 r0] [fstrain.train] step 4/20 loss 3.0000 lr 1e-3 tokens/s 100\n")
        handle.write('[node1 r1] FSTRAIN_METRICS {"step": 5}\n[node1 r0] Traceback (most recent call last):\n')
    assert last_step(tmp_path, {"node1.log": offset}) == 5
    assert last_step(tmp_path, {"node1.log": 0}) == 9
    assert last_step(tmp_path, {"gone.log": 0}) is None


def _node(name: str, rank: int, exit_code: int | None, lines: list[str], own: bool = False,
          error: str | None = None) -> NodeState:
    from fstrain.core.hosts.hostfile import Host
    from fstrain.core.job.spec import NodeLaunch
    from fstrain.core.monitor.rankexit import RankFailure

    launch = NodeLaunch(Host(name), rank, 1, ("python3", "t.py"), rank_offset=rank)
    failure = RankFailure(rank, 0, exit_code, name) if own and exit_code is not None else None
    return NodeState(launch, exit_code=exit_code, error=error, failure=failure,
                     rank_tails={0: [f"[{name} r{rank}] {line}" for line in lines]})


TRACEBACK = ["step 3", "Traceback (most recent call last):", '  File "t.py", line 3, in <module>',
             "ValueError: bad batch 3"]


def test_evidence_keeps_the_tracebacks_of_torn_down_ranks_and_leaves_their_signals_out() -> None:
    from fstrain.api.driver import attempt_evidence
    from fstrain.core.launch.blame import blame
    from fstrain.io.launch import RunOutcome

    nodes = [_node("n1", 0, 1, TRACEBACK, own=True), _node("n2", 1, 143, TRACEBACK), _node("n3", 2, 137, ["step 3"])]
    evidence = attempt_evidence(RunOutcome(1, "failed", 0, nodes, 0.0, 1.0))
    assert [end.host for end in evidence.failed] == ["n1", "n2"] and evidence.first_failure_host == "n1"
    assert blame(evidence).kind == "application"
    lost = [_node("n1", 0, 143, ["step 3"]), _node("n2", 1, None, ["step 3"], error="no answer for 4 s")]
    evidence = attempt_evidence(RunOutcome(255, "lost", 1, lost, 0.0, 1.0))
    assert evidence.lost_hosts == ("n2",) and [end.host for end in evidence.failed] == ["n2"]
    verdict = blame(evidence)
    assert (verdict.kind, verdict.suspects) == ("hardware", ("n2",))


def test_a_slurm_batch_jobs_launch_gets_the_recovery_options(tmp_path: Path) -> None:
    result = run_fstrain("launch", "--slurm-render-only", "--nodes", "2", "--on-failure", "exclude", "--max-restarts",
                         "2", "--min-nodes", "1", "--run-dir", str(tmp_path / "run"), "--", "python3", "t.py")
    assert result.returncode == 0, result.stderr
    script = (tmp_path / "run" / "sbatch.sh").read_text()
    assert "--max-restarts 2 --on-failure exclude --min-nodes 1" in script
    # A node that fails must leave the others to the next attempt: Slurm would end the whole job.
    assert "#SBATCH --no-kill " in script
    plain = run_fstrain("launch", "--slurm-render-only", "--nodes", "2", "--run-dir", str(tmp_path / "plain"), "--",
                        "python3", "t.py")
    assert plain.returncode == 0, plain.stderr
    assert "--no-kill" not in (tmp_path / "plain" / "sbatch.sh").read_text()
