"""Small SVG charts written by hand: a line chart, a per-rank distribution, bars with reference
lines and a timeline. Pure Python, no dependency: the page must open with no network and
``fstrain report`` must run wherever fstrain does (see docs/observability.md for the choice).

Every chart is one ``<svg>`` element with a ``data-chart`` attribute naming it and a ``<title>``
per mark, so a browser shows each value on hover and a test can find each chart.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import TypeVar

from fstrain.core.report.series import quantile

T = TypeVar("T")
WIDTH, HEIGHT = 760, 300
LEFT, RIGHT, TOP, BOTTOM = 72, 150, 34, 44  # margins: the y ticks left, the legend right
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
ALERT = "#d62728"
# A long run on many ranks must still make a page a browser opens at once: a line keeps at most
# MAX_LINE_POINTS points (evenly spaced, the last always), hover markers are drawn up to
# MAX_MARKERS points per line, a distribution at most MAX_DOTS dots per rank, and the legend
# names the first LEGEND_ROWS series (the --json output keeps every number).
MAX_LINE_POINTS = 1000
MAX_MARKERS = 200
MAX_DOTS = 300
LEGEND_ROWS = 12


@dataclass(frozen=True)
class Line:
    label: str
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Group:
    """One rank's values in a distribution chart."""

    label: str
    values: tuple[float, ...]
    marked: bool
    """Drawn in the alert colour with ``mark_label`` (a straggler)."""


@dataclass(frozen=True)
class Bar:
    label: str
    value: float


@dataclass(frozen=True)
class Reference:
    label: str
    value: float


@dataclass(frozen=True)
class Mark:
    """One timeline event: where on the time axis (None: after the last timed one), its row label."""

    at: float | None
    kind: str
    text: str
    alert: bool


