"""SSH transport over paramiko: one verified connection per host, one channel per command.

Host keys are checked against known_hosts before any credential is sent. An unknown host is
refused unless ``accept_new`` (``--accept-new-hosts``, or ``StrictHostKeyChecking
accept-new|no`` in the config), in which case its key is appended to the first known_hosts file;
a changed key is always refused. ProxyJump hops are opened as ``direct-tcpip`` channels through
the previous hop, each hop verified the same way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fstrain.errors import HostKeyError, TransportError
from fstrain.io.sshconfig import SshConfig, SshTarget
from fstrain.io.transport.base import CommandResult, merged_lines, quote_argv

if TYPE_CHECKING:
    import paramiko

KEEPALIVE_INTERVAL_S = 15

# paramiko logs failed handshakes with a traceback from its own thread; fstrain reports every
# failure as one line per host instead (FSTRAIN_DEBUG=1 lets paramiko speak).
if not os.environ.get("FSTRAIN_DEBUG"):
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    logging.getLogger("paramiko").propagate = False
_known_hosts_lock = threading.Lock()


def known_hosts_name(hostname: str, port: int) -> str:
    """The name OpenSSH files a host key under: ``host``, or ``[host]:port`` off port 22."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


def remote_command(argv: Sequence[str]) -> str:
    """The one string sent to the remote login shell for ``argv``.

    ``sh -c '"$@"; exit $?'`` runs the argv literally (quoted once, here) and turns a death by
    signal into an ordinary exit status of 128+signal: sshd would otherwise report it as an
    ``exit-signal`` request, which paramiko drops.
    """
    return quote_argv(["sh", "-c", '"$@"; exit $?', "sh", *argv])


