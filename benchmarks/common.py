"""Small helpers shared by the benchmarks: timing whole commands and summarising as ratios."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Mapping, Sequence


def time_command(argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 600) -> tuple[float, str]:
    """Wall seconds of one run of ``argv`` and its stdout; raises if it fails."""
    start = time.perf_counter()
    proc = subprocess.run(list(argv), capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=timeout, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return seconds, proc.stdout


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def machine_line() -> str:
    """Machine, date and Python, for the record in docs/benchmarks.md."""
    cpus = os.cpu_count()
    model = ""
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")
    except OSError:
        pass
    return (f"{time.strftime('%Y-%m-%d')}, {platform.machine()}, {cpus} CPUs {model}, "
            f"Python {platform.python_version()}")
