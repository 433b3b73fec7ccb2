"""What a command that reaches N hosts holds open on the machine it runs on, against that
machine's limits: checked before anything is contacted, so a launch to many hosts is refused in
one line that says what to set, instead of failing at host 1,021 with "Too many open files"
(or losing its local log files half-way).

Pure: the counts and the limits are values; fstrain/io/clientlimits.py reads the limits and
raises the soft one where the hard one allows.

What one host costs the client (fstrain/io/fanout.py, fstrain/io/launch.py), as measured with
`/proc/PID/fd` and `/proc/PID/task` on the namespace and loopback test clusters:

- an SSH connection: one socket and one thread (paramiko's transport), for the whole command;
  while a command runs on it (at most ``--fanout`` at once), two more files (its channel's
  pipe) and a thread or two (the fan-out's worker): ``exec`` to 64 hosts held 195 files and
  145 threads at fan-out 64, 99 and 81 at fan-out 16;
- an attached launch, per host: its log file (``RUN_DIR/logs/<host>.log``) and one per rank
  (``<host>.r<rank>.log``), open until the run ends, beside the connection, and 4 to 6
  threads: 4 hosts of 4 ranks held 28 files (7 for one host of one rank, 3 more per rank and
  per host);
- a detached launch keeps nothing open once its nodes started: its connections are the fan-out's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# An allowance for what the command holds besides its hosts: the interpreter's own files and
# threads, the console, the run's manifest and events files, a tracker's connection.
BASE_OPEN_FILES = 64
BASE_THREADS = 16
UNLIMITED = -1  # resource.RLIM_INFINITY as this module holds it


@dataclass(frozen=True)
class ClientNeeds:
    """Open files and threads a command will hold at once on this machine, and why."""

    open_files: int
    threads: int
    why: str  # "a connection and 3 log files per host"
    logs_here: bool = False  # an attached launch: its log files are open on this machine


@dataclass(frozen=True)
class ClientLimits:
    """This process's limits: ``ulimit -n`` (soft and hard) and the threads it may start (the
    user's process limit, ``ulimit -u``, where it applies: not for root; and the kernel's
    ``threads-max``). ``UNLIMITED`` where there is none."""

    open_files_soft: int
    open_files_hard: int
    threads: int = UNLIMITED


def connection_needs(hosts: int, fanout: int = 64) -> ClientNeeds:
    """`exec`, `doctor`, `bench` and the start of every launch: one connection per host, kept
    for the command, and ``fanout`` commands in flight at once."""
    busy = min(hosts, fanout)
    return ClientNeeds(BASE_OPEN_FILES + hosts + 2 * busy, BASE_THREADS + hosts + 2 * busy, "a connection per host")


def attached_launch_needs(ranks_per_host: Sequence[int]) -> ClientNeeds:
    """An attached launch: per host a connection, its log file and one per rank
    (``ranks_per_host``: each host's processes; 1 where not yet known), and the threads that
    read and answer its stream (up to 6 per host)."""
    hosts = len(ranks_per_host)
    files = sum(1 + 1 + max(1, ranks) for ranks in ranks_per_host)
    per_host = max((max(1, ranks) for ranks in ranks_per_host), default=1) + 1
    return ClientNeeds(BASE_OPEN_FILES + files, BASE_THREADS + 6 * hosts,
                       f"a connection and up to {per_host} log files per host", logs_here=True)


def soft_limit_to_set(needs: ClientNeeds, limits: ClientLimits) -> int | None:
    """The open-files soft limit to raise this process to (twice what it needs, at most the
    hard limit), or None where the soft limit is enough already."""
    if limits.open_files_soft == UNLIMITED or needs.open_files <= limits.open_files_soft:
        return None
    wanted = 2 * needs.open_files
    return wanted if limits.open_files_hard == UNLIMITED else min(wanted, limits.open_files_hard)


def shortfall(needs: ClientNeeds, limits: ClientLimits, hosts: int, action: str) -> tuple[str, str] | None:
    """(what, how to fix it) where the hard limits cannot hold what ``action`` ("connecting to",
    "an attached launch on") needs for ``hosts`` hosts; None where they can (the soft
    open-files limit is raised first)."""
    if limits.open_files_hard != UNLIMITED and needs.open_files > limits.open_files_hard:
        wanted = _round_up(2 * needs.open_files)
        return (f"{action} {hosts:,} hosts holds about {needs.open_files:,} files open at once "
                f"({needs.why}), and this machine allows {limits.open_files_hard:,} (`ulimit -Hn`)",
                f"raise this user's limit: `ulimit -n {wanted}` as root, or `nofile {wanted}` in "
                f"/etc/security/limits.conf and log in again; or reach fewer hosts from one command"
                + ("; or launch with --detach, which keeps the logs on the nodes" if needs.logs_here else ""))
    if limits.threads != UNLIMITED and needs.threads > limits.threads:
        wanted = _round_up(2 * needs.threads)
        return (f"{action} {hosts:,} hosts runs about {needs.threads:,} threads ({needs.why}), and this "
                f"user may run {limits.threads:,} processes and threads (`ulimit -u`)",
                f"raise it: `ulimit -u {wanted}`, or `nproc {wanted}` in /etc/security/limits.conf")
    return None


def _round_up(count: int) -> int:
    """A limit worth writing down: the next multiple of 1,024."""
    return -(-count // 1024) * 1024
