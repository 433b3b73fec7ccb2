"""`fstrain launch` when its own output cannot keep up or cannot be written.

- a flood of output: fstrain's memory stays bounded (back-pressure) and no line is lost;
- stdout read by ``| head -n 3`` (EPIPE): said once, the job runs on, exit code and manifest are
  the job's;
- the run directory on a full disk (a tiny tmpfs) or over a file-size limit: said once, the
  output still streams, the job runs on, the manifest is written where it fits.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.cluster.launch_helpers import assert_no_job_processes
from tests.conftest import NamespaceCluster
from tests.helpers import REPO, require_tool

FLOOD = str(REPO / "tests" / "cluster" / "programs" / "flood.py")
# 80 MB of output in 40,000 lines of 2 KB: more than the bound many times over, so output held in
# memory instead of pushed back on the ranks shows, at a fraction of the time of as many bytes in
# short lines (the 1,000,000-line figure is benchmarks/output_flood.py's).
FLOOD_LINES, FLOOD_PAD = 40_000, 2_000
STALL_S = 4  # the reader reads nothing this long: a terminal scrolled back, a full pipe
MAX_RSS_MIB = 90  # fstrain itself starts at ~30 MiB; unbounded, 1e6 lines took it past 150


def launch_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "fstrain", "launch", *args]


def peak_rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def test_a_flood_of_output_keeps_fstrain_small_and_loses_no_line(tmp_path: Path) -> None:
    """A rank floods a reader that reads nothing for STALL_S, then everything: fstrain must push
    back on the rank (its memory stays bounded) and lose no line. localhost (no SSH): the relay
    path from the watchdog's pipe to stdout is the same."""
    env = {**os.environ, "FSTRAIN_TEST_LINES": str(FLOOD_LINES), "FSTRAIN_TEST_PAD": str(FLOOD_PAD)}
    proc = subprocess.Popen(launch_argv("--nproc-per-node", "1", "--backend", "deepspeed", "--run-dir",
                                        str(tmp_path / "run"), "--", "python3", FLOOD),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
    assert proc.stdout is not None and proc.stderr is not None
    counted: list[int] = []
    tail: list[bytes] = []

    def read() -> None:
        assert proc.stdout is not None
        found = 0
        for line in proc.stdout:
            found += b" flood rank=0 line=" in line
            if b"flood done" in line:
                tail.append(line)
        counted.append(found)

    errors: list[bytes] = []
    stderr_reader = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    stderr_reader.start()
    peak, started = 0, time.monotonic()
    reader = threading.Thread(target=read, daemon=True)
    deadline = started + 600
    while proc.poll() is None and time.monotonic() < deadline:
        peak = max(peak, peak_rss_kib(proc.pid))
        if reader.ident is None and time.monotonic() - started > STALL_S:  # not started yet
            reader.start()
        time.sleep(0.1)
    if reader.ident is None:  # the launch ended within the stall
        reader.start()
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)
    reader.join(timeout=60)
    stderr_reader.join(timeout=30)
    proc.stdout.close()
    proc.stderr.close()
    stderr = b"".join(errors).decode(errors="replace")
    assert proc.returncode == 0, stderr[-3000:]
    assert counted == [FLOOD_LINES] and tail, stderr[-3000:]
    assert 0 < peak / 1024 < MAX_RSS_MIB, f"fstrain's peak RSS was {peak / 1024:.0f} MiB"


def test_stdout_closed_by_head_does_not_stop_the_job(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = {**os.environ, "FSTRAIN_TEST_LINES": "20000"}
    command = " ".join([*launch_argv("--nproc-per-node", "1", "--run-dir", str(run_dir), "--", "python3", FLOOD),
                        "| head -n 3; exit ${PIPESTATUS[0]}"])
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, cwd=REPO,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(result.stdout.splitlines()) == 3
    assert result.stderr.count("warning: cannot write to stdout") == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "all nodes finished ok; exit code 0" in result.stderr
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["exit_code"] == 0 and manifest["reason"] == "ok"
    assert (run_dir / "logs" / "localhost.log").read_text().count(" flood rank=0 line=") == 20000


def _limit_file_size() -> None:
    limit = 64 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.cluster
@pytest.mark.parametrize("full", ["file-size-limit", "tiny-tmpfs"])
def test_run_dir_on_a_full_disk_does_not_stop_the_job(cluster: NamespaceCluster, tmp_path: Path,
                                                      full: str) -> None:
    # Remote hosts: the job writes on the nodes, only fstrain's local copy runs out of room.
    run_dir = tmp_path / "run"
    args = launch_argv("--ssh-config", cluster.ssh_config, "--hosts", "node[1-2]", "--nproc-per-node", "1",
                       "--grace", "3", "--run-dir", str(run_dir), "--env", "FSTRAIN_TEST_LINES=5000", "--",
                       "python3", FLOOD)
    env = dict(os.environ)
    if full == "tiny-tmpfs":
        require_tool("unshare", "apt-get install util-linux")
        run_dir.mkdir()
        # A private mount namespace: the 64 KiB file system exists for this fstrain only.
        mount = f"mount -t tmpfs -o size=64k fstrain-full {run_dir} && exec \"$@\""
        args = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh", *args]
    result = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=False,
                            preexec_fn=_limit_file_size if full == "file-size-limit" else None)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.count("warning: cannot write the logs in") == 1, result.stderr
    lines = result.stdout.splitlines()
    for node in ("node1", "node2"):  # every line still streamed
        assert sum(line.startswith(f"[{node} r") and "] flood rank=" in line for line in lines) == 5000
        assert any(line.startswith(f"[{node} r") and "] flood done rank=" in line for line in lines)
    assert "all nodes finished ok; exit code 0" in result.stderr
    if full == "file-size-limit":  # the logs hit the limit; the small manifest still fits
        manifest = json.loads((run_dir / "manifest.json").read_text())
        assert manifest["exit_code"] == 0 and [n["exit_code"] for n in manifest["nodes"]] == [0, 0]
    assert_no_job_processes(cluster, 8)
