"""Which hosts a command runs on, and how they are reached: the host options every
multi-host command shares, and the Slurm allocation whose nodes run a job through srun.

Order: ``--hostfile`` or ``--hosts`` (not both); else the Slurm job's nodes (inside a job,
``SLURM_JOB_ID`` set: as Slurm expands them, see :func:`allocation_nodes`; else
``SLURM_JOB_NODELIST`` as written); else localhost, said out loud. A hostfile that does not
exist is an error, never a fallback to localhost. A hostfile's hosts marked ``spare=true`` are
held back (``HostSelection.spares``): every command runs on the others.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fstrain.core.hosts.hostfile import (
    Host,
    hosts_from_environment,
    parse_host_list,
    parse_hostfile,
    select_hosts,
    split_spares,
    with_default_slots,
)
from fstrain.errors import InventoryError

if TYPE_CHECKING:
    from fstrain.api.requests import HostRequest
    from fstrain.core.slurm.job import Allocation
    from fstrain.io.fanout import Connector


@dataclass(frozen=True)
class HostSelection:
    hosts: list[Host]  # the hosts a run starts on
    source: str  # where the hosts came from, for messages
    spares: list[Host] = field(default_factory=list)  # hostfile hosts marked spare=true, held back


def resolve_hosts(
    hostfile: str | None,
    hosts: str | None,
    include: str | None,
    exclude: str | None,
    gpus_per_node: int | None,
    environ: Mapping[str, str] | None = None,
) -> HostSelection:
    """Turn the host options into the selected hosts, or raise one clear InventoryError."""
    env = os.environ if environ is None else environ
    for flag, value in (("--hostfile", hostfile), ("--hosts", hosts), ("--include", include), ("--exclude", exclude)):
        if value is not None and not value.strip():  # explicitly empty: never a silent fallback
            raise InventoryError(f"{flag} is empty", f"give {flag} a value, or leave the option out", flag)
    if hostfile and hosts:
        raise InventoryError("--hostfile and --hosts cannot be combined", "use one of them", "--hostfile/--hosts")
    if hostfile:
        from fstrain.io.userfiles import read_text_bounded

        path = Path(hostfile)
        if not path.exists():
            raise InventoryError("hostfile not found", "check the path given to --hostfile", hostfile)
        if not path.is_file():
            raise InventoryError("hostfile is not a regular file", "give the path of a hostfile", hostfile)
        text = read_text_bounded(path, "hostfile", hint="check the path given to --hostfile")
        found, source = parse_hostfile(text, hostfile), hostfile
    elif hosts:
        found, source = parse_host_list(hosts), "--hosts"
    else:
        slurm = slurm_job_hosts(env)
        if slurm is not None:
            found, source = slurm, "SLURM_JOB_NODELIST"
        else:
            found, source = [Host("localhost", where="default")], "localhost (no --hostfile or --hosts given)"
    found = with_default_slots(found, gpus_per_node)
    world, spares = split_spares(select_hosts(found, include, exclude), source)
    return HostSelection(world, source, spares)


def slurm_job_hosts(environ: Mapping[str, str]) -> list[Host] | None:
    """The hosts ``SLURM_JOB_NODELIST`` names: inside a job, the job's nodes as Slurm has them
    (a list scontrol cannot read is an error here, before any host is contacted)."""
    from fstrain.core.slurm.job import allocation_from_env

    allocation = allocation_from_env(environ)
    if allocation is None:
        return hosts_from_environment(environ)
    from fstrain.io.localout import warn
    from fstrain.io.slurm import allocation_nodes

    return parse_host_list(",".join(allocation_nodes(allocation, warn, environ)), "SLURM_JOB_NODELIST")


def choose_allocation(launcher: str, hostfile: str | None, hosts: str | None,
                      environ: Mapping[str, str] | None = None) -> Allocation | None:
    """The allocation whose nodes run the job through srun, or ``None`` for SSH. Inside an srun
    step of several tasks nothing is chosen: one launch per task is refused."""
    from fstrain.core.slurm.job import check_one_task

    env = os.environ if environ is None else environ
    check_one_task(env)
    return allocation_for(launcher, hostfile, hosts, env)


def allocation_for(launcher: str, hostfile: str | None, hosts: str | None,
                   environ: Mapping[str, str] | None = None) -> Allocation | None:
    """The one rule for srun or SSH: ``srun`` is the allocation's (refused outside one); ``auto``
    is the allocation's when inside one and no --hosts/--hostfile is given; ``ssh`` never."""
    from fstrain.core.slurm.job import LAUNCHERS, allocation_from_env
    from fstrain.errors import InputError

    env = os.environ if environ is None else environ
    if launcher not in LAUNCHERS:
        raise InputError(f"unknown launcher {launcher!r}", f"use one of {', '.join(LAUNCHERS)}", "--launcher")
    if launcher == "ssh":
        return None
    allocation = allocation_from_env(env)
    if launcher == "srun" and allocation is None:
        raise InputError("--launcher srun runs inside a Slurm allocation, and SLURM_JOB_ID/SLURM_JOB_NODELIST "
                         "are not set", "run it under salloc or sbatch, or submit with --slurm", "--launcher")
    if launcher == "auto" and (hostfile or hosts):
        return None
    return allocation


