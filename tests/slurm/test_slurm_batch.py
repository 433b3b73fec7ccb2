"""`launch --slurm` batch jobs on the real test Slurm, as a Slurm admin expects them: a refused
sbatch leaving nothing."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.slurm.conftest import SlurmCluster
from tests.slurm.test_slurm_launch import fstrain

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


def test_a_refused_sbatch_leaves_nothing_behind(slurm: SlurmCluster, tmp_path: Path) -> None:
    result = fstrain(slurm, tmp_path, "launch", "--slurm", "--partition", "nope", "--run-dir", str(tmp_path / "run"),
                     "--", "true", timeout=60)
    assert result.returncode != 0 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: sbatch: sbatch refused the job: Batch job submission failed: Invalid "
                                    "partition name specified"), result.stderr
    assert not (tmp_path / "run").exists()
    listed = fstrain(slurm, tmp_path, "runs", "--all", "--json")
    assert json.loads(listed.stdout) == {"runs": []}
