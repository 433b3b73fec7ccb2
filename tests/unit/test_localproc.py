"""Signalling fstrain's own processes on this machine: only while their command line is ours."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from fstrain.io.localproc import command_line, process_alive, terminate_if_ours, wait_gone


def test_a_process_is_signalled_only_while_its_command_line_is_ours() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "fstrain-test-marker"])
    try:
        deadline = time.monotonic() + 10  # until it has exec'd (its command line reads empty before, on a busy machine)
        while b"fstrain-test-marker" not in command_line(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process_alive(child.pid) and b"fstrain-test-marker" in command_line(child.pid)
        assert not terminate_if_ours(child.pid, b"not-this-one")  # a reused pid: left alone
        assert child.poll() is None
        assert terminate_if_ours(child.pid, b"fstrain-test-marker")
        assert child.wait(timeout=10) == -15
        assert not process_alive(child.pid) and wait_gone(child.pid, 0.1)
        assert not terminate_if_ours(child.pid, b"fstrain-test-marker")  # gone
    finally:
        child.kill()
        child.wait()


def test_a_zombie_is_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # it has exited, and is not reaped yet
    assert not process_alive(child.pid)
    child.wait()
    assert command_line(child.pid) == b"" and not process_alive(-1)
