"""The recovery loop for real (docs/recovery.md): a node lost mid-run is excluded and the run
resumes from its last checkpoint on the others; a failure on one host is restarted; an error on
every rank ends the run at once; the budget and --min-nodes bound it. Every rank's lines arrive
once per attempt, and nothing is left running.

The ranks run tests/cluster/programs/recovering.py: steps and checkpoints without torch, so
each test takes seconds plus the launcher's start-up per attempt.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from tests.cluster.launch_helpers import LaunchProcess, assert_no_job_processes, start_launch
from tests.conftest import NamespaceCluster
from tests.helpers import REPO, run_fstrain

pytestmark = pytest.mark.cluster
PROGRAM = str(REPO / "tests" / "cluster" / "programs" / "recovering.py")
GRACE_S = 3
LINE = re.compile(r"^\[(node\d) r(\d)\] line rank=(\d) attempt=(\d) step=(\d+)$")
LOSS = re.compile(r"^\[node\d r\d\] \[fstrain\.train\] step (\d+)/\d+ loss ([0-9.]+) ")


def recovering(tmp_path: Path, hosts: str, *options: str, program: tuple[str, ...] = ()) -> list[str]:
    """``hosts``: a host list, or a hostfile's path. The ranks start with fstrain's own starter
    unless ``options`` name a backend (the program uses nothing of torchrun, which imports torch
    on every node)."""
    where = ["--hostfile", hosts] if "/" in hosts else ["--hosts", hosts]
    backend = [] if "--backend" in options else ["--backend", "direct"]
    return [*where, "--nproc-per-node", "1", "--grace", str(GRACE_S), "--heartbeat-timeout", "4",
            "--run-dir", str(tmp_path / "run"), *backend, *options, "--", "python3", PROGRAM, *program]


def manifest(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / "manifest.json").read_text())


def lose_node(cluster: NamespaceCluster, launch: LaunchProcess, index: int, after: str) -> int:
    """Once ``after`` shows, host ``index`` dies (its sshd and sessions); the launch's exit code."""
    launch.wait_for(after, timeout=300)  # a DeepSpeed run may first wait for its CPU ops to compile
    cluster.script("stop-sshd", str(index))
    try:
        return launch.finish(timeout=150)
    finally:
        cluster.script("start-sshd", str(index))


def step_lines(stdout: list[str]) -> dict[tuple[int, int], list[int]]:
    """Per (rank, attempt), the steps whose line reached the terminal, in order."""
    found: dict[tuple[int, int], list[int]] = {}
    for line in stdout:
        match = LINE.match(line.rstrip("\n"))
        if match:
            assert match.group(2) == match.group(3)
            found.setdefault((int(match.group(3)), int(match.group(4))), []).append(int(match.group(5)))
    return found


