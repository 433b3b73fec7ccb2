"""The host-selection options every multi-host command shares (how they resolve:
fstrain/api/hosts.py)."""

from __future__ import annotations

import typer

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


