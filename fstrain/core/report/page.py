"""The report as one self-contained HTML page: inline CSS and SVG, no script, no link to fetch.

Sections, each a ``<section data-section=NAME>``: a failed run's failing rank and its last lines
(first: it is what a failed run's reader looks for), the table "planned vs measured", loss and
tokens/s over steps, the step-time distribution per rank, memory per rank, the timeline, notes.
"""

from __future__ import annotations

import time
from html import escape

from fstrain.core.monitor.stragglers import STRAGGLER_FRACTION
from fstrain.core.report import svg
from fstrain.core.report.excerpt import FailureExcerpt
from fstrain.core.report.numbers import Comparison, Report
from fstrain.core.report.series import RankSeries, differ

ALERT_KINDS = frozenset({"failure", "stall", "stop", "excluded"})
_STYLE = """
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 980px; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 4px 10px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.state-succeeded { color: #2ca02c; } .state-failed, .state-lost, .state-stalled { color: #d62728; }
.note { color: #666; }
pre { text-align: left; background: #f6f6f6; padding: 8px; overflow-x: auto; font-size: 12px; }
"""


def render(report: Report, fstrain_version: str) -> str:
    state = report.state
    head = (f'<h1>fstrain report: run {escape(report.run_id)}</h1><p>{escape(report.kind)} run, '
            f'<b class="state-{escape(state.state)}">{escape(state.state)}</b>'
            + (f", exit {state.exit_code}" if state.exit_code is not None else "")
            + (f" ({escape(state.reason)})" if state.reason not in ("", "ok", state.state) else "")
            + (f"; trained on {escape(report.device)}" if report.device else "") + "</p>")
    sections = [_section("failure", "Where it failed", _failure(report.failure))] if report.failure else []
    sections += [
        _section("table", "Planned vs measured", _table(report.table)),
        _section("loss", "Loss", _over_steps(report.series, "loss", "loss", "loss")),
        _section("tokens", "Tokens/s", _over_steps(report.series, "tokens_per_s", "tokens/s", "tokens/s")),
        _section("step-times", "Step time per rank", _step_times(report)),
        _section("memory", "Memory per rank", _memory(report)),
        _section("timeline", "Timeline", _timeline(report)),
    ]
    if report.notes:
        sections.append(_section("notes", "Notes", "<ul>" + "".join(f'<li class="note">{escape(n)}</li>'
                                                                    for n in report.notes) + "</ul>"))
    made = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>fstrain report {escape(report.run_id)}</title><style>{_STYLE}</style></head><body>"
            + head + "".join(sections)
            + f'<p class="note">written by fstrain {escape(fstrain_version)} on {made}</p></body></html>\n')


def _section(name: str, title: str, body: str) -> str:
    return f'<section data-section="{name}"><h2>{escape(title)}</h2>{body}</section>'


def _failure(failure: FailureExcerpt) -> str:
    lines = "\n".join(escape(line) for line in failure.lines)
    return (f'<p class="state-failed">{escape(failure.heading)}</p>'
            + (f'<pre data-own="{int(failure.own)}">{lines}</pre>' if failure.lines else ""))


def _value(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "bytes":
        return f"{value / 2**20:,.1f} MiB"
    if unit == "s":
        return f"{value:.4g} s"
    return f"{value:,.0f}"


def _table(rows: tuple[Comparison, ...]) -> str:
    body = []
    for row in rows:
        error = f"{100 * row.error:+.1f} %" if row.error is not None else "n/a"
        body.append(f'<tr data-row="{escape(row.name)}"><td>{escape(row.name)}</td>'
                    f'<td data-value="{row.planned if row.planned is not None else ""}" '
                    f'title="{escape(row.planned_from)}">{_value(row.planned, row.unit)}</td>'
                    f'<td data-value="{row.measured if row.measured is not None else ""}" '
                    f'title="{escape(row.measured_from)}">{_value(row.measured, row.unit)}</td>'
                    f'<td data-value="{row.error if row.error is not None else ""}">{error}</td></tr>')
    return ('<table id="planned-vs-measured"><thead><tr><th></th><th>planned</th><th>measured</th>'
            '<th>error</th></tr></thead><tbody>' + "".join(body) + "</tbody></table>"
            '<p class="note">error = measured / planned - 1; hover a number for where it comes from.</p>')


def _over_steps(series: tuple[RankSeries, ...], field: str, title: str, y_label: str) -> str:
    per_rank = differ(series, field)
    lines = []
    for one in series:
        points = tuple((float(p.step), float(getattr(p, field))) for p in one.points
                       if getattr(p, field) is not None)
        if points:
            lines.append(svg.Line(f"rank {one.rank}" + (f" ({one.host})" if one.host else ""), points))
        if lines and not per_rank:  # the ranks agree: one line says it
            lines = [svg.Line("all ranks" if len(series) > 1 else lines[0].label, lines[0].points)]
            break
    name = "tokens" if field == "tokens_per_s" else field
    if not lines:
        return svg.empty(name, title, "no step reported it (no metric or progress line in the output)")
    return svg.line_chart(name, f"{title} over steps", lines, "step", y_label)


def _step_times(report: Report) -> str:
    if not report.steps:
        return svg.empty("step-times", "step time", "no step time in the output")
    groups = [svg.Group(f"rank {s.rank}", s.step_s, s.straggler) for s in report.steps]
    chart = svg.distribution_chart("step-times", "Step time per rank (first step left out)", groups,
                                   "seconds", "straggler")
    stragglers = [s for s in report.steps if s.straggler]
    said = ", ".join(f"rank {s.rank} on {s.host} (median {s.median_s:.4g} s)" for s in stragglers)
    return chart + (f'<p data-stragglers="{len(stragglers)}">stragglers: {escape(said)}</p>' if stragglers
                    else f'<p data-stragglers="0">no straggler: no rank\'s median is over '
                    f'{100 * STRAGGLER_FRACTION:.0f} % above the median of the other ranks\' medians.</p>')


def _memory(report: Report) -> str:
    if not report.memory:
        return svg.empty("memory", "memory", "no memory in the output or the summary")
    bars = [svg.Bar(f"rank {m.rank}" if m.rank is not None else "max over ranks", float(m.peak_bytes) / 2**30)
            for m in report.memory]
    references = []
    if report.planned_memory_bytes:
        references.append(svg.Reference("plan's peak", report.planned_memory_bytes / 2**30))
    if report.card_bytes:
        references.append(svg.Reference("card's memory", report.card_bytes / 2**30))
    return svg.bar_chart("memory", report.memory_label, bars, references, "GiB")


def _timeline(report: Report) -> str:
    origin = next((e.time for e in report.events if e.time is not None), None)
    marks = [svg.Mark(e.time, e.kind, (f"{e.where}: " if e.where else "") + e.text, e.kind in ALERT_KINDS)
             for e in report.events]
    return svg.timeline("timeline", "Events", marks, origin)
