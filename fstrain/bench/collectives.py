"""Timing of torch.distributed collectives per message size, reported as nccl-tests reports them.

Every rank of ``group`` must call :func:`time_collective` with the same arguments (it is itself
a collective). One sample is a batch of back-to-back operations started together after a
barrier; a sample's time is the slowest rank's (the operation is done when the last rank is
done), the same rule as nccl-tests' reported time. The batch length and the number of samples
come from a warm-up timing that all ranks agree on (a MAX all-reduce), so every rank runs the same
number of operations whatever its clock says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from fstrain.bench.timing import sync, timed, wait
from fstrain.core.bench.arithmetic import algbw_gbps, bus_bandwidth_factor, elements_for, summarize

# torch 2.13 renamed the tensor forms (`all_gather_into_tensor` -> `all_gather_single`);
# the old names warn. Take whichever this torch has.
_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def time_collective(
    collective: str,
    size_bytes: int,
    *,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
    dtype: torch.dtype = torch.float32,
    seconds: float = 0.5,
    warmup: int = 2,
    min_samples: int = 3,
    max_samples: int = 50,
    sample_seconds: float = 0.02,
) -> dict[str, Any]:
    """Time ``collective`` on a ``size_bytes`` array (see :mod:`fstrain.core.bench.arithmetic` for what the
    size means per collective) for about ``seconds``; returns every sample and the bandwidths
    of the median sample."""
    world_size = dist.get_world_size(group)
    element_bytes = torch.empty((), dtype=dtype).element_size()
    count = elements_for(collective, size_bytes, element_bytes, world_size)
    op = _operation(collective, count, world_size, device, dtype, group)
    for _ in range(max(1, warmup)):
        op()
    probe_s = _agreed_max(_time_batch(op, 1, device, group), device, group)
    ops_per_sample = max(1, min(1000, int(sample_seconds / max(probe_s, 1e-9))))
    samples = max(min_samples, min(max_samples, int(seconds / max(probe_s * ops_per_sample, 1e-9))))
    local = [_time_batch(op, ops_per_sample, device, group) / ops_per_sample for _ in range(samples)]
    per_op_s = _agreed_max_list(local, device, group)
    actual_bytes = count * element_bytes
    median_s = summarize(per_op_s)["median"]
    factor = bus_bandwidth_factor(collective, world_size)
    return {
        "collective": collective,
        "size_bytes": actual_bytes,
        "requested_bytes": size_bytes,  # actual_bytes is rounded to whole elements, split evenly
        "elements": count,
        "dtype": str(dtype).removeprefix("torch."),
        "world_size": world_size,
        "ops_per_sample": ops_per_sample,
        "samples_seconds": per_op_s,
        "time_us": {k: v * 1e6 for k, v in summarize(per_op_s).items()},
        "algbw_gbps": algbw_gbps(actual_bytes, median_s),
        "busbw_gbps": algbw_gbps(actual_bytes, median_s) * factor,
        "bus_factor": factor,
        "samples_busbw_gbps": [algbw_gbps(actual_bytes, s) * factor for s in per_op_s],
    }


def _operation(
    collective: str, count: int, world_size: int, device: torch.device, dtype: torch.dtype,
    group: dist.ProcessGroup | None,
) -> Callable[[], None]:
    """A closure running one ``collective`` over buffers allocated once."""
    part = count // world_size

    def full(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=dtype, device=device)

    if collective == "all_reduce":
        buf = full(count)
        return lambda: wait(dist.all_reduce(buf, group=group))
    if collective == "all_gather":
        inp, out = full(part), full(count)
        return lambda: wait(_all_gather_tensor(out, inp, group=group))
    if collective == "reduce_scatter":
        inp, out = full(count), full(part)
        return lambda: wait(_reduce_scatter_tensor(out, inp, group=group))
    if collective == "all_to_all":
        inp, out = full(count), full(count)
        return lambda: wait(dist.all_to_all_single(out, inp, group=group))
    if collective == "broadcast":
        buf = full(count)
        root = dist.get_global_rank(group, 0) if group is not None else 0
        return lambda: wait(dist.broadcast(buf, src=root, group=group))
    raise ValueError(f"unknown collective {collective!r}")


def _time_batch(op: Callable[[], None], repeats: int, device: torch.device, group: dist.ProcessGroup | None) -> float:
    """Seconds this rank needs for ``repeats`` back-to-back ``op`` after a common start."""
    dist.barrier(group=group)
    sync(device)
    return timed(device, op, repeats)


def _agreed_max(value: float, device: torch.device, group: dist.ProcessGroup | None) -> float:
    return _agreed_max_list([value], device, group)[0]


def _agreed_max_list(values: list[float], device: torch.device, group: dist.ProcessGroup | None) -> list[float]:
    """Element-wise maximum over the ranks of ``group`` (the slowest rank's timings)."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return [float(v) for v in tensor.tolist()]
