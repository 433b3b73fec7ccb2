"""The metric line (fstrain.core.monitor.metricline): written and read back, and what is refused."""

from __future__ import annotations

import json

import pytest

from fstrain.core.monitor.metricline import (
    METRIC_LINE,
    PREFIX,
    PROGRESS_LINE,
    StepMetrics,
    StepReading,
    format_metric_line,
    from_mapping,
    parse_metric_line,
    read_step,
)


def test_a_line_reads_back_as_written() -> None:
    metrics = StepMetrics(step=12, steps=100, loss=2.5, lr=1e-4, tokens_per_s=5000.0, scope="rank", step_s=0.4,
                          memory_bytes=3 << 30, rank=3, time=1_700_000_000.5, extra={"grad_norm": 1.25})
    line = format_metric_line(metrics)
    assert line.startswith(PREFIX) and "\n" not in line
    assert parse_metric_line(line) == metrics


def test_only_the_step_is_required_and_a_launcher_tag_before_the_prefix_is_allowed() -> None:
    parsed = parse_metric_line('[rank3]: FSTRAIN_METRICS {"step": 7}\n')
    assert parsed == StepMetrics(step=7)
    assert parse_metric_line(b'FSTRAIN_METRICS {"step": 0, "loss": 3}') == StepMetrics(step=0, loss=3.0)


def test_non_finite_numbers_are_written_as_null() -> None:
    line = format_metric_line(StepMetrics(step=1, loss=float("nan"), tokens_per_s=float("inf")))
    assert json.loads(line[len(PREFIX):])["loss"] is None
    assert parse_metric_line(line) == StepMetrics(step=1)


@pytest.mark.parametrize("line", [
    "step 5 loss 2.0",  # not a metric line
    "FSTRAIN_METRICS {not json}",
    'FSTRAIN_METRICS {"loss": 2.0}',  # no step
    'FSTRAIN_METRICS {"step": -1}',
    'FSTRAIN_METRICS {"step": true}',
    'FSTRAIN_METRICS {"step": 1.5}',
    'FSTRAIN_METRICS {"step": 1, "loss": "low"}',
    'FSTRAIN_METRICS {"step": 1, "rank": 2.0}',
    'FSTRAIN_METRICS {"step": 1, "scope": "node"}',
    'FSTRAIN_METRICS {"v": 2, "step": 1}',  # a newer format
    'FSTRAIN_METRICS [1, 2]',
])
def test_what_is_not_a_readable_metric_line_reads_as_none(line: str) -> None:
    assert parse_metric_line(line) is None


def test_an_overlong_line_is_not_read() -> None:
    assert parse_metric_line(PREFIX + '{"step": 1, "pad": "' + "x" * 70_000 + '"}') is None
    assert from_mapping({"step": 1, "pad": "x"}) == StepMetrics(step=1, extra={"pad": "x"})


# Real lines: a `fstrain launch --model tiny --nproc-per-node 1 --steps 3` run's log file (the bundled
# trainer on CPU, tagged as `fstrain logs` shows them), and the DeepSpeed run of
# tests/fixtures/gpu/h200-2026-11-30/zero2-gpt2-1.5b-train-head.log (untagged).
TINY_METRIC = ('[localhost r0] FSTRAIN_METRICS {"v":1,"step":2,"steps":3,"loss":6.2902092933654785,"lr":0.0003,'
               '"tokens_per_s":299.24085400752324,"step_s":1.6968562959955307,"memory_bytes":377581568,"rank":0,'
               '"time":1796171094.572452,"scope":"job"}')
TINY_PROGRESS = "[localhost r0] [fstrain.train] step 2/3 loss 6.2902 lr 3.000e-04 tokens/s 299 max_rss_bytes=360.1MiB"
H200_PROGRESS = ("[fstrain.train] step 1/4 loss 11.1449 lr 0.000e+00 tokens/s 694 max_allocated_bytes=32746.2MiB "
                 "max_reserved_bytes=47034.0MiB")


