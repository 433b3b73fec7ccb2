"""What recovery needs of the bundled trainer, on real CPU processes: a checkpoint written by
2 ranks resumed by 3 (FSDP2 + DCP reshard it, the re-planned global batch is the same six
sequences), a checkpoint saved on SIGTERM, and FSTRAIN_CHECKPOINT_DIR / FSTRAIN_RESTART."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fstrain.core.plan.replan import replan_file
from tests.plans import make_plan
from tests.train.conftest import REPO, render, torchrun


def test_a_checkpoint_of_two_ranks_resumes_on_three_with_the_same_losses(tmp_path: Path) -> None:
    two = make_plan("fsdp-full", dp=2, micro_batch_size=3, grad_accum_steps=1, precision="fp32")
    three, message = replan_file(two, ("node1", "node2", "node3"), 1)
    assert message == ("2 nodes -> 3: dp 2 -> 3, micro-batch 3 -> 2; the global batch of 6 sequences is kept")
    first_files, resumed_files = render(two, tmp_path / "r2"), render(three, tmp_path / "r3")
    ckpt = ["--steps", "6", "--checkpoint-dir", str(tmp_path / "ckpt")]
    first = torchrun(2, ["--plan", str(first_files / "plan.yaml"), "--fsdp-config", str(first_files / "fsdp.yaml"),
                         *ckpt, "--checkpoint-interval", "3"], tmp_path / "first.json").summary
    (tmp_path / "ckpt" / "latest").write_text("step_0000003\n")
    resumed = torchrun(3, ["--plan", str(resumed_files / "plan.yaml"), "--fsdp-config",
                           str(resumed_files / "fsdp.yaml"), *ckpt, "--resume"], tmp_path / "resumed.json")
    assert "step_0000003 was written by 2 ranks: resharded for 3" in resumed.stdout
    assert (resumed.summary["start_step"], resumed.summary["world_size"]) == (3, 3)
    # The first step after the checkpoint: the same weights (resharded) on the same six sequences.
    assert resumed.summary["losses"][0] == pytest.approx(first["losses"][3], rel=1e-5)
    # And the steps after it: the same gradients (the mean over the same global batch) and optimizer state.
    assert resumed.summary["losses"] == pytest.approx(first["losses"][3:], rel=1e-4)


def test_sigterm_saves_the_step_and_a_restart_resumes_from_it(tmp_path: Path) -> None:
    plan = render(make_plan("fsdp-full", dp=2, precision="fp32"), tmp_path / "r")
    args = ["-m", "fstrain.train", "--plan", str(plan / "plan.yaml"), "--fsdp-config", str(plan / "fsdp.yaml")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FSTRAIN_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
           "FSTRAIN_GRACE_S": "60"}
    env.pop("FSTRAIN_RESTART", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    job = subprocess.Popen([*command, *args, "--steps", "1000"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, env=env, cwd=REPO, start_new_session=True)
    lines: list[str] = []
    try:
        assert job.stdout is not None
        for line in job.stdout:
            lines.append(line)
            if "[fstrain.train] step 3/1000" in line:
                os.killpg(job.pid, signal.SIGTERM)  # as the node watchdog stops a job
                break
        lines += job.stdout.readlines()
        code = job.wait(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        if job.stdout is not None:
            job.stdout.close()
    output = "".join(lines)
    saved = next((line for line in lines if "SIGTERM after step" in line), "")
    assert "checkpoint saved" in saved, output[-4000:]
    step = int(saved.split("SIGTERM after step ")[1].split(":")[0])
    assert step >= 3 and code != 0
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == f"step_{step:07d}"
    assert not list((tmp_path / "ckpt").glob("*.tmp"))

    restarted = torchrun(2, [*args[2:], "--steps", str(step + 2)], tmp_path / "summary.json",
                         env={"FSTRAIN_RESTART": "1", "FSTRAIN_CHECKPOINT_DIR": str(tmp_path / "ckpt")})
    assert f"restart 1: resumed from step {step}" in restarted.stdout
    assert restarted.summary["start_step"] == step and len(restarted.summary["losses"]) == 2


def test_deepspeed_refuses_a_checkpoint_of_another_world_in_one_line(tmp_path: Path) -> None:
    from fstrain.train.deepspeed_backend import check_same_world, checkpoint_world

    tag = tmp_path / "step_0000004"
    tag.mkdir()
    for rank in range(2):
        (tag / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"")
        (tag / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt").write_bytes(b"")
    (tmp_path / "latest").write_text("step_0000004\n")
    assert checkpoint_world(tag) == 2
    check_same_world(tmp_path, 2)
    from fstrain.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        check_same_world(tmp_path, 3)
    assert refused.value.message.endswith("was written by 2 ranks and this run has 3: DeepSpeed's ZeRO "
                                          "checkpoints reload at the same world size only")
    assert "\n" not in refused.value.one_line()