def test_lost_node_is_excluded_and_the_run_resumes_on_the_rest(cluster: NamespaceCluster, tmp_path: Path) -> None:
    launch = start_launch(cluster, *recovering(tmp_path, "node[1-4]", "--on-failure", "exclude", "--max-restarts",
                                               "2", program=("--steps", "14", "--checkpoint-every", "3")))
    code = lose_node(cluster, launch, 4, "] line rank=0 attempt=0 step=5")
    assert code == 0, launch.err
    first, second = manifest(tmp_path)["attempts"]
    assert first["hosts"] == ["node1", "node2", "node3", "node4"] and first["exit_code"] == 255
    assert first["verdict"]["kind"] == "hardware" and first["verdict"]["suspects"] == ["node4"]
    assert first["excluded"] == ["node4"] and first["next"] == "restart"
    assert first["tested"]["node4"].startswith("ssh.connect") and first["tested"]["node1"] == "nothing found"
    assert first["last_checkpoint_step"] is not None and first["last_checkpoint_step"] >= 3
    assert second["hosts"] == ["node1", "node2", "node3"] and second["exit_code"] == 0
    assert second["resumed_from_step"] == first["last_checkpoint_step"] and second["progress"] is True
    assert second["recover_s"] > 0 and first["steps_lost"] >= 0
    lines = step_lines(launch.stdout)
    resumed_step = first["last_checkpoint_step"]
    # The new world: three ranks, from the checkpoint to the last step, every line once.
    assert lines[(0, 1)] == lines[(1, 1)] == lines[(2, 1)] == list(range(resumed_step + 1, 15))
    assert (3, 1) not in lines
    assert lines[(0, 0)][:5] == [1, 2, 3, 4, 5]
    assert "world=3" in "".join(line for line in launch.stdout if "attempt=1 host=" in line)
    log = (tmp_path / "run" / "logs" / "node1.log").read_text()
    assert "==== attempt 1 (hosts node1,node2,node3,node4) ====" in log
    assert "==== attempt 2 (hosts node1,node2,node3) ====" in log
    assert "attempt 2 on 3 nodes (node1, node2, node3)" in launch.err
    # The launch wrote each decision to the run's events as it took it.
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [(e["kind"], e["attempt"]) for e in events] == [
        ("started", 1), ("first_step", 1), ("failure", 1), ("blame", 1), ("excluded", 1), ("attempt", 2),
        ("resumed", 2), ("first_step", 2), ("finished", 2)], events
    started, stepped, failure, blamed, excluded, attempt, resumed, stepped_again, finished = events
    assert started["hosts"] == ["node1", "node2", "node3", "node4"] and stepped["step"] == 1
    assert (failure["host"], failure["exit_code"]) == ("node4", 255)
    assert (blamed["verdict"], blamed["suspects"]) == ("hardware", ["node4"])
    assert blamed["tested"]["node4"].startswith("ssh.connect") and blamed["evidence"] == first["verdict"]["why"]
    assert excluded["host"] == "node4" and attempt["hosts"] == ["node1", "node2", "node3"]
    assert resumed["step"] == resumed_step == second["resumed_from_step"]
    assert stepped_again["step"] > resumed["step"]
    assert (finished["state"], finished["exit_code"]) == ("succeeded", 0)
    assert [e["time"] for e in events] == sorted(e["time"] for e in events)
    assert_no_job_processes(cluster, GRACE_S + 8)


def test_restart_resumes_the_same_hosts(cluster: NamespaceCluster, tmp_path: Path) -> None:
    launch = start_launch(cluster, *recovering(
        tmp_path, "node[1-2]", "--on-failure", "restart", "--max-restarts", "1",
        program=("--steps", "8", "--exit-at-step", "4", "--exit-host", "node2", "--first-attempt-only")))
    code = launch.finish(timeout=120)
    assert code == 0, launch.err
    first, second = manifest(tmp_path)["attempts"]
    assert first["exit_code"] == 3 and first["verdict"]["kind"] != "application" and first["next"] == "restart"
    assert first["excluded"] == [] and second["hosts"] == ["node1", "node2"]
    resumed = first["last_checkpoint_step"]
    assert resumed in (3, 6) and second["resumed_from_step"] == resumed  # node1 may reach 6 while stopping
    assert first["steps_lost"] >= 0
    lines = step_lines(launch.stdout)
    assert lines[(0, 1)] == lines[(1, 1)] == list(range(resumed + 1, 9))
    assert lines[(1, 0)] == [1, 2, 3]
    counts = Counter(line for line in launch.stdout if "attempt=1" in line and "] done rank=" in line)
    assert sorted(counts.values()) == [1, 1]
    run_id = manifest(tmp_path)["run_id"]
    status = json.loads(run_fstrain("status", run_id, "--json").stdout)
    assert [a["attempt"] for a in status["attempts"]] == [1, 2] and status["state"] == "succeeded"
    logs = run_fstrain("logs", run_id).stdout
    assert logs.count("==== attempt 2 (hosts node1,node2) ====") == 2  # one in each host's log
    assert step_lines(logs.splitlines()) == lines  # the logs hold every line the terminal showed
    assert_no_job_processes(cluster, GRACE_S + 8)


