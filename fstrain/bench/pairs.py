"""Node-to-node bandwidth: one rank per node (local rank 0) sends to another node's leader.

Rounds come from :func:`fstrain.core.bench.pairs.pair_rounds`: in a round every node sends, or
receives, or waits, never two at once. A link is timed at its receive_from, from the common start
until the send_to's 4-byte acknowledgement arrives, so the time covers the whole transfer
whichever side is slow. Every rank calls :func:`time_pairs` (ranks that lead no node, and nodes
idle in a round, only join the barriers).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from fstrain.bench.timing import sync, wait
from fstrain.core.bench.pairs import pair_rounds, schedule

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
    links: Sequence[tuple[int, int]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Per directed link ``{src, dst, size_bytes, samples_seconds, samples_gbps}``; the full list
    on every rank. ``leaders[i]`` is the global rank that speaks for node ``node_names[i]``;
    ``links`` (node index pairs, the same on every rank) times only those instead of ``mode``'s."""
    rank = dist.get_rank()
    me = leaders.index(rank) if rank in leaders else None
    count = max(1, size_bytes // 4)
    send = torch.ones(count, dtype=torch.float32, device=device)
    recv = torch.empty_like(send)
    ack_out = torch.ones(1, dtype=torch.float32, device=device)
    ack_in = torch.empty_like(ack_out)
    rounds = pair_rounds(len(leaders), mode) if links is None else schedule(links, len(leaders))
    times: list[list[float]] = [[] for _ in rounds]
    # Samples go round the schedule, so a burst of load elsewhere touches every link alike.
    for iteration in range(warmup + samples):
        if progress is not None and iteration >= warmup:
            progress(f"sample {iteration - warmup + 1} of {samples} of {sum(len(r) for r in rounds)} links")
        for index, links_now in enumerate(rounds):
            dist.barrier()
            if me is None:
                continue
            send_to = dict(links_now).get(me)
            receive_from = {dst: src for src, dst in links_now}.get(me)
            if send_to is not None:
                seconds = _send(leaders[send_to], send, ack_in, device)
                if iteration >= warmup:
                    times[index].append(seconds)
            elif receive_from is not None:
                _receive(leaders[receive_from], recv, ack_out, device)
    mine: list[dict[str, Any]] = []
    for index, links_now in enumerate(rounds):
        send_to = dict(links_now).get(me) if me is not None else None
        if me is not None and send_to is not None:
            nbytes = count * 4
            mine.append({
                "src": node_names[me],
                "dst": node_names[send_to],
                "size_bytes": nbytes,
                "samples_seconds": times[index],
                "samples_gbps": [nbytes / s / 1e9 for s in times[index]],
            })
    gathered: list[list[dict[str, Any]] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return [record for records in gathered if records for record in records]


def _send(dst: int, data: torch.Tensor, ack: torch.Tensor, device: torch.device) -> float:
    """Send ``data`` to ``dst``; seconds until ``dst`` acknowledged it."""
    started = time.perf_counter()
    sent = dist.isend(data, dst, tag=_DATA_TAG)
    wait(dist.irecv(ack, dst, tag=_ACK_TAG))
    sync(device)
    seconds = time.perf_counter() - started
    wait(sent)
    return seconds


def _receive(src: int, data: torch.Tensor, ack: torch.Tensor, device: torch.device) -> None:
    """Receive from ``src``, then acknowledge."""
    wait(dist.irecv(data, src, tag=_DATA_TAG))
    sync(device)
    wait(dist.isend(ack, src, tag=_ACK_TAG))
