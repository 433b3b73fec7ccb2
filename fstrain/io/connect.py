"""Pick the transport for a host: local subprocess for ``localhost``, SSH for the rest."""

from __future__ import annotations

from fstrain.core.hostfile import Host
from fstrain.io.fanout import Connector
from fstrain.io.transport.base import Transport
from fstrain.io.transport.local import LocalTransport

LOCAL_NAMES = frozenset({"localhost"})


def is_local(host: Host) -> bool:
    """``localhost`` with no user or port runs here, without SSH."""
    return host.name in LOCAL_NAMES and host.user is None and host.port is None


def make_connector(ssh_config_path: str | None = None, *, accept_new_hosts: bool = False) -> Connector:
    """A connector for :class:`fstrain.io.fanout.HostPool` that honours the user's SSH config.

    The SSH config (and paramiko) is loaded on the first remote host only, so a purely local
    command never pays for it; a bad ``--ssh-config`` path is still reported up front.
    """
    from fstrain.io.sshconfig import SshConfig

    config: SshConfig | None = SshConfig(ssh_config_path) if ssh_config_path else None

    def connect(host: Host) -> Transport:
        nonlocal config
        if is_local(host):
            return LocalTransport(host.name)
        from fstrain.io.transport.ssh import SshTransport

        if config is None:
            config = SshConfig(None)
        return SshTransport(config.resolve(host), config, accept_new=accept_new_hosts)

    return connect
