"""This machine's limits for a command that reaches many hosts (fstrain/core/launch/clientlimits.py):
read them, raise the open-files soft limit up to the hard one where the command needs it, and
refuse in one line, before anything is contacted, what the hard limits cannot hold."""

from __future__ import annotations

import os
import resource

from fstrain.core.launch.clientlimits import UNLIMITED, ClientLimits, ClientNeeds, shortfall, soft_limit_to_set
from fstrain.errors import InputError


def _limit(value: int) -> int:
    return UNLIMITED if value == resource.RLIM_INFINITY else int(value)


def read_limits(threads_needed: int = 0) -> ClientLimits:
    """``ulimit -n`` (soft, hard) and the threads this process may still start: the kernel's
    ``threads-max`` less the tasks running now, and for a user other than root (whom the kernel
    does not hold to it) ``ulimit -u`` less this user's tasks. This user's tasks are counted
    (a walk of /proc) only where counting every task as theirs leaves fewer than
    ``threads_needed``: a command started again and again (`status --watch`) walks nothing."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    most, running = _kernel_tasks()
    threads = UNLIMITED if most == UNLIMITED else most - running
    nproc_soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if os.geteuid() != 0 and nproc_soft != resource.RLIM_INFINITY:
        left = int(nproc_soft) - running  # at least this many: not every task is this user's
        if running == UNLIMITED or left < threads_needed:
            left = int(nproc_soft) - _user_tasks(os.getuid())
        threads = left if threads == UNLIMITED else min(threads, left)
    return ClientLimits(_limit(soft), _limit(hard), threads)


def _kernel_tasks() -> tuple[int, int]:
    """(``threads-max``, the tasks running now), UNLIMITED for each that cannot be read."""
    try:
        with open("/proc/sys/kernel/threads-max") as handle:
            most = int(handle.read())
        with open("/proc/loadavg") as handle:  # "0.20 0.18 0.12 1/80 11206": 80 tasks now
            running = int(handle.read().split()[3].split("/")[1])
    except (OSError, ValueError, IndexError):
        return UNLIMITED, UNLIMITED
    return most, running


def _user_tasks(uid: int) -> int:
    """This user's processes and threads now (what ``ulimit -u`` counts)."""
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid == uid:
                count += len(os.listdir(f"/proc/{name}/task"))
        except OSError:
            continue
    return count


def ensure(needs: ClientNeeds, hosts: int, action: str, limits: ClientLimits | None = None) -> None:
    """Make room for ``needs`` (the open-files soft limit raised where the hard one allows), or
    raise InputError saying what to set."""
    limits = read_limits(needs.threads) if limits is None else limits
    missing = shortfall(needs, limits, hosts, action)
    if missing is not None:
        what, fix = missing
        raise InputError(what, fix, "limits")
    soft = soft_limit_to_set(needs, limits)
    if soft is not None:
        hard = resource.RLIM_INFINITY if limits.open_files_hard == UNLIMITED else limits.open_files_hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        except (OSError, ValueError) as exc:
            raise InputError(f"{action} {hosts:,} hosts holds about {needs.open_files:,} files open at once "
                             f"({needs.why}), and the open-files limit could not be raised from "
                             f"{limits.open_files_soft:,} ({exc})", "raise it before fstrain: `ulimit -n "
                             f"{soft}`", "limits") from None
