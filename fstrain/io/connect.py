"""Pick the transport for a host: local subprocess for ``localhost``, SSH for the rest."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from fstrain.core.hosts.hostfile import Host, check_unique, machine_key
from fstrain.io.fanout import Connector
from fstrain.io.transport.base import Transport
from fstrain.io.transport.local import LocalTransport

if TYPE_CHECKING:
    from fstrain.io.sshconfig import SshConfig

LOCAL_NAMES = frozenset({"localhost"})


def is_local(host: Host) -> bool:
    """``localhost`` with no user or port runs here, without SSH."""
    return host.name in LOCAL_NAMES and host.user is None and host.port is None


def make_connector(ssh_config_path: str | None = None, *, accept_new_hosts: bool = False,
                   config: SshConfig | None = None) -> Connector:
    """A connector for :class:`fstrain.io.fanout.HostPool` that honours the user's SSH config.

    The SSH config (and paramiko) is loaded on the first remote host only, so a purely local
    command never pays for it; a bad ``--ssh-config`` path is still reported up front. A
    ``config`` already loaded (by :func:`check_distinct_endpoints`) is reused with the hosts it
    has resolved, so no host is looked up twice (``ssh -G`` is a process per host).
    """
    from fstrain.io.sshconfig import SshConfig

    if config is None and ssh_config_path:
        config = SshConfig(ssh_config_path)

    def connect(host: Host) -> Transport:
        nonlocal config
        if is_local(host):
            return LocalTransport(host.name)
        from fstrain.io.transport.ssh import SshTransport

        if config is None:
            config = SshConfig(None)
        return SshTransport(config.resolve(host), config, accept_new=accept_new_hosts)

    return connect


def check_distinct_endpoints(hosts: Sequence[Host], ssh_config_path: str | None = None) -> SshConfig | None:
    """Refuse two inventory entries that reach the same machine once the SSH config is applied
    (an alias and its HostName, two aliases of one HostName and Port): the job would run twice
    on it. The error names both entries' lines. Returns the config the hosts were resolved
    with, for :func:`make_connector` (``None`` when fewer than two hosts are remote)."""
    from fstrain.io.sshconfig import SshConfig

    remote = [host for host in hosts if not is_local(host)]
    if len(remote) < 2:
        return None
    config = SshConfig(ssh_config_path)
    with ThreadPoolExecutor(max_workers=16) as pool:
        targets = list(pool.map(config.resolve, remote))
    check_unique(remote, [machine_key(target.hostname, target.port) for target in targets], " after the SSH config")
    return config
