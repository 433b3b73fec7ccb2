"""Process-group set-up and measurements shared by both backends.

The same code runs on CPU (gloo) and on GPUs (NCCL): the device and the backend follow from
``torch.cuda.is_available()``; ranks come from the variables torchrun and the deepspeed
launcher both set (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from fstrain.train.runtime_env import world_size_from_env


@dataclass(frozen=True)
class Runtime:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_runtime() -> Runtime:
    """Join the process group torchrun / the deepspeed launcher describe (or a world of one)."""
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = world_size_from_env()
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if world_size == 1 and "MASTER_ADDR" not in os.environ:
        # A plain `python -m fstrain.train`: a one-rank group on loopback.
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_RANK", "0")  # DeepSpeed insists on it
    if not dist.is_initialized():
        # device_id binds NCCL's communicator to this GPU up front (no lazy guess later).
        device_id = device if device.type == "cuda" else None
        dist.init_process_group(backend=backend, timeout=timedelta(minutes=10), device_id=device_id)
    return Runtime(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


# Threads of the gloo and NCCL process groups (their names in /proc/self/task/*/comm).
BACKEND_THREAD_PREFIXES = ("gloo", "pt_gloo", "pt_nccl")


def shutdown_distributed(finished: bool) -> None:
    """End the process group in order.

    After a successful run, every rank first meets at a barrier: no rank tears down its
    connections while a peer still has work in flight with it (the last all-reduce, a
    checkpoint's collectives). Then the process group is destroyed.
    """
    if not dist.is_initialized():
        return
    if finished:
        dist.barrier()
    dist.destroy_process_group()


def lingering_backend_threads() -> list[str]:
    """Process-group threads still running after ``destroy_process_group``.

    ``destroy_process_group`` only drops torch's registry entries; the group object, and with it
    its gloo worker threads, lives on while anything else references it. In torch 2.13 that is
    the case after any FSDP2 run: ``torch.distributed.nn.functional``, imported after the
    group exists, captured it as the default ``group=`` of its functions, and the DeviceMesh
    (whose ``_pg_registry`` holds the group) stays cached after the model is gone. The threads
    then run on into the interpreter's finalization, which is where "terminate called without
    an active exception" (SIGABRT, exit 134) comes from after a successful run: a C++ thread
    meeting a Python runtime being torn down. Empty where /proc is not available.
    """
    names = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as handle:
                name = handle.read().strip()
        except OSError:
            continue
        if name.startswith(BACKEND_THREAD_PREFIXES):
            names.append(name)
    return sorted(names)


def end_process(code: int) -> NoReturn:
    """Exit with ``code``; with process-group threads still alive, skip the interpreter's
    teardown (the job's files are written and closed, the streams are flushed here)."""
    if not lingering_backend_threads():
        sys.exit(code)
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict[str, int]:
    """Peak memory so far: CUDA allocator peaks on a GPU, the process's peak RSS on CPU."""
    if device.type == "cuda":
        return {
            "max_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
            "max_reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
        }
    # ru_maxrss is in KiB on Linux and bytes on macOS.
    scale = 1 if sys.platform == "darwin" else 1024
    return {"max_rss_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale}


def peak_bytes(peaks: dict[str, int]) -> int | None:
    """The one number a metric line carries (``memory_bytes``): the allocator's reserved peak on a
    GPU (what the card must hold), the peak RSS on CPU."""
    for key in ("max_reserved_bytes", "max_rss_bytes"):
        if key in peaks:
            return peaks[key]
    return None


def all_reduce_mean(value: float, device: torch.device) -> float:
    tensor = torch.tensor([value], dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return float(tensor.item()) / dist.get_world_size()


def all_reduce_max(values: dict[str, int], device: torch.device) -> dict[str, int]:
    keys = sorted(values)
    tensor = torch.tensor([values[k] for k in keys], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return {k: int(v) for k, v in zip(keys, tensor.tolist(), strict=True)}
