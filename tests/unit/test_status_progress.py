"""Each rank's ``progress`` in `fstrain status`: its latest numbers, from its metric line or its
progress line, the way the live view (`status --watch`) reads them, on every rank. For a detached
run, from the record the node's watchdog keeps per rank (fstrain/io/remote/coordinator.py
``Output``); for a Slurm run, from each rank's log file."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fstrain.api.runs import progress_of, status_document
from fstrain.core.hosts.hostfile import Host
from fstrain.core.monitor.metricline import StepMetrics, format_metric_line, newer_step
from fstrain.core.monitor.watch import latest_samples
from fstrain.core.runs.runrecord import DetachedNode, DetachedRecord
from fstrain.io.remote.coordinator import Output
from fstrain.io.runs import RunRecord

TRAINER = "[fstrain.train] step {step}/10 loss {loss:.4f} lr 1.000e-04 tokens/s {rate:,.0f} max_rss_bytes=1MiB"


def metric(step: int, rank: int, **values: Any) -> str:
    return format_metric_line(StepMetrics(step=step, steps=10, rank=rank, scope="rank", **values))


# What each local rank prints, in order. Rank 0 is the bundled trainer: its progress line and a
# metric line per step, then a line that only says a step ("checkpoint saved: step 2"). Rank 1
# prints nothing but metric lines (the last one over 300 characters: extra fields), then a plain line.
LINES = [
    (0, TRAINER.format(step=1, loss=3.0, rate=1000)), (0, metric(1, 0, loss=3.01, tokens_per_s=500.0)),
    (1, metric(1, 1, loss=3.02, tokens_per_s=510.0)),
    (0, TRAINER.format(step=2, loss=2.5, rate=1100)), (0, metric(2, 0, loss=2.51, tokens_per_s=550.0)),
    (1, metric(2, 1, loss=2.52, tokens_per_s=560.0, extra={"note": "x" * 300})),
    (0, "[fstrain.train] checkpoint saved: step 2 in /ckpt"),
    (1, "saving"),
]
EXPECTED = {0: {"step": 2, "steps": 10, "loss": 2.51, "tokens_per_s": 550.0},
            1: {"step": 2, "steps": 10, "loss": 2.52, "tokens_per_s": 560.0}}


def as_live_view_reads_it() -> dict[int, dict[str, Any]]:
    """What `status --watch` shows of the same lines (fstrain/core/monitor/watch.py)."""
    samples = latest_samples(f"[node1 r{rank}] {text}\n" for rank, text in LINES)
    return {rank: {"step": m.step, "steps": m.steps, "loss": m.loss, "tokens_per_s": m.tokens_per_s}
            for rank, m in samples.items()}


def test_progress_is_the_latest_metric_line_else_progress_line_as_the_live_view_reads_it() -> None:
    found = {rank: progress_of(text for r, text in LINES if r == rank) for rank in (0, 1)}
    assert found == EXPECTED == as_live_view_reads_it()
    assert progress_of([TRAINER.format(step=4, loss=1.0, rate=2000)]) == {"step": 4, "steps": 10, "loss": 1.0,
                                                                          "tokens_per_s": 2000.0}
    assert progress_of(["hello", ""]) is None


def test_a_detached_runs_status_shows_every_ranks_numbers_from_the_nodes_record(tmp_path: Path) -> None:
    output = Output(-1, str(tmp_path / "node0.out"), [], newer_step)  # note() only: no pipe is read
    now = time.time()
    for rank, text in LINES:
        output.note(now, f"[local{rank}]:{text}")
    node = {**output.snapshot(), "node_rank": 0, "exit_code": None}
    view = {"node": node, "run": {"state": "running"}, "watchdog_alive": True, "ranks_alive": [0, 1]}
    hosts = (DetachedNode(Host("node1"), 0, 2, 0, str(tmp_path), 10, 11),)
    detached = DetachedRecord("20261201-120000-aaaaaa", "torchrun", now, "python3", 15.0, None, "", 1234, hosts)
    document = status_document(RunRecord(detached.run_id, tmp_path, detached, None, None), [view])
    ranks = document["nodes"][0]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert {r["rank"]: r["progress"] for r in ranks} == EXPECTED == as_live_view_reads_it()
    assert [r["last_line"] for r in ranks] == ["[local0]:[fstrain.train] checkpoint saved: step 2 in /ckpt",
                                                "[local1]:saving"]
