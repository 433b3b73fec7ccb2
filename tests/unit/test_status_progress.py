"""Each rank's ``progress`` in `fstrain status`: its latest numbers, from its metric line or its
progress line, the way the live view (`status --watch`) reads them, on every rank. For a detached
run, from the record the node's watchdog keeps per rank (fstrain/io/remote/coordinator.py
``Output``), which the live view and `runs` then read from the status alone; for a Slurm run,
from each rank's log file."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from fstrain.api.runs import Run, progress_of, row_progress, status_document
from fstrain.cli.watch_output import read_view
from fstrain.core.hosts.hostfile import Host
from fstrain.core.monitor.metricline import StepMetrics, format_metric_line, newer_step
from fstrain.core.monitor.watch import Watch, latest_samples
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
    (1, metric(2, 1, loss=2.52, tokens_per_s=560.0, step_s=0.5, memory_bytes=2**30, extra={"note": "x" * 300})),
    (0, "[fstrain.train] checkpoint saved: step 2 in /ckpt"),
    (1, "saving"),
]
EXPECTED = {0: {"step": 2, "steps": 10, "loss": 2.51, "tokens_per_s": 550.0, "step_s": None, "memory_bytes": None},
            1: {"step": 2, "steps": 10, "loss": 2.52, "tokens_per_s": 560.0, "step_s": 0.5, "memory_bytes": 2**30}}


def as_live_view_reads_it() -> dict[int, dict[str, Any]]:
    """What `status --watch` shows of the same lines (fstrain/core/monitor/watch.py)."""
    samples = latest_samples(f"[node1 r{rank}] {text}\n" for rank, text in LINES)
    return {rank: {"step": m.step, "steps": m.steps, "loss": m.loss, "tokens_per_s": m.tokens_per_s,
                   "step_s": m.step_s, "memory_bytes": m.memory_bytes} for rank, m in samples.items()}


def test_progress_is_the_latest_metric_line_else_progress_line_as_the_live_view_reads_it() -> None:
    found = {rank: progress_of(text for r, text in LINES if r == rank) for rank in (0, 1)}
    assert found == EXPECTED == as_live_view_reads_it()
    assert progress_of([TRAINER.format(step=4, loss=1.0, rate=2000)]) == {
        "step": 4, "steps": 10, "loss": 1.0, "tokens_per_s": 2000.0, "step_s": None, "memory_bytes": None}
    assert progress_of(["hello", ""]) is None


def status_ranks(output: Output, tmp_path: Path) -> list[dict[str, Any]]:
    """The ranks of a detached run's status whose one node's record ``output`` keeps."""
    node = {**output.snapshot(), "node_rank": 0, "exit_code": None}
    view = {"node": node, "run": {"state": "running"}, "watchdog_alive": True, "ranks_alive": [0, 1]}
    hosts = (DetachedNode(Host("node1"), 0, 2, 0, str(tmp_path), 10, 11),)
    detached = DetachedRecord("20261201-120000-aaaaaa", "torchrun", time.time(), "python3", 15.0, None, "", 1234,
                              hosts)
    document = status_document(RunRecord(detached.run_id, tmp_path, detached, None, None), [view])
    return list(document["nodes"][0]["ranks"])


def test_a_detached_runs_status_shows_every_ranks_numbers_from_the_nodes_record(tmp_path: Path) -> None:
    output = Output(-1, str(tmp_path / "node0.out"), [], newer_step)  # note() only: no pipe is read
    now = time.time()
    for rank, text in LINES:
        output.note(now, f"[local{rank}]:{text}")
    ranks = status_ranks(output, tmp_path)
    assert [r["rank"] for r in ranks] == [0, 1]
    assert {r["rank"]: r["progress"] for r in ranks} == EXPECTED == as_live_view_reads_it()
    assert [r["last_line"] for r in ranks] == ["[local0]:[fstrain.train] checkpoint saved: step 2 in /ckpt",
                                                "[local1]:saving"]


# transformers' Trainer under torchrun (examples/train_hf.py, tests/fixtures/trainer-output): the
# bar's draws on stderr, a line it is still writing, and a log dict per step on stdout.
HF_DRAWS = "\r  8%|▊         | 1/12 [00:01<00:13,  1.26s/it]\r 17%|█▋        | 2/12 [00:02<00:11,  1.12s/it]"
HF_DICT = ("{'loss': '4.216', 'grad_norm': '1.629', 'learning_rate': '0.0005', 'epoch': '0.0625', "
           "'num_input_tokens_seen': 2048, 'train_runtime': '2.1', 'train_tokens_per_second': '975.2'}")


def test_a_bars_draws_and_the_trainers_dicts_give_status_step_loss_and_tokens(tmp_path: Path) -> None:
    """The watchdog's draw events give the step while the bar's line is still being written;
    the dict that follows gives its loss and tokens/s. A draw is output (the rank's last output
    time) but no line: the rank's last line and the node's last lines stay as they were."""
    output = Output(-1, str(tmp_path / "node0.out"), [], newer_step)
    output.note(100.0, "[local0]:starting")
    output.note_draw(101.0, {"local": 0, "fd": 2, "text": HF_DRAWS})
    (rank,) = status_ranks(output, tmp_path)
    assert rank["progress"] == {"step": 2, "steps": 12, "loss": None, "tokens_per_s": None, "step_s": None,
                                "memory_bytes": None}
    assert (rank["last_line"], rank["last_output_at"]) == ("[local0]:starting", 101.0)
    output.note(102.0, f"[local0]:{HF_DICT}")
    step_3 = "\r 25%|██▌       | 3/12 [00:03<00:09,  1.04s/it]"
    output.note_draw(103.0, {"local": 0, "fd": 2, "text": HF_DRAWS + step_3})
    output.note_draw(104.0, {"local": "0", "text": "\r 99%|#| 11/12 [00:03<00:09,  1.04s/it]"})  # not the watchdog's
    (rank,) = status_ranks(output, tmp_path)
    assert rank["progress"] == {"step": 3, "steps": 12, "loss": 4.216, "tokens_per_s": 975.2, "step_s": None,
                                "memory_bytes": None}
    assert output.snapshot()["last_lines"] == ["[local0]:starting", f"[local0]:{HF_DICT}"]


class CountingOutputs:
    """A run's output that counts its reads (what a refresh would read on every node)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.reads = 0

    def read(self, tail: int | None = None) -> Iterator[str]:
        self.reads += 1
        return iter(self.lines)

    def close(self) -> None:
        pass


