"""Real CPU runs of FSDP2 (fully_shard) with rendered fsdp.yaml files: full shard and
shard-grad-op on 2 processes, hybrid sharding on a 2x2 mesh with 4, and a DCP checkpoint
save + resume that reproduces the uninterrupted run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plans import make_plan
from tests.train.conftest import assert_learns, render, torchrun

pytestmark = pytest.mark.train

STEPS = 8


@pytest.mark.parametrize(
    ("nproc", "strategy", "group", "precision", "offload", "ac", "mesh"),
    [
        (2, "fsdp-grad-op", 2, "fp16", "optimizer", "none", [2]),  # ShardedGradScaler, CPUOffloadPolicy
        (4, "fsdp-hybrid", 2, "bf16", "none", "full", [2, 2]),
        (2, "fsdp-full", 2, "bf16-pure", "none", "none", [2]),  # a bf16 model, AdamW states in bf16
        (2, "fsdp-full", 2, "amp-bf16", "none", "full", [2]),  # torch.autocast over fp32 weights
        (2, "fsdp-grad-op", 2, "amp-fp16", "none", "none", [2]),  # autocast(float16) + ShardedGradScaler
    ],
)
def test_fsdp_layout_trains(
    tmp_path: Path, nproc: int, strategy: str, group: int, precision: str, offload: str, ac: str, mesh: list[int]
) -> None:
    plan = make_plan(strategy, dp=nproc, shard_group_size=group, precision=precision, offload=offload,
                     activation_checkpointing=ac)
    out = render(plan, tmp_path / "r")
    run = torchrun(nproc, ["--plan", str(out / "plan.yaml"), "--fsdp-config", str(out / "fsdp.yaml"),
                           "--steps", str(STEPS)], tmp_path / "summary.json")
    summary = run.summary
    assert (summary["backend"], summary["world_size"], summary["strategy"]) == ("fsdp", nproc, strategy)
    assert summary["tokens_per_step"] == 4 * 2 * nproc * 64
    assert_learns(summary, min_drop=0.2)
    assert f"step {STEPS}/{STEPS} loss" in run.stdout


@pytest.mark.smoke  # scripts/test.sh --quick
def test_full_shard_checkpoint_and_resume(tmp_path: Path) -> None:
    out = render(make_plan("fsdp-full", precision="bf16", activation_checkpointing="selective-op"), tmp_path / "r")
    common = ["--plan", str(out / "plan.yaml"), "--fsdp-config", str(out / "fsdp.yaml"), "--steps", str(STEPS),
              "--checkpoint-dir", str(tmp_path / "ckpt")]
    first = torchrun(2, [*common, "--checkpoint-interval", "4"], tmp_path / "first.json").summary
    assert_learns(first, min_drop=0.2)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["latest", "step_0000004", "step_0000008"]
    (tmp_path / "ckpt" / "latest").write_text("step_0000004\n")
    resumed = torchrun(2, [*common, "--resume"], tmp_path / "resumed.json")
    assert "resumed from step 4" in resumed.stdout
    assert resumed.summary["start_step"] == 4
    assert resumed.summary["losses"] == pytest.approx(first["losses"][4:], rel=1e-5)


def test_plain_python_is_a_world_of_one_with_the_tiny_recipe(tmp_path: Path) -> None:
    # No launcher, no files: the trainer renders fsdp.yaml for one rank from the tiny recipe.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "FSTRAIN_DEBUG"):
        env.pop(name, None)
    summary_path = tmp_path / "summary.json"
    command = [sys.executable, "-m", "fstrain.train", "--steps", "4", "--summary-json", str(summary_path)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads(summary_path.read_text())
    assert (summary["world_size"], summary["model"], summary["strategy"]) == (1, "tiny", "fsdp-full")
    assert summary["last_loss"] < summary["first_loss"]


def test_mixture_of_experts_trains_sharded(tmp_path: Path) -> None:
    # The tiny MoE recipe in bf16 (torch._grouped_mm) with 3 experts over 2 ranks: the stacked
    # expert weights do not split by expert, so FSDP shards them on their second dimension.
    from dataclasses import replace

    from fstrain.core.plan.schema import MoESpec
    from fstrain.io.recipes import load_shipped_recipe

    model = load_shipped_recipe("tiny-moe").model
    model = replace(model, moe=MoESpec(num_experts=3, top_k=2, expert_ffn_hidden_size=96))
    plan = make_plan("fsdp-full", model=model, precision="bf16", activation_checkpointing="selective-op")
    out = render(plan, tmp_path / "r")
    run = torchrun(2, ["--plan", str(out / "plan.yaml"), "--fsdp-config", str(out / "fsdp.yaml"),
                       "--steps", str(STEPS)], tmp_path / "summary.json")
    assert_learns(run.summary, min_drop=0.2)


def test_mixture_of_experts_recipe_trains_in_fp32(tmp_path: Path) -> None:
    # fp32 runs fstrain's grouped matmul (torch._grouped_mm takes bf16 only under fake tensors);
    # 4 experts over 2 ranks: each rank holds two whole experts (FSDP's dim-0 sharding).
    from fstrain.io.recipes import load_shipped_recipe

    plan = make_plan("fsdp-full", model=load_shipped_recipe("tiny-moe").model, precision="fp32",
                     activation_checkpointing="full")
    out = render(plan, tmp_path / "r")
    run = torchrun(2, ["--plan", str(out / "plan.yaml"), "--fsdp-config", str(out / "fsdp.yaml"),
                       "--steps", str(STEPS)], tmp_path / "summary.json")
    assert run.summary["model"] == "tiny-moe"
    assert_learns(run.summary, min_drop=0.2)


def test_compiled_blocks_train(tmp_path: Path) -> None:
    # --compile: each block under torch.compile (Inductor builds C++ kernels for CPU), trained for
    # real by FSDP2 on 2 processes; the loss falls as the eager model's does.
    out = render(make_plan("fsdp-full", precision="bf16", activation_checkpointing="selective-op", compile=True),
                 tmp_path / "r")
    run = torchrun(2, ["--plan", str(out / "plan.yaml"), "--fsdp-config", str(out / "fsdp.yaml"), "--steps",
                       str(STEPS)], tmp_path / "summary.json")
    assert run.summary["compiled_blocks"] == 2  # the tiny model's blocks, each compiled
    assert_learns(run.summary, min_drop=0.2)
