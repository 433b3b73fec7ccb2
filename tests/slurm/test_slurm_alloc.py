"""fstrain launched by hand inside a real Slurm allocation (scripts/testslurm.sh): one launch per
allocation whatever srun does, the job's nodes from inside a step of fewer, and a node list
Slurm cannot read."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm.conftest import SlurmCluster
from tests.slurm.test_slurm_launch import fstrain

pytestmark = pytest.mark.slurm

# Each rank says where it runs, then ends.
WHERE_PROGRAM = ("import os; print(f'rank {os.environ[\"RANK\"]} of {os.environ[\"WORLD_SIZE\"]} on "
                 "{os.uname().nodename}', flush=True)")
WHERE_LINE = re.compile(r"^\[node\d r\d\] rank (\d) of (\d) on (node\d)$", re.MULTILINE)


def own_lines(stderr: str) -> list[str]:
    """fstrain's lines on stderr, without salloc's and srun's own notes."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith(("salloc:", "srun:"))]


@pytest.fixture
def allocation(slurm: SlurmCluster, tmp_path: Path) -> Iterator[str]:
    """A 2-node job with no shell (`salloc --no-shell -N2`): its id; cancelled at the end."""
    result = subprocess.run(["salloc", "--no-shell", "-N2"], capture_output=True, text=True, timeout=120,
                            env=slurm.env(tmp_path), check=True)
    job_id = re.search(r"Granted job allocation (\d+)", result.stderr)
    assert job_id is not None, result.stderr
    try:
        yield job_id.group(1)
    finally:
        subprocess.run(["scancel", job_id.group(1)], env=slurm.env(tmp_path), timeout=60, check=False)


def test_srun_of_two_tasks_refuses_once_per_task_and_starts_nothing(slurm: SlurmCluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = fstrain(slurm, tmp_path, "launch", "--nproc-per-node", "1", "--run-dir", str(run_dir), "--",
                     "python3", "-c", WHERE_PROGRAM, prefix=("salloc", "-N2", "srun"))
    assert result.returncode == 2, result.stderr[-3000:]
    lines = own_lines(result.stderr)
    assert len(lines) == 2, result.stderr[-3000:]  # one per task, each the same single line
    assert all(line.startswith("error: srun: this srun step runs 2 tasks (SLURM_STEP_NUM_TASKS=2)")
               for line in lines)
    assert not WHERE_LINE.search(result.stdout) and not run_dir.exists()


def test_a_one_node_step_of_a_two_node_job_launches_on_both(slurm: SlurmCluster, tmp_path: Path,
                                                            allocation: str) -> None:
    """`srun --jobid=J -N1 fstrain launch`: the step's SLURM_JOB_NODELIST names node1 only; the
    launch runs on the job's two nodes, and says so."""
    run_dir = tmp_path / "run"
    result = fstrain(slurm, tmp_path, "launch", "--nproc-per-node", "2", "--grace", "5", "--run-dir",
                     str(run_dir), "--", "python3", "-c", WHERE_PROGRAM,
                     prefix=("srun", f"--jobid={allocation}", "-N1"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (f"warning: this srun step holds 1 of Slurm job {allocation}'s 2 nodes (node1); fstrain runs on all "
            "of the job's: node1, node2") in result.stderr
    ranks = {(int(m.group(1)), int(m.group(2)), m.group(3)) for m in WHERE_LINE.finditer(result.stdout)}
    assert ranks == {(0, 4, "node1"), (1, 4, "node1"), (2, 4, "node2"), (3, 4, "node2")}, result.stdout[-2000:]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [n["host"] for n in manifest["nodes"]] == ["node1", "node2"]


@pytest.mark.parametrize("command", [("launch", "--nproc-per-node", "1", "--", "true"), ("doctor",)])
def test_a_node_list_slurm_cannot_read_is_one_line(slurm: SlurmCluster, tmp_path: Path,
                                                   command: tuple[str, ...]) -> None:
    """scontrol rejects node[1-70000] (too many hosts in a range) yet exits 0, and fstrain's own
    expansion reads it: one line naming the variable, exit 2, at once."""
    started = time.monotonic()
    result = fstrain(slurm, tmp_path, *command, prefix=("salloc", "-N2", "env", "SLURM_JOB_NODELIST=node[1-70000]"),
                     timeout=120)
    assert time.monotonic() - started < 60
    assert result.returncode == 2, result.stderr[-3000:]
    lines = own_lines(result.stderr)
    assert len(lines) == 1 and len(lines[0]) < 500, result.stderr[-3000:]
    assert lines[0].startswith("error: SLURM_JOB_NODELIST: Slurm cannot read SLURM_JOB_NODELIST='node[1-70000]': ")
    assert "Too many hosts in range" in lines[0]


def test_hosts_outside_the_allocation_are_refused_before_anything_starts(slurm: SlurmCluster,
                                                                       tmp_path: Path) -> None:
    """--launcher srun --hosts node1,node3 in a node[1-2] job: srun can reach node3 only by failing
    late ("Requested node configuration is not available"); fstrain says so in one line first."""
    run_dir = tmp_path / "run"
    started = time.monotonic()
    result = fstrain(slurm, tmp_path, "launch", "--launcher", "srun", "--hosts", "node1,node3", "--nproc-per-node",
                     "1", "--run-dir", str(run_dir), "--", "python3", "-c", WHERE_PROGRAM,
                     prefix=("salloc", "-N2", "--nodelist=node[1-2]"), timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = own_lines(result.stderr)
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("error: --hosts: node3 is not in Slurm job "), lines
    assert lines[0].endswith(", whose nodes are node1, node2: srun reaches only those (hint: name the job's nodes, "
                             "or reach other hosts over SSH with --launcher ssh)"), lines
    assert "Requested node configuration" not in result.stderr and not run_dir.exists()
    assert time.monotonic() - started < 60
