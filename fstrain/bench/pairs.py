"""Node-to-node bandwidth: one rank per node (local rank 0) sends to another node's leader.

Rounds come from :func:`fstrain.core.benchpairs.pair_rounds`; in a round every leader sends
``size_bytes`` to its receiver while receiving as much from its sender. A link is timed at its
sender, from the common start until the receiver's 4-byte acknowledgement arrives, so the time
covers the whole transfer whichever side is slow. Every rank calls :func:`time_pairs` (ranks that
lead no node only join the barriers).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from fstrain.bench.timing import sync
from fstrain.core.benchpairs import pair_rounds

_DATA_TAG = 1
_ACK_TAG = 2


def time_pairs(
    leaders: list[int],
    node_names: list[str],
    size_bytes: int,
    *,
    device: torch.device,
    mode: str = "auto",
    samples: int = 5,
    warmup: int = 1,
) -> list[dict[str, Any]]:
    """Per directed link ``{src, dst, size_bytes, samples_seconds, samples_gbps}``; the full list
    on every rank. ``leaders[i]`` is the global rank that speaks for node ``node_names[i]``."""
    rank = dist.get_rank()
    me = leaders.index(rank) if rank in leaders else None
    count = max(1, size_bytes // 4)
    send = torch.ones(count, dtype=torch.float32, device=device)
    recv = torch.empty_like(send)
    ack_out = torch.ones(1, dtype=torch.float32, device=device)
    ack_in = torch.empty_like(ack_out)
    mine: list[dict[str, Any]] = []
    for links in pair_rounds(len(leaders), mode):
        peers = {src: dst for src, dst in links}
        sources = {dst: src for src, dst in links}
        times: list[float] = []
        for iteration in range(warmup + samples):
            dist.barrier()
            if me is None:
                continue
            seconds = _transfer(leaders[peers[me]], leaders[sources[me]], send, recv, ack_out, ack_in, device)
            if iteration >= warmup:
                times.append(seconds)
        if me is not None:
            nbytes = count * 4
            mine.append({
                "src": node_names[me],
                "dst": node_names[peers[me]],
                "size_bytes": nbytes,
                "samples_seconds": times,
                "samples_gbps": [nbytes / s / 1e9 for s in times],
            })
    gathered: list[list[dict[str, Any]] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return [record for records in gathered if records for record in records]


def _transfer(
    dst: int, src: int, send: torch.Tensor, recv: torch.Tensor, ack_out: torch.Tensor, ack_in: torch.Tensor,
    device: torch.device,
) -> float:
    """Send to ``dst`` while receiving from ``src``; seconds until ``dst`` acknowledged."""
    started = time.perf_counter()
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.irecv, recv, src, tag=_DATA_TAG),
        dist.P2POp(dist.isend, send, dst, tag=_DATA_TAG),
    ])
    works[0].wait()
    sync(device)
    acks = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, ack_out, src, tag=_ACK_TAG),
        dist.P2POp(dist.irecv, ack_in, dst, tag=_ACK_TAG),
    ])
    acks[1].wait()
    sync(device)
    seconds = time.perf_counter() - started
    for work in (works[1], acks[0]):
        work.wait()
    sync(device)
    return seconds
