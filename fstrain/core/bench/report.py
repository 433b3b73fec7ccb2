"""Reading a bench document (``python -m fstrain.bench``'s JSON): rows, verdicts and bar charts.

Everything here is a function of the document: the CLI prints it, ``plan --calibrate`` and
``doctor --bench`` read the same analysis, and tests check it on values.

Compute: a rank is a *straggler* below ``COMPUTE_STRAGGLER_FRACTION`` of the median rank (matmul
TFLOPS or memory bandwidth), and each rank is compared with its GPU's datasheet peak
(:mod:`fstrain.core.plan.gpus`) where the GPU is in the table.

Collectives: a node whose own ranks' collective (the ``intra_node`` scope) reaches less than
``DEFAULT_THRESHOLD`` of the median node's bus bandwidth at the largest size is an outlier host.

Every verdict is confirmed before it is given: the worker times the suspects again (pairs: see
:mod:`fstrain.core.bench.pairs`; compute: every rank once more; intra-node collectives: the
suspect collective at its largest size on every node once more) and a rank or a node stands only
when it is below the threshold in both passes, each pass against its own median.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fstrain.core.bench.gemm import gemm_summary
from fstrain.core.bench.pairs import DEFAULT_THRESHOLD, PairsVerdict, analyze_links, link_table, slow_in_pass
from fstrain.core.plan.gpus import GpuSpec, lookup_gpu
from fstrain.errors import InputError

SCHEMA = "fstrain.bench/1"
COMPUTE_STRAGGLER_FRACTION = 0.8
"""A GPU (or CPU rank) below this fraction of the median rank is a straggler."""


def check_document(document: Any, where: str) -> dict[str, Any]:
    """The document, or one InputError saying why it is not a bench document."""
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise InputError(f"not an fstrain bench document (schema {SCHEMA!r} expected)",
                         "give the JSON that `fstrain bench --json` or `--out` wrote", where)
    return document


@dataclass(frozen=True)
class CollectiveRow:
    scope: str
    group: int
    collective: str
    size_bytes: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    latency_size: bool
    requested_bytes: int
    """The size asked for (``size_bytes`` is rounded down to whole elements split evenly)."""


def collective_rows(document: Mapping[str, Any]) -> list[CollectiveRow]:
    rows: list[CollectiveRow] = []
    for scope in document.get("collectives", {}).get("scopes", []):
        for r in scope["results"]:
            rows.append(CollectiveRow(scope["scope"], int(r.get("group", 0)), r["collective"], int(r["size_bytes"]),
                                      float(r["time_us"]["median"]), float(r["algbw_gbps"]),
                                      float(r["busbw_gbps"]), bool(r.get("latency_size")),
                                      int(r.get("requested_bytes", r["size_bytes"]))))
    return rows


@dataclass(frozen=True)
class CollectiveSummary:
    scope: str
    collective: str
    group_size: int
    groups: int
    latency_us: float
    """Median time of the smallest message (over the groups: the slowest)."""
    busbw_gbps: float
    """Bus bandwidth at the largest message (over the groups: the slowest group)."""
    algbw_gbps: float
    size_bytes: int
    """The largest size asked for."""


def collective_summaries(document: Mapping[str, Any]) -> list[CollectiveSummary]:
    """Per scope and collective: latency at the smallest size, bandwidth at the largest."""
    out: list[CollectiveSummary] = []
    for scope in document.get("collectives", {}).get("scopes", []):
        rows = collective_rows({"collectives": {"scopes": [scope]}})
        for collective in dict.fromkeys(r.collective for r in rows):
            mine = [r for r in rows if r.collective == collective]
            smallest = min(r.requested_bytes for r in mine)
            largest = max(r.requested_bytes for r in mine)
            at_large = [r for r in mine if r.requested_bytes == largest]
            slowest = min(at_large, key=lambda r: r.busbw_gbps if r.busbw_gbps else r.algbw_gbps)
            out.append(CollectiveSummary(
                scope=scope["scope"], collective=collective, group_size=len(scope["groups"][0]),
                groups=len(scope["groups"]),
                latency_us=max(r.time_us for r in mine if r.requested_bytes == smallest),
                busbw_gbps=slowest.busbw_gbps, algbw_gbps=slowest.algbw_gbps, size_bytes=largest,
            ))
    return out


@dataclass(frozen=True)
class ComputeRow:
    rank: int
    node: str
    device_name: str
    tflops: float
    memory_gbps: float
    dtype: str
    peak_tflops: float | None
    peak_memory_gbps: float | None
    straggler: str
    """Empty, or what is slow: ``matmul``, ``memory`` or both."""

    @property
    def tflops_fraction(self) -> float | None:
        return self.tflops / self.peak_tflops if self.peak_tflops else None

    @property
    def memory_fraction(self) -> float | None:
        return self.memory_gbps / self.peak_memory_gbps if self.peak_memory_gbps else None


def gpu_of(device_name: str) -> GpuSpec | None:
    """The GPU table's entry for a device name torch reports, if it has one."""
    try:
        return lookup_gpu(device_name)
    except InputError:
        return None


