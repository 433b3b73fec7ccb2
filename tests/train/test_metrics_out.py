"""The bundled trainer's step metrics, from a real 2-rank CPU run: a metric line per rank and
logged step, each rank's metrics.jsonl, and rank 0's TensorBoard event files read back with
TensorBoard's own reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from fstrain.core.monitor.metricline import parse_metric_line, parse_metrics_jsonl
from fstrain.train.steplog import BOARD_TAGS
from tests.train.conftest import torchrun

pytestmark = pytest.mark.train

STEPS, LOG_EVERY, NPROC = 5, 2, 2
LOGGED = [2, 4, 5]  # every LOG_EVERY-th step, and the last


def test_every_rank_reports_every_logged_step(tmp_path: Path) -> None:
    run = torchrun(NPROC, ["--steps", str(STEPS), "--log-every", str(LOG_EVERY), "--metrics-dir",
                           str(tmp_path / "metrics"), "--tensorboard", str(tmp_path / "tb")], tmp_path / "summary.json")
    lines = [m for m in map(parse_metric_line, run.stdout.splitlines()) if m is not None]
    assert sorted((m.rank, m.step) for m in lines) == sorted((r, s) for r in range(NPROC) for s in LOGGED)
    assert {(m.steps, m.scope) for m in lines} == {(STEPS, "job")}
    assert all(m.loss and m.lr and m.tokens_per_s and m.step_s and m.memory_bytes and m.time for m in lines)
    assert run.stdout.count(f"step {STEPS}/{STEPS} loss") == 1  # rank 0's progress line stays

    for rank in range(NPROC):
        kept = parse_metrics_jsonl((tmp_path / "metrics" / f"rank{rank}.jsonl").read_text())
        assert kept == [m for m in lines if m.rank == rank]

    # Rank 0 alone writes events: the job's mean loss, which the summary holds per step.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(tmp_path / "tb"))
    board.Reload()
    assert sorted(board.Tags()["scalars"]) == sorted(f"train/{tag}" for tag in BOARD_TAGS)
    for tag in BOARD_TAGS:
        assert [event.step for event in board.Scalars(f"train/{tag}")] == LOGGED
    losses = [event.value for event in board.Scalars("train/loss")]  # stored as float32
    assert losses == pytest.approx([run.summary["losses"][s - 1] for s in LOGGED], rel=1e-6)
