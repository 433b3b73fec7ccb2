"""Running `fstrain launch` against the namespace cluster and checking nothing is left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import NamespaceCluster
from tests.helpers import REPO, interruptible

WORKER = str(REPO / "tests" / "cluster" / "programs" / "worker.py")
# Every launch a test started, so that one a failing test left running is stopped at its end
# (tests/cluster/conftest.py) instead of running on beside the tests that follow.
STARTED: list[LaunchProcess] = []


@dataclass
class LaunchProcess:
    """A running `fstrain launch` whose stdout/stderr are collected by threads."""

    proc: subprocess.Popen[str]
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    readers: list[threading.Thread] = field(default_factory=list)

    def wait_for(self, fragment: str, count: int = 1, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(fragment in line for line in list(self.stdout)) >= count:
                return
            if self.proc.poll() is not None:
                time.sleep(0.5)  # let the readers catch up before failing
                if sum(fragment in line for line in list(self.stdout)) >= count:
                    return
                raise AssertionError(f"launch exited {self.proc.returncode} before {count}x {fragment!r}:\n"
                                     + "".join(self.stdout[-30:]) + "".join(self.stderr[-30:]))
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout:g} s waiting for {count}x {fragment!r}:\n"
                             + "".join(self.stdout[-30:]) + "".join(self.stderr[-30:]))

    def finish(self, timeout: float = 120) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        finally:
            for reader in self.readers:
                reader.join(timeout=10)
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()
        return code

    @property
    def out(self) -> str:
        return "".join(self.stdout)

    @property
    def err(self) -> str:
        return "".join(self.stderr)


def start_launch(cluster: NamespaceCluster, *args: str, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> LaunchProcess:
    argv = [sys.executable, "-m", "fstrain", "launch", "--ssh-config", cluster.ssh_config, *args]
    return start_process(argv, {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, cwd or REPO)


def start_process(argv: Sequence[str], env: dict[str, str], cwd: Path) -> LaunchProcess:
    """``argv`` running, its output collected as it comes (stopped at the session's end if left)."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            preexec_fn=interruptible)  # the tests Ctrl-C it
    launch = LaunchProcess(proc)
    STARTED.append(launch)
    assert proc.stdout is not None and proc.stderr is not None
    for stream, sink in ((proc.stdout, launch.stdout), (proc.stderr, launch.stderr)):
        reader = threading.Thread(target=lambda s=stream, k=sink: k.extend(iter(s.readline, "")), daemon=True)
        reader.start()
        launch.readers.append(reader)
    return launch


def namespace_processes(namespaces: Sequence[str], is_daemon: Callable[[str], bool]) -> dict[str, list[str]]:
    """Processes in each namespace that ``is_daemon(pid)`` does not excuse, as 'PID cmdline' (a process
    gone or unreadable while looked at, OSError, is skipped)."""
    found: dict[str, list[str]] = {}
    for namespace in namespaces:
        pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True,
                              check=False).stdout.split()
        rest = []
        for pid in pids:
            try:
                daemon = is_daemon(pid)
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
            except OSError:
                continue
            if not daemon:
                rest.append(f"{pid} {cmdline}")
        if rest:
            found[namespace] = rest
    return found


def wait_until_none(processes: Callable[[], dict[str, list[str]]], within_s: float) -> None:
    """Poll ``processes`` until it finds none; fail with what is left after ``within_s``."""
    deadline = time.monotonic() + within_s
    left = processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = processes()
    assert not left, f"processes left after {within_s} s: {left}"


def job_processes(cluster: NamespaceCluster) -> dict[str, list[str]]:
    """Processes in each namespace other than sshd itself (its daemon and session processes)."""
    namespaces = [cluster.namespace(index) for index in range(1, cluster.num_hosts + 1)]
    return namespace_processes(namespaces, lambda pid: os.readlink(f"/proc/{pid}/exe") == "/usr/sbin/sshd")


def assert_no_job_processes(cluster: NamespaceCluster, within_s: float) -> None:
    wait_until_none(lambda: job_processes(cluster), within_s)


def stop_started_launches(grace_s: float = 30) -> list[str]:
    """Stop (SIGINT, then SIGKILL after ``grace_s``) every launch still running, close the pipes
    of all, and forget them; returns the command lines of those that were still running."""
    running = [launch for launch in STARTED if launch.proc.poll() is None]
    for launch in running:
        launch.proc.send_signal(signal.SIGINT)
    for launch in STARTED:
        try:
            launch.finish(timeout=grace_s)
        except subprocess.TimeoutExpired:
            launch.proc.wait()
    STARTED.clear()
    return [" ".join(launch.proc.args[3:]) for launch in running]  # type: ignore[index]


def kill_job_processes(cluster: NamespaceCluster) -> dict[str, list[str]]:
    """SIGKILL every job process in the cluster's namespaces; returns what was found."""
    found = job_processes(cluster)
    for processes in found.values():
        for entry in processes:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.split()[0]), signal.SIGKILL)
    return found


def send(launch: LaunchProcess, sig: signal.Signals) -> None:
    launch.proc.send_signal(sig)
