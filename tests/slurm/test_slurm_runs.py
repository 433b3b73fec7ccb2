"""Runs submitted with `launch --slurm --detach` on the real test Slurm, looked at and stopped
from fresh fstrain processes (`runs`, `status`, `logs`, `stop`) as SSH runs are."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO
from tests.slurm.conftest import SlurmCluster
from tests.slurm.test_slurm_launch import assert_nodes_idle, fstrain, scontrol_job

pytestmark = pytest.mark.slurm

GRACE_S = 5
# Every rank prints STEPS progress lines (the bundled trainer's form), half a second apart;
# with FAULT_CODE set, rank 3 exits with it at its third step.
STEP_PROGRAM = "\n".join([
    "import os, sys, time",
    "r, n, c = int(os.environ['RANK']), int(os.environ['STEPS']), int(os.environ.get('FAULT_CODE', '0'))",
    "for i in range(1, n + 1):",
    "    print(f'rank {r} step {i}/{n} loss {2.0 / i:.4f}', flush=True)",
    "    if c and r == 3 and i == 3:",
    "        sys.exit(c)",
    "    time.sleep(0.5)",
])
RANK_LINE = re.compile(r"^\[(node\d) r(\d)\] rank \d step (\d+)/\d+ loss ", re.MULTILINE)


def submit(slurm: SlurmCluster, home: Path, run_dir: Path, *env: str, grace_s: float = GRACE_S,
           program: tuple[str, ...] = ("python3", "-c", STEP_PROGRAM)) -> tuple[str, str]:
    """`launch --slurm --detach` of ``program`` on 2 nodes of 2 ranks: (run id, job id)."""
    args = [a for pair in (("--env", e) for e in env) for a in pair]
    result = fstrain(slurm, home, "launch", "--slurm", "--detach", "--nodes", "2", "--nproc-per-node", "2",
                     "--backend", "deepspeed", "--no-local-rank", "--grace", str(grace_s), "--run-dir", str(run_dir),
                     *args, "--", *program, timeout=60)
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    match = re.search(r"submitted Slurm job (\d+) as run (\S+):", result.stderr)
    assert match is not None and match.group(1) == job_id, result.stderr
    return match.group(2), job_id


def runs(slurm: SlurmCluster, home: Path) -> dict[str, dict[str, Any]]:
    result = fstrain(slurm, home, "runs", "--all", "--json", timeout=60)
    assert result.returncode == 0, result.stderr
    return {row["run_id"]: row for row in json.loads(result.stdout)["runs"]}


def wait_for(slurm: SlurmCluster, home: Path, run_id: str, states: set[str], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        row = runs(slurm, home)[run_id]
        if row["state"] in states or time.monotonic() > deadline:
            return row
        time.sleep(1)


def wait_for_lines(slurm: SlurmCluster, home: Path, run_id: str, count: int, timeout: float = 120) -> None:
    """Until every one of the 4 ranks has printed ``count`` lines (as `fstrain logs` shows them)."""
    deadline = time.monotonic() + timeout
    while True:
        ranks = [m.group(2) for m in RANK_LINE.finditer(fstrain(slurm, home, "logs", run_id).stdout)]
        if all(ranks.count(str(rank)) >= count for rank in range(4)):
            return
        assert time.monotonic() < deadline, f"not every rank printed {count} lines: {ranks}"
        time.sleep(1)


def test_a_detached_slurm_run_is_listed_followed_and_stopped(slurm: SlurmCluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_id, job_id = submit(slurm, tmp_path, run_dir, "STEPS=600")
    row = wait_for(slurm, tmp_path, run_id, {"running"}, 120)
    assert (row["state"], row["job_id"], row["slurm_state"], row["nodes"]) == ("running", job_id, "RUNNING",
                                                                                ["node1", "node2"])
    assert list(runs(slurm, tmp_path)) == [run_id]  # the job's own launch is not a second run
    wait_for_lines(slurm, tmp_path, run_id, 2)
    rank3 = fstrain(slurm, tmp_path, "logs", job_id, "--rank", "3", "--tail", "2").stdout.splitlines()
    assert len(rank3) == 2 and all(line.startswith("[node2 r3] rank 3 step ") for line in rank3)
    status = json.loads(fstrain(slurm, tmp_path, "status", run_id, "--json").stdout)
    assert (status["state"], status["job"]["state"], status["job"]["nodes"]) == ("running", "RUNNING", "node[1-2]")
    ranks = {(n["host"], r["rank"]) for n in status["nodes"] for r in n["ranks"]}
    assert ranks == {("node1", 0), ("node1", 1), ("node2", 2), ("node2", 3)}
    assert all(r["progress"]["step"] >= 1 for n in status["nodes"] for r in n["ranks"])
    # A step of the job on each node (srun --jobid --overlap) saw its ranks alive; no GPUs here.
    assert [(n["reachable"], n["gpus"], n["gpus_error"]) for n in status["nodes"]] == [(True, [], None)] * 2
    assert all(r["alive"] is True for n in status["nodes"] for r in n["ranks"]), status
    table = fstrain(slurm, tmp_path, "status", run_id)
    assert table.returncode == 0 and re.search(r"node2\W+3\W+yes\W+\d+ s ago", table.stderr), table.stderr
    follower = subprocess.Popen([sys.executable, "-m", "fstrain", "logs", run_id, "--follow", "--tail", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=slurm.env(tmp_path),
                                cwd=tmp_path)
    try:
        time.sleep(3)
        stopped_at = time.monotonic()
        stop = fstrain(slurm, tmp_path, "stop", run_id, timeout=120)
        assert stop.returncode == 0, stop.stderr
        assert f"run {run_id} stopped, exit 143 (SIGTERM)" in stop.stderr
        assert time.monotonic() - stopped_at < GRACE_S + 15
        assert_nodes_idle(slurm, 5)  # no process of the job is left on any node
        # --follow ends with the job, having printed the lines written meanwhile and fstrain's end.
        out, _ = follower.communicate(timeout=30)
        assert follower.returncode == 0 and RANK_LINE.search(out) and "terminated (SIGTERM)" in out
    finally:
        if follower.poll() is None:
            follower.kill()
    row = runs(slurm, tmp_path)[run_id]
    assert (row["state"], row["exit_code"], row["reason"]) == ("stopped", 143, "fstrain stop")
    assert scontrol_job(slurm, tmp_path, job_id).state == "FAILED"  # Slurm's word: the script exited 143
    again = fstrain(slurm, tmp_path, "stop", run_id)
    assert again.returncode == 0 and "has already ended: stopped" in again.stderr


def test_detached_slurm_runs_end_succeeded_and_failed_with_their_codes(slurm: SlurmCluster, tmp_path: Path) -> None:
    ok_id, _ = submit(slurm, tmp_path, tmp_path / "ok", "STEPS=4")
    bad_id, bad_job = submit(slurm, tmp_path, tmp_path / "bad", "STEPS=600", "FAULT_CODE=7")
    ok = wait_for(slurm, tmp_path, ok_id, {"succeeded", "failed", "stopped", "lost"}, 180)
    bad = wait_for(slurm, tmp_path, bad_id, {"succeeded", "failed", "stopped", "lost"}, 180)
    assert (ok["state"], ok["exit_code"], ok["slurm_state"]) == ("succeeded", 0, "COMPLETED"), ok
    assert (bad["state"], bad["exit_code"], bad["slurm_state"]) == ("failed", 7, "FAILED"), bad
    assert_nodes_idle(slurm, 10)
    status = json.loads(fstrain(slurm, tmp_path, "status", ok_id, "--json").stdout)
    assert [r["progress"]["step"] for n in status["nodes"] for r in n["ranks"]] == [4, 4, 4, 4]
    assert [n["exit_code"] for n in status["nodes"]] == [0, 0]
    failed = fstrain(slurm, tmp_path, "status", bad_job)
    assert failed.returncode == 0 and f"run {bad_id}: failed, exit 7" in failed.stderr
    assert "Slurm job " + bad_job + ": FAILED on node[1-2]" in failed.stderr
    logs = fstrain(slurm, tmp_path, "logs", ok_id).stdout
    assert len(RANK_LINE.findall(logs)) == 16 and "all nodes finished ok; exit code 0" in logs
    attach = fstrain(slurm, tmp_path, "attach", bad_id, timeout=60)
    assert attach.returncode == 7 and f"run {bad_id} failed, exit 7" in attach.stderr
    assert len(attach.stdout.splitlines()) == 20


def test_stop_of_a_pending_job_and_stop_force(slurm: SlurmCluster, tmp_path: Path) -> None:
    waiting = fstrain(slurm, tmp_path, "launch", "--slurm", "--detach", "--nodes", "2", "--sbatch-arg=--begin=now+3600",
                      "--run-dir", str(tmp_path / "later"), "--", "python3", "-c", "print(1)", timeout=60)
    assert waiting.returncode == 0, waiting.stderr
    later = waiting.stdout.strip()
    row = runs(slurm, tmp_path)
    assert [(r["state"], r["reason"]) for r in row.values()] == [("pending", "waiting in Slurm's queue (BeginTime)")]
    status = fstrain(slurm, tmp_path, "status", later)
    assert status.returncode == 0 and f"Slurm job {later}: PENDING" in status.stderr
    stop = fstrain(slurm, tmp_path, "stop", later, timeout=60)
    assert stop.returncode == 0 and "stopped" in stop.stderr, stop.stderr
    assert scontrol_job(slurm, tmp_path, later).state == "CANCELLED"
    run_id, job_id = submit(slurm, tmp_path, tmp_path / "run", "STEPS=600")
    wait_for(slurm, tmp_path, run_id, {"running"}, 120)
    wait_for_lines(slurm, tmp_path, run_id, 1)
    started = time.monotonic()
    force = fstrain(slurm, tmp_path, "stop", job_id, "--force", "--grace", "60", timeout=60)
    assert force.returncode == 0 and f"run {run_id} stopped" in force.stderr, force.stderr
    # SIGKILL to each node's step at once: no grace, and no wait for Slurm's KillWait (30 s).
    assert time.monotonic() - started < GRACE_S + 5
    assert_nodes_idle(slurm, 2)
    assert runs(slurm, tmp_path)[run_id]["state"] == "stopped"


def test_stop_of_a_job_whose_ranks_ignore_sigterm_kills_it_after_the_grace(slurm: SlurmCluster,
                                                                           tmp_path: Path) -> None:
    # The run's own --grace (60 s) is far longer than stop's: the job's fstrain, which would
    # SIGKILL the ranks after it, does not end the run; stop's SIGKILL to every srun step does.
    stop_grace_s = 3
    worker = ("python3", str(REPO / "tests" / "cluster" / "programs" / "worker.py"))
    run_id, job_id = submit(slurm, tmp_path, tmp_path / "run", "FSTRAIN_TEST_IGNORE_TERM=1", grace_s=60,
                            program=worker)
    wait_for(slurm, tmp_path, run_id, {"running"}, 120)
    deadline = time.monotonic() + 120
    while len(set(re.findall(r"^\[node\d r\d\] ready rank=(\d) ", fstrain(slurm, tmp_path, "logs", run_id).stdout,
                             re.MULTILINE))) < 4:  # every rank ignores SIGTERM from its first line on
        assert time.monotonic() < deadline, fstrain(slurm, tmp_path, "logs", run_id).stdout
        time.sleep(1)
    started = time.monotonic()
    stop = fstrain(slurm, tmp_path, "stop", run_id, "--grace", str(stop_grace_s), timeout=120)
    took_s = time.monotonic() - started
    assert stop.returncode == 0 and f"run {run_id} stopped" in stop.stderr, stop.stderr
    # Not before the grace (SIGTERM alone ended nothing), and soon after: SIGKILL to the steps at
    # once, then Slurm's cancellation of the batch script, whose fstrain exits as its steps end.
    assert stop_grace_s <= took_s < stop_grace_s + 15, took_s
    assert_nodes_idle(slurm, 2)  # no process of the job is left on any node
    row = runs(slurm, tmp_path)[run_id]
    assert (row["state"], row["reason"]) == ("stopped", "fstrain stop"), row
    status = json.loads(fstrain(slurm, tmp_path, "status", run_id, "--json").stdout)
    assert [n["exit_code"] for n in status["nodes"]] == [137, 137]  # each node's step got SIGKILL
    assert scontrol_job(slurm, tmp_path, job_id).state == "CANCELLED"  # then Slurm's cancellation


def test_status_watch_follows_a_slurm_run_to_its_end(slurm: SlurmCluster, tmp_path: Path) -> None:
    """`status --watch` of a Slurm run, stderr a pipe: a plain line per refresh with the run's step
    (every rank prints its steps), nothing on stdout, and the run's exit code at its end."""
    run_id, _ = submit(slurm, tmp_path, tmp_path / "run", "STEPS=16")
    watch = fstrain(slurm, tmp_path, "status", run_id, "--watch", "--interval", "1", timeout=300)
    assert watch.returncode == 0, watch.stderr[-3000:]
    assert watch.stdout == ""
    lines = watch.stderr.splitlines()
    assert all(line.startswith(f"run {run_id}: ") for line in lines), lines
    assert lines[-1] == f"run {run_id}: succeeded, exit 0; step 16/16 (100%)", lines
    seen = {int(m.group(1)) for m in re.finditer(r"running; step (\d+)/16 ", watch.stderr)}
    assert seen and min(seen) < 16, lines  # it was watched while it ran
    assert_nodes_idle(slurm, 30)