class SshTransport:
    """A connection to one host. Not thread-safe for ``run`` from many threads; fan-out uses one per host."""

    def __init__(self, target: SshTarget, config: SshConfig, *, accept_new: bool = False) -> None:
        self.host = target.alias
        self.target = target
        self._config = config
        self._accept_new = accept_new
        self._transports: list[paramiko.Transport] = []  # jump hops first, the target last

    # -- connecting -------------------------------------------------------------------------

    def connect(self) -> None:
        """Open (and verify, and authenticate) the connection, through every ProxyJump hop."""
        if self._transports:
            return
        try:
            sock: Any = None
            for hop in [self._config.resolve_hop(h) for h in self.target.proxy_jump]:
                sock = self._open(hop, sock)
            self._open(self.target, sock)
        except BaseException:
            self.close()
            raise

    def _open(self, target: SshTarget, via: paramiko.Transport | None) -> paramiko.Transport:
        import paramiko

        where = f"{self.host}" if target.alias == self.host else f"{self.host} (via {target.alias})"
        sock = self._socket(target, via, where)
        transport = paramiko.Transport(sock)
        self._transports.append(transport)
        transport.banner_timeout = target.connect_timeout_s
        transport.handshake_timeout = target.connect_timeout_s
        known = self._load_known_hosts(target)
        names = self._host_key_names(target)
        preferred = [k for name in names if name in known for k in known[name]]
        if preferred:  # ask for the key type we can verify, as OpenSSH does
            options = transport.get_security_options()
            options.key_types = tuple(dict.fromkeys([*preferred, *options.key_types]))
        try:
            transport.start_client(timeout=target.connect_timeout_s)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(f"SSH handshake failed: {exc or type(exc).__name__}",
                                 "is an SSH server listening there?", where) from None
        self._verify_host_key(target, transport, known, names, where)
        self._authenticate(target, transport, where)
        transport.set_keepalive(KEEPALIVE_INTERVAL_S)
        return transport

    @staticmethod
    def _socket(target: SshTarget, via: paramiko.Transport | None, where: str) -> Any:
        if via is not None:
            try:
                return via.open_channel(
                    "direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0), timeout=target.connect_timeout_s
                )
            except Exception as exc:
                raise TransportError(
                    f"jump host could not reach {target.hostname}:{target.port}: {exc}",
                    "check ProxyJump and that the jump host may forward (AllowTcpForwarding)",
                    where,
                ) from None
        try:
            return socket.create_connection((target.hostname, target.port), timeout=target.connect_timeout_s)
        except TimeoutError:
            raise TransportError(
                f"connection to {target.hostname}:{target.port} timed out after {target.connect_timeout_s:g} s",
                "is the host up and reachable? (ConnectTimeout in the SSH config sets the limit)",
                where,
            ) from None
        except socket.gaierror as exc:
            raise TransportError(
                f"cannot resolve {target.hostname!r}: {exc.strerror}",
                "check the name, or set HostName in the SSH config",
                where,
            ) from None
        except OSError as exc:
            raise TransportError(
                f"cannot connect to {target.hostname}:{target.port}: {exc.strerror or exc}",
                "is the host up and sshd running?",
                where,
            ) from None

    @staticmethod
    def _host_key_names(target: SshTarget) -> list[str]:
        names = [known_hosts_name(target.hostname, target.port)]
        alias = known_hosts_name(target.alias, target.port)
        if alias not in names:
            names.append(alias)
        return names

    @staticmethod
    def _load_known_hosts(target: SshTarget) -> paramiko.HostKeys:
        import paramiko

        keys = paramiko.HostKeys()
        for path in target.known_hosts_files:
            if os.path.isfile(path):
                with contextlib.suppress(OSError):  # an unreadable file is like a missing one
                    keys.load(path)
        return keys

    def _verify_host_key(
        self, target: SshTarget, transport: paramiko.Transport, known: paramiko.HostKeys, names: list[str], where: str
    ) -> None:
        key = transport.get_remote_server_key()
        key_type = key.get_name()
        fingerprint = key.fingerprint
        for name in names:
            entry = known.lookup(name)
            if entry is None:
                continue
            if key_type in entry:
                if entry[key_type] == key:
                    return
                raise HostKeyError(
                    f"HOST KEY CHANGED for {name}: server offers {key_type} {fingerprint}, known_hosts has another key",
                    f"if the host was really reinstalled, remove the old key with `ssh-keygen -R {name}`",
                    where,
                )
        accept = self._accept_new or target.strict_host_key_checking in ("accept-new", "no", "off")
        if not accept:
            raise HostKeyError(
                f"unknown host key for {names[0]} ({key_type} {fingerprint})",
                "verify it and add it to known_hosts, or pass --accept-new-hosts to trust it on first use",
                where,
            )
        self._remember_host_key(target, names[0], key)

    @staticmethod
    def _remember_host_key(target: SshTarget, name: str, key: paramiko.PKey) -> None:
        path = Path(target.known_hosts_files[0])
        with _known_hosts_lock:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with path.open("a") as handle:
                handle.write(f"{name} {key.get_name()} {key.get_base64()}\n")

    def _authenticate(self, target: SshTarget, transport: paramiko.Transport, where: str) -> None:
        import paramiko

        tried: list[str] = []
        for label, key in self._candidate_keys(target, tried):
            try:
                transport.auth_publickey(target.user, key)
            except paramiko.AuthenticationException:
                tried.append(f"{label}: rejected")
                continue
            except paramiko.SSHException as exc:
                tried.append(f"{label}: {exc}")
                continue
            if transport.is_authenticated():
                return
        detail = "; ".join(tried) if tried else "no key found"
        raise TransportError(
            f"authentication failed for {target.user}@{target.hostname} ({detail})",
            "check User and IdentityFile in the SSH config, or load the key into ssh-agent",
            where,
        )

    @staticmethod
    def _candidate_keys(target: SshTarget, notes: list[str]) -> list[tuple[str, paramiko.PKey]]:
        import paramiko

        keys: list[tuple[str, paramiko.PKey]] = []
        if not target.identities_only and os.environ.get("SSH_AUTH_SOCK"):
            agent = paramiko.Agent()
            keys.extend((f"agent key {k.get_name()}", k) for k in agent.get_keys())
        for path in target.identity_files:
            if not os.path.isfile(path):
                continue
            try:
                keys.append((path, paramiko.PKey.from_path(path)))
            except paramiko.PasswordRequiredException:
                notes.append(f"{path}: passphrase-protected (load it into ssh-agent)")
            except (paramiko.SSHException, OSError, ValueError) as exc:
                notes.append(f"{path}: unreadable ({exc})")
        return keys

    # -- running ----------------------------------------------------------------------------

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
    ) -> CommandResult:
        start = time.monotonic()
        command = remote_command(argv)
        try:
            self.connect()
            channel = self._transports[-1].open_session(timeout=self.target.connect_timeout_s)
        except TransportError as exc:
            return CommandResult(None, "", "", time.monotonic() - start, exc.one_line())
        except Exception as exc:
            return CommandResult(None, "", "", time.monotonic() - start, f"cannot open a session: {exc}")
        try:
            return self._run_on_channel(channel, command, stdin, timeout_s, start)
        finally:
            channel.close()

    @staticmethod
    def _run_on_channel(
        channel: paramiko.Channel, command: str, stdin: bytes | None, timeout_s: float | None, start: float
    ) -> CommandResult:
        channel.exec_command(command)
        if stdin:
            channel.sendall(stdin)
        channel.shutdown_write()
        stdout, stderr = bytearray(), bytearray()
        deadline = None if timeout_s is None else start + timeout_s
        while True:
            while channel.recv_ready():
                stdout += channel.recv(65536)
            while channel.recv_stderr_ready():
                stderr += channel.recv_stderr(65536)
            if channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
                break
            if channel.closed and not channel.recv_ready():
                break
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return CommandResult(
                    None, stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace"),
                    time.monotonic() - start, f"timed out after {timeout_s:g} s",
                )
            select.select([channel], [], [], min(remaining, 1.0) if remaining is not None else 1.0)
        code = channel.recv_exit_status() if channel.exit_status_ready() else -1
        error = None
        if code == -1:
            error = "connection lost before the command finished"
        return CommandResult(
            None if code == -1 else code,
            stdout.decode("utf-8", "replace"),
            stderr.decode("utf-8", "replace"),
            time.monotonic() - start,
            error,
        )

    def start(self, argv: Sequence[str]) -> SshRunning:
        """Start ``argv`` on a new channel with stdin kept open (raises TransportError)."""
        self.connect()
        try:
            channel = self._transports[-1].open_session(timeout=self.target.connect_timeout_s)
            channel.exec_command(remote_command(argv))
        except Exception as exc:
            raise TransportError(f"cannot start a command: {exc}", "is the host still up?", self.host) from None
        return SshRunning(self.host, channel)

    def alive(self, timeout_s: float) -> bool:
        """Whether the server answers a keep-alive request within ``timeout_s`` (link check)."""
        if not self._transports or not self._transports[-1].is_active():
            return False
        transport = self._transports[-1]
        answered = threading.Event()

        def ask() -> None:
            with contextlib.suppress(Exception):
                transport.global_request("keepalive@openssh.com", wait=True)
                answered.set()

        threading.Thread(target=ask, daemon=True, name=f"fstrain-alive-{self.host}").start()
        return answered.wait(timeout_s)

    def close(self) -> None:
        for transport in reversed(self._transports):
            with contextlib.suppress(Exception):
                transport.close()
        self._transports = []