def compute_stragglers(per_rank: Sequence[Mapping[str, Any]]) -> dict[int, list[str]]:
    """``{rank: ["matmul", "memory"]}``: what of each rank is below ``COMPUTE_STRAGGLER_FRACTION``
    of the median rank, in one pass; ranks with nothing slow are left out."""
    raw = [(int(r["rank"]), float(r["matmul"]["tflops"]["median"]), float(r["memory"]["gbps"]["median"]))
           for r in per_rank]
    if not raw:
        return {}
    median_tflops = statistics.median([t for _, t, _ in raw])
    median_gbps = statistics.median([g for _, _, g in raw])
    slow = {rank: [name for name, value, median in (("matmul", tflops, median_tflops), ("memory", gbps, median_gbps))
                   if value < COMPUTE_STRAGGLER_FRACTION * median]
            for rank, tflops, gbps in raw}
    return {rank: kinds for rank, kinds in slow.items() if kinds}


def compute_rows(document: Mapping[str, Any]) -> list[ComputeRow]:
    """One row per rank: its best median over the passes, and a straggler only where the re-time
    (when there was one) found the same rank slow in the same way."""
    compute = document.get("compute", {})
    per_rank = compute.get("per_rank", [])
    nodes = {r["rank"]: r.get("hostname", "") for r in document.get("ranks", [])}
    if not per_rank:
        return []
    slow = compute_stragglers(per_rank)
    retime = compute.get("retime")
    if retime is not None:
        again = compute_stragglers(retime)
        slow = {rank: [k for k in kinds if k in again.get(rank, [])] for rank, kinds in slow.items()}
    second = {int(r["rank"]): r for r in retime or []}
    rows = []
    for record in per_rank:
        passes = [record, *([second[record["rank"]]] if record["rank"] in second else [])]
        tflops = max(float(r["matmul"]["tflops"]["median"]) for r in passes)
        gbps = max(float(r["memory"]["gbps"]["median"]) for r in passes)
        spec = gpu_of(record["device_name"]) if record["device"].startswith("cuda") else None
        dtype = record["matmul"]["dtype"]
        peak = spec.peak_flops("bf16" if dtype == "bfloat16" else "fp16" if dtype == "float16" else "fp32") \
            if spec else None
        rows.append(ComputeRow(
            rank=int(record["rank"]), node=nodes.get(record["rank"], ""), device_name=record["device_name"],
            tflops=tflops, memory_gbps=gbps, dtype=dtype,
            peak_tflops=peak / 1e12 if peak else None,
            peak_memory_gbps=spec.hbm_bandwidth_bytes_per_s / 1e9 if spec else None,
            straggler="+".join(slow.get(int(record["rank"]), [])),
        ))
    return rows


