"""The metric line (fstrain.core.launch.metricline): written and read back, and what is refused."""

from __future__ import annotations

import json

import pytest

from fstrain.core.launch.metricline import PREFIX, StepMetrics, format_metric_line, from_mapping, parse_metric_line


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
