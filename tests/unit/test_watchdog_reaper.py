"""A watchdog killed with SIGKILL (or by the OOM killer) can clean nothing up: its reaper ends the
job instead, within the grace period. Real processes on this machine: a job that starts a child in
a session of its own that ignores SIGTERM (as torchrun's workers can), and whose own process ignores
SIGTERM too (a launcher busy in its shutdown)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fstrain.core.job.spec import SCRIPT_FLAGS
from fstrain.io.remote import source
from fstrain.io.remote.watchdog import BOOTSTRAP, REAPER_POLL_S

GRACE_S = 2.0
# Ignores SIGTERM, starts a grandchild in a new session that ignores it too, writes both pids, sleeps.
JOB = """\
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
    start_new_session=True)
with open(sys.argv[1] + ".tmp", "w") as handle:
    handle.write("%d %d" % (os.getpid(), child.pid))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def marked(tmp_path: Path) -> list[int]:
    """The live processes started under this test's watchdog (its job's and its reaper), by the
    mark in their environment."""
    mark = f"FSTRAIN_TEST_MARK={tmp_path}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if mark in (entry / "environ").read_bytes().split(b"\0") and alive(int(entry.name)):
                    found.append(int(entry.name))
    return found


def start(tmp_path: Path, grace_s: float = GRACE_S, stdout: int = subprocess.DEVNULL) \
        -> tuple[subprocess.Popen[bytes], list[int]]:
    """A watchdog running JOB; (the watchdog, [job pid, grandchild pid]) once both are up."""
    (tmp_path / "job.py").write_text(JOB)
    pids_file = tmp_path / "pids"
    header = {"source": source("watchdog"), "argv": [sys.executable, str(tmp_path / "job.py"), str(pids_file)],
              "env": {}, "run_dir": str(tmp_path / "run"), "run_id": "r", "node_rank": 0, "grace_s": grace_s,
              "heartbeat_timeout_s": 600}
    watchdog = subprocess.Popen([sys.executable, *SCRIPT_FLAGS, "-c", BOOTSTRAP], stdin=subprocess.PIPE,
                                stdout=stdout, stderr=subprocess.DEVNULL,
                                env={**os.environ, "FSTRAIN_TEST_MARK": str(tmp_path)})
    assert watchdog.stdin is not None
    watchdog.stdin.write((json.dumps(header) + "\n").encode())
    watchdog.stdin.flush()
    deadline = time.monotonic() + 60
    while not pids_file.exists():
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.05)
    time.sleep(3 * REAPER_POLL_S)  # the reaper has noted both
    assert len(marked(tmp_path)) == 4, "the watchdog, the job, its grandchild and the reaper"
    return watchdog, [int(pid) for pid in pids_file.read_text().split()]


def test_a_sigkilled_watchdog_leaves_no_process_after_the_grace(tmp_path: Path) -> None:
    watchdog, _ = start(tmp_path)
    try:
        watchdog.kill()
        watchdog.wait(timeout=10)
        killed_at = time.monotonic()
        while marked(tmp_path) and time.monotonic() - killed_at < GRACE_S + 5:
            time.sleep(0.05)
        left = marked(tmp_path)
        assert not left, f"left {GRACE_S + 5:g} s after the watchdog's SIGKILL: {left}"
        # Both ignore SIGTERM: only the SIGKILL after the grace ends them.
        assert time.monotonic() - killed_at >= GRACE_S - 0.5
    finally:
        assert watchdog.stdin is not None
        watchdog.stdin.close()
        for pid in marked(tmp_path):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_a_watchdog_that_ends_its_job_leaves_no_reaper(tmp_path: Path) -> None:
    watchdog, pids = start(tmp_path, grace_s=0.5)
    assert watchdog.stdin is not None
    watchdog.stdin.write(b"kill\n")
    watchdog.stdin.flush()
    assert watchdog.wait(timeout=30) == 128 + signal.SIGKILL
    watchdog.stdin.close()
    assert marked(tmp_path) == [], "the watchdog's end takes its reaper with it"
    assert not any(alive(pid) for pid in pids)


def test_the_reaper_holds_none_of_the_watchdogs_descriptors(tmp_path: Path) -> None:
    """The reaper is forked from the watchdog: it keeps only its pipe, so the watchdog's own
    output (an SSH channel's, on a node) ends when the watchdog does, not once the reaper has
    spent the grace; and it runs in a session of its own."""
    watchdog, job = start(tmp_path, stdout=subprocess.PIPE)
    assert watchdog.stdout is not None and watchdog.stdin is not None
    try:
        reapers = [pid for pid in marked(tmp_path) if pid not in (watchdog.pid, *job)]
        assert len(reapers) == 1
        parent = Path(f"/proc/{reapers[0]}/stat").read_text().rsplit(")", 1)[1].split()[1]
        assert (int(parent), os.getsid(reapers[0])) == (watchdog.pid, reapers[0]), \
            "a child of the watchdog, leading a session of its own"
        held = sorted(int(fd) for fd in os.listdir(f"/proc/{reapers[0]}/fd"))
        assert held == [0, 1, 2], f"the reaper holds descriptors {held}: its pipe and /dev/null only"
        watchdog.kill()
        killed_at = time.monotonic()
        assert watchdog.stdout.read() == b""
        assert time.monotonic() - killed_at < GRACE_S - 0.5, "the output ended with the watchdog"
        assert alive(reapers[0]), "the reaper still spends the grace"
    finally:
        watchdog.wait(timeout=10)
        watchdog.stdout.close()
        watchdog.stdin.close()
        deadline = time.monotonic() + GRACE_S + 5
        while marked(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in marked(tmp_path):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