class SshRunning:
    """A command started by :meth:`SshTransport.start` on its own channel."""

    def __init__(self, host: str, channel: paramiko.Channel) -> None:
        self.host = host
        self._channel = channel
        self._write_lock = threading.Lock()

    def write(self, data: bytes) -> bool:
        with self._write_lock:
            if self._channel.closed or self._channel.eof_sent:
                return False
            try:
                self._channel.sendall(data)
            except (OSError, EOFError, Exception):
                return False
        return True

    def close_stdin(self) -> None:
        with self._write_lock, contextlib.suppress(Exception):
            self._channel.shutdown_write()

    def lines(self) -> Iterator[tuple[str, str]]:
        stdout = self._channel.makefile("rb")
        stderr = self._channel.makefile_stderr("rb")
        return merged_lines({"stdout": stdout.readline, "stderr": stderr.readline})

    def wait(self) -> tuple[int | None, str | None]:
        if not self._channel.exit_status_ready():
            # Output ended: the exit status follows at once, unless the connection is gone.
            self._channel.status_event.wait(5.0)
        # paramiko also sets the status event when the channel closes without one (-1).
        code = self._channel.recv_exit_status() if self._channel.exit_status_ready() else -1
        if code == -1:
            return None, "connection lost before the job finished"
        return code, None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._channel.close()
