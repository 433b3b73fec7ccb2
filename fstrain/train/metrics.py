"""Report a training step's numbers the way fstrain reads them: stdlib only, no torch.

A program fstrain launches calls :func:`report_step` once per logged step, on every rank::

    from fstrain.train.metrics import report_step

    report_step(step=120, loss=2.314, tokens_per_s=51234.5, step_s=0.81)

which prints one metric line (``FSTRAIN_METRICS {"v":1,...}``, documented in
fstrain/core/monitor/metricline.py and docs/observability.md) on stdout. A program without
fstrain on its nodes prints the same line itself. The bundled trainer also keeps each rank's
lines as JSON lines (:class:`MetricsLog`, ``RUN_DIR/metrics/rank<R>.jsonl``).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from fstrain.core.monitor.metricline import PREFIX, StepMetrics, format_metric_line

METRICS_FOLDER = "metrics"  # under the run directory: rank<R>.jsonl


def report_step(
    step: int,
    *,
    loss: float | None = None,
    lr: float | None = None,
    tokens_per_s: float | None = None,
    scope: str = "job",
    step_s: float | None = None,
    memory_bytes: int | None = None,
    steps: int | None = None,
    rank: int | None = None,
    stream: TextIO | None = None,
    **extra: Any,
) -> StepMetrics:
    """Print step ``step``'s metric line (one write, flushed) and return its values.

    ``rank`` defaults to the launcher's RANK variable and the time to now; ``scope`` says whether
    ``tokens_per_s`` counts the whole job's tokens ("job") or this rank's ("rank"). ``extra``
    fields (JSON values) travel in the line as they are."""
    if rank is None and os.environ.get("RANK", "").isdigit():
        rank = int(os.environ["RANK"])
    metrics = StepMetrics(step=step, steps=steps, loss=loss, lr=lr, tokens_per_s=tokens_per_s, scope=scope,
                          step_s=step_s, memory_bytes=memory_bytes, rank=rank, time=time.time(), extra=extra)
    write_metric_line(metrics, stream)
    return metrics


def write_metric_line(metrics: StepMetrics, stream: TextIO | None = None) -> None:
    """The line in one write: ranks sharing a pipe never split each other's lines."""
    out = stream if stream is not None else sys.stdout
    out.write(format_metric_line(metrics) + "\n")
    out.flush()


def metrics_file(folder: Path, rank: int) -> Path:
    """One rank's JSON-lines file in ``folder`` (``RUN_DIR/metrics``)."""
    return folder / f"rank{rank}.jsonl"


class MetricsLog:
    """A rank's metrics.jsonl: the metric line's JSON object, one line per logged step, appended
    and flushed at once, so a run killed at any point keeps every step it finished."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = path.open("a", encoding="utf-8")

    def write(self, metrics: StepMetrics) -> None:
        line = format_metric_line(metrics)[len(PREFIX):]
        self._handle.write(line + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()

