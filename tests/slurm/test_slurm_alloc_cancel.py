"""`scancel` of a run launched by hand inside a real Slurm allocation (scripts/testslurm.sh):
reported as Slurm's, each torchrun ended by Slurm's one SIGTERM, every rank gone at once."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.slurm.conftest import SlurmCluster
from tests.slurm.test_slurm_launch import RANK_PROGRAM, READY_LINE, assert_nodes_idle, scontrol_job

pytestmark = pytest.mark.slurm


def test_scancel_of_a_salloc_run_is_slurms_and_ends_every_rank_at_once(slurm: SlurmCluster, tmp_path: Path) -> None:
    """scancel: Slurm sends SIGTERM to every process of every step (watchdogs, torchrun, ranks).
    The run is reported as cancelled by Slurm, not as a failed node; each torchrun gets that one
    SIGTERM (none from its watchdog) and ends by itself, well within the grace period (60 s
    here, so that a loaded machine cannot blur the two: on this test machine, loaded at ~22
    runnable processes per 2 cores, torchrun took 4-8 s to exit after its SIGTERM, 3.5 s
    unloaded)."""
    run_dir = tmp_path / "run"
    out_path, err_path = tmp_path / "out.txt", tmp_path / "err.txt"
    with out_path.open("w") as out_file, err_path.open("w") as err_file:
        launcher = subprocess.Popen(
            ["salloc", "-N2", sys.executable, "-m", "fstrain", "launch", "--nproc-per-node", "2", "--grace", "60",
             "--run-dir", str(run_dir), "--", "python3", "-c", RANK_PROGRAM],
            stdout=out_file, stderr=err_file, text=True, env=slurm.env(tmp_path), cwd=tmp_path)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and launcher.poll() is None:
            if len(READY_LINE.findall(out_path.read_text(errors="replace"))) == 4:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"the ranks never became ready: {err_path.read_text()[-3000:]}")
        granted = re.search(r"Granted job allocation (\d+)", err_path.read_text())
        assert granted is not None
        job_id = granted.group(1)
        subprocess.run(["scancel", job_id], check=True, env=slurm.env(tmp_path), timeout=60)
        cancelled = time.monotonic()
        launcher.wait(timeout=120)
        took_s = time.monotonic() - cancelled
    finally:
        if launcher.poll() is None:
            launcher.kill()
    out, err = out_path.read_text(), err_path.read_text()
    assert launcher.returncode == 143, err[-3000:]
    assert took_s < 45, took_s  # well before the 60 s grace: Slurm's own SIGKILL ended the ranks
    assert "cancelled by Slurm (scancel); exit code 143" in err and "first failure" not in err, err[-3000:]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert (manifest["reason"], manifest["exit_code"], manifest["detail"]) == (
        "cancelled", 143, "cancelled by Slurm (scancel)")
    assert manifest["first_failure_node_rank"] is None
    # No torchrun was killed at the grace period, and none got a second SIGTERM while stopping
    # (torchrun then abandons its own shutdown: "During handling of the above exception").
    assert all(n["exit_code"] != 137 for n in manifest["nodes"]), manifest["nodes"]
    node_logs = "".join(p.read_text(errors="replace") for p in (run_dir / "logs").glob("node?.log"))
    assert "grace period: SIGKILL" not in node_logs + out + err
    assert "During handling of the above exception" not in node_logs
    assert scontrol_job(slurm, tmp_path, job_id).state in ("CANCELLED", "COMPLETING")
    assert_nodes_idle(slurm, 10)
