"""The report's chart axes (fstrain/core/report/svg.py): tick labels that tell every tick apart
at the precision the ticks need, and a flat or nearly flat series drawn inside a padded range."""

from __future__ import annotations

import re

from fstrain.core.report.svg import Line, line_chart, nice_ticks, tick_labels


def y_tick_labels(chart: str) -> list[str]:
    """The y axis's labels of a chart, bottom to top (each sits right-aligned left of the plot)."""
    return re.findall(r'<text x="66" y="[0-9.]+" text-anchor="end">([^<]*)</text>', chart)


def test_ticks_a_few_units_apart_on_a_large_value_are_labelled_with_every_digit() -> None:
    ticks = nice_ticks(51230, 51260)
    assert ticks == [51230, 51240, 51250, 51260]
    assert tick_labels(ticks) == ["51,230", "51,240", "51,250", "51,260"]


def test_labels_keep_the_short_suffix_where_it_tells_the_ticks_apart() -> None:
    assert tick_labels([0, 20000, 40000, 60000]) == ["0", "20k", "40k", "60k"]
    assert tick_labels([1e6, 1.5e6, 2e6]) == ["1.0M", "1.5M", "2.0M"]
    assert tick_labels([0, 2.5e5, 5e5, 7.5e5, 1e6]) == ["0", "250,000", "500,000", "750,000", "1,000,000"]
    assert tick_labels([0.0, 0.2, 0.4]) == ["0", "0.2", "0.4"]
    assert tick_labels([0.0, 0.25, 0.5]) == ["0", "0.25", "0.50"]


def test_a_nearly_flat_tokens_per_s_series_has_distinct_tick_labels() -> None:
    """Tokens/s of about 1,000 that varies by a few tokens: six ticks, once all labelled "1k"."""
    rates = (1000.4, 1003.1, 1001.7, 1004.6, 1002.2)
    chart = line_chart("tokens", "Tokens/s over steps",
                       [Line("all ranks", tuple((float(step), rate) for step, rate in enumerate(rates, 1)))],
                       "step", "tokens/s")
    labels = y_tick_labels(chart)
    assert len(labels) >= 3 and len(set(labels)) == len(labels), labels
    assert labels == ["1,000", "1,001", "1,002", "1,003", "1,004", "1,005"]


def test_a_flat_series_is_drawn_inside_a_padded_range() -> None:
    ticks = nice_ticks(1000.0, 1000.0)
    assert ticks[0] < 1000.0 < ticks[-1]  # the line runs through the middle, not along an edge
    assert ticks[-1] - ticks[0] <= 300.0  # and the range stays about the value
    labels = tick_labels(ticks)
    assert len(set(labels)) == len(labels) and "1,000" in labels
    assert nice_ticks(0.0, 0.0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]  # zero stays the floor (a loss, a memory)


def test_a_range_far_narrower_than_its_level_is_widened_to_readable_ticks() -> None:
    """A change of 0.01 % of the value is noise on a chart: ticks finer than that would need
    more than six digits each."""
    ticks = nice_ticks(1000.0, 1000.0004)
    assert ticks[0] <= 1000.0 and ticks[-1] >= 1000.0004 and ticks[-1] - ticks[0] >= 0.1
    labels = tick_labels(ticks)
    assert len(set(labels)) == len(labels) and max(len(label.replace(",", "")) for label in labels) <= 8