def pairs_verdict(document: Mapping[str, Any], threshold: float = DEFAULT_THRESHOLD) -> PairsVerdict | None:
    """The outlier analysis of the pairs suite (None when it did not run or had one node): every
    link at its best sample over all passes; after a re-time only the links the last re-time
    found slow against its own median can be named (see :mod:`fstrain.core.bench.pairs`)."""
    pairs = document.get("pairs", {})
    links = pairs.get("links", [])
    if not links:
        return None
    retimes = pairs.get("retimes", [])
    records = [*links, *(record for retime in retimes for record in retime["links"])]
    confirmed = slow_in_pass(link_table(retimes[-1]["links"]), threshold) if retimes else None
    return analyze_links(link_table(records), threshold, confirmed)


@dataclass(frozen=True)
class NodeOutlier:
    """A node whose own ranks' collective is slow, in every pass."""

    host: str
    collective: str
    size_bytes: int
    busbw_gbps: float
    median_gbps: float


def slow_groups(results: Sequence[Mapping[str, Any]], threshold: float = DEFAULT_THRESHOLD) -> dict[str, list[int]]:
    """``{collective: [group, ...]}``: the groups of one scope whose bandwidth at the collective's
    largest size is below ``threshold`` times the median group's (at least three groups)."""
    slow: dict[str, list[int]] = {}
    for collective in dict.fromkeys(str(r["collective"]) for r in results):
        mine = [r for r in results if r["collective"] == collective]
        largest = max(int(r.get("requested_bytes", r["size_bytes"])) for r in mine)
        per_group = {int(r.get("group", 0)): _bandwidth(r) for r in mine
                     if int(r.get("requested_bytes", r["size_bytes"])) == largest}
        if len(per_group) < 3:
            continue  # with two nodes the median is their mean: nothing says which one is off
        median = statistics.median(per_group.values())
        groups = sorted(g for g, value in per_group.items() if value < threshold * median)
        if groups:
            slow[collective] = groups
    return slow


def _bandwidth(result: Mapping[str, Any]) -> float:
    return float(result["busbw_gbps"]) or float(result["algbw_gbps"])


def node_outliers(document: Mapping[str, Any], threshold: float = DEFAULT_THRESHOLD) -> list[NodeOutlier]:
    """Nodes whose intra-node collective is slow in the first pass and in the re-time (when the
    worker re-timed; a document without a re-time is read as it is)."""
    scope = next((s for s in document.get("collectives", {}).get("scopes", []) if s["scope"] == "intra_node"), None)
    names = list(document.get("nodes", []))
    if scope is None or len(names) != len(scope["groups"]):
        return []
    first = slow_groups(scope["results"], threshold)
    retime = scope.get("retime")
    again = slow_groups(retime, threshold) if retime is not None else first
    out = []
    for collective, groups in first.items():
        rows = [r for r in scope["results"] if r["collective"] == collective]
        largest = max(int(r.get("requested_bytes", r["size_bytes"])) for r in rows)
        at_large = {int(r.get("group", 0)): _bandwidth(r) for r in rows
                    if int(r.get("requested_bytes", r["size_bytes"])) == largest}
        median = statistics.median(at_large.values())
        out += [NodeOutlier(names[g], collective, largest, at_large[g], median)
                for g in groups if g in again.get(collective, [])]
    return out


