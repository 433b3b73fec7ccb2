"""The arithmetic of ``fstrain bench``: message sizes, algorithm and bus bandwidth, statistics.

Bandwidths follow nccl-tests (NVIDIA/nccl-tests ``doc/PERFORMANCE.md``) so a number printed here
can be compared with an ``all_reduce_perf`` line and with a link's datasheet:

- algorithm bandwidth ``algbw = S / t``: ``S`` bytes of the operation, ``t`` seconds;
- bus bandwidth ``busbw = algbw * factor(n)``, the bandwidth each rank's link had to carry:
  all_reduce ``2(n-1)/n``, reduce_scatter, all_gather and all_to_all ``(n-1)/n``, broadcast ``1``.

``S`` is the size of the whole array: for all_gather the gathered output (n times each rank's
input), for reduce_scatter the input (n times each rank's output), for all_to_all each rank's send
buffer. GB/s means 10**9 bytes per second, as in nccl-tests. With one rank nothing crosses a link:
the factor is 0 and so is the bus bandwidth.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence

from fstrain.errors import InputError

COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
"""The collectives the collectives suite times, in report order."""

_GB = 1e9
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20,
          "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+)\s*([A-Za-z]*)\s*$")


def bus_bandwidth_factor(collective: str, world_size: int) -> float:
    """nccl-tests' correction from algorithm to bus bandwidth for ``world_size`` ranks."""
    if world_size < 1:
        raise InputError(f"world size must be at least 1, got {world_size}", "count the ranks again")
    n = world_size
    factors = {
        "all_reduce": 2 * (n - 1) / n,
        "all_gather": (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "all_to_all": (n - 1) / n,
        "broadcast": 1.0 if n > 1 else 0.0,
    }
    if collective not in factors:
        raise InputError(f"unknown collective {collective!r}", f"use one of {', '.join(COLLECTIVES)}")
    return factors[collective]


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (10**9 bytes/s): the operation's size over its time."""
    if seconds <= 0:
        raise InputError(f"a timing must be positive, got {seconds} s", "time at least one operation")
    return size_bytes / seconds / _GB


def busbw_gbps(collective: str, size_bytes: int, seconds: float, world_size: int) -> float:
    """Bus bandwidth in GB/s: ``algbw * bus_bandwidth_factor(collective, world_size)``."""
    return algbw_gbps(size_bytes, seconds) * bus_bandwidth_factor(collective, world_size)


def parse_size(text: str, *, where: str = "--sizes") -> int:
    """``"1M"`` -> 1048576: a byte count with an optional binary unit (K, M, G; KiB/MB spellings too)."""
    match = _SIZE.match(text)
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _UNITS:
        raise InputError(f"cannot read {text!r} as a size", "write a byte count such as 8, 64K, 1M or 1G",
                         where=where)
    size = int(match.group(1)) * _UNITS[unit]
    if size <= 0:
        raise InputError(f"a size must be positive, got {text!r}", "write a byte count such as 1M", where=where)
    return size


def parse_sizes(text: str, *, where: str = "--sizes") -> list[int]:
    """Message sizes from ``MIN-MAX`` (doubling from MIN up to MAX, as nccl-tests' ``-f 2``),
    ``MIN-MAX:F`` (multiplying by F) or a comma list ``1M,16M``; sorted, without repeats."""
    sizes: set[int] = set()
    for part in (p for p in text.split(",") if p.strip()):
        span, _, factor_text = part.partition(":")
        factor = 2
        if factor_text:
            if not factor_text.strip().isdigit() or int(factor_text) < 2:
                raise InputError(f"step factor must be an integer >= 2, got {factor_text!r}",
                                 "write e.g. 1M-1G:4", where=where)
            factor = int(factor_text)
        low_text, dash, high_text = span.partition("-")
        low = parse_size(low_text, where=where)
        high = parse_size(high_text, where=where) if dash else low
        if high < low:
            raise InputError(f"range {span.strip()!r} runs backwards", "write the smaller size first, e.g. 1M-1G",
                             where=where)
        size = low
        while size <= high:
            sizes.add(size)
            size *= factor
    if not sizes:
        raise InputError("no message sizes given", "write e.g. 1M-1G", where=where)
    return sorted(sizes)


def format_size(size_bytes: int) -> str:
    """1048576 -> ``1M``; the inverse of :func:`parse_size` for whole binary units."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size_bytes >= scale and size_bytes % scale == 0:
            return f"{size_bytes // scale}{unit}"
    return f"{size_bytes}B"


def elements_for(collective: str, size_bytes: int, element_bytes: int, world_size: int) -> int:
    """Elements of the array the collective moves, rounded down to a multiple of ``world_size``
    for the collectives that split it in n equal parts (at least one part per rank)."""
    count = max(1, size_bytes // element_bytes)
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        count = max(world_size, count - count % world_size)
    return count


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and mean of a non-empty list of samples."""
    if not values:
        raise InputError("no samples to summarize", "time at least one iteration")
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "mean": statistics.fmean(values),
    }


SUITES: tuple[str, ...] = ("collectives", "pairs", "compute")
"""The suites ``fstrain bench`` runs, in the order ``all`` runs them."""


def parse_suites(text: str, where: str = "--suite") -> list[str]:
    """``all`` or a comma list of suites -> the suites in run order."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [n for n in names if n not in (*SUITES, "all")]
    if bad or not names:
        raise InputError(f"unknown suite {', '.join(bad) or 'none'} in {text!r}",
                         f"use {', '.join(SUITES)} or all", where)
    return list(SUITES) if "all" in names else [s for s in SUITES if s in names]


def worker_argv(python: str, *, suites: Sequence[str], json_out: str, sizes: str = "", backend: str = "",
                extra: Sequence[str] = ()) -> list[str]:
    """The command every rank runs: ``python -m fstrain.bench`` with the suites and sizes."""
    argv = [python, "-m", "fstrain.bench", "--suite", ",".join(suites), "--json-out", json_out]
    if sizes:
        argv += ["--sizes", sizes]
    if backend:
        argv += ["--backend", backend]
    return argv + list(extra)
