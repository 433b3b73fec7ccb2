"""Node-to-node bandwidth: which links to time together, and who is to blame for the slow ones.

A *round* is a set of directed links (sender -> receiver) in which every node takes part at most
once, so a transfer never shares a node's NIC with another transfer of the same round: a host that
is slow in one direction then slows only the links of that direction (sending and receiving at
once would delay the TCP acknowledgements of the outgoing stream behind the incoming one, and a
slow ingress would look like a slow egress too). ``all`` mode times every ordered pair
(``n(n-1)`` links in about ``2n`` rounds); ``ring`` mode times a ring and its reverse (``2n``
links in four to six rounds, whatever the cluster's size).

The analysis is on *directed* links (``a -> b``), each at its *best* sample: load elsewhere on a
host (another job, a busy CPU) only ever slows a transfer down, while a link can never beat its
slowest part, so the best of a few transfers is the link's capacity and a noisy sample does not
make a healthy link look slow. A host whose NIC, cable or port is slow in one direction slows
every link that enters (or leaves) it, and only those. A link is *slow* below
``threshold`` (0.7) times the median of all links. A host is blamed for a direction when at least
two of its links in that direction were timed and more than half of them are slow; blamed hosts
are taken greedily (the one that explains the most slow links first). Slow links no blamed host
explains are reported as links, with the two hosts they share.

*Re-timing* (:func:`retime_links`): one pass under load can still leave a healthy link below the
threshold. Before a verdict, the worker times again every slow link, the other links of the same
direction at both of its ends (what tells a slow host from a slow link) and the two other links
nearest the median (the yardstick, timed under the same load); a second re-time
(``MAX_RETIMES``) follows only when a link the last re-time did not time has become slow. Each
link's capacity is then its best sample over every pass (:func:`link_table` over all the
records), and a link is named only when it is still slow *and* the last re-time found it slow
against that re-time's own median (the yardsticks timed beside it, under the same load): a link
the last re-time did not time, or timed at the pace of its yardsticks, was never confirmed.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from fstrain.errors import InputError

DEFAULT_THRESHOLD = 0.7
"""A link slower than this fraction of the median is an outlier."""
RING_FROM_NODES = 17
"""``auto`` mode times every pair up to 16 nodes (15 rounds) and a ring and its reverse beyond."""
MAX_RETIMES = 2
"""Re-time passes at most: another only while a slow link was not timed in the last one."""
MEDIAN_REFERENCES = 2
"""Links nearest the median re-timed beside the slow ones."""


def pair_rounds(num_nodes: int, mode: str = "auto") -> list[list[tuple[int, int]]]:
    """The rounds of directed links (sender index, receiver index) for ``mode`` all|ring|auto;
    in a round no node appears twice."""
    if mode == "auto":
        mode = "all" if num_nodes < RING_FROM_NODES else "ring"
    if mode == "all":
        wanted = [(a, b) for a in range(num_nodes) for b in range(num_nodes) if a != b]
    elif mode == "ring":
        wanted = list(dict.fromkeys([(i, (i + 1) % num_nodes) for i in range(num_nodes)]
                                    + [((i + 1) % num_nodes, i) for i in range(num_nodes)]))
    else:
        raise InputError(f"unknown pairs mode {mode!r}", "use all, ring or auto", where="--pairs")
    if num_nodes < 2:
        return []
    return schedule(wanted, num_nodes)


def schedule(wanted: Sequence[tuple[int, int]], num_nodes: int) -> list[list[tuple[int, int]]]:
    """``wanted`` directed links (sender index, receiver index) in rounds where no node appears twice."""
    wanted = list(wanted)
    # Greedy edge colouring, links taken by distance then sender: each link goes into the first
    # round where neither of its nodes is busy yet.
    wanted.sort(key=lambda link: ((link[1] - link[0]) % num_nodes, link[0]))
    rounds: list[list[tuple[int, int]]] = []
    busy: list[set[int]] = []
    for src, dst in wanted:
        for links, used in zip(rounds, busy, strict=True):
            if src not in used and dst not in used:
                links.append((src, dst))
                used.update((src, dst))
                break
        else:
            rounds.append([(src, dst)])
            busy.append({src, dst})
    return rounds


@dataclass(frozen=True)
class LinkOutlier:
    src: str
    dst: str
    gbps: float
    fraction_of_median: float


@dataclass(frozen=True)
class HostOutlier:
    host: str
    direction: str
    """``in`` (traffic into the host is slow) or ``out``."""
    slow_links: int
    links: int
    median_gbps: float


@dataclass(frozen=True)
class PairsVerdict:
    median_gbps: float
    threshold_gbps: float
    slow_links: list[LinkOutlier] = field(default_factory=list)
    hosts: list[HostOutlier] = field(default_factory=list)
    unexplained: list[LinkOutlier] = field(default_factory=list)
    """Slow links no blamed host explains: a cable or a port between the two hosts."""

    @property
    def outlier_hosts(self) -> list[str]:
        """Hosts the report names: blamed hosts, then both ends of unexplained links."""
        names = [h.host for h in self.hosts]
        for link in self.unexplained:
            names += [link.src, link.dst]
        return list(dict.fromkeys(names))


def analyze_links(links: Mapping[tuple[str, str], float], threshold: float = DEFAULT_THRESHOLD,
                  confirmed: Collection[tuple[str, str]] | None = None) -> PairsVerdict:
    """Outliers among directed link bandwidths ``{(src, dst): gbps}``; with ``confirmed`` (the
    re-timed links), only those can be slow."""
    check_threshold(threshold)
    if not links:
        return PairsVerdict(median_gbps=0.0, threshold_gbps=0.0)
    median = statistics.median(links.values())
    limit = threshold * median
    slow = {key for key, gbps in links.items() if gbps < limit and (confirmed is None or key in confirmed)}

    def outlier(key: tuple[str, str]) -> LinkOutlier:
        return LinkOutlier(key[0], key[1], links[key], links[key] / median if median else 0.0)

    by_end: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for key in links:
        by_end.setdefault((key[1], "in"), []).append(key)
        by_end.setdefault((key[0], "out"), []).append(key)
    blamed: list[HostOutlier] = []
    explained: set[tuple[str, str]] = set()
    candidates = dict(by_end)
    while True:
        best: tuple[int, float, tuple[str, str]] | None = None
        for end, keys in candidates.items():
            slow_keys = [k for k in keys if k in slow]
            fresh = [k for k in slow_keys if k not in explained]
            if len(keys) < 2 or 2 * len(slow_keys) <= len(keys) or not fresh:
                continue
            rank = (len(fresh), -statistics.median(links[k] for k in keys), end)
            if best is None or rank > best:
                best = rank
        if best is None:
            break
        end = best[2]
        keys = candidates.pop(end)
        slow_keys = [k for k in keys if k in slow]
        explained.update(slow_keys)
        blamed.append(HostOutlier(end[0], end[1], len(slow_keys), len(keys),
                                  statistics.median(links[k] for k in keys)))
    ordered = sorted(slow, key=lambda k: (links[k], k))
    return PairsVerdict(
        median_gbps=median,
        threshold_gbps=limit,
        slow_links=[outlier(k) for k in ordered],
        hosts=blamed,
        unexplained=[outlier(k) for k in ordered if k not in explained],
    )


def check_threshold(threshold: float) -> None:
    if not 0 < threshold < 1:
        raise InputError(f"outlier threshold must be between 0 and 1, got {threshold}", "use e.g. 0.7")


def link_table(samples: Sequence[Mapping[str, object]], statistic: str = "best") -> dict[tuple[str, str], float]:
    """``{(src, dst): gbps}`` from the pairs suite's per-link records: each link's ``best``
    sample (its capacity, what the verdicts use) or its ``median``; a link with several records
    (a re-time) counts the samples of all of them."""
    if statistic not in ("best", "median"):
        raise InputError(f"unknown link statistic {statistic!r}", "use best or median")
    merged: dict[tuple[str, str], list[float]] = {}
    for record in samples:
        values = record.get("samples_gbps")
        if not isinstance(values, list) or not values:
            raise InputError(f"link record without samples: {dict(record)!r}", "rerun fstrain bench --suite pairs")
        merged.setdefault((str(record["src"]), str(record["dst"])), []).extend(float(v) for v in values)
    return {key: max(values) if statistic == "best" else statistics.median(values) for key, values in merged.items()}


def slow_in_pass(links: Mapping[tuple[str, str], float], threshold: float = DEFAULT_THRESHOLD) -> set[tuple[str, str]]:
    """The links of one pass below ``threshold`` times that pass's median link."""
    check_threshold(threshold)
    if not links:
        return set()
    median = statistics.median(links.values())
    return {key for key, gbps in links.items() if gbps < threshold * median}


def retime_links(links: Mapping[tuple[str, str], float], threshold: float = DEFAULT_THRESHOLD,
                 confirmed: Collection[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """The links to time again before a verdict: every link below ``threshold`` times the median,
    the other links leaving its sender and entering its receiver, and the ``MEDIAN_REFERENCES``
    other links nearest the median; none when no link is slow, or when every slow link is in
    ``confirmed`` (re-timed in the last pass, and still slow)."""
    slow = slow_in_pass(links, threshold)
    if not slow or slow <= set(confirmed):
        return []
    median = statistics.median(links.values())
    wanted = set(slow)
    for src, dst in slow:
        wanted.update(key for key in links if key[0] == src or key[1] == dst)
    # Yardsticks that share no suspect end: the median is re-measured under the same load.
    nearest = sorted((key for key in links if key not in wanted), key=lambda key: (abs(links[key] - median), key))
    wanted.update(nearest[:MEDIAN_REFERENCES])
    return sorted(wanted)
