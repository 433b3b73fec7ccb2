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
    """Per scope and collective: latency at the smallest size, bus bandwidth at the largest, the
    slowest group by its hosts; then the nodes whose own collective is slow (every size of every
    group is in bench.json)."""
    from fstrain.core.bench.arithmetic import format_size
    from fstrain.core.bench.report import bar_chart, collective_summaries, group_names, node_outliers

    table = _table("scope", "collective", "ranks", "latency us", "largest", "busbw GB/s", "slowest group")
    scopes = {scope["scope"]: scope for scope in document.get("collectives", {}).get("scopes", [])}
    summaries = collective_summaries(document)
    for s in summaries:
        scope = scopes[s.scope]
        names = group_names(document, scope)
        table.add_row(s.scope, s.collective, f"{s.groups} x {s.group_size}" if s.groups > 1 else str(s.group_size),
                      f"{s.latency_us:,.0f}", format_size(s.size_bytes), f"{s.busbw_gbps or s.algbw_gbps:.3g}",
                      _slowest_group(scope, s.collective, s.size_bytes, names))
    console().print(table)
    items = [(f"{s.scope} {s.collective} ({s.group_size} ranks)", s.busbw_gbps or s.algbw_gbps) for s in summaries]
    marks = [f"at {format_size(s.size_bytes)}, latency {s.latency_us:,.0f} us"
             + ("" if s.busbw_gbps else " (algbw: one rank)") for s in summaries]
    lines = _chart("collectives: bus bandwidth at the largest size (slowest group)",
                   bar_chart(items, unit="GB/s", marks=marks))
    slow = node_outliers(document)
    verdicts = [f"collectives: outlier host {n.host}: its own {n.collective} reaches {n.busbw_gbps:.3g} GB/s at "
                f"{format_size(n.size_bytes)}, {100 * n.busbw_gbps / n.median_gbps:.0f} % of the median node "
                f"({n.median_gbps:.3g} GB/s), in both passes" for n in slow]
    for text in verdicts:
        console().print(f"[red]{text}[/red]", highlight=False)
    return lines + verdicts


def _slowest_group(scope: dict[str, Any], collective: str, size_bytes: int, names: list[str]) -> str:
    """The host (or group) with the lowest bandwidth at ``size_bytes``, when the scope has several."""
    if len(names) < 2:
        return names[0] if names else ""
    rows = [r for r in scope["results"] if r["collective"] == collective
            and int(r.get("requested_bytes", r["size_bytes"])) == size_bytes]
    if not rows:
        return ""
    worst = min(rows, key=lambda r: float(r["busbw_gbps"]) or float(r["algbw_gbps"]))
    return names[int(worst.get("group", 0))]


def print_pairs(document: dict[str, Any]) -> list[str]:
    from fstrain.core.bench.pairs import link_table
    from fstrain.core.bench.report import pair_matrix, pairs_verdict

    verdict = pairs_verdict(document)
    if verdict is None:
        line = "pairs: one node, no links to time"
        console().print(f"[dim]{line}[/dim]")
        return [line]
    pairs = document["pairs"]
    records = [*pairs["links"], *(r for retime in pairs.get("retimes", []) for r in retime["links"])]
    links = link_table(records)
    slow = {(link.src, link.dst) for link in verdict.slow_links}
    retimed = sum(len(r["links"]) for r in pairs.get("retimes", []))
    title = (f"pairs: best GB/s of {_samples(document)} transfers of {pairs['size']} per link"
             + (f", {retimed} link timings repeated" if retimed else "")
             + f"; median link {verdict.median_gbps:.3f} GB/s, slow (*) below {verdict.threshold_gbps:.3f} GB/s"
             + ("" if slow else ", < the slowest"))
    lines = _chart(title, pair_matrix(links, list(document.get("nodes", [])), slow))
    verdicts = pairs_text(verdict)
    for text in verdicts:
        console().print(f"[{'red' if verdict.outlier_hosts else 'green'}]{text}[/]")
    return lines + verdicts


def _samples(document: dict[str, Any]) -> int:
    return min(len(link["samples_gbps"]) for link in document["pairs"]["links"])


def pairs_text(verdict: Any) -> list[str]:
    """The verdict in words: who is slow, and what the slow links share."""
    if not verdict.slow_links:
        return ["pairs: no outliers (every link within 70 % of the median, or faster when timed again)"]
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
    from fstrain.core.bench.gemm import gemm_lines

    gemm = gemm_lines(document)
    for line in gemm:
        console().print(line, markup=False, highlight=False, soft_wrap=True)
    return [*lines, verdict, *gemm]
