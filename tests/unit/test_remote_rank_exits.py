"""The watchdog's catch of the first rank to exit non-zero (fstrain/io/remote/stacks.py), on
real processes: a launcher stand-in that, like DeepSpeed's, collects its ranks once a second."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from fstrain.io.remote.stacks import FirstFailedRank, zombie_wait_status
from fstrain.io.remote.watchdog import descendants

# Starts ranks 0..3 (RANK/LOCAL_RANK in their environment, as DeepSpeed's launcher sets them),
# each exiting with argv's code after argv's delay; reaps them once a second.
LAUNCHER = r"""
import os, subprocess, sys, time
plan = [x.split(":") for x in sys.argv[1:]]
procs = []
for rank, (code, delay) in enumerate(plan):
    env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank % 2)}
    procs.append(subprocess.Popen([sys.executable, "-c",
        f"import os, time, signal; time.sleep({delay}); "
        f"os.kill(os.getpid(), signal.SIGSEGV) if {code} < 0 else os._exit({code})"], env=env))
while any(p.returncode is None for p in procs):
    time.sleep(1.0)
    for p in procs:
        p.poll()
"""


def watch(plan: list[str], limit_s: float = 20) -> dict | None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, *plan])
    watcher = FirstFailedRank(len(plan))
    deadline = time.monotonic() + limit_s
    failure = None
    try:
        while launcher.poll() is None and time.monotonic() < deadline:
            pids = descendants(launcher.pid) if watcher.needs_scan() else None
            failure = watcher.poll(pids) or failure
            time.sleep(0.1)
    finally:
        launcher.kill()
        launcher.wait()
    return failure


def test_the_first_rank_to_exit_non_zero_is_named_with_its_own_code() -> None:
    assert watch(["0:0.5", "0:4", "7:1.5", "0:4"]) == {"rank": 2, "local_rank": 0, "exit_code": 7}


def test_a_signal_death_reads_as_128_plus_the_signal() -> None:
    assert watch(["0:4", "-11:1.5", "0:4", "0:4"]) == {"rank": 1, "local_rank": 1, "exit_code": 139}


def test_ranks_that_all_succeed_report_nothing() -> None:
    assert watch(["0:0.5", "0:1", "0:1", "0:0.5"]) is None


def test_a_running_process_is_no_zombie() -> None:
    assert zombie_wait_status(os.getpid()) is None
    assert zombie_wait_status(2**22 + 12345) is None  # no such process
