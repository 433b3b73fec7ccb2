"""Real 2-process CPU runs of deepspeed.initialize with rendered configs: ZeRO 1, 2 and 3, with
CPU offload of the optimizer (ZeRO-2) and of optimizer and parameters (ZeRO-3), DeepSpeed's
activation checkpointing, and a checkpoint save + resume that reproduces the uninterrupted run.
The ZeRO runs also have the engine print its own step lines, which fstrain reads (metricline's
DeepSpeed formats), checked against DeepSpeed's own CSV monitor of the same run."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from fstrain.core.monitor.metricline import newer_step, read_step
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
    print_engine_lines(out / "ds_config.json", tmp_path / "monitor")
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
    assert_engine_lines_read_as_logged(run.stdout.splitlines() + run.stderr.splitlines(), tmp_path / "monitor",
                                       samples_per_step=4 * 2 * 2)


def print_engine_lines(ds_config: Path, monitor: Path) -> None:
    """The rendered config, with the engine printing its step and ThroughputTimer lines every step
    (INFO lines: DeepSpeed's logger starts at WARNING) and its CSV monitor recording each step's
    learning rate under ``monitor``: the run trains as rendered, and says more."""
    config = json.loads(ds_config.read_text())
    config.update({"steps_per_print": 1, "log_level": "info",
                   "csv_monitor": {"enabled": True, "output_path": str(monitor), "job_name": "engine"}})
    ds_config.write_text(json.dumps(config))


def assert_engine_lines_read_as_logged(lines: list[str], monitor: Path, samples_per_step: int) -> None:
    """The engine's lines, read as `status` and `report` read them, give each step's learning rate
    as DeepSpeed's CSV monitor recorded it (by the samples trained), and its samples/s."""
    with (monitor / "engine" / "Train_Samples_lr.csv").open() as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["step", "lr"]
    logged = {int(samples) // samples_per_step: float(lr) for samples, lr in rows[1:]}
    assert sorted(logged) == list(range(1, STEPS + 1))
    # The bundled trainer's own progress and metric lines are beside them: left out here.
    ds_lines = [line for line in lines if (r := read_step(line)) is not None and r.source.startswith("DeepSpeed")]
    found = [r for r in map(read_step, ds_lines) if r is not None]
    engine = {r.metrics.step: r.metrics for r in found if r.source == "DeepSpeed engine"}
    assert {step: m.lr for step, m in engine.items() if step > 0} == logged  # step 0: before the first
    timer = [r.metrics for r in found if r.source == "DeepSpeed ThroughputTimer"]
    assert timer and timer[-1].step == STEPS and all(m.extra["samples_per_s"] > 0 for m in timer)
    held = None
    for line in ds_lines:
        held = newer_step(held, line)  # the step's two lines add up
    assert held is not None and (held.metrics.step, held.metrics.lr) == (STEPS, logged[STEPS])
    assert held.metrics.extra["samples_per_s"] == timer[-1].extra["samples_per_s"]


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