def test_error_on_every_rank_ends_the_run_without_a_restart(cluster: NamespaceCluster, tmp_path: Path) -> None:
    launch = start_launch(cluster, *recovering(tmp_path, "node[1-2]", "--on-failure", "exclude", "--max-restarts",
                                               "3", program=("--raise-at-step", "3")))
    code = launch.finish(timeout=120)
    assert code == 1, launch.err
    (only,) = manifest(tmp_path)["attempts"]
    assert only["verdict"]["kind"] == "application" and only["next"] == "stop"
    assert "no restart" in only["next_why"]
    assert "RuntimeError: rank" in launch.out
    assert_no_job_processes(cluster, GRACE_S + 8)


def test_budget_spent_ends_with_the_failing_ranks_code(cluster: NamespaceCluster, tmp_path: Path) -> None:
    launch = start_launch(cluster, *recovering(
        tmp_path, "node[1-2]", "--on-failure", "restart", "--max-restarts", "1",
        program=("--exit-at-step", "2", "--exit-host", "node2", "--checkpoint-every", "100")))
    code = launch.finish(timeout=120)
    assert code == 3, launch.err
    document = manifest(tmp_path)
    attempts = document["attempts"]
    assert [a["exit_code"] for a in attempts] == [3, 3]
    assert attempts[1]["next"] == "stop" and "restart budget is spent" in attempts[1]["next_why"]
    assert attempts[1]["progress"] is False  # no checkpoint at all: restarting gained nothing
    assert document["exit_code"] == 3 and document["ended"]
    assert_no_job_processes(cluster, GRACE_S + 8)


def test_min_nodes_stops_the_shrinking(cluster: NamespaceCluster, tmp_path: Path) -> None:
    launch = start_launch(cluster, *recovering(tmp_path, "node[1-3]", "--on-failure", "exclude", "--max-restarts",
                                               "2", "--min-nodes", "3", program=("--steps", "30")))
    code = lose_node(cluster, launch, 3, "] line rank=0 attempt=0 step=2")
    assert code == 255, launch.err
    (only,) = manifest(tmp_path)["attempts"]
    assert only["verdict"]["kind"] == "hardware" and "node3" in only["tested"]
    assert only["next"] == "stop" and "2 nodes left after excluding node3, fewer than --min-nodes 3" in only["next_why"]
    assert "fewer than --min-nodes 3" in launch.err
    assert_no_job_processes(cluster, GRACE_S + 8)


def test_a_hung_rank_is_found_stalled_and_the_run_restarts(cluster: NamespaceCluster, tmp_path: Path) -> None:
    # torchrun: its agents wait in their exit barrier after the ranks end, which no stall clock counts
    launch = start_launch(cluster, *recovering(
        tmp_path, "node[1-2]", "--backend", "torchrun", "--on-failure", "restart", "--max-restarts", "1",
        "--stall-timeout", "8s",
        program=("--steps", "8", "--hang-at-step", "3", "--exit-host", "node2", "--first-attempt-only")))
    code = launch.finish(timeout=150)
    assert code == 0, launch.err
    first, second = manifest(tmp_path)["attempts"]
    assert first["exit_code"] == 124 and first["reason"] == "stalled" and first["next"] == "restart"
    assert first["verdict"]["why"].startswith("the run stalled, but its stacks show no host's rank behind")
    assert second["exit_code"] == 0 and second["hosts"] == ["node1", "node2"]
    assert (tmp_path / "run" / "stacks").is_dir()
    assert_no_job_processes(cluster, GRACE_S + 8)


