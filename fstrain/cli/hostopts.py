"""The host-selection options every multi-host command shares, and how they resolve.

Order: ``--hostfile`` or ``--hosts`` (not both); else ``SLURM_JOB_NODELIST``; else localhost,
said out loud. A hostfile that does not exist is an error, never a fallback to localhost.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import typer

from fstrain.core.hosts.hostfile import (
    Host,
    hosts_from_environment,
    parse_host_list,
    parse_hostfile,
    select_hosts,
    with_default_slots,
)
from fstrain.errors import InventoryError

HOSTFILE = typer.Option(None, "--hostfile", "-H", help="DeepSpeed hostfile ('host slots=N') or one host per line.")
HOSTS = typer.Option(None, "--hosts", help="Hosts as a Slurm list: 'node[01-04,07]', 'a,b', 'user@h:2222'.")
INCLUDE = typer.Option(None, "--include", "-i", help="Only these hosts/slots: 'host1:0,1@host2'.")
EXCLUDE = typer.Option(None, "--exclude", "-e", help="All but these hosts/slots: 'host1:0,1@host2'.")
GPUS_PER_NODE = typer.Option(None, "--gpus-per-node", help="Slots of hosts whose hostfile line gives none.")
SSH_CONFIG = typer.Option(None, "--ssh-config", help="OpenSSH client config to use instead of ~/.ssh/config.")
ACCEPT_NEW = typer.Option(
    False, "--accept-new-hosts", help="Trust and record unknown host keys (like StrictHostKeyChecking=accept-new)."
)
FANOUT = typer.Option(64, "--fanout", min=1, help="Hosts contacted at once.")


@dataclass(frozen=True)
class HostSelection:
    hosts: list[Host]
    source: str  # where the hosts came from, for messages


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
        slurm = hosts_from_environment(env)
        if slurm is not None:
            found, source = slurm, "SLURM_JOB_NODELIST"
        else:
            found, source = [Host("localhost", where="default")], "localhost (no --hostfile or --hosts given)"
    found = with_default_slots(found, gpus_per_node)
    return HostSelection(select_hosts(found, include, exclude), source)
