"""Where a logged step's numbers go: every rank's metric line and metrics.jsonl, rank 0's
TensorBoard event files (``--tensorboard DIR``).

TensorBoard is written by rank 0 alone: one event folder per job reads as one run in
TensorBoard, with the job's mean loss, the learning rate, the job's tokens/s and rank 0's step
time and peak memory. A writer per rank would put world-size curves of the same loss and lr
into every chart, on every node's disk; each rank's own numbers are in its metrics.jsonl and
its metric lines (``fstrain report``, the Prometheus textfile).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fstrain.core.monitor.metricline import StepMetrics
from fstrain.train.metrics import MetricsLog, metrics_file, write_metric_line

# The TensorBoard tags (the metric line's fields under "train/") of each logged step.
BOARD_TAGS = ("loss", "lr", "tokens_per_s", "step_s", "memory_bytes")


class StepLog:
    def __init__(self, metrics_dir: Path | None, tensorboard_dir: Path | None, rank: int) -> None:
        self.jsonl = MetricsLog(metrics_file(metrics_dir, rank)) if metrics_dir is not None else None
        self.board: Any = None
        if tensorboard_dir is not None and rank == 0:
            from torch.utils.tensorboard import SummaryWriter

            self.board = SummaryWriter(log_dir=str(tensorboard_dir))

    def step(self, metrics: StepMetrics, job_loss: float) -> None:
        """This rank's line and JSON line; on rank 0 the event file gets ``job_loss`` (the mean
        over ranks) as the loss, flushed at once like the JSON lines."""
        write_metric_line(metrics)
        if self.jsonl is not None:
            self.jsonl.write(metrics)
        if self.board is not None:
            values = {"loss": job_loss, "lr": metrics.lr, "tokens_per_s": metrics.tokens_per_s,
                      "step_s": metrics.step_s, "memory_bytes": metrics.memory_bytes}
            for tag in BOARD_TAGS:
                value = values[tag]
                if value is not None:
                    self.board.add_scalar(f"train/{tag}", value, metrics.step, walltime=metrics.time)
            self.board.flush()

    def close(self) -> None:
        if self.jsonl is not None:
            self.jsonl.close()
        if self.board is not None:
            self.board.close()
