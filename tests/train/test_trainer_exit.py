"""A successful run ends with exit code 0, every time (issue: 'terminate called without an
active exception', SIGABRT, after ``done``, in some FSDP and DeepSpeed runs on gloo).

The cause: after FSDP2 (and DeepSpeed) runs the process group stays referenced (function
defaults in torch.distributed.nn.functional, a cached DeviceMesh), so ``destroy_process_group``
does not join its gloo threads, and they run on into the interpreter's teardown. The trainer
now meets at a final barrier, destroys the group, and ends without that teardown while such
threads live. Each run below repeats the end of training and checks both the exit and that
no process-group thread is alive when the interpreter would tear itself down.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plans import make_plan
from tests.train.conftest import REPO, render

pytestmark = pytest.mark.train

PROBE = str(Path(__file__).resolve().parent / "programs" / "exit_probe.py")
REPEATS = 2


@pytest.mark.parametrize(("strategy", "backend"), [("fsdp-full", "fsdp"), ("zero3", "deepspeed")])
def test_successful_runs_always_exit_0_without_live_process_group_threads(tmp_path: Path, strategy: str,
                                                                          backend: str) -> None:
    out = render(make_plan(strategy, dp=2), tmp_path / "r")
    config = ["--fsdp-config", str(out / "fsdp.yaml")] if backend == "fsdp" else \
        ["--deepspeed-config", str(out / "ds_config.json")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("FSTRAIN_DEBUG", None)
    for attempt in range(REPEATS):
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", PROBE,
                   "--plan", str(out / "plan.yaml"), "--backend", backend, *config, "--steps", "1",
                   "--checkpoint-dir", str(tmp_path / f"ckpt{attempt}")]
        result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=600,
                                check=False)
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"run {attempt}: exit {result.returncode}\n{output[-4000:]}"
        assert "[fstrain.train] done: loss" in result.stdout
        assert "terminate called" not in output
        assert "exit-probe:" not in output, output[-2000:]
