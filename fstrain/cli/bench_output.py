"""``fstrain bench``'s report: a rich table and a plain-text bar chart per suite, on stderr."""

from __future__ import annotations

from typing import Any

from fstrain.cli.output import console


def _table(*columns: str) -> Any:
    from rich.table import Table

    table = Table(show_edge=False, pad_edge=False)
    for column in columns:
        table.add_column(column, no_wrap=column != "device",
                         justify="left" if column in ("scope", "collective", "link", "node", "device", "note")
                         else "right")
    return table


def _chart(title: str, lines: list[str]) -> list[str]:
    out = console()
    out.print(title)
    for line in lines:
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    return [title, *lines]


def _pct(value: float | None) -> str:
    return f"{100 * value:.0f} %" if value is not None else "-"


def print_collectives(document: dict[str, Any]) -> list[str]:
    from fstrain.core.bench.arithmetic import format_size
    from fstrain.core.bench.report import bar_chart, collective_rows, collective_summaries

    table = _table("scope", "group", "collective", "size", "time us", "algbw GB/s", "busbw GB/s")
    for row in collective_rows(document):
        table.add_row(row.scope, str(row.group), row.collective, format_size(row.requested_bytes),
                      f"{row.time_us:,.1f}", f"{row.algbw_gbps:.3f}", f"{row.busbw_gbps:.3f}")
    console().print(table)
    summaries = collective_summaries(document)
    items = [(f"{s.scope} {s.collective} ({s.group_size} ranks)", s.busbw_gbps or s.algbw_gbps) for s in summaries]
    marks = [f"at {format_size(s.size_bytes)}, latency {s.latency_us:,.0f} us"
             + ("" if s.busbw_gbps else " (algbw: one rank)") for s in summaries]
    return _chart("collectives: bus bandwidth at the largest size (slowest group)",
                  bar_chart(items, unit="GB/s", marks=marks))


def print_pairs(document: dict[str, Any]) -> list[str]:
    from fstrain.core.bench.pairs import link_table
    from fstrain.core.bench.report import bar_chart, pairs_verdict

    links = link_table(document["pairs"]["links"])
    medians = link_table(document["pairs"]["links"], "median")
    verdict = pairs_verdict(document)
    if verdict is None or not links:
        line = "pairs: one node, no links to time"
        console().print(f"[dim]{line}[/dim]")
        return [line]
    slow = {(link.src, link.dst) for link in verdict.slow_links}
    table = _table("link", "best GB/s", "median GB/s", "of median link", "note")
    for (src, dst), gbps in sorted(links.items()):
        table.add_row(f"{src} -> {dst}", f"{gbps:.3f}", f"{medians[(src, dst)]:.3f}",
                      _pct(gbps / verdict.median_gbps if verdict.median_gbps else 0),
                      "[red]slow[/red]" if (src, dst) in slow else "")
    console().print(table)
    keys = sorted(links)
    lines = _chart(f"pairs: {document['pairs']['size']} per transfer, best of {_samples(document)} per link; "
                   f"median link {verdict.median_gbps:.3f} GB/s, outlier below {verdict.threshold_gbps:.3f} GB/s",
                   bar_chart([(f"{s} -> {d}", links[(s, d)]) for s, d in keys], unit="GB/s",
                             marks=["SLOW" if k in slow else "" for k in keys]))
    verdicts = pairs_text(verdict)
    for text in verdicts:
        console().print(f"[{'red' if verdict.outlier_hosts else 'green'}]{text}[/]")
    return lines + verdicts


def _samples(document: dict[str, Any]) -> int:
    return min(len(link["samples_gbps"]) for link in document["pairs"]["links"])


def pairs_text(verdict: Any) -> list[str]:
    """The verdict in words: who is slow, and what the slow links share."""
    if not verdict.slow_links:
        return ["pairs: no outliers (every link within 70 % of the median)"]
    lines = []
    for host in verdict.hosts:
        way = "into" if host.direction == "in" else "out of"
        lines.append(f"pairs: outlier host {host.host}: traffic {way} it is slow ({host.slow_links} of {host.links} "
                     f"links below the threshold, median {host.median_gbps:.3f} GB/s)")
    for link in verdict.unexplained:
        lines.append(f"pairs: outlier link {link.src} -> {link.dst} at {100 * link.fraction_of_median:.0f} % of the "
                     f"median: the cable, ports or switch between {link.src} and {link.dst}")
    return lines


def print_compute(document: dict[str, Any]) -> list[str]:
    from fstrain.core.bench.report import COMPUTE_STRAGGLER_FRACTION, bar_chart, compute_rows

    rows = compute_rows(document)
    table = _table("node", "rank", "device", "TFLOPS", "of peak", "mem GB/s", "of peak", "note")
    for row in rows:
        table.add_row(row.node, str(row.rank), f"{row.device_name} ({row.dtype})", f"{row.tflops:.3g}",
                      _pct(row.tflops_fraction), f"{row.memory_gbps:,.1f}", _pct(row.memory_fraction),
                      f"[red]straggler ({row.straggler})[/red]" if row.straggler else "")
    console().print(table)
    lines = _chart("compute: matmul TFLOPS per rank",
                   bar_chart([(f"{r.node} r{r.rank}", r.tflops) for r in rows], unit="TFLOPS",
                             marks=[f"STRAGGLER ({r.straggler})" if r.straggler else "" for r in rows]))
    stragglers = [r for r in rows if r.straggler]
    verdict = (f"compute: stragglers (below {100 * COMPUTE_STRAGGLER_FRACTION:.0f} % of the median rank): "
               + ", ".join(f"{r.node} rank {r.rank} ({r.straggler})" for r in stragglers)) if stragglers \
        else "compute: no stragglers"
    console().print(f"[{'red' if stragglers else 'green'}]{verdict}[/]")
    return [*lines, verdict]
