"""Resolve a host of the inventory into where and how to connect, as OpenSSH would.

The config is the user's OpenSSH client config (``~/.ssh/config``, or the file given with
``--ssh-config``, which then replaces it as ``ssh -F`` does). Two resolvers:

- ``ssh -G HOST`` when the OpenSSH client is installed: OpenSSH itself evaluates the file, so
  ``Include``, ``Match``, ``CanonicalizeHostname``, tokens and defaults are exactly ssh's;
- paramiko's ``SSHConfig`` otherwise, with one warning for what it cannot evaluate
  (``Include``: hosts defined in included files would resolve to the wrong address and user).

fstrain applies HostName, User, Port, IdentityFile, IdentitiesOnly, CertificateFile,
ProxyJump, ProxyCommand, ConnectTimeout, ServerAliveInterval, ServerAliveCountMax,
UserKnownHostsFile and StrictHostKeyChecking; a few keys that change where or how to connect
and that it cannot honour (HostKeyAlias, PKCS11Provider, IdentityAgent, BindAddress,
BindInterface) get one warning each. ``user@`` and ``:port`` written in the inventory win over
the config, as on the ssh command line.
"""

from __future__ import annotations

import getpass
import os
import pwd
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fstrain.core.hosts.hostfile import Host, parse_host_token
from fstrain.errors import InputError

DEFAULT_IDENTITY_FILES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts",)
DEFAULT_CONNECT_TIMEOUT_S = 10.0
# OpenSSH's default is no probe at all (a frozen host is waited for until TCP gives up, hours);
# fstrain declares a silent host lost after 5 s x 3 unanswered probes.
DEFAULT_SERVER_ALIVE_INTERVAL_S = 5.0
DEFAULT_SERVER_ALIVE_COUNT_MAX = 3
SSH_G_TIMEOUT_S = 10.0
UNHONOURED_KEYS = ("hostkeyalias", "pkcs11provider", "identityagent", "bindaddress", "bindinterface")

Options = Mapping[str, Sequence[str]]  # lower-case key -> values, in order


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
    strict_host_key_checking: str  # "yes", "accept-new", "no", "ask"
    connect_timeout_s: float
    proxy_jump: tuple[str, ...] = ()  # hops, outermost first, as written ([user@]host[:port])
    proxy_command: str = ""  # with %h %p %r %n %% already substituted
    certificate_files: tuple[str, ...] = ()
    server_alive_interval_s: float = DEFAULT_SERVER_ALIVE_INTERVAL_S  # silence before a keep-alive probe
    server_alive_count_max: int = DEFAULT_SERVER_ALIVE_COUNT_MAX  # unanswered probes before "lost"


