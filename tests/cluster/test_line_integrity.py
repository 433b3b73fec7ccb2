"""Every line of every rank reaches the user once and whole, for every backend, attached and
detached: lines written in two writes, 64 KiB lines (each past every pipe and read buffer on the
way, so a line cut at a buffer boundary shows), lines with invalid UTF-8 bytes (an offset counted
in characters, not bytes, shows), lines on stderr. The same counts at volume, 4 ranks x 200,000
lines, are benchmarks/line_integrity.py's (docs/benchmarks.md, "Line integrity").

The writer (tests/cluster/programs/lines.py) makes line N of rank R a pure function of both
(tests/integrity.py ``rank_line``), so each test knows every line it must find. Attached, the
lines are read from `fstrain launch`'s stdout; detached, from `fstrain logs --follow` and, byte
for byte, from each node's ``node<I>.out``. ``FSTRAIN_INTEGRITY_LINES`` sets the lines per rank
(default 1,500).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import NamespaceCluster
from tests.helpers import REPO
from tests.integrity import (
    LineReport,
    check_lines,
    half_line,
    node_out_lines,
    rank_line,
    shown_lines,
    writer_launch_args,
)

pytestmark = pytest.mark.cluster
LINES = int(os.environ.get("FSTRAIN_INTEGRITY_LINES", "1500"))
NODES, NPROC = 2, 2
RANKS = NODES * NPROC


def fstrain(home: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[bytes]:
    """A fresh fstrain process with its own HOME (its index of runs); output as bytes."""
    env = {**os.environ, "HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("FSTRAIN_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "fstrain", *args], capture_output=True, env=env, timeout=timeout,
                          cwd=REPO, check=False)


def node_out(cluster: NamespaceCluster, index: int, node: dict) -> bytes:
    """Node ``index``'s ``node<I>.out``, read on the node."""
    path = f"{node['run_dir']}/node{node['node_rank']}.out"
    return subprocess.run(["ip", "netns", "exec", cluster.namespace(index), "cat", path], capture_output=True,
                          check=True, timeout=120).stdout


def run_writer(cluster: NamespaceCluster, tmp_path: Path, backend: str, mode: str, lines: int, long_every: int,
               pause_s: float, timeout: float) -> dict[str, LineReport]:
    """Launch the writer on 2 nodes x 2 ranks; what came back on each path, counted."""
    home, run_dir = tmp_path / "home", tmp_path / "run"
    args = ["launch", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-2]", "--nproc-per-node", str(NPROC),
            "--grace", "3", "--run-dir", str(run_dir)]
    writer = writer_launch_args(backend, lines, long_every, pause_s)
    count = {"ranks": RANKS, "count": lines, "long_every": long_every}
    if mode == "attached":
        result = fstrain(home, *args, *writer, timeout=timeout)
        assert result.returncode == 0, result.stderr[-3000:].decode(errors="replace")
        return {"launch": check_lines(shown_lines(result.stdout), decoded=True, **count)}
    started = fstrain(home, *args, "--detach", *writer, timeout=180)
    assert started.returncode == 0, started.stderr.decode(errors="replace")
    run_id = started.stdout.decode().strip()
    followed = fstrain(home, "logs", run_id, "--follow", timeout=timeout)
    assert followed.returncode == 0, followed.stderr[-3000:].decode(errors="replace")
    detached = json.loads((run_dir / "detached.json").read_text())
    on_nodes = [line for index, node in enumerate(detached["nodes"], start=1)
                for line in node_out_lines(node_out(cluster, index, node), node["node_rank"] * NPROC)]
    return {"logs --follow": check_lines(shown_lines(followed.stdout), decoded=True, **count),
            "node<I>.out": check_lines(on_nodes, decoded=False, **count)}


def assert_whole(reports: dict[str, LineReport]) -> None:
    bad = {path: report.summary() for path, report in reports.items() if not report.ok}
    assert not bad, bad


@pytest.mark.parametrize("mode", ["attached", "detached"])
@pytest.mark.parametrize("backend", ["torchrun", "deepspeed", "direct"])
def test_every_line_arrives_once_and_whole(cluster: NamespaceCluster, tmp_path: Path, backend: str,
                                           mode: str) -> None:
    """Two-part lines (half, a pause, the rest), 64 KiB lines (one in 25), invalid UTF-8 and
    stderr lines: every one once, whole, with its rank's tag, each rank's stdout in order."""
    assert_whole(run_writer(cluster, tmp_path, backend, mode, LINES, long_every=25, pause_s=0.002, timeout=300))


def test_torchrun_restarts_are_followed(cluster: NamespaceCluster, tmp_path: Path) -> None:
    """--max-restarts 1: every rank writes its lines, half a line and exits 3; torchrun restarts
    the ranks in a new attempt folder, where they write the same lines and exit 0. Each line
    comes twice, whole, the half line once with its newline."""
    writer = writer_launch_args("torchrun", 300, long_every=25, pause_s=0.002)
    result = fstrain(tmp_path / "home", "launch", "--ssh-config", cluster.ssh_config, "--hosts", "node1",
                     "--nproc-per-node", str(NPROC), "--max-restarts", "1", "--grace", "3", "--run-dir",
                     str(tmp_path / "run"), "--env", "FSTRAIN_TEST_FAIL_FIRST_ATTEMPT=1", *writer, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:].decode(errors="replace")
    got = Counter(shown_lines(result.stdout))
    expected = Counter({(rank, rank_line(rank, number, 25).decode(errors="replace").encode()): 2
                        for rank in range(NPROC) for number in range(300)})
    expected.update({(rank, half_line(rank)): 1 for rank in range(NPROC)})
    assert got == expected, (sorted((got - expected).items())[:3], sorted((expected - got).items())[:3])
