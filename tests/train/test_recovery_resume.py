"""What recovery needs of the bundled trainer, on real CPU processes: a checkpoint written by
2 ranks resumed by 3 (FSDP2 + DCP reshard it, the re-planned global batch is the same six
sequences), a DeepSpeed ZeRO checkpoint of 2 ranks resumed by 1 (through DeepSpeed's universal
checkpoint), a checkpoint saved on SIGTERM, and FSTRAIN_CHECKPOINT_DIR / FSTRAIN_RESTART."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fstrain.core.plan.replan import replan_file
from tests.plans import make_plan
from tests.train.conftest import REPO, Run, render, torchrun

pytestmark = pytest.mark.train


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


def _deepspeed_args(files: Path, checkpoint_dir: Path, steps: int) -> list[str]:
    return ["--plan", str(files / "plan.yaml"), "--backend", "deepspeed", "--deepspeed-config",
            str(files / "ds_config.json"), "--steps", str(steps), "--checkpoint-dir", str(checkpoint_dir)]


def _resume_deepspeed_on_one_rank(tmp_path: Path, strategy: str, precision: str) -> tuple[list[float], Run]:
    """A ZeRO checkpoint of 2 ranks (micro-batch 2) at step 3 of 6, resumed by 1 rank re-planned
    for the same global batch of 4 sequences: the first run's losses and the resumed run."""
    two = make_plan(strategy, dp=2, micro_batch_size=2, grad_accum_steps=1, precision=precision)
    one, message = replan_file(two, ("node1",), 1)
    assert message == "2 nodes -> 1: dp 2 -> 1, grad-accum 1 -> 2; the global batch of 4 sequences is kept"
    first_files, resumed_files = render(two, tmp_path / "r2"), render(one, tmp_path / "r1")
    ckpt = tmp_path / "ckpt"
    first = torchrun(2, [*_deepspeed_args(first_files, ckpt, 6), "--checkpoint-interval", "3"],
                     tmp_path / "first.json").summary
    (ckpt / "latest").write_text("step_0000003\n")
    resumed = torchrun(1, [*_deepspeed_args(resumed_files, ckpt, 6), "--resume"], tmp_path / "resumed.json")
    assert (resumed.summary["start_step"], resumed.summary["world_size"]) == (3, 1)
    return first["losses"], resumed


def test_a_deepspeed_zero2_checkpoint_of_two_ranks_resumes_on_one_with_the_same_losses(tmp_path: Path) -> None:
    first, resumed = _resume_deepspeed_on_one_rank(tmp_path, "zero2", "fp32")
    universal = tmp_path / "ckpt" / "universal"
    assert (f"step_0000003 was written by 2 ranks: converted to a universal checkpoint in {universal / 'step_0000003'}"
            ", resharded for 1") in resumed.stdout
    # The first step after the checkpoint: the same weights (resharded) on the same four sequences,
    # then the same optimizer state (Adam's moments, resharded) at every step after it.
    assert resumed.summary["losses"][0] == pytest.approx(first[3], rel=1e-5)
    assert resumed.summary["losses"] == pytest.approx(first[3:], rel=1e-5)
    assert (universal / "latest_universal").read_text().strip() == "step_0000003"
    assert not list(universal.glob("*.tmp"))
    # A second resume from the same tag reuses the conversion.
    (tmp_path / "ckpt" / "latest").write_text("step_0000003\n")
    again = torchrun(1, [*_deepspeed_args(tmp_path / "r1", tmp_path / "ckpt", 4), "--resume"], tmp_path / "again.json")
    assert "step_0000003 was written by 2 ranks: its conversion to a universal checkpoint in" in again.stdout
    assert again.summary["losses"] == pytest.approx(first[3:4], rel=1e-5)


def test_a_deepspeed_zero3_bf16_checkpoint_of_two_ranks_resumes_on_one_with_the_same_loss(tmp_path: Path) -> None:
    first, resumed = _resume_deepspeed_on_one_rank(tmp_path, "zero3", "bf16")
    assert "step_0000003 was written by 2 ranks: converted to a universal checkpoint" in resumed.stdout
    assert resumed.summary["losses"][0] == pytest.approx(first[3], rel=1e-5)
    # bf16 gradients summed over another split of the batch round differently from here on.
    assert resumed.summary["losses"] == pytest.approx(first[3:], rel=1e-3)