def test_read_step_reads_a_metric_line_whole() -> None:
    reading = read_step(TINY_METRIC)
    assert reading is not None and reading.source == METRIC_LINE and reading.from_metric_line
    assert reading.metrics == StepMetrics(step=2, steps=3, loss=6.2902092933654785, lr=0.0003,
                                          tokens_per_s=299.24085400752324, scope="job", step_s=1.6968562959955307,
                                          memory_bytes=377581568, rank=0, time=1796171094.572452)
    assert read_step(TINY_METRIC, any_program=True) == reading


@pytest.mark.parametrize(("line", "expected"), [
    (TINY_PROGRESS, StepMetrics(step=2, steps=3, loss=6.2902, tokens_per_s=299.0)),
    (H200_PROGRESS, StepMetrics(step=1, steps=4, loss=11.1449, tokens_per_s=694.0)),
    ("[default0]:[fstrain.train] step 12/20 loss 3.4567 lr 1.000e-04 tokens/s 12,345 cpu=1.0MiB and more words",
     StepMetrics(step=12, steps=20, loss=3.4567, tokens_per_s=12345.0)),
    ("[fstrain.train] step 7", StepMetrics(step=7)),
    ("[fstrain.train] step 5/20 loss nan lr 0", StepMetrics(step=5, steps=20, loss=float("nan"))),
    # What comes before the trainer's mark is not read: the step is the mark's.
    ("[rank0]: warm-up step 99 done [fstrain.train] step 5/20 loss 3.0000", StepMetrics(step=5, steps=20, loss=3.0)),
    # Numbers that only look like numbers are left out, the step still counts.
    ("[fstrain.train] step 5/20 loss - lr 1e-4 tokens/s .", StepMetrics(step=5, steps=20)),
    # A metric line that cannot be read, then the trainer's progress line on the same line.
    ("FSTRAIN_METRICS {not json} [fstrain.train] step 6/20 loss 2.0000", StepMetrics(step=6, steps=20, loss=2.0)),
])
def test_read_step_reads_the_trainers_progress_line(line: str, expected: StepMetrics) -> None:
    reading = read_step(line)
    assert reading is not None and reading.source == PROGRESS_LINE and not reading.from_metric_line
    assert repr(reading.metrics) == repr(expected)  # repr: NaN == NaN


@pytest.mark.parametrize("line", [
    "[localhost r0] [fstrain.train] done: loss 6.2753 -> 6.1251 over 3 steps",
    "[fstrain.train] rank 0/1 local 0 on vm (cuda, backend deepspeed)",
    "[2026-11-30 15:55:24,169] [WARNING] [lr_schedules.py:938:get_lr] Attempting to get learning rate from "
    "scheduler before it has started",
    "[fstrain.train] resumed from step 4",
    "[fstrain.train] checkpoint saved: step 10 in /ckpt/step_0000010",
    "[fstrain.train] step x/20 loss 1.0",
    "FSTRAIN_METRICS {not json}",
    'FSTRAIN_METRICS {"step": 1.5, "loss": 2.0}',
    "rank 3 step 4/10 loss 2.5000",  # a program's own: read only with any_program
    "",
])
def test_what_is_neither_reads_as_none(line: str) -> None:
    assert read_step(line) is None


def test_any_program_also_reads_a_programs_own_step_lines() -> None:
    assert read_step("rank 3 step 4/10 loss 2.5000", any_program=True) == StepReading(
        StepMetrics(step=4, steps=10, loss=2.5), PROGRESS_LINE)
    assert read_step("[fstrain.train] resumed from step 4", any_program=True) == StepReading(
        StepMetrics(step=4), PROGRESS_LINE)
    assert read_step(TINY_PROGRESS, any_program=True) == read_step(TINY_PROGRESS)
    assert read_step("step 7 loss e tokens/s ,", any_program=True) == StepReading(StepMetrics(step=7), PROGRESS_LINE)
    for line in ("steps 4", "stepped 3 times", "line rank=0 attempt=0 step=5", "FSTRAIN_METRICS {not json}"):
        assert read_step(line, any_program=True) is None
