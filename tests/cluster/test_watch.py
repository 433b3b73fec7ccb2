"""`fstrain status RUN --watch` in a real pseudo-terminal (tmux) against a real detached run on
the namespace cluster: every rank on the screen, the progress bar advancing, Ctrl-C leaving the
run alone; then, stderr a pipe, plain lines to the run's end."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.test_runs import detach, fstrain
from tests.conftest import NamespaceCluster
from tests.helpers import REPO

pytestmark = pytest.mark.cluster

STEPS = 40  # enough to Ctrl-C before the end on an idle machine, few enough to end soon after


class Pane:
    """A tmux server of the test's own (its own socket) running one command in a 200x40 pane."""

    def __init__(self, socket: Path, command: str) -> None:
        self.socket = socket
        self.tmux("new-session", "-d", "-x", "200", "-y", "40", command)

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", str(self.socket), *args], capture_output=True, text=True, check=True,
                              timeout=30).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p")

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            match = re.search(pattern, screen)
            if match is not None:
                return match
            assert time.monotonic() < deadline, f"no {pattern!r} on the screen after {timeout} s:\n{screen}"
            time.sleep(0.5)


@pytest.fixture
def tmux_socket(tmp_path: Path) -> Iterator[Path]:
    socket = tmp_path / "tmux.sock"
    yield socket
    subprocess.run(["tmux", "-S", str(socket), "kill-server"], capture_output=True, check=False, timeout=30)


def test_watch_shows_every_rank_advances_and_ctrl_c_leaves_the_run_alone(
    cluster: NamespaceCluster, tmp_path: Path, tmux_socket: Path
) -> None:
    home, run_dir, exited = tmp_path / "home", tmp_path / "run", tmp_path / "exit-code"
    run_id = detach(cluster, home, run_dir, "--nproc-per-node", "1", "--model", "tiny", "--steps", str(STEPS))
    env = f"HOME={shlex.quote(str(home))} PYTHONPATH={shlex.quote(str(REPO))}"
    watch = f"{sys.executable} -m fstrain status {run_id} --watch --interval 1"
    # The exit code is kept in a file, and the pane stays open for the last capture.
    pane = Pane(tmux_socket, f"cd {shlex.quote(str(REPO))} && env {env} {watch}; echo $? > {exited}; sleep 600")
    first = int(pane.wait_for(rf"step (\d+)/{STEPS} \(").group(1))
    screen = pane.screen()
    assert f"run {run_id}: running" in screen
    for host, rank in (("node1", 0), ("node2", 1)):
        assert re.search(rf"^{host}\s+│ {rank}\s+│ yes", screen, re.MULTILINE), screen
    bar = next(line for line in screen.splitlines() if re.search(rf"step \d+/{STEPS} \(", line))
    assert "━" in bar.split("step")[0], screen  # the bar, left of its step
    deadline = time.monotonic() + 120
    while (later := int(pane.wait_for(rf"step (\d+)/{STEPS} \(").group(1))) <= first:
        assert time.monotonic() < deadline, f"the step stayed at {first}:\n{pane.screen()}"
        time.sleep(0.5)
    assert later < STEPS, "the run ended before Ctrl-C: give it more steps"
    pane.tmux("send-keys", "C-c")
    pane.wait_for("stopped watching run", timeout=30)
    deadline = time.monotonic() + 30
    while not exited.exists() or not exited.read_text().strip():
        assert time.monotonic() < deadline, pane.screen()
        time.sleep(0.2)
    assert exited.read_text().strip() == "0"
    status = json.loads(fstrain(home, "status", run_id, "--json").stdout)
    assert status["state"] == "running", status  # the run goes on
    # Watched again with stderr a pipe, to its end: one plain line per refresh, nothing on
    # stdout, the run's exit code.
    result = subprocess.run([sys.executable, "-m", "fstrain", "status", run_id, "--watch", "--interval", "1"],
                            capture_output=True, text=True, timeout=600, cwd=REPO, check=False,
                            env={**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[-1] == f"run {run_id}: succeeded, exit 0; step {STEPS}/{STEPS} (100%)", lines
    assert all(line.startswith(f"run {run_id}: ") for line in lines), lines
