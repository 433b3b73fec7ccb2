"""One clock for every benchmark: CUDA events on a GPU, ``time.perf_counter`` on a CPU."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch


def timed(device: torch.device, op: Callable[[], None], repeats: int) -> float:
    """Seconds for ``repeats`` back-to-back calls of ``op``, finished on the device. On a GPU the
    events bracket the queued work, so the host's launch overhead hides behind the kernels."""
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            op()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3
    started = time.perf_counter()
    for _ in range(repeats):
        op()
    return time.perf_counter() - started


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wait(work: Any) -> None:
    """Wait for an asynchronous torch.distributed operation (synchronous calls return None)."""
    if work is not None:
        work.wait()


def on_device(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Make ``device`` the current GPU (CUDA events record on the current device's stream)."""
    if device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()
