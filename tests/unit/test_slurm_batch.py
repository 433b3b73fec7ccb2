"""`launch --slurm` batch jobs as a Slurm admin expects them, as values: nothing left by a refused
sbatch."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.helpers import REPO, run_fstrain

FIXTURES = REPO / "tests" / "fixtures" / "slurm-runs"
NO_SLURM = {"SLURM_JOB_ID": "", "SLURM_JOB_NODELIST": ""}


# -- a refused sbatch ---------------------------------------------------------------------------


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
