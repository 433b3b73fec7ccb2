"""Run the reference trainer the way a user does: rendered files, torchrun, real processes.

Each run is a subprocess (torchrun --standalone), so torch's and DeepSpeed's warnings stay out
of pytest's filterwarnings=error. On a CPU machine the ranks use gloo. DeepSpeed JIT-compiles
two small C++ ops on its first CPU run (its shared-memory communicator, and CPUAdam for offload)
into the suite's extensions folder (tests/build_ops.py); later runs load them in about a second.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fstrain.core.plan.planfile import PlanFile
from fstrain.core.render.options import TrainingOptions
from fstrain.io.render_files import render_and_write

REPO = Path(__file__).resolve().parents[2]
# A rate the 2-layer test model learns visibly in a handful of steps.
FAST = TrainingOptions(lr=3e-3, warmup_steps=2)


@dataclass(frozen=True)
class Run:
    summary: dict[str, Any]
    stdout: str
    stderr: str


def render(plan: PlanFile, out: Path, options: TrainingOptions = FAST) -> Path:
    render_and_write(plan, out, force=False, options=options)
    return out


def torchrun(nproc: int, args: list[str], summary: Path, timeout_s: float = 600,
             env: dict[str, str] | None = None) -> Run:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    env.pop("FSTRAIN_DEBUG", None)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
        "-m", "fstrain.train", *args, "--summary-json", str(summary),
    ]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout_s,
                            check=False)
    if result.returncode != 0:
        pytest.fail(f"trainer exited {result.returncode}\n--- stdout\n{result.stdout[-4000:]}\n"
                    f"--- stderr\n{result.stderr[-6000:]}")
    return Run(json.loads(summary.read_text()), result.stdout, result.stderr)


def assert_learns(summary: dict[str, Any], min_drop: float) -> None:
    losses = summary["losses"]
    assert len(losses) == summary["steps"] - summary["start_step"]
    assert losses[-1] < losses[0] - min_drop, losses