class DetachedRun:
    """What the live view and `runs` ask of a detached run: its status document, its output."""

    kind = "detached"

    def __init__(self, document: dict[str, Any], outputs: CountingOutputs) -> None:
        self.document, self._outputs = document, outputs
        self.record = SimpleNamespace(started=time.time() - 60)

    def status(self) -> dict[str, Any]:
        return self.document

    def outputs(self) -> CountingOutputs:
        return self._outputs

    def events(self) -> None:
        return None


def detached_status(output: Output | None, tmp_path: Path) -> dict[str, Any]:
    """A one-node detached run's status: node 0 answered with the node's view (from ``output``),
    or, with None, had none for it."""
    view = None if output is None else {"node": {**output.snapshot(), "node_rank": 0, "exit_code": None},
                                         "run": {"state": "running"}, "watchdog_alive": True, "ranks_alive": [0, 1]}
    hosts = (DetachedNode(Host("node1"), 0, 2, 0, str(tmp_path), 10, 11),)
    detached = DetachedRecord("20261201-120000-aaaaaa", "torchrun", time.time(), "python3", 15.0, None, "", 1234,
                              hosts)
    return status_document(RunRecord(detached.run_id, tmp_path, detached, None, None), [view])


def test_a_detached_runs_live_view_and_runs_row_read_the_numbers_from_its_status_alone(tmp_path: Path) -> None:
    """While node 0 holds every node's view, `status --watch` and `runs` take each rank's
    numbers (step time and memory among them) from the status, one SSH session, and read no
    output on the nodes; a node without its view has its output read, with the same numbers."""
    output = Output(-1, str(tmp_path / "node0.out"), [], newer_step)
    for rank, text in LINES:
        output.note(time.time(), f"[local{rank}]:{text}")
    tagged = [f"[node1 r{rank}] {text}\n" for rank, text in LINES]
    shown = []
    for document in (detached_status(output, tmp_path), detached_status(None, tmp_path)):
        outputs = CountingOutputs(tagged)
        run = cast(Run, DetachedRun(document, outputs))
        view = read_view(run, outputs, Watch())
        assert outputs.reads == (0 if document["nodes"][0]["reachable"] else 1)
        shown.append([(r.rank, r.step, r.loss, r.tokens_per_s, r.step_s, r.memory_bytes) for r in view.rows])
        row = row_progress(run, "running")
        assert outputs.reads == (0 if document["nodes"][0]["reachable"] else 2)
        assert (row["step"], row["steps"]) == (2, 10)
    assert shown[0] == shown[1] == [(0, 2, 2.51, 550.0, None, None), (1, 2, 2.52, 560.0, 0.5, 2**30)]
