"""Compute measurements on one device: matmul (GEMM) throughput and memory bandwidth; and the
host's optimizer rate (torch's AdamW on CPU tensors, what FSDP's CPU offload runs).

Both run a short warm-up, then repeat timed samples until ``seconds`` have passed (at least
``min_samples``), and return a plain dict with every sample so a report can show the spread.
On a GPU each sample is timed with CUDA events around a batch of operations (the launch queue
stays full, as in training); on a CPU with ``time.perf_counter``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from fstrain.bench.timing import on_device, sync, timed
from fstrain.core.bench.arithmetic import summarize

GPU_MATMUL_SIZE = 8192
"""n of the n x n matmuls on a GPU: large enough to reach the Tensor Cores' plateau."""
CPU_MATMUL_SIZE = 1024
"""n on a CPU: a few hundred milliseconds per product on a laptop core."""
GPU_COPY_BYTES = 1 << 30
"""Bytes of the source buffer of the memory test on a GPU (the destination is as large)."""
CPU_COPY_BYTES = 64 << 20
"""Bytes of the source buffer on a CPU: well above the last-level cache."""
HOST_ADAMW_ELEMENTS = 1 << 24
"""fp32 parameters of the host AdamW test beside a GPU, in four tensors: 256 MiB of parameters,
gradients and moments, well above a server's last-level cache."""
CPU_HOST_ADAMW_ELEMENTS = 1 << 22
"""The same in a CPU-only bench (64 MiB), where the figure only says what the CPU does, no GPU
offloads to it, and the suite's time is the CPU's."""
SAMPLE_SECONDS = 0.05
"""Aim of one timed sample: long enough that timer resolution and launch gaps do not count."""


def matmul_tflops(
    device: torch.device | str,
    dtype: torch.dtype = torch.bfloat16,
    size: int | None = None,
    seconds: float = 2.0,
    *,
    warmup: int = 3,
    min_samples: int = 3,
) -> dict[str, Any]:
    """Dense ``size x size`` matmul throughput in TFLOPS (10**12 FLOP/s), 2 * size**3 FLOPs per
    product. ``size`` defaults to 8192 on a GPU and 1024 on a CPU."""
    device = torch.device(device)
    n = size or (GPU_MATMUL_SIZE if device.type == "cuda" else CPU_MATMUL_SIZE)
    result = gemm_tflops(device, dtype, n, n, n, seconds, warmup=warmup, min_samples=min_samples)
    return {"kind": "matmul", **{k: v for k, v in result.items() if k not in ("m", "n", "k")}, "size": n}


def gemm_tflops(
    device: torch.device | str,
    dtype: torch.dtype,
    m: int,
    n: int,
    k: int,
    seconds: float = 0.25,
    *,
    warmup: int = 3,
    min_samples: int = 3,
) -> dict[str, Any]:
    """Throughput in TFLOPS of ``C[m x n] = A[m x k] @ B[k x n]``, 2 m n k FLOPs per product."""
    device = torch.device(device)
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    out = torch.empty(m, n, device=device, dtype=dtype)
    flops_per_op = 2 * m * n * k

    def op() -> None:
        torch.matmul(a, b, out=out)

    with on_device(device):
        samples_s, ops_per_sample = _time_samples(device, op, seconds, warmup, min_samples)
    tflops = [flops_per_op * ops_per_sample / s / 1e12 for s in samples_s]
    return {
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "m": m,
        "n": n,
        "k": k,
        "flops_per_op": flops_per_op,
        "ops_per_sample": ops_per_sample,
        "samples_seconds": samples_s,
        "samples_tflops": tflops,
        "tflops": summarize(tflops),
    }


def memory_bandwidth_gbps(
    device: torch.device | str,
    nbytes: int | None = None,
    seconds: float = 2.0,
    *,
    warmup: int = 3,
    min_samples: int = 3,
) -> dict[str, Any]:
    """Device memory bandwidth in GB/s (10**9 bytes/s) of a device-to-device copy of ``nbytes``.

    A copy reads ``nbytes`` and writes ``nbytes``: both are counted (``2 * nbytes`` per copy), as
    STREAM's copy and NVIDIA's bandwidth tests count them, so the number compares with the
    datasheet's HBM bandwidth. ``nbytes`` defaults to 1 GiB on a GPU and 64 MiB on a CPU.
    """
    device = torch.device(device)
    size = nbytes or (GPU_COPY_BYTES if device.type == "cuda" else CPU_COPY_BYTES)
    src = torch.empty(size, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)

    def op() -> None:
        dst.copy_(src)

    with on_device(device):
        samples_s, ops_per_sample = _time_samples(device, op, seconds, warmup, min_samples)
    moved = 2 * size * ops_per_sample
    gbps = [moved / s / 1e9 for s in samples_s]
    return {
        "kind": "copy",
        "device": str(device),
        "bytes": size,
        "bytes_moved_per_op": 2 * size,
        "ops_per_sample": ops_per_sample,
        "samples_seconds": samples_s,
        "samples_gbps": gbps,
        "gbps": summarize(gbps),
    }


def cpu_adamw_params_per_s(
    seconds: float = 2.0, elements: int = HOST_ADAMW_ELEMENTS, *, warmup: int = 1, min_samples: int = 1
) -> dict[str, Any]:
    """Parameters per second this process updates with ``torch.optim.AdamW`` on CPU tensors (its
    default implementation there, with torch's intra-op threads as the launcher set them).

    FSDP's CPU offload runs the user's optimizer on the host like this, every rank of a node at
    once: run on every rank at the same time, the ranks' rates summed over a node are the node's
    rate (``plan --calibrate`` reads it as ``torch_cpu_adamw_params_per_s_per_node``).
    """
    params = [torch.nn.Parameter(torch.zeros(elements // 4)) for _ in range(4)]
    for param in params:
        param.grad = torch.full_like(param, 1e-3)
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    cpu = torch.device("cpu")
    samples_s, steps_per_sample = _time_samples(cpu, optimizer.step, seconds, warmup, min_samples)
    counted = 4 * (elements // 4)
    rates = [counted * steps_per_sample / s for s in samples_s]
    return {
        "kind": "torch_adamw",
        "elements": counted,
        "threads": torch.get_num_threads(),
        "steps_per_sample": steps_per_sample,
        "samples_seconds": samples_s,
        "samples_params_per_s": rates,
        "params_per_s": summarize(rates),
    }


def _time_samples(
    device: torch.device, op: Callable[[], None], seconds: float, warmup: int, min_samples: int
) -> tuple[list[float], int]:
    """Warm up, size a batch of ``op`` to about SAMPLE_SECONDS, then time batches until
    ``seconds`` have passed; returns each batch's seconds and the batch length."""
    for _ in range(max(1, warmup)):
        op()
    sync(device)
    probe = timed(device, op, 1)
    ops_per_sample = max(1, int(SAMPLE_SECONDS / max(probe, 1e-9)))
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(samples) < min_samples or time.perf_counter() < deadline:
        samples.append(timed(device, op, ops_per_sample))
    return samples, ops_per_sample
