"""Trainers' own output, read from a real run of each package on the CPU: transformers' Trainer,
Lightning's Trainer and a loop on Accelerate (tests/train/programs/), unchanged. Each run's
output is read as fstrain reads a rank's lines (metricline.read_step: `status` through
newer_step, `report` through rank_series, the Prometheus textfile through NodeMetrics) and
compared with what the package recorded itself: transformers' trainer_state.json, Lightning's
CSVLogger metrics.csv, Accelerate's TensorBoard tracker. One short run per package, one process
each, several checks per run. DeepSpeed's engine lines are checked on the ZeRO runs of
test_deepspeed_train.py, which print them: no DeepSpeed run of its own.

On a tiny model a step takes milliseconds, under tqdm's 0.1 s between draws, so a bar would
skip the draws of most steps; ``TQDM_MININTERVAL=0`` (tqdm's own setting, read from the
environment) draws every update, as a real model's step of a second or more does."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fstrain.core.monitor.metricline import newer_reading, newer_step, read_step
from fstrain.core.monitor.promfile import NodeMetrics
from fstrain.core.report.series import rank_series
from tests.unit.test_trainer_lines import significant

# Alone, at a load average of 5 on the shared 2 cores: 9.2 s (transformers), 7.4 s (Lightning),
# 4.3 s (Accelerate); under 10 s, so not slow.
pytestmark = pytest.mark.train

PROGRAMS = Path(__file__).resolve().parent / "programs"


def run_program(name: str, out: Path, merged: bool = False) -> tuple[str, str]:
    """stdout and stderr of ``python programs/NAME OUT``, each as written (tqdm's "\\r" kept);
    ``merged``: both in one pipe, as one file holds them (a Slurm output file, ``2>&1``), and
    returned as stdout."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TQDM_MININTERVAL": "0"}
    result = subprocess.run([sys.executable, str(PROGRAMS / name), str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merged else subprocess.PIPE, env=env, timeout=300,
                            check=False)
    stdout, stderr = result.stdout.decode("utf-8"), (result.stderr or b"").decode("utf-8")
    if result.returncode != 0:
        pytest.fail(f"{name} exited {result.returncode}\n--- stdout\n{stdout[-5000:]}\n--- stderr\n{stderr[-5000:]}")
    return stdout, stderr


def relayed(text: str) -> list[str]:
    """The output's lines as a relay splits them: at "\\n" only, tqdm's "\\r" redraws kept."""
    return text.split("\n")


def textfile_samples(lines: list[str]) -> dict[str, float]:
    """metric name -> value in the Prometheus textfile of a one-rank node that printed ``lines``."""
    node = NodeMetrics("r1", "node1", 0, 1, 0, started=100.0, read_step=read_step, newer_reading=newer_reading)
    for line in lines:
        node.line(None, line, 101.0)
    return {line.split("{", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in node.render(102.0).splitlines() if line and not line.startswith("#")}


def test_a_transformers_trainer_run_reads_as_its_log_history(tmp_path: Path) -> None:
    # Both streams in one: the log dicts on stdout end the lines of the bar on stderr, which
    # gives their step (the bar alone, in a file of its own, is tests/unit/test_trainer_lines.py's).
    merged = relayed(run_program("hf_trainer.py", tmp_path, merged=True)[0])
    state = json.loads((tmp_path / "checkpoint-6" / "trainer_state.json").read_text())
    logged = {e["step"]: e for e in state["log_history"] if "loss" in e}
    assert sorted(logged) == [2, 4, 6]
    found = [r for r in map(read_step, merged) if r is not None]
    assert found and {r.source for r in found} == {"transformers Trainer"}
    assert (found[-1].metrics.step, found[-1].metrics.steps) == (6, 6)
    # ProgressCallback prints each float as f"{v:.4g}" (transformers 5.25 trainer_callback.py:686)
    assert [(r.metrics.step, r.metrics.loss, r.metrics.lr, r.metrics.extra["grad_norm"])
            for r in found if r.metrics.loss is not None] == [
        (step, significant(e["loss"], 4), significant(e["learning_rate"], 4), significant(e["grad_norm"], 4))
        for step, e in sorted(logged.items())]
    (series,) = rank_series(merged)  # fstrain report
    assert {p.step: p.loss for p in series.points if p.loss is not None} == {
        step: significant(e["loss"], 4) for step, e in logged.items()}
    held = None
    for line in merged:  # fstrain status
        held = newer_step(held, line)
    assert held is not None and (held.metrics.step, held.metrics.loss) == (6, significant(logged[6]["loss"], 4))
    samples = textfile_samples(merged)
    assert (samples["fstrain_step"], samples["fstrain_final_step"]) == (6, 6)
    assert samples["fstrain_loss"] == significant(logged[6]["loss"], 4)


def test_a_lightning_run_reads_as_its_csv_logger(tmp_path: Path) -> None:
    stdout, stderr = run_program("lightning_trainer.py", tmp_path)
    with (tmp_path / "lightning" / "version_0" / "metrics.csv").open() as handle:
        logged = {int(row["step"]): float(row["train_loss"]) for row in csv.DictReader(handle) if row["train_loss"]}
    assert sorted(logged) == list(range(8))  # 4 batches x 2 epochs, steps from 0
    found = [r for r in map(read_step, relayed(stdout)) if r is not None]
    assert found and {r.source for r in found} == {"Lightning Trainer"}
    # The bar's batches done count from 1, the CSV's steps from 0; tqdm shows 3 significant digits.
    for reading in found:
        assert reading.metrics.loss == significant(logged[reading.metrics.step - 1], 3), reading
    assert found[-1].metrics.step == 8
    assert [line for line in relayed(stderr) if read_step(line) is not None] == []
    (series,) = rank_series(relayed(stdout))
    assert series.points[-1].step == 8 and series.points[-1].loss == significant(logged[7], 3)
    samples = textfile_samples(relayed(stdout))
    assert (samples["fstrain_step"], samples["fstrain_loss"]) == (8, significant(logged[7], 3))


def test_an_accelerate_loop_reads_as_its_tensorboard_tracker(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    stdout, stderr = run_program("accelerate_loop.py", tmp_path)
    board = EventAccumulator(str(tmp_path / "loop"))
    board.Reload()
    logged = {e.step: (e.value, lr.value) for e, lr in zip(board.Scalars("step_loss"), board.Scalars("lr"),
                                                           strict=True)}
    assert sorted(logged) == list(range(1, 9))
    assert [line for line in relayed(stdout) if read_step(line) is not None] == []
    lines = relayed(stderr)
    found = [r for r in map(read_step, lines) if r is not None]
    assert found and {r.source for r in found} == {"Accelerate steps bar"}
    last = found[-1].metrics  # the bar's line ends at the end: its last draw
    assert (last.step, last.steps) == (8, 8)
    # The postfix shows 3 significant digits (tqdm's format_num); TensorBoard keeps float32.
    assert (last.loss, last.lr) == (pytest.approx(logged[8][0], rel=5e-3), pytest.approx(logged[8][1], rel=5e-3))
    # Draw by draw (a relay that passes tqdm's redraws as they come): each step's last draw
    # shows what the loop logged at that step.
    by_step = {}
    for draw in stderr.replace("\n", "\r").split("\r"):
        reading = read_step(draw)
        if reading is not None:
            by_step[reading.metrics.step] = reading.metrics
    assert set(by_step) - {0} == set(logged)  # step 0: the bar's first draw, before any step
    for step, (loss, lr) in logged.items():
        assert (by_step[step].loss, by_step[step].lr) == (pytest.approx(loss, rel=5e-3),
                                                          pytest.approx(lr, rel=5e-3)), step
    samples = textfile_samples(lines)
    assert (samples["fstrain_step"], samples["fstrain_final_step"]) == (8, 8)

