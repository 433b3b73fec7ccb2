"""Small helpers shared by the benchmarks: timing whole commands and summarising as ratios."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path


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


@contextlib.contextmanager
def namespace_cluster(hosts: int, base: Path, cluster_id: str, run_ids: Sequence[str],
                      plain_home: bool = False) -> Iterator[Path]:
    """The test cluster (`scripts/testcluster.sh up HOSTS`) with cluster id ``cluster_id`` and
    its state in ``base/cluster`` (yielded), apart from other sessions' clusters; taken down at
    the end, with the hosts' folders of fstrain's runs ``run_ids`` (the hosts share this
    machine's home, or with ``plain_home`` the empty folder ``base/home``, which the sessions
    then get as HOME instead of running this machine's ~/.bashrc)."""
    state = base / "cluster"  # testcluster.sh owns (and removes) this folder
    env = {**os.environ, "FSTRAIN_TESTCLUSTER_ID": cluster_id, "FSTRAIN_TESTCLUSTER_DIR": str(state)}
    if plain_home:
        (base / "home").mkdir(exist_ok=True)
        env["FSTRAIN_TESTCLUSTER_HOME"] = str(base / "home")
    script = str(Path(__file__).resolve().parent.parent / "scripts" / "testcluster.sh")
    try:
        subprocess.run([script, "up", str(hosts)], check=True, env=env, capture_output=True)
        yield state
    finally:
        subprocess.run([script, "down"], check=False, env=env, capture_output=True)
        for run_id in run_ids:
            shutil.rmtree(Path.home() / ".fstrain" / "runs" / run_id, ignore_errors=True)