def _fake_zero_checkpoint(directory: Path, ranks: int) -> None:
    """The files a ZeRO checkpoint of ``ranks`` data-parallel ranks names (empty)."""
    tag = directory / "step_0000004"
    tag.mkdir(parents=True)
    for rank in range(ranks):
        (tag / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"")
        (tag / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt").write_bytes(b"")
    (directory / "latest").write_text("step_0000004\n")


def test_which_deepspeed_checkpoints_reshard_and_which_are_refused_in_one_line(tmp_path: Path) -> None:
    from fstrain.errors import ConfigError
    from fstrain.train.ds_universal import checkpoint_world, plan_reshard

    _fake_zero_checkpoint(tmp_path, 2)
    assert checkpoint_world(tmp_path / "step_0000004") == 2
    adamw = {"optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 2}}
    assert plan_reshard(tmp_path, 2, adamw) is None  # the world that wrote it: loaded as it is
    reshard = plan_reshard(tmp_path, 3, adamw)
    assert reshard is not None and (reshard.tag, reshard.load_dir, reshard.written_by) == (
        "step_0000004", tmp_path / "universal", 2)
    offloaded = {"optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 3, "offload_optimizer": {
        "device": "cpu"}, "offload_param": {"device": "cpu"}}}
    assert plan_reshard(tmp_path, 1, offloaded) is not None
    refused = {
        "SGD": ({"optimizer": {"type": "SGD"}}, "ds_to_universal carries Adam's state only (exp_avg, exp_avg_sq), "
                "and the optimizer is SGD"),
        "client": ({"zero_optimization": {"stage": 2}}, "the optimizer is the trainer's own (adam8bit, adafactor), "
                   "whose state ds_to_universal does not know"),
        "nvme": ({"optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 3, "offload_optimizer": {
            "device": "nvme"}}}, "the optimizer state is offloaded to NVMe, in per-rank swap files that "
                 "ds_to_universal does not read"),
    }
    for config, why in refused.values():
        with pytest.raises(ConfigError) as error:
            plan_reshard(tmp_path, 3, config)
        assert error.value.message == ("step_0000004 was written by 2 ranks and this run has 3, and DeepSpeed's "
                                       f"universal checkpoint cannot reshard it: {why}")
        assert error.value.hint.startswith("resume with 2 ranks") and "\n" not in error.value.one_line()


@pytest.mark.parametrize(
    ("optimizer", "line"),
    [
        # Refused before anything is converted or built.
        ("sgd", "step_0000004 was written by 2 ranks and this run has 1, and DeepSpeed's universal checkpoint "
                "cannot reshard it: ds_to_universal carries Adam's state only"),
        # Converted, and ds_to_universal fails on the (empty) files: its last line, nothing left behind.
        ("adamw", "step_0000004: DeepSpeed's ds_to_universal could not convert it (exit 1): "),
    ],
    ids=["refused", "conversion-fails"],
)
def test_the_trainer_ends_in_one_line_when_a_deepspeed_checkpoint_cannot_reshard(tmp_path: Path, optimizer: str,
                                                                                   line: str) -> None:
    _fake_zero_checkpoint(tmp_path / "ckpt", 2)
    files = render(make_plan("zero2", dp=1, precision="fp32", optimizer=optimizer), tmp_path / "r")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("FSTRAIN_DEBUG", None)
    result = subprocess.run([sys.executable, "-m", "fstrain.train", *_deepspeed_args(files, tmp_path / "ckpt", 6),
                             "--resume"], capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=False)
    errors = [text for text in result.stderr.splitlines() if text.startswith("error: ")]
    assert result.returncode == 2 and len(errors) == 1 and line in errors[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert not list((tmp_path / "ckpt").glob("universal/step_0000004*"))
