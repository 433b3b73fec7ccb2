"""``fstrain doctor --bench``: a bench document's outliers as check verdicts, each with a fix.

- ``bench.pairs``: a host whose traffic in one direction is slow fails (every job runs at its
  speed); a single slow link warns (a cable, a port, a switch path); ok otherwise.
- ``bench.collectives``: each collective of each node's own ranks (``intra_node``) compared
  across nodes: a node below 70 % of the median node warns; the bus bandwidth and latency of
  the whole world are reported with the ok row.

Every suspect is timed again before it becomes a verdict (:mod:`fstrain.core.bench.report`):
a host, a link or a node is named only when the re-time confirms it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fstrain.core.bench.pairs import DEFAULT_THRESHOLD
from fstrain.core.bench.report import collective_summaries, node_outliers, pairs_verdict
from fstrain.core.doctor.result import CheckResult


def bench_checks(document: Mapping[str, Any], hosts: Sequence[str]) -> list[CheckResult]:
    """The verdicts of the quick suites over ``hosts`` (the doctor's host names)."""
    return [*_pairs(document, hosts), *_collectives(document, hosts)]


def bench_failed(exit_code: int, logs: str, hosts: Sequence[str]) -> list[CheckResult]:
    """The benchmark itself did not finish: one failing row that says where to look."""
    return [CheckResult("bench.run", "fail", tuple(hosts), f"the benchmark job exited {exit_code}",
                        f"read {logs}; run `fstrain bench` alone to see it fail")]


def _pairs(document: Mapping[str, Any], hosts: Sequence[str]) -> list[CheckResult]:
    verdict = pairs_verdict(document)
    if verdict is None:
        return [CheckResult("bench.pairs", "skipped", tuple(hosts), "one host: no node-to-node link to time")]
    results = []
    median = verdict.median_gbps
    for host in verdict.hosts:
        way = "into" if host.direction == "in" else "out of"
        results.append(CheckResult(
            "bench.pairs", "fail", (host.host,),
            f"traffic {way} {host.host} is slow: {host.median_gbps:.3g} GB/s, {100 * host.median_gbps / median:.0f} % "
            f"of the median link ({median:.3g} GB/s); {host.slow_links} of its {host.links} links",
            f"check {host.host}'s NIC, cable and switch port (link speed in `ethtool`/`ibstat`, errors, "
            f"shaping); until then leave it out with --exclude {host.host}"))
    for link in verdict.unexplained:
        results.append(CheckResult(
            "bench.pairs", "warn", (link.src, link.dst),
            f"link {link.src} -> {link.dst} is slow: {link.gbps:.3g} GB/s, {100 * link.fraction_of_median:.0f} % "
            f"of the median link ({median:.3g} GB/s)",
            f"check the path between {link.src} and {link.dst} (cables, switch ports, routes); rerun "
            "`fstrain bench --suite pairs` to confirm"))
    if not results:
        count = len(document.get("pairs", {}).get("links", []))
        results.append(CheckResult("bench.pairs", "ok", tuple(hosts),
                                   f"{count} node-to-node links within {100 * DEFAULT_THRESHOLD:.0f} % of the "
                                   f"median ({median:.3g} GB/s)"))
    return results


def _collectives(document: Mapping[str, Any], hosts: Sequence[str]) -> list[CheckResult]:
    summaries = [s for s in collective_summaries(document) if s.collective == "all_reduce"]
    if not summaries:
        return [CheckResult("bench.collectives", "skipped", tuple(hosts), "no all_reduce was timed")]
    results = []
    for node in node_outliers(document):
        results.append(CheckResult(
            "bench.collectives", "warn", (node.host,),
            f"{node.collective} among {node.host}'s own ranks: {node.busbw_gbps:.3g} GB/s bus bandwidth, "
            f"{100 * node.busbw_gbps / node.median_gbps:.0f} % of the median node ({node.median_gbps:.3g} GB/s), "
            "in both passes",
            f"check {node.host}'s GPU interconnect (`nvidia-smi topo -m`, `nvidia-smi nvlink -s`) and "
            "PCIe links; run `fstrain bench --suite compute` for a throttling GPU"))
    if not results:
        text = "; ".join(f"{s.scope} ({s.group_size} ranks): {s.busbw_gbps or s.algbw_gbps:.3g} GB/s "
                         f"{'bus' if s.busbw_gbps else 'algorithm'} bandwidth, latency {s.latency_us:,.0f} us"
                         for s in summaries)
        results.append(CheckResult("bench.collectives", "ok", tuple(hosts), f"all_reduce {text}"))
    return results