# A flat series (every value the same) is drawn inside its value +- FLAT_PAD_FRACTION, so its
# line runs through the middle of the plot; a flat zero keeps zero as its floor (a loss, a memory).
FLAT_PAD_FRACTION = 0.10
# A range narrower than MIN_SPAN_FRACTION of its level (tokens/s of 1,000.0 to 1,000.04) is
# widened to that: finer ticks would need more than six digits each, and so small a change is
# noise on a chart (the --json output keeps every number).
MIN_SPAN_FRACTION = 1e-4
# Tick labels use a k/M/G suffix only where it needs at most this many decimals (20k, 1.5M);
# a finer step is written whole (51,230), which a reader compares at a glance.
SUFFIX_DECIMALS = 1
SUFFIXES = ((1e9, "G"), (1e6, "M"), (1e3, "k"))


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high] (a flat or nearly flat range padded first)."""
    if not math.isfinite(low) or not math.isfinite(high):
        return [0.0]
    low, high = _padded(low, high)
    raw = (high - low) / max(1, count)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step)
    ticks = []
    index = first
    while index * step <= high + step * 1e-9:
        ticks.append(round(index * step, 12))
        index += 1
    if ticks[-1] < high:
        ticks.append(round(index * step, 12))
    return ticks


def _padded(low: float, high: float) -> tuple[float, float]:
    """The range to draw: a flat one padded around its value, one narrower than
    MIN_SPAN_FRACTION of its level widened about its middle."""
    if high < low:
        low, high = high, low
    level = max(abs(low), abs(high))
    if high == low:
        return (0.0, 1.0) if low == 0 else (low - level * FLAT_PAD_FRACTION, high + level * FLAT_PAD_FRACTION)
    least = level * MIN_SPAN_FRACTION
    if high - low < least:
        middle = (low + high) / 2
        return middle - least / 2, middle + least / 2
    return low, high


def tick_labels(ticks: Sequence[float]) -> list[str]:
    """The labels of an axis's ticks, each told apart from its neighbours: with a k/M/G suffix
    where the step needs at most SUFFIX_DECIMALS decimals under it (``20k``, ``1.5M``), else
    whole with thousands separators and the decimals the step needs (``51,230``, ``0.25``)."""
    if len(ticks) < 2:
        return [number(tick) for tick in ticks]
    step = min(b - a for a, b in itertools.pairwise(ticks))
    largest = max(abs(tick) for tick in ticks)
    scale, suffix = next(((s, x) for s, x in SUFFIXES if largest >= s), (1.0, ""))
    places = _decimals(step / scale)
    if places > SUFFIX_DECIMALS:
        scale, suffix, places = 1.0, "", _decimals(step)
    return ["0" if tick == 0 else f"{tick / scale:,.{places}f}{suffix}" for tick in ticks]


def _decimals(step: float) -> int:
    """The fewest decimals that write ``step`` (and so every multiple of it) exactly."""
    for places in range(13):
        if abs(step - round(step, places)) <= abs(step) * 1e-6:
            return places
    return 12


def number(value: float) -> str:
    """A hover label: short, with k/M/G for large values (an axis's ticks: :func:`tick_labels`)."""
    size = abs(value)
    for limit, suffix in SUFFIXES:
        if size >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


class _Frame:
    """The plot area of one chart: scales from data to pixels, the axes, the legend."""

    def __init__(self, name: str, title: str, x_range: tuple[float, float], y_range: tuple[float, float],
                 x_label: str, y_label: str, x_ticks: bool = True) -> None:
        self.parts = [f'<svg xmlns="http://www.w3.org/2000/svg" data-chart="{escape(name)}" role="img" '
                      f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
                      'font-family="sans-serif" font-size="11">',
                      f'<text x="{LEFT}" y="18" font-size="13" font-weight="bold">{escape(title)}</text>']
        self.x_ticks = nice_ticks(*x_range) if x_ticks else []
        self.y_ticks = nice_ticks(*y_range)
        self.x0, self.x1 = (self.x_ticks[0], self.x_ticks[-1]) if x_ticks else x_range
        self.y0, self.y1 = self.y_ticks[0], self.y_ticks[-1]
        self.legend_rows = 0
        right, bottom = WIDTH - RIGHT, HEIGHT - BOTTOM
        self.parts.append(f'<rect x="{LEFT}" y="{TOP}" width="{right - LEFT}" height="{bottom - TOP}" '
                          'fill="none" stroke="#999"/>')
        for tick, label in zip(self.y_ticks, tick_labels(self.y_ticks), strict=True):
            y = self.y(tick)
            self.parts.append(f'<line x1="{LEFT}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                              f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
        for tick, label in zip(self.x_ticks, tick_labels(self.x_ticks), strict=True):
            x = self.x(tick)
            self.parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom + 4}" stroke="#999"/>'
                              f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">{label}</text>')
        self.parts.append(f'<text x="{(LEFT + right) / 2:.1f}" y="{HEIGHT - 6}" text-anchor="middle">'
                          f'{escape(x_label)}</text>')
        self.parts.append(f'<text transform="translate(14 {(TOP + bottom) / 2:.1f}) rotate(-90)" '
                          f'text-anchor="middle">{escape(y_label)}</text>')

    def x(self, value: float) -> float:
        span = (self.x1 - self.x0) or 1.0
        return LEFT + (value - self.x0) / span * (WIDTH - RIGHT - LEFT)

    def y(self, value: float) -> float:
        span = (self.y1 - self.y0) or 1.0
        return HEIGHT - BOTTOM - (value - self.y0) / span * (HEIGHT - BOTTOM - TOP)

    def legend(self, label: str, colour: str, dashed: bool = False) -> None:
        if self.legend_rows == LEGEND_ROWS:
            self.parts.append(f'<text x="{WIDTH - RIGHT + 10}" y="{TOP + 12 + 16 * LEGEND_ROWS}">and more</text>')
        self.legend_rows += 1
        if self.legend_rows > LEGEND_ROWS:
            return
        y = TOP + 8 + 16 * (self.legend_rows - 1)
        x = WIDTH - RIGHT + 10
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        self.parts.append(f'<line x1="{x}" x2="{x + 18}" y1="{y}" y2="{y}" stroke="{colour}" stroke-width="2"{dash}/>'
                          f'<text x="{x + 24}" y="{y + 4}">{escape(label[:22])}</text>')

    def done(self) -> str:
        return "".join(self.parts) + "</svg>"


def _span(values: Sequence[float], floor_zero: bool = False) -> tuple[float, float]:
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    return (min(0.0, low) if floor_zero else low), high


def empty(name: str, title: str, why: str) -> str:
    """A chart with nothing to draw, saying why."""
    return (f'<svg xmlns="http://www.w3.org/2000/svg" data-chart="{escape(name)}" data-empty="1" role="img" '
            f'viewBox="0 0 {WIDTH} 70" width="{WIDTH}" height="70" font-family="sans-serif" font-size="12">'
            f'<text x="{LEFT}" y="18" font-size="13" font-weight="bold">{escape(title)}</text>'
            f'<text x="{LEFT}" y="46" fill="#666">{escape(why)}</text></svg>')


def line_chart(name: str, title: str, lines: Sequence[Line], x_label: str, y_label: str) -> str:
    xs = [x for line in lines for x, _ in line.points]
    ys = [y for line in lines for _, y in line.points]
    frame = _Frame(name, title, _span(xs), _span(ys), x_label, y_label)
    for index, line in enumerate(lines):
        colour = COLOURS[index % len(COLOURS)]
        points = thinned(line.points, MAX_LINE_POINTS)
        path = " ".join(f"{'M' if i == 0 else 'L'}{frame.x(x):.1f},{frame.y(y):.1f}"
                        for i, (x, y) in enumerate(points))
        frame.parts.append(f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="1.8"/>')
        for x, y in points if len(points) <= MAX_MARKERS else ():
            frame.parts.append(f'<circle cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" r="2.5" fill="{colour}">'
                               f'<title>{escape(line.label)}: step {x:g}, {number(y)}</title></circle>')
        frame.legend(line.label, colour)
    return frame.done()


def distribution_chart(name: str, title: str, groups: Sequence[Group], y_label: str, mark_label: str) -> str:
    """Per group: every value as a dot, the 10-90 % range as a box, the median as a bar."""
    values = [v for group in groups for v in group.values]
    low, high = _span(values, floor_zero=True)
    frame = _Frame(name, title, (0.0, float(len(groups))), (low, high * 1.05), "", y_label, x_ticks=False)
    slot = (WIDTH - RIGHT - LEFT) / max(1, len(groups))
    for index, group in enumerate(groups):
        centre = LEFT + slot * (index + 0.5)
        colour = ALERT if group.marked else COLOURS[0]
        ordered = sorted(group.values)
        low, high = quantile(ordered, 0.1), quantile(ordered, 0.9)
        median = quantile(ordered, 0.5)
        half = min(28.0, slot / 3)
        frame.parts.append(f'<rect x="{centre - half:.1f}" y="{frame.y(high):.1f}" width="{2 * half:.1f}" '
                           f'height="{max(1.0, frame.y(low) - frame.y(high)):.1f}" fill="{colour}" '
                           f'fill-opacity="0.18" stroke="{colour}"/>'
                           f'<line x1="{centre - half:.1f}" x2="{centre + half:.1f}" y1="{frame.y(median):.1f}" '
                           f'y2="{frame.y(median):.1f}" stroke="{colour}" stroke-width="2.5">'
                           f'<title>{escape(group.label)}: median {number(median)}</title></line>')
        for position, value in enumerate(thinned(group.values, MAX_DOTS)):
            jitter = ((position * 7) % 11 - 5) / 5 * half * 0.7
            frame.parts.append(f'<circle cx="{centre + jitter:.1f}" cy="{frame.y(value):.1f}" r="2" '
                               f'fill="{colour}" fill-opacity="0.7"><title>{escape(group.label)}: '
                               f'{number(value)}</title></circle>')
        label = escape(group.label) + (f" ({escape(mark_label)})" if group.marked else "")
        weight = ' font-weight="bold"' if group.marked else ""
        frame.parts.append(f'<text x="{centre:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle" '
                           f'fill="{colour}"{weight}>{label}</text>')
    frame.legend("median, 10-90 %", COLOURS[0])
    if any(group.marked for group in groups):
        frame.legend(mark_label, ALERT)
    return frame.done()


def bar_chart(name: str, title: str, bars: Sequence[Bar], references: Sequence[Reference], y_label: str) -> str:
    values = [b.value for b in bars] + [r.value for r in references]
    frame = _Frame(name, title, (0.0, float(len(bars))), (0.0, max(values) * 1.05 if values else 1.0), "",
                   y_label, x_ticks=False)
    slot = (WIDTH - RIGHT - LEFT) / max(1, len(bars))
    for index, bar in enumerate(bars):
        left = LEFT + slot * index + slot * 0.2
        top = frame.y(bar.value)
        frame.parts.append(f'<rect x="{left:.1f}" y="{top:.1f}" width="{slot * 0.6:.1f}" '
                           f'height="{frame.y(0) - top:.1f}" fill="{COLOURS[0]}"><title>{escape(bar.label)}: '
                           f'{number(bar.value)}</title></rect>'
                           f'<text x="{left + slot * 0.3:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">'
                           f'{escape(bar.label)}</text>')
    frame.legend("measured peak", COLOURS[0])
    for index, reference in enumerate(references):
        colour = (ALERT, COLOURS[2], COLOURS[3])[index % 3]
        y = frame.y(reference.value)
        frame.parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="{colour}" '
                           f'stroke-width="2" stroke-dasharray="5 3"><title>{escape(reference.label)}: '
                           f'{number(reference.value)}</title></line>')
        frame.legend(reference.label, colour, dashed=True)
    return frame.done()


def thinned(values: Sequence[T], most: int) -> Sequence[T]:
    """At most ``most`` of ``values``, evenly spaced, the first and the last kept."""
    if len(values) <= most:
        return values
    step = (len(values) - 1) / (most - 1)
    return [values[round(i * step)] for i in range(most)]


def timeline(name: str, title: str, marks: Sequence[Mark], origin: float | None) -> str:
    """One row per event, a dot at its time (seconds after ``origin``) and its text beside it."""
    timed = [m.at - origin for m in marks if m.at is not None and origin is not None]
    end = max(timed) if timed else 1.0
    row = 18
    height = TOP + 14 + row * len(marks) + BOTTOM
    ticks = nice_ticks(0.0, end or 1.0)
    span = ticks[-1] or 1.0
    plot = (LEFT, LEFT + 300)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" data-chart="{escape(name)}" role="img" '
             f'viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" font-family="sans-serif" '
             f'font-size="11"><text x="{LEFT}" y="18" font-size="13" font-weight="bold">{escape(title)}</text>']
    axis = height - BOTTOM + 4
    parts.append(f'<line x1="{plot[0]}" x2="{plot[1]}" y1="{axis}" y2="{axis}" stroke="#999"/>')
    for tick, label in zip(ticks, tick_labels(ticks), strict=True):
        x = plot[0] + tick / span * (plot[1] - plot[0])
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{axis}" stroke="#eee"/>'
                     f'<text x="{x:.1f}" y="{axis + 14}" text-anchor="middle">{label}</text>')
    parts.append(f'<text x="{(plot[0] + plot[1]) / 2:.1f}" y="{axis + 30}" text-anchor="middle">'
                 'seconds after the start</text>')
    last = 0.0
    for index, mark in enumerate(marks):
        y = TOP + 14 + row * index
        offset = mark.at - origin if mark.at is not None and origin is not None else None
        last = offset if offset is not None else last
        x = plot[0] + last / span * (plot[1] - plot[0])
        colour = ALERT if mark.alert else COLOURS[0]
        shape = (f'<circle cx="{x:.1f}" cy="{y}" r="4" fill="{colour}"/>' if offset is not None else
                 f'<circle cx="{x:.1f}" cy="{y}" r="4" fill="none" stroke="{colour}"/>')
        when = f"+{offset:.1f} s" if offset is not None else "time unknown"
        parts.append(f'<g data-event="{escape(mark.kind)}">{shape}<text x="{LEFT - 6}" y="{y + 4}" '
                     f'text-anchor="end" fill="{colour}">{escape(mark.kind)}</text>'
                     f'<text x="{plot[1] + 10}" y="{y + 4}" fill="{colour}">{escape(when)} '
                     f'{escape(mark.text[:70])}</text><title>{escape(mark.text)}</title></g>')
    return "".join(parts) + "</svg>"
