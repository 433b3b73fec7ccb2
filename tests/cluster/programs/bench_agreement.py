"""A rank that times the same collective two ways and prints both bus bandwidths (rank 0, JSON).

1. fstrain.bench.collectives.time_collective (what ``fstrain bench`` reports);
2. by hand: CALLS times a barrier and one call of the torch.distributed collective timed with
   perf_counter, the slowest rank's time per call, and nccl-tests' formula written out here.

The two alternate REPEATS times in short turns (CALLS operations each), taking turns to go
first, so that load elsewhere on the machine touches both alike, and
each side's bus bandwidth is taken at the median of all its timings (the bench's per-operation
samples, the direct per-call times). Both sides use the median because that is what the bench
reports: on a loaded machine a mean would count the calls another process delayed.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from fstrain.bench.collectives import time_collective

SIZE_BYTES = 4 << 20
REPEATS = 120
CALLS = 3

dist.init_process_group("gloo")
n = dist.get_world_size()
device = torch.device("cpu")


def direct_seconds(collective: str) -> tuple[list[float], int, float]:
    """Per-call seconds (the slowest rank's), the bytes S of the operation, the bus factor."""
    elements = SIZE_BYTES // 4
    elements -= elements % n
    if collective == "all_reduce":
        buf = torch.ones(elements)

        def op() -> None:
            dist.all_reduce(buf)
        factor = 2 * (n - 1) / n
    else:  # all_gather into one tensor: S is the gathered output
        out, inp = torch.ones(elements), torch.ones(elements // n)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

        def op() -> None:
            gather(out, inp)
        factor = (n - 1) / n
    op()
    seconds = []
    for _ in range(CALLS):
        dist.barrier()
        started = time.perf_counter()
        op()
        seconds.append(time.perf_counter() - started)
    slowest = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.tolist(), elements * 4, factor


results = {}
for collective in ("all_reduce", "all_gather"):
    bench: list[float] = []
    direct: list[float] = []
    for repeat in range(REPEATS):
        for side in ("bench", "direct") if repeat % 2 else ("direct", "bench"):  # neither always goes first
            if side == "bench":
                # CALLS samples of one operation each, as the direct side times them.
                row = time_collective(collective, SIZE_BYTES, device=device, seconds=0.0, warmup=1,
                                      max_samples=CALLS, sample_seconds=0.0)
                bench += row["samples_seconds"]
            else:
                seconds, size, factor = direct_seconds(collective)
                direct += seconds
    bench_busbw = row["size_bytes"] / statistics.median(bench) / 1e9 * row["bus_factor"]
    direct_busbw = size / statistics.median(direct) / 1e9 * factor
    results[collective] = {"ratio": bench_busbw / direct_busbw, "bench": bench_busbw, "direct": direct_busbw,
                           "bench_samples": len(bench), "direct_samples": len(direct)}
if dist.get_rank() == 0:
    print("AGREEMENT " + json.dumps({"world_size": n, "host": os.uname().nodename, "results": results}), flush=True)
dist.destroy_process_group()
