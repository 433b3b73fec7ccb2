"""NCCL's latency model (tuning.cc, Simple protocol) worked by hand."""

from __future__ import annotations

import pytest

from fstrain.core.plan.nccllatency import Hops, all_reduce_latency_s, ring_latency_s, tree_latency_s

NCCL = dict(intra_s=3.4e-6, inter_s=14e-6, base_s=8.4e-6)


def test_ring_all_gather_counts_network_and_nvlink_steps() -> None:
    # 16 ranks on 2 nodes: 15 steps, one across the network
    assert ring_latency_s(Hops(16, 2, **NCCL)) == pytest.approx(8.4e-6 + 14 * 3.4e-6 + 14e-6)
    assert ring_latency_s(Hops(1, 1, **NCCL)) == 0.0


def test_ring_all_reduce_crosses_the_network_twice_a_node_and_plateaus() -> None:
    # 16 ranks on 2 nodes: 30 steps, 4 across the network (NCCL's 2 x nNodes), x1.4 across nodes
    expected = 1.4 * (8.4e-6 + 26 * 3.4e-6 + 4 * 14e-6)
    assert ring_latency_s(Hops(16, 2, **NCCL), all_reduce=True) == pytest.approx(expected)
    # inside one node, no plateau: 14 steps
    assert ring_latency_s(Hops(8, 1, **NCCL), all_reduce=True) == pytest.approx(8.4e-6 + 14 * 3.4e-6)


def test_tree_is_logarithmic_in_the_nodes_and_wins_at_scale() -> None:
    hops = Hops(1024, 128, **NCCL)
    assert tree_latency_s(hops) == pytest.approx(2 * (7 * 4e-6 + 7 * 14e-6))
    assert all_reduce_latency_s(hops) == tree_latency_s(hops)
    assert ring_latency_s(hops, all_reduce=True) > 10 * tree_latency_s(hops)
    # the tree's hops follow the assumed ring hops: none assumed, none charged
    assert all_reduce_latency_s(Hops(1024, 128, 0.0, 0.0, 0.0)) == 0.0
