"""`launch --slurm` batch jobs on the real test Slurm, as a Slurm admin expects them: the CPUs of
every rank, a time-limit warning that fits a short --time and is named as the end, the script
submitted twice keeping both jobs, a refused sbatch leaving nothing, and a job cancelled while
pending reported as such."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.slurm.conftest import SlurmCluster
from tests.slurm.test_slurm_launch import RANK_PROGRAM, assert_nodes_idle, fstrain, scontrol_job, wait_for_job

pytestmark = pytest.mark.slurm

JOB_PROGRAM = "import os,time; print('job', os.environ['SLURM_JOB_ID'], 'rank', os.environ['RANK'], flush=True); " \
              "time.sleep(float(os.environ.get('HOLD_S', '1')))"


def show(slurm: SlurmCluster, home: Path, what: str, ident: str) -> dict[str, str]:
    """``scontrol show job|step -o ID`` as its Key=Value words."""
    out = subprocess.run(["scontrol", "show", what, "-o", ident], capture_output=True, text=True, check=True,
                         env=slurm.env(home), timeout=60).stdout
    return dict(word.partition("=")[::2] for word in out.split() if "=" in word)


def job_id_of(run_dir: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    ids = run_dir / "slurm_job_id"
    while not (ids.is_file() and ids.read_text().strip()):
        assert time.monotonic() < deadline, "no job id written"
        time.sleep(0.2)
    return ids.read_text().strip()


def test_a_2x2_job_holds_cpus_for_every_rank_on_each_node(slurm: SlurmCluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = fstrain(slurm, tmp_path, "launch", "--slurm", "--detach", "--nodes", "2", "--nproc-per-node", "2",
                     "--backend", "deepspeed", "--no-local-rank", "--grace", "5", "--env", "HOLD_S=20",
                     "--run-dir", str(run_dir), "--", "python3", "-c", JOB_PROGRAM, timeout=60)
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    # The job: 2 ranks x 4 CPUs on each node (it asked for one CPU per node before).
    job = show(slurm, tmp_path, "job", job_id)
    assert (job["NumCPUs"], job["CPUs/Task"]) == ("16", "8"), job
    # Its per-node steps (each node's watchdog and ranks) hold the same 8 CPUs, not one.
    deadline, steps = time.monotonic() + 120, []
    while time.monotonic() < deadline:
        output = run_dir / f"slurm-{job_id}.out"
        if output.is_file() and output.read_text().count(f"job {job_id} rank") == 4:
            listed = subprocess.run(["squeue", "-s", "-j", job_id, "-h", "-o", "%i"], capture_output=True, text=True,
                                    env=slurm.env(tmp_path), timeout=60, check=True).stdout.split()
            steps = [s for s in listed if s.split(".")[1].isdigit()]
            break
        time.sleep(0.5)
    assert len(steps) >= 2, steps
    for step in steps:
        assert "cpu=8," in show(slurm, tmp_path, "step", step)["TRES"], step
    assert (wait_for_job(slurm, tmp_path, job_id).state, scontrol_job(slurm, tmp_path, job_id).exit_code) == (
        "COMPLETED", 0)


def test_a_short_time_limit_runs_the_job_and_names_the_limit_as_its_end(slurm: SlurmCluster,
                                                                       tmp_path: Path) -> None:
    """--time 2: the warning comes 30 s before the limit (not 90 s: at once, as Slurm may send it
    up to a minute early), fstrain stops every node, and the end is the time limit."""
    run_dir = tmp_path / "run"
    started = time.monotonic()
    result = fstrain(slurm, tmp_path, "launch", "--slurm", "--nodes", "2", "--time", "2", "--nproc-per-node", "2",
                     "--grace", "5", "--run-dir", str(run_dir), "--", "python3", "-c", RANK_PROGRAM, timeout=300)
    took = time.monotonic() - started
    assert result.returncode == 143, result.stderr[-3000:] + result.stdout[-3000:]
    assert 25 < took < 120, took  # the ranks ran; the 2-minute limit itself never came
    job_id = (run_dir / "slurm_job_id").read_text().strip()
    assert "#SBATCH --signal=B:USR1@30 " in (run_dir / "sbatch.sh").read_text()
    assert f"fstrain: the time limit of Slurm job {job_id} is near: stopping the run" in result.stdout
    assert f"Slurm job {job_id}: FAILED, exit code 143: time limit (--time 00:02:00) reached" in result.stderr
    manifest = json.loads((run_dir / f"job-{job_id}" / "manifest.json").read_text())
    assert manifest["exit_code"] == 143 and [n["host"] for n in manifest["nodes"]] == ["node1", "node2"]
    # The batch job's launch writes the run's events in its job folder, as they happen.
    events = [json.loads(line) for line in (run_dir / f"job-{job_id}" / "events.jsonl").read_text().splitlines()]
    assert [(e["kind"], e["attempt"]) for e in events] == [("started", 1), ("finished", 1)], events
    assert events[0]["hosts"] == ["node1", "node2"] and events[0]["format"] == 1
    assert (events[1]["state"], events[1]["exit_code"]) == ("stopped", 143)
    assert events[0]["time"] <= events[1]["time"] == manifest["ended"]
    status = json.loads(fstrain(slurm, tmp_path, "status", job_id, "--json").stdout)
    assert (status["state"], status["exit_code"], status["reason"]) == (
        "failed", 143, "time limit (--time 00:02:00) reached")
    assert_nodes_idle(slurm, 10)
    too_short = fstrain(slurm, tmp_path, "launch", "--slurm", "--time", "1", "--run-dir", str(tmp_path / "short"),
                        "--", "true")
    assert too_short.returncode == 2 and too_short.stderr.startswith("error: --time: --time 1 is shorter than")
    assert not (tmp_path / "short").exists()


def test_the_script_submitted_twice_keeps_both_jobs(slurm: SlurmCluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = fstrain(slurm, tmp_path, "launch", "--slurm", "--detach", "--nodes", "1", "--nproc-per-node", "1",
                     "--grace", "5", "--run-dir", str(run_dir), "--", "python3", "-c", JOB_PROGRAM, timeout=60)
    assert result.returncode == 0, result.stderr
    first = result.stdout.strip()
    run_id = re.search(r"as run (\S+):", result.stderr).group(1)  # type: ignore[union-attr]
    again = subprocess.run(["sbatch", "--parsable", str(run_dir / "sbatch.sh")], capture_output=True, text=True,
                           env=slurm.env(tmp_path), cwd=tmp_path, timeout=60, check=False)
    assert again.returncode == 0, again.stderr
    second = again.stdout.strip()
    for job_id in (first, second):
        assert wait_for_job(slurm, tmp_path, job_id).state == "COMPLETED"
    for job_id in (first, second):
        job_dir = run_dir / f"job-{job_id}"
        for _ in range(40):  # the job's fstrain writes its manifest as it ends
            if (job_dir / "manifest.json").is_file():
                break
            time.sleep(0.25)
        assert json.loads((job_dir / "manifest.json").read_text())["exit_code"] == 0
        assert {p.read_text().count(f"job {job_id} rank 0") for p in (job_dir / "logs").glob("*.r0.log")} == {1}
        status = json.loads(fstrain(slurm, tmp_path, "status", job_id, "--json").stdout)
        assert (status["run_id"], status["job"]["job_id"], status["state"]) == (run_id, job_id, "succeeded")
        assert [r["last_line"] for n in status["nodes"] for r in n["ranks"]] == [f"job {job_id} rank 0"]
        logs = fstrain(slurm, tmp_path, "logs", job_id, "--rank", "0")
        assert logs.returncode == 0 and f"run {run_id}: Slurm job {job_id}" in logs.stderr
        assert f"job {job_id} rank 0" in logs.stdout and logs.stdout.count(" rank 0") == 1
    # The run is the job `launch --slurm` submitted.
    assert json.loads(fstrain(slurm, tmp_path, "status", run_id, "--json").stdout)["job"]["job_id"] == first


def test_a_refused_sbatch_leaves_nothing_behind(slurm: SlurmCluster, tmp_path: Path) -> None:
    result = fstrain(slurm, tmp_path, "launch", "--slurm", "--partition", "nope", "--run-dir", str(tmp_path / "run"),
                     "--", "true", timeout=60)
    assert result.returncode != 0 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: sbatch: sbatch refused the job: Batch job submission failed: Invalid "
                                    "partition name specified"), result.stderr
    assert not (tmp_path / "run").exists()
    listed = fstrain(slurm, tmp_path, "runs", "--all", "--json")
    assert json.loads(listed.stdout) == {"runs": []}


def test_a_job_cancelled_while_pending_is_cancelled_not_exit_0(slurm: SlurmCluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    follower = subprocess.Popen(
        [sys.executable, "-m", "fstrain", "launch", "--slurm", "--nodes", "2", "--sbatch-arg=--begin=now+3600",
         "--run-dir", str(run_dir), "--", "python3", "-c", "print(1)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=slurm.env(tmp_path), cwd=tmp_path)
    try:
        job_id = job_id_of(run_dir)
        time.sleep(3)  # the follower has printed the first state
        subprocess.run(["scancel", job_id], check=True, env=slurm.env(tmp_path), timeout=60)
        _, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 143, err
    assert f"Slurm job {job_id}: pending (BeginTime)" in err and "(None)" not in err
    assert f"Slurm job {job_id}: CANCELLED before it started" in err and "exit code 0" not in err
    assert "never appeared" not in err  # it had no output to write
    status = fstrain(slurm, tmp_path, "status", job_id)
    assert status.returncode == 0, status.stderr
    assert "stopped (cancelled before it started (CANCELLED))" in status.stderr and "exit 0" not in status.stderr
    document = json.loads(fstrain(slurm, tmp_path, "status", job_id, "--json").stdout)
    assert (document["state"], document["exit_code"]) == ("stopped", None)


def test_a_job_that_can_never_start_is_said_and_cancelled_not_followed_forever(slurm: SlurmCluster,
                                                                               tmp_path: Path) -> None:
    """5 nodes on the 3-node partition: Slurm queues the job (Reason=PartitionConfig, then
    PartitionNodeLimit) and would keep it pending for ever; fstrain says so in one line, cancels it
    and exits 2."""
    started = time.monotonic()
    result = fstrain(slurm, tmp_path, "launch", "--slurm", "--nodes", "5", "--run-dir", str(tmp_path / "run"), "--",
                     "true", timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    assert time.monotonic() - started < 60
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1, result.stderr
    job_id = re.search(r"Slurm job (\d+) cannot start: PartitionNodeLimit: it asks for 5 nodes and partition test "
                       r"has 3; fstrain cancelled it", error[0])
    assert job_id is not None, error[0]
    assert "choose another --partition" in error[0]
    assert wait_for_job(slurm, tmp_path, job_id.group(1), timeout=60).state == "CANCELLED"
    assert (tmp_path / "run").is_dir()  # the rendered script is kept


def test_the_documented_api_example_submits_follows_and_reads_the_end(slurm: SlurmCluster, tmp_path: Path) -> None:
    """docs/api.md's Slurm example, run as a user would: submit, follow to the end, read the end."""
    text = (REPO / "docs" / "api.md").read_text()
    section = text[text.index("\n## Slurm\n"):]
    match = re.search(r"```python\n(.*?)```", section[:section.index("\n## ", 5)], re.S)
    assert match is not None, "docs/api.md lost its Slurm example"
    result = subprocess.run([sys.executable, "-c", match.group(1)], cwd=tmp_path, capture_output=True, text=True,
                            env={**slurm.env(tmp_path), "PYTHONPATH": str(REPO)}, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert re.search(r"^job \d+ run \S+ script sbatch\.sh$", out, re.M), out
    assert sorted(re.findall(r"hello from rank (\d)", out)) == ["0", "1", "2", "3"], out
    assert out.rstrip().splitlines()[-1] == "end COMPLETED 0 ok", out[-2000:]
