"""Real 2-process CPU runs of deepspeed.initialize with rendered configs: ZeRO 1, 2 and 3, with
CPU offload of the optimizer (ZeRO-2) and of optimizer and parameters (ZeRO-3), DeepSpeed's
activation checkpointing, and a checkpoint save + resume that reproduces the uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plans import make_plan
from tests.train.conftest import assert_learns, render, torchrun

pytestmark = pytest.mark.train

STEPS = 8


@pytest.mark.parametrize(
    ("strategy", "precision", "offload", "ac"),
    [
        ("zero1", "bf16", "none", "none"),
        ("zero2", "fp32", "optimizer", "full"),  # DeepSpeedCPUAdam; DeepSpeed's checkpoint function
        ("zero2", "amp-bf16", "none", "none"),  # DeepSpeed's torch_autocast section
    ],
)
def test_zero_stage_trains(tmp_path: Path, strategy: str, precision: str, offload: str, ac: str) -> None:
    out = render(make_plan(strategy, precision=precision, offload=offload, activation_checkpointing=ac), tmp_path / "r")
    run = torchrun(2, ["--plan", str(out / "plan.yaml"), "--backend", "deepspeed",
                       "--deepspeed-config", str(out / "ds_config.json"), "--steps", str(STEPS)],
                   tmp_path / "summary.json")
    summary = run.summary
    assert (summary["backend"], summary["world_size"], summary["strategy"]) == ("deepspeed", 2, strategy)
    assert (summary["micro_batch_size"], summary["grad_accum_steps"]) == (4, 2)
    assert summary["tokens_per_step"] == 4 * 2 * 2 * 64
    assert summary["tokens_per_s"] > 0 and summary["peak_memory_rank0"]["max_rss_bytes"] > 2**20
    assert_learns(summary, min_drop=0.2)
    assert f"step {STEPS}/{STEPS} loss" in run.stdout


def test_zero3_offload_checkpoint_and_resume(tmp_path: Path) -> None:
    plan = make_plan("zero3", precision="bf16", offload="optimizer+params",
                     activation_checkpointing="megatron-selective")
    out = render(plan, tmp_path / "r")
    common = ["--plan", str(out / "plan.yaml"), "--backend", "deepspeed", "--deepspeed-config",
              str(out / "ds_config.json"), "--steps", str(STEPS), "--checkpoint-dir", str(tmp_path / "ckpt")]
    first = torchrun(2, [*common, "--checkpoint-interval", "4"], tmp_path / "first.json").summary
    assert_learns(first, min_drop=0.2)
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "step_0000008"
    # Roll back to the step-4 checkpoint and continue: steps 5..8 must repeat the first run's.
    (tmp_path / "ckpt" / "latest").write_text("step_0000004\n")
    resumed = torchrun(2, [*common, "--resume"], tmp_path / "resumed.json")
    assert "resumed from step 4" in resumed.stdout
    assert resumed.summary["start_step"] == 4
    assert resumed.summary["losses"] == pytest.approx(first["losses"][4:], rel=1e-5)


def test_compiled_blocks_train_under_zero2(tmp_path: Path) -> None:
    # --compile under DeepSpeed: the blocks are compiled before deepspeed.initialize wraps the model.
    out = render(make_plan("zero2", precision="bf16", compile=True), tmp_path / "r")
    run = torchrun(2, ["--plan", str(out / "plan.yaml"), "--backend", "deepspeed",
                       "--deepspeed-config", str(out / "ds_config.json"), "--steps", str(STEPS)],
                   tmp_path / "summary.json")
    assert run.summary["compiled_blocks"] == 2
    assert_learns(run.summary, min_drop=0.2)