def connector(allocation: Allocation | None, request: HostRequest, step_args: Sequence[str] = (),
              config: Any = None) -> Connector:
    """srun steps on the allocation's nodes (``step_args`` added to each), else SSH with the
    request's config (``localhost`` runs here, without SSH)."""
    if allocation is not None:
        from fstrain.io.slurm import srun_connector

        return srun_connector(step_args)
    from fstrain.io.connect import make_connector

    return make_connector(request.ssh_config, accept_new_hosts=request.accept_new_hosts, config=config)


def allocation_hosts(allocation: Allocation, hostfile: str | None, hosts: str | None, include: str | None,
                     exclude: str | None, gpus_per_node: int | None) -> HostSelection:
    """The nodes to run on: the allocation's (in allocation order, cross-checked with scontrol),
    or the --hosts/--hostfile given with --launcher srun (a hostfile's ``spare=true`` nodes held
    back for recovery); slots from the GPUs Slurm assigned."""
    from fstrain.core.slurm.job import check_hosts_in_job
    from fstrain.io.localout import warn
    from fstrain.io.slurm import allocation_nodes

    slots = gpus_per_node or allocation.gpus_per_node
    if hostfile or hosts:
        chosen = resolve_hosts(hostfile, hosts, include, exclude, slots)
        job_nodes = allocation_nodes(allocation, lambda _note: None)  # which nodes srun can reach
        check_hosts_in_job([h.name for h in [*chosen.hosts, *chosen.spares]], allocation.job_id, job_nodes,
                           "--hostfile" if hostfile else "--hosts")
        return HostSelection(chosen.hosts, "Slurm job", chosen.spares)
    nodes = allocation_nodes(allocation, warn)
    return HostSelection(resolve_hosts(None, ",".join(nodes), include, exclude, slots).hosts, "Slurm job")


def select(request: HostRequest) -> HostSelection:
    """:func:`resolve_hosts` of a request's host options."""
    return resolve_hosts(request.hostfile, request.hosts, request.include, request.exclude, request.gpus_per_node)


@dataclass(frozen=True)
class Reach:
    """How the selected hosts are reached: the connector, and its path when it is not SSH."""

    connect: Connector
    through: str | None = None  # "srun in Slurm job 14"; None: SSH, and localhost here


def reach(selection: HostSelection, request: HostRequest, report: Callable[[str], None]) -> Reach:
    """srun for `doctor`, `exec`, `topo` and `bench` inside an allocation when no hosts are
    given (the rule `launch` follows: :func:`allocation_for`), said to ``report``; otherwise SSH."""
    allocation = allocation_for("auto", request.hostfile, request.hosts)
    if allocation is not None:
        report(f"Slurm job {allocation.job_id}: reaching its nodes through srun")
        return Reach(connector(allocation, request), f"srun in Slurm job {allocation.job_id}")
    return Reach(connector(None, request))


def quiet(line: str) -> None:
    """A ``report`` that says nothing (the API's default: a caller that wants the lines passes one)."""