def analysis(document: Mapping[str, Any]) -> dict[str, Any]:
    """The verdicts in plain data, added to the JSON document as ``analysis``."""
    result: dict[str, Any] = {}
    summaries = collective_summaries(document)
    if summaries:
        result["collectives"] = [s.__dict__ for s in summaries]
    compute = compute_rows(document)
    if compute:
        result["compute"] = {
            "ranks": [{**row.__dict__, "tflops_fraction_of_peak": row.tflops_fraction,
                       "memory_fraction_of_peak": row.memory_fraction} for row in compute],
            "stragglers": [row.rank for row in compute if row.straggler],
            "straggler_fraction": COMPUTE_STRAGGLER_FRACTION,
        }
    gemm = gemm_summary(document)
    if gemm is not None:
        result["gemm"] = gemm
    nodes = node_outliers(document)
    if nodes:
        result["collectives_outliers"] = [node.__dict__ for node in nodes]
    verdict = pairs_verdict(document)
    if verdict is not None:
        result["pairs"] = {
            "median_gbps": verdict.median_gbps,
            "threshold_gbps": verdict.threshold_gbps,
            "slow_links": [link.__dict__ for link in verdict.slow_links],
            "hosts": [host.__dict__ for host in verdict.hosts],
            "unexplained_links": [link.__dict__ for link in verdict.unexplained],
            "outlier_hosts": verdict.outlier_hosts,
        }
    result["outlier_hosts"] = outlier_hosts(result, document)
    return result


def outlier_hosts(result: Mapping[str, Any], document: Mapping[str, Any]) -> list[str]:
    """Every host an analysis names: pairs outliers, slow intra-node collectives, straggler ranks' hosts."""
    hosts = {r["rank"]: r.get("hostname", "") for r in document.get("ranks", [])}
    names = [*result.get("pairs", {}).get("outlier_hosts", []),
             *(node["host"] for node in result.get("collectives_outliers", [])),
             *(hosts.get(rank, f"rank {rank}") for rank in result.get("compute", {}).get("stragglers", []))]
    return list(dict.fromkeys(names))


def group_names(document: Mapping[str, Any], scope: Mapping[str, Any]) -> list[str]:
    """A name per group of a collectives scope, in hosts: ``world`` for every rank, a node's host
    for ``intra_node``, ``local rank k`` for ``inter_node`` (its hosts are every node)."""
    names = list(document.get("nodes", []))
    if scope["scope"] == "intra_node" and len(names) == len(scope["groups"]):
        return names
    if scope["scope"] == "inter_node":
        return [f"local rank {k}" for k in range(len(scope["groups"]))]
    return ["all hosts" if len(scope["groups"]) == 1 else f"group {i}" for i in range(len(scope["groups"]))]


def pair_matrix(links: Mapping[tuple[str, str], float], nodes: Sequence[str],
                slow: Collection[tuple[str, str]]) -> list[str]:
    """Sender rows x receiver columns of GB/s, plain text: ``*`` after a slow link, ``<`` after
    the slowest link when none is slow, ``-`` for a link not timed (``--pairs ring``)."""
    worst = min(links, key=lambda key: links[key]) if links and not slow else None
    width = max([9, *(len(n) + 1 for n in nodes)])
    lines = ["from \\ to".ljust(width) + " | " + " ".join(f"{n} ".rjust(width) for n in nodes)]
    for src in nodes:
        cells = []
        for dst in nodes:
            key = (src, dst)
            if key not in links:
                cells.append(("-" if src != dst else "").rjust(width))
                continue
            mark = "*" if key in slow else "<" if key == worst else " "
            cells.append(f"{_number(links[key])}{mark}".rjust(width))
        lines.append(src.ljust(width) + " | " + " ".join(cells))
    return lines


def bar_chart(items: Sequence[tuple[str, float]], *, unit: str, width: int = 40,
              marks: Sequence[str] = ()) -> list[str]:
    """A plain-text bar per item, scaled to the largest; ``marks[i]`` is printed after bar i."""
    if not items:
        return []
    label_width = max(len(label) for label, _ in items)
    top = max(value for _, value in items) or 1.0
    lines = []
    for index, (label, value) in enumerate(items):
        filled = round(width * value / top) if value > 0 else 0
        mark = marks[index] if index < len(marks) else ""
        bar = "#" * filled + "." * (width - filled)
        lines.append(f"{label.ljust(label_width)} |{bar}| {_number(value)} {unit}{'  ' + mark if mark else ''}")
    return lines


def _number(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
