"""A command to many hosts checks this machine's open-files and thread limits before it
contacts anything (fstrain/core/launch/clientlimits.py, fstrain/io/clientlimits.py)."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from fstrain.core.launch.clientlimits import (
    BASE_OPEN_FILES,
    BASE_THREADS,
    UNLIMITED,
    ClientLimits,
    attached_launch_needs,
    connection_needs,
    shortfall,
    soft_limit_to_set,
)
from tests.helpers import REPO


def test_what_a_host_costs_the_client() -> None:
    # A socket and a thread per connection, and per command in flight (the fan-out) a channel's
    # two pipe ends and up to two threads.
    needs = connection_needs(600, fanout=64)
    assert (needs.open_files, needs.threads) == (BASE_OPEN_FILES + 600 + 128, BASE_THREADS + 600 + 128)
    assert connection_needs(10, fanout=64).open_files == BASE_OPEN_FILES + 10 + 20
    # An attached launch: a connection, the host's log and one log per rank (1 while unknown).
    needs = attached_launch_needs([8, 8, 0])
    assert (needs.open_files, needs.threads) == (BASE_OPEN_FILES + 10 + 10 + 3, BASE_THREADS + 18)
    assert needs.why == "a connection and up to 9 log files per host" and needs.logs_here


def test_the_soft_limit_is_raised_up_to_the_hard_one() -> None:
    needs = connection_needs(1000)
    assert soft_limit_to_set(needs, ClientLimits(1024, 1 << 20)) == 2 * needs.open_files
    assert soft_limit_to_set(needs, ClientLimits(1024, 2000)) == 2000  # what the hard limit allows
    assert soft_limit_to_set(needs, ClientLimits(4096, 4096)) is None  # enough already
    assert soft_limit_to_set(needs, ClientLimits(UNLIMITED, UNLIMITED)) is None
    assert shortfall(needs, ClientLimits(1024, 2000), 1000, "connecting to") is None


def test_what_the_hard_limits_cannot_hold_is_said_with_what_to_set() -> None:
    files = shortfall(attached_launch_needs([8] * 200), ClientLimits(1024, 1024), 200, "an attached launch on")
    assert files == ("an attached launch on 200 hosts holds about 2,064 files open at once (a connection and up "
                     "to 9 log files per host), and this machine allows 1,024 (`ulimit -Hn`)",
                     "raise this user's limit: `ulimit -n 5120` as root, or `nofile 5120` in "
                     "/etc/security/limits.conf and log in again; or reach fewer hosts from one command; or launch "
                     "with --detach, which keeps the logs on the nodes")
    threads = shortfall(connection_needs(4096), ClientLimits(UNLIMITED, UNLIMITED, 4000), 4096, "connecting to")
    assert threads == ("connecting to 4,096 hosts runs about 4,240 threads (a connection per host), and this user "
                       "may run 4,000 processes and threads (`ulimit -u`)",
                       "raise it: `ulimit -u 9216`, or `nproc 9216` in /etc/security/limits.conf")


def run_limited(soft: int, hard: int, *argv: str, home: Path) -> subprocess.CompletedProcess[str]:
    """``python -m fstrain ARGV`` with ``ulimit -n`` set to (soft, hard) for it alone."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return subprocess.run([sys.executable, "-m", "fstrain", *argv], capture_output=True, text=True, timeout=60,
                          cwd=home, preexec_fn=limit,
                          env={"PYTHONPATH": str(REPO), "HOME": str(home), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize(("argv", "expected"), [
    (("exec", "--hosts", "node[1-600]", "--", "true"),
     "error: limits: connecting to 600 hosts holds about 792 files open at once (a connection per host), and this "
     "machine allows 512 (`ulimit -Hn`) (hint: raise this user's limit: `ulimit -n 2048` as root"),
    (("launch", "--hosts", "node[1-200]", "--nproc-per-node", "8", "--", "python3", "x.py"),
     "error: limits: an attached launch on 200 hosts holds about 2,064 files open at once"),
])
def test_a_command_beyond_the_hard_limit_is_one_line_before_any_host_is_contacted(
        tmp_path: Path, argv: tuple[str, ...], expected: str) -> None:
    # node1..node600 resolve nowhere: a command that contacted them would say so per host.
    result = run_limited(256, 512, *argv, home=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(expected) and len(result.stderr.splitlines()) == 1, result.stderr
    assert list(tmp_path.iterdir()) == []  # no run folder, no record: nothing was started


def test_the_soft_limit_is_raised_for_the_command_itself(tmp_path: Path) -> None:
    code = ("import resource; from fstrain.core.launch.clientlimits import connection_needs; "
            "from fstrain.io.clientlimits import ensure; ensure(connection_needs(500), 500, 'connecting to'); "
            "print(*resource.getrlimit(resource.RLIMIT_NOFILE))")

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            preexec_fn=limit, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert (result.returncode, result.stdout.split()) == (0, ["1384", "4096"]), result.stderr


def test_a_users_tasks_are_walked_only_where_the_cheap_count_falls_short() -> None:
    """For a user other than root, ``ulimit -u`` less every task running is a floor of what is
    left: where it covers the need, /proc is not walked; where it does not, this user's own
    tasks are counted, and more is left than the floor said."""
    import json
    import os

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a child as a user that runs almost nothing (as itself where the tests are not root)
        try:
            os.close(read)
            from fstrain.io.clientlimits import read_limits

            resource.setrlimit(resource.RLIMIT_NPROC, (5000, 5000))
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            found = [read_limits(10).threads, read_limits(10**6).threads]
            os.write(write, json.dumps(found).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        floor, counted = json.loads(answer.read())
    os.waitpid(pid, 0)
    with open("/proc/loadavg") as handle:
        running = int(handle.read().split()[3].split("/")[1])
    assert floor <= 5000 - running + 50  # every task counted as this user's (give or take the ones since)
    assert counted > floor  # its own tasks are far fewer than every task
