"""Resolve a host of the inventory into where and how to connect, as OpenSSH would.

Reads the user's OpenSSH client config (``~/.ssh/config``, or the file given with
``--ssh-config``, which then replaces it as ``ssh -F`` does) through paramiko's parser, and
applies the keys fstrain honours: HostName, User, Port, IdentityFile, IdentitiesOnly,
ProxyJump, ConnectTimeout, UserKnownHostsFile, StrictHostKeyChecking. ``user@`` and ``:port``
written in the inventory win over the config, as on the ssh command line.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from pathlib import Path

from fstrain.core.hostfile import Host, parse_host_token
from fstrain.errors import InputError

DEFAULT_IDENTITY_FILES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts",)
DEFAULT_CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SshTarget:
    """Everything needed to open one SSH connection."""

    alias: str  # the name as written in the inventory
    hostname: str  # what to connect to (HostName)
    port: int
    user: str
    identity_files: tuple[str, ...]
    identities_only: bool
    known_hosts_files: tuple[str, ...]
    strict_host_key_checking: str  # "yes", "accept-new", "no"
    connect_timeout_s: float
    proxy_jump: tuple[str, ...] = ()  # hops, outermost first, as written ([user@]host[:port])


class SshConfig:
    """A loaded OpenSSH client config that resolves inventory hosts into :class:`SshTarget`."""

    def __init__(self, path: str | None = None) -> None:
        import paramiko  # the edge only: keeps the CLI start-up light

        self.path = path
        if path is not None:
            if not Path(path).is_file():
                raise InputError("SSH config file not found", "check the path given to --ssh-config", path)
            try:
                self._config = paramiko.SSHConfig.from_path(path)
            except Exception as exc:  # paramiko raises several types for bad files
                raise InputError(
                    f"cannot read SSH config: {exc}", "check its syntax with `ssh -G -F FILE HOST`", path
                ) from None
        else:
            default = Path("~/.ssh/config").expanduser()
            self._config = paramiko.SSHConfig.from_path(str(default)) if default.is_file() else paramiko.SSHConfig()

    def resolve(self, host: Host) -> SshTarget:
        """Where and how to reach ``host``."""
        options = self._config.lookup(host.name)
        port = host.port if host.port is not None else int(options.get("port", 22))
        user = host.user or options.get("user") or getpass.getuser()
        identity_files = tuple(options.get("identityfile", ())) or DEFAULT_IDENTITY_FILES
        known_hosts = tuple(str(options.get("userknownhostsfile", "")).split()) or DEFAULT_KNOWN_HOSTS
        jump = options.get("proxyjump", "")
        hops = () if not jump or jump.lower() == "none" else tuple(h.strip() for h in jump.split(",") if h.strip())
        timeout = options.get("connecttimeout")
        return SshTarget(
            alias=host.name,
            hostname=options.get("hostname", host.name),
            port=port,
            user=user,
            identity_files=tuple(os.path.expanduser(p) for p in identity_files),
            identities_only=str(options.get("identitiesonly", "no")).lower() == "yes",
            known_hosts_files=tuple(os.path.expanduser(p) for p in known_hosts),
            strict_host_key_checking=str(options.get("stricthostkeychecking", "ask")).lower(),
            connect_timeout_s=float(timeout) if timeout else DEFAULT_CONNECT_TIMEOUT_S,
            proxy_jump=hops,
        )

    def resolve_hop(self, hop: str) -> SshTarget:
        """Resolve one ProxyJump hop (``[user@]host[:port]``, itself looked up in the config)."""
        return self.resolve(parse_host_token(hop, "ProxyJump"))