class SshConfig:
    """A loaded OpenSSH client config that resolves inventory hosts into :class:`SshTarget`."""

    def __init__(self, path: str | None = None, *, use_openssh: bool | None = None) -> None:
        self.path = path
        if path is not None and not Path(path).is_file():
            raise InputError("SSH config file not found", "check the path given to --ssh-config", path)
        # Without --ssh-config: ~/.ssh/config of $HOME (ssh alone would read the passwd entry's
        # home, which tests and sudo users do not expect), and like `ssh -F` no system-wide file.
        default = Path("~/.ssh/config").expanduser()
        self._file = path if path is not None else (str(default) if default.is_file() else None)
        self._ssh = shutil.which("ssh") if use_openssh is not False else None
        if use_openssh and self._ssh is None:
            raise InputError("the OpenSSH client (ssh) is not installed", "install openssh-client", "ssh -G")
        self._cache: dict[str, Options] = {}
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._paramiko_config = None if self._ssh else self._load_paramiko()

    @property
    def resolver(self) -> str:
        return "ssh -G" if self._ssh else "paramiko"

    def _load_paramiko(self) -> object:
        import paramiko  # the edge only: keeps the CLI start-up light

        if self._file is None:
            return paramiko.SSHConfig()
        try:
            config = paramiko.SSHConfig.from_path(self._file)
        except Exception as exc:  # paramiko raises several types for bad files
            raise InputError(
                f"cannot read SSH config: {exc}", "check its syntax with `ssh -G -F FILE HOST`", self._file
            ) from None
        if _uses_include(self._file):
            self._warn("include", f"warning: {self._file}: Include is not honoured without the OpenSSH client: "
                                  "hosts defined in included files resolve as if undefined "
                                  "(hint: install openssh-client, so that fstrain resolves hosts with `ssh -G`)")
        return config

    def options(self, name: str) -> Options:
        """The config's options for host ``name`` (lower-case keys, every value as a list)."""
        with self._lock:
            cached = self._cache.get(name)
        if cached is not None:
            return cached
        found = self._ssh_g(name) if self._ssh else self._paramiko_options(name)
        with self._lock:
            self._cache[name] = found
        return found

    def _ssh_g(self, name: str) -> Options:
        argv = [str(self._ssh), "-G", "-F", self._file or os.devnull, "--", name]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=SSH_G_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise InputError(f"`ssh -G {name}` failed: {exc}", "check the SSH config", self._file or "ssh -G") \
                from None
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            raise InputError(f"ssh cannot read the config for {name!r}: {lines[-1] if lines else done.returncode}",
                             "check it with `ssh -G -F FILE HOST`", self._file or "ssh -G")
        options: dict[str, list[str]] = {}
        home = pwd.getpwuid(os.getuid()).pw_dir.rstrip("/") + "/"
        for line in done.stdout.splitlines():
            key, _, value = line.partition(" ")
            if key in ("identityfile", "certificatefile", "userknownhostsfile"):
                # ssh expands ~ from the passwd entry; fstrain's ~ is $HOME (the same, but in tests).
                value = " ".join("~/" + part[len(home):] if part.startswith(home) else part for part in value.split())
            options.setdefault(key, []).append(value)
        return options

    def _paramiko_options(self, name: str) -> Options:
        looked_up = self._paramiko_config.lookup(name)  # type: ignore[attr-defined]
        options: dict[str, list[str]] = {}
        for key, value in looked_up.items():
            options[key] = [str(v) for v in value] if isinstance(value, list) else [str(value)]
        return options

    def resolve(self, host: Host) -> SshTarget:
        """Where and how to reach ``host``."""
        options = self.options(host.name)
        self._warn_unhonoured(host.name, options)

        def first(key: str, default: str = "") -> str:
            values = options.get(key)
            return values[0] if values else default

        port = host.port if host.port is not None else _int(first("port", "22"), "Port", 22)
        user = host.user or first("user") or getpass.getuser()
        hostname = first("hostname", host.name)
        identity_files = tuple(options.get("identityfile", ())) or DEFAULT_IDENTITY_FILES
        known_hosts = tuple(" ".join(options.get("userknownhostsfile", ())).split()) or DEFAULT_KNOWN_HOSTS
        jump = first("proxyjump")
        hops = () if not jump or jump.lower() == "none" else tuple(h.strip() for h in jump.split(",") if h.strip())
        proxy = first("proxycommand")
        proxy = "" if proxy.lower() == "none" else _expand_tokens(proxy, hostname, port, user, host.name)
        timeout = first("connecttimeout")
        interval = _float(first("serveraliveinterval", "0"), "ServerAliveInterval", 0.0)
        strict = first("stricthostkeychecking", "ask").lower()
        return SshTarget(
            alias=host.name,
            hostname=hostname,
            port=port,
            user=user,
            identity_files=tuple(os.path.expanduser(p) for p in identity_files),
            identities_only=first("identitiesonly", "no").lower() in ("yes", "true"),
            known_hosts_files=tuple(os.path.expanduser(p) for p in known_hosts),
            strict_host_key_checking={"true": "yes", "false": "no"}.get(strict, strict),
            connect_timeout_s=_float(timeout, "ConnectTimeout", DEFAULT_CONNECT_TIMEOUT_S)
            if timeout and timeout != "none" else DEFAULT_CONNECT_TIMEOUT_S,
            proxy_jump=hops,
            proxy_command=proxy,
            certificate_files=tuple(os.path.expanduser(p) for p in options.get("certificatefile", ())),
            server_alive_interval_s=interval if interval > 0 else DEFAULT_SERVER_ALIVE_INTERVAL_S,
            server_alive_count_max=max(1, _int(first("serveralivecountmax", "3"), "ServerAliveCountMax", 3)),
        )

    def resolve_hop(self, hop: str) -> SshTarget:
        """Resolve one ProxyJump hop (``[user@]host[:port]``, itself looked up in the config)."""
        return self.resolve(parse_host_token(hop, "ProxyJump"))

    def _warn_unhonoured(self, name: str, options: Options) -> None:
        for key in UNHONOURED_KEYS:
            values = [v for v in options.get(key, ()) if v.lower() not in ("none", "ssh_auth_sock")]
            if values:
                self._warn(key, f"warning: ssh config: {key} ({values[0]}) for {name} is not honoured by fstrain "
                                "(hint: it connects as if the key were not set; remove it for these hosts "
                                "or connect through ProxyJump)")

    def _warn(self, key: str, text: str) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def _uses_include(path: str) -> bool:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return any(re.match(r"\s*include\b", line, re.IGNORECASE) for line in text.splitlines())


def _expand_tokens(command: str, hostname: str, port: int, user: str, alias: str) -> str:
    """OpenSSH's ProxyCommand tokens: %h %p %r %n and %%."""
    values = {"h": hostname, "p": str(port), "r": user, "n": alias, "%": "%"}
    return re.sub(r"%(.)", lambda m: values.get(m.group(1), m.group(0)), command)


def _float(text: str, key: str, default: float) -> float:
    try:
        return float(text)
    except ValueError:
        return default


def _int(text: str, key: str, default: int) -> int:
    return int(text) if text.isascii() and text.isdigit() else default