def test_a_spare_takes_the_lost_hosts_place_and_the_world_keeps_its_size(cluster: NamespaceCluster,
                                                                        tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=1\nnode2 slots=1\nnode3 slots=1 spare=true\n")
    launch = start_launch(cluster, *recovering(tmp_path, str(hostfile), "--on-failure", "exclude", "--max-restarts",
                                               "1", program=("--steps", "10")))
    code = lose_node(cluster, launch, 2, "] line rank=0 attempt=0 step=4")
    assert code == 0, launch.err
    first, second = manifest(tmp_path)["attempts"]
    assert first["hosts"] == ["node1", "node2"] and first["excluded"] == ["node2"]
    assert first["spares_used"] == ["node3"] and second["hosts"] == ["node1", "node3"]
    assert "world=2" in "".join(line for line in launch.stdout if "attempt=1 host=node3" in line)
    assert_no_job_processes(cluster, GRACE_S + 8)


def test_the_bundled_trainer_resumes_resharded_with_the_same_loss(cluster: NamespaceCluster, tmp_path: Path) -> None:
    """4 nodes -> 3, re-planned for the same global batch: the loss of the first step after the
    resumed checkpoint is the one the first attempt logged for that step (same model, same data).
    FSDP2's checkpoint reshards through DCP; DeepSpeed's universal checkpoint reshards the same way
    in tests/train/test_recovery_resume.py (2 ranks -> 1, ZeRO-2 and ZeRO-3)."""
    # Checkpoints at steps 4 and 8 and node4 lost once step 5 shows: the ranks would have to run
    # three steps past what the terminal showed before the next save. With a save every 2 steps, a
    # loaded run saved step 6 and lost node4 before step 7's line, leaving nothing to compare.
    launch = start_launch(cluster, "--hosts", "node[1-4]", "--nproc-per-node", "1", "--model", "tiny",
                          "--micro-batch", "3", "--precision", "fp32", "--steps", "10", "--checkpoint-interval", "4",
                          "--on-failure", "exclude", "--max-restarts", "1", "--heartbeat-timeout", "4",
                          "--grace", str(GRACE_S),
                          "--run-dir", str(tmp_path / "run"))
    code = lose_node(cluster, launch, 4, "[fstrain.train] step 5/10 loss")
    assert code == 0, launch.err
    first, second = manifest(tmp_path)["attempts"]
    assert first["excluded"] == ["node4"] and second["hosts"] == ["node1", "node2", "node3"]
    assert "the global batch of 12 sequences is kept" in second["replanned"], second["replanned"]
    resumed = second["resumed_from_step"]
    assert resumed == first["last_checkpoint_step"] and resumed >= 4
    banner = next(i for i, line in enumerate(launch.stdout) if line.startswith("==== attempt 2 "))
    losses = [{int(m.group(1)): float(m.group(2)) for m in map(LOSS.match, part) if m}
              for part in (launch.stdout[:banner], launch.stdout[banner:])]
    assert resumed + 1 in losses[0], (resumed, losses)
    assert min(losses[1]) == resumed + 1 and max(losses[1]) == 10
    assert abs(losses[1][resumed + 1] - losses[0][resumed + 1]) < 1e-3, (resumed, losses)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 3 and summary["start_step"] == resumed
    assert_no_job_processes(cluster, GRACE_S + 8)


def test_restart_of_a_lost_host_cannot_start_and_ends_with_the_record(cluster: NamespaceCluster,
                                                                     tmp_path: Path) -> None:
    launch = start_launch(cluster, *recovering(tmp_path, "node[1-2]", "--on-failure", "restart", "--max-restarts",
                                               "2", program=("--steps", "30")))
    code = lose_node(cluster, launch, 2, "] line rank=0 attempt=0 step=2")
    assert code == 255, launch.err
    (only,) = manifest(tmp_path)["attempts"]
    assert only["next"] == "stop"
    assert only["next_why"].startswith("attempt 2 could not start: preflight failed on node2")
    assert "attempt 2 could not start" in launch.err
    assert manifest(tmp_path)["ended"] and manifest(tmp_path)["exit_code"] == 255
    assert_no_job_processes(cluster, GRACE_S + 8)
