"""Pick the transport for a host: local subprocess for ``localhost``, SSH for the rest."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from fstrain.core.hosts.hostfile import Host
from fstrain.errors import InventoryError
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


def check_distinct_endpoints(hosts: Sequence[Host], ssh_config_path: str | None = None) -> None:
    """Refuse two inventory entries that reach the same address and port once the SSH config is
    applied (an alias and its HostName, say): the job would run twice on that machine."""
    from fstrain.io.sshconfig import SshConfig

    remote = [host for host in hosts if not is_local(host)]
    if len(remote) < 2:
        return
    config = SshConfig(ssh_config_path)
    with ThreadPoolExecutor(max_workers=16) as pool:
        targets = list(pool.map(config.resolve, remote))
    seen: dict[tuple[str, int], Host] = {}
    for host, target in zip(remote, targets, strict=True):
        key = (target.hostname.lower(), target.port)
        if key in seen:
            raise InventoryError(
                f"{host.label()!r} and {seen[key].label()!r} are the same host "
                f"({target.hostname}:{target.port} after the SSH config)",
                "list each host once and raise its slots instead",
                host.where or host.label(),
            )
        seen[key] = host
