"""Progress of launch, bench and doctor on the namespace cluster: on stderr only, plain lines when
stderr is a pipe, a live display when it is a terminal (under `script`), and ``--json``'s stdout
one document either way."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.launch_helpers import WORKER
from tests.conftest import NamespaceCluster
from tests.helpers import REPO, run_fstrain

pytestmark = pytest.mark.cluster


def launch_args(cluster: NamespaceCluster, tmp_path: Path, *extra: str) -> list[str]:
    return ["launch", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-2]", "--nproc-per-node", "1",
            "--backend", "direct", "--run-dir", str(tmp_path / "run"), "--workdir", str(REPO), "--env",
            "FSTRAIN_TEST_SECONDS=0", *extra, "--json", "--", "python3", WORKER]


def doctor_args(cluster: NamespaceCluster) -> list[str]:
    return ["doctor", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-2]", "--only", "sw.python", "--json"]


def bench_args(cluster: NamespaceCluster, tmp_path: Path) -> list[str]:
    return ["bench", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-2]", "--workdir", str(REPO),
            "--run-dir", str(tmp_path / "bench"), "--suite", "collectives", "--nproc-per-node", "1", "--sizes",
            "256K", "--seconds", "0.05", "--json"]


def in_terminal(args: list[str], tmp_path: Path) -> tuple[int, str, str]:
    """``fstrain ARGS`` with stderr a terminal (a pty under `script`) and stdout a file:
    (exit code, stdout, what the terminal showed)."""
    out, screen = tmp_path / "stdout.json", tmp_path / "typescript"
    command = shlex.join([sys.executable, "-m", "fstrain", *args]) + f" > {shlex.quote(str(out))}"
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "160"}
    env.pop("FSTRAIN_DEBUG", None)
    result = subprocess.run(["script", "-qefc", command, str(screen)], capture_output=True, text=True, env=env,
                            cwd=REPO, timeout=600, check=False, stdin=subprocess.DEVNULL)
    return result.returncode, out.read_text(), screen.read_text(errors="replace")


def test_launch_stages_are_plain_lines_on_a_pipe_and_json_stays_one_document(
    cluster: NamespaceCluster, tmp_path: Path
) -> None:
    result = run_fstrain(*launch_args(cluster, tmp_path), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["exit_code"] == 0  # one document: the manifest
    for line in ("[connect] done 2/2", "[preflight] done", "[rendezvous] done ", "[start] done 2/2 node ",
                 "[first step] done no step reported"):  # the worker prints no training step
        assert line in result.stderr, result.stderr[-3000:]
    detached = run_fstrain(*launch_args(cluster, tmp_path / "d", "--detach"), env={"HOME": str(tmp_path / "home")},
                           timeout=300)
    assert detached.returncode == 0, detached.stderr[-3000:]
    assert json.loads(detached.stdout)["run_id"]
    assert "[start] done 2/2" in detached.stderr, detached.stderr[-3000:]


def test_launch_in_a_terminal_draws_the_stages_on_stderr_only(cluster: NamespaceCluster, tmp_path: Path) -> None:
    code, stdout, screen = in_terminal(launch_args(cluster, tmp_path), tmp_path)
    assert code == 0, screen[-3000:]
    assert json.loads(stdout)["exit_code"] == 0
    assert "preflight" in screen and "rendezvous" in screen and "starting nodes" in screen, screen[-3000:]
    assert "[preflight]" not in screen  # the live display, not the plain lines


def test_doctor_hosts_answered(cluster: NamespaceCluster, tmp_path: Path) -> None:
    piped = run_fstrain(*doctor_args(cluster), timeout=300)
    assert piped.returncode == 0, piped.stderr[-3000:]
    assert json.loads(piped.stdout)["summary"]["hosts"] == ["node1", "node2"]
    assert "[hosts] done 2/2" in piped.stderr
    code, stdout, screen = in_terminal(doctor_args(cluster), tmp_path)
    assert code == 0, screen[-3000:]
    assert json.loads(stdout)["summary"]["hosts"] == ["node1", "node2"]
    assert "hosts answered" in screen and "[hosts]" not in screen, screen[-3000:]


def test_bench_measurements(cluster: NamespaceCluster, tmp_path: Path) -> None:
    piped = run_fstrain(*bench_args(cluster, tmp_path / "piped"), timeout=600)
    assert piped.returncode in (0, 1), piped.stderr[-3000:]
    assert "collectives" in json.loads(piped.stdout)
    measured = [line for line in piped.stderr.splitlines() if line.startswith("[measure] ")]
    assert measured and "(" not in measured[0] and "/" in measured[0], piped.stderr[-3000:]  # counted
    assert measured[-1] == "[measure] done"
    code, stdout, screen = in_terminal(bench_args(cluster, tmp_path / "tty"), tmp_path)
    assert code in (0, 1), screen[-3000:]
    assert "collectives" in json.loads(stdout)
    assert "measuring" in screen and "[measure]" not in screen, screen[-3000:]
