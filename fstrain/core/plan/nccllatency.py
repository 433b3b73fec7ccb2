"""The latency (alpha) of one NCCL collective, after NCCL's own tuning model.

NCCL prices every algorithm and protocol as ``latency + bytes / bandwidth`` and runs the
cheapest (NVIDIA/nccl src/graph/tuning.cc @b647562, ``ncclTopoTuneModel`` and
``ncclTopoGetAlgoTime``). For the Simple protocol, which carries the megabyte buffers of
training, its latency is:

- **Ring** all-gather / reduce-scatter: ``baseLat`` (8.4 us) plus one hop per ring step,
  ``n - 1`` steps of which ``nodes - 1`` cross the network (``hwLat`` NET Ring Simple, 14 us)
  and the rest stay in a node (NVLink 3.4 us, PCIe 5.7 us; NCCL's floor of 3 x the 1 us network
  post overhead per step, ``getNetOverhead``, is below both).
- **Ring** all-reduce: ``2(n - 1)`` steps of which ``2 nodes`` cross the network, times 1.4
  across nodes on Ampere and newer (the "plateau effect of ring" in ``ncclTopoGetAlgoTime``).
- **Tree** all-reduce (no tree for all-gather or reduce-scatter): no base latency, ``2 x
  ((ranks per node - 1) x intra + log2(nodes) x inter)`` with the tree's hops (NVLink Tree Simple
  4 us, NET Tree Simple 14 us): logarithmic in the nodes, where the ring is linear in the
  ranks. At a thousand ranks an all-reduce's alpha is tens of microseconds by tree and
  milliseconds by ring; NCCL picks the tree for all but the largest buffers. An all-gather or
  reduce-scatter over all of them has no such way out: ``n - 1`` hops, about 4.8 ms at 1,024
  ranks on 128 nodes of 8 GPUs, whatever the size, which is why sharding ZeRO's states over every
  rank is slower than sharding them inside a node and all-reducing the shards across nodes.

NCCL adds a NIC's ``latency`` attribute from the topology (``<net latency="...">`` in microseconds,
0 in the dumps NCCL writes: ``../shared/fixtures/nccl-xml/FORMAT.md``, ``<net>``) to each
network hop (``graphs[a]->latencyInter``, twice for Simple); none of the fixtures sets one, so
it is not modelled.

The hop latencies are assumptions (``nvlink_latency_s``, ``collective_latency_s``,
``collective_base_latency_s``: NCCL's ring figures by default); the tree's are NCCL's ratio to
them. The all-reduce's bandwidth term stays the ring's: the tree's bus bandwidth is within 8 %
of it in NCCL's model (``busBw * .92``), and the tree wins where latency dominates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# NCCL tuning.cc @b647562: baseLat[RING][SIMPLE] and hwLat[NVLINK|PCI|NET][TREE|RING][SIMPLE].
RING_BASE_S = 8.4e-6
NVLINK_RING_HOP_S = 3.4e-6
PCIE_RING_HOP_S = 5.7e-6
NET_RING_HOP_S = 14.0e-6
TREE_INTRA_HOP_S = 4.0e-6  # hwLat NVLINK/PCI Tree Simple
TREE_INTER_HOP_S = 14.0e-6  # hwLat NET Tree Simple
RING_PLATEAU = 1.4  # ncclTopoGetAlgoTime: multi-node ring all-reduce latency, compute capability >= 8.0


@dataclass(frozen=True)
class Hops:
    """One collective's group as NCCL sees it, and its per-hop latencies (seconds)."""

    ranks: int
    nodes: int  # nodes the group spans
    intra_s: float  # one ring step inside a node
    inter_s: float  # one ring step across the network
    base_s: float  # the ring's fixed latency per collective

    @property
    def ranks_per_node(self) -> int:
        return max(1, self.ranks // max(1, self.nodes))


def ring_latency_s(hops: Hops, all_reduce: bool = False) -> float:
    """Ring latency: ``n - 1`` steps (all-gather, reduce-scatter) or ``2(n - 1)`` (all-reduce)."""
    n, nodes = hops.ranks, hops.nodes
    if n <= 1:
        return 0.0
    intra = hops.intra_s
    steps = 2 * (n - 1) if all_reduce else n - 1
    inter_steps = (2 * nodes if all_reduce else nodes - 1) if nodes > 1 else 0
    inter_steps = min(inter_steps, steps)
    latency = hops.base_s + (steps - inter_steps) * intra + inter_steps * hops.inter_s
    if all_reduce and nodes > 1:
        latency *= RING_PLATEAU
    return latency


def tree_latency_s(hops: Hops, tree_intra_s: float = TREE_INTRA_HOP_S, tree_inter_s: float = TREE_INTER_HOP_S) -> float:
    """Tree all-reduce latency: up and down the tree, ``(ppn - 1)`` hops in each node and
    ``log2(nodes)`` across them (NCCL's ``log2i``, the floor)."""
    if hops.ranks <= 1:
        return 0.0
    levels = int(math.log2(hops.nodes)) if hops.nodes > 1 else 0
    return 2 * ((hops.ranks_per_node - 1) * tree_intra_s + levels * tree_inter_s)


def all_reduce_latency_s(hops: Hops) -> float:
    """The alpha NCCL's choice of algorithm gives an all-reduce: the cheaper of ring and tree.
    The tree's hop latencies follow the ring's by NCCL's ratios (so that overriding the
    assumed hop latencies, or setting them to 0, moves both)."""
    tree = tree_latency_s(hops, TREE_INTRA_HOP_S * hops.intra_s / NVLINK_RING_HOP_S,
                          TREE_INTER_HOP_S * hops.inter_s / NET_RING_HOP_S)
    return min(ring_latency_s(hops, all_reduce=True), tree)
