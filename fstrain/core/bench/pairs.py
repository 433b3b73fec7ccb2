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
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fstrain.errors import InputError

DEFAULT_THRESHOLD = 0.7
"""A link slower than this fraction of the median is an outlier."""
RING_FROM_NODES = 17
"""``auto`` mode times every pair up to 16 nodes (15 rounds) and a ring and its reverse beyond."""


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


def analyze_links(links: Mapping[tuple[str, str], float], threshold: float = DEFAULT_THRESHOLD) -> PairsVerdict:
    """Outliers among directed link bandwidths ``{(src, dst): gbps}``."""
    if not 0 < threshold < 1:
        raise InputError(f"outlier threshold must be between 0 and 1, got {threshold}", "use e.g. 0.7")
    if not links:
        return PairsVerdict(median_gbps=0.0, threshold_gbps=0.0)
    median = statistics.median(links.values())
    limit = threshold * median
    slow = {key for key, gbps in links.items() if gbps < limit}

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


def link_table(samples: Sequence[Mapping[str, object]], statistic: str = "best") -> dict[tuple[str, str], float]:
    """``{(src, dst): gbps}`` from the pairs suite's per-link records: each link's ``best``
    sample (its capacity, what the verdicts use) or its ``median``."""
    if statistic not in ("best", "median"):
        raise InputError(f"unknown link statistic {statistic!r}", "use best or median")
    table: dict[tuple[str, str], float] = {}
    for record in samples:
        values = record.get("samples_gbps")
        if not isinstance(values, list) or not values:
            raise InputError(f"link record without samples: {dict(record)!r}", "rerun fstrain bench --suite pairs")
        floats = [float(v) for v in values]
        table[(str(record["src"]), str(record["dst"]))] = max(floats) if statistic == "best" \
            else statistics.median(floats)
    return table
