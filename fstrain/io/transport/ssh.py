"""SSH transport over paramiko: one verified connection per host, one channel per command.

Host keys are checked against known_hosts before any credential is sent. An unknown host is
refused unless ``accept_new`` (``--accept-new-hosts``, or ``StrictHostKeyChecking
accept-new|no`` in the config), in which case its key is appended to the first known_hosts file;
a changed key is always refused. ProxyJump hops are opened as ``direct-tcpip`` channels through
the previous hop, each hop verified the same way. ``@revoked`` keys are refused, host
certificates signed by a ``@cert-authority`` key are accepted, and known_hosts lines that
cannot be read are skipped with a warning (see :mod:`fstrain.io.transport.hostkeys`).
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

from fstrain.core.hosts.knownhosts import KnownHost, entries_for, key_blob_type, revoked_line
from fstrain.errors import HostKeyError, TransportError
from fstrain.io.sshconfig import SshConfig, SshTarget
from fstrain.io.transport.base import CommandResult, merged_lines, quote_argv
from fstrain.io.transport.hostkeys import (
    CERT_SUFFIX,
    HostCertificate,
    certificate_of,
    certificate_problem,
    load_known_hosts,
)

if TYPE_CHECKING:
    import paramiko

KEEPALIVE_INTERVAL_S = 15
HANDSHAKE_MIN_S = 30.0  # the least limit of each step after the greeting (handshake_timeout_s)
_FROZEN_HINT = ("the host accepts connections but its sshd does not answer: is it frozen or overloaded? "
                "(ConnectTimeout in the SSH config sets the limit)")
_PLAIN_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
                    "rsa-sha2-512", "rsa-sha2-256")

# paramiko logs failed handshakes with a traceback from its own thread; fstrain reports every
# failure as one line per host instead (FSTRAIN_DEBUG=1 lets paramiko speak).
if not os.environ.get("FSTRAIN_DEBUG"):
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    logging.getLogger("paramiko").propagate = False
_known_hosts_lock = threading.Lock()


def handshake_timeout_s(connect_timeout_s: float) -> float:
    """How long the key exchange, the authentication, opening a session and the answer to its
    command request may each take (sshd's work, slow on a busy host): ConnectTimeout, or
    HANDSHAKE_MIN_S if that is longer."""
    return max(connect_timeout_s, HANDSHAKE_MIN_S)


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
        # Every step of the connection has a deadline: a host that accepts TCP but never answers
        # (a frozen sshd) is reported, never waited for. ConnectTimeout bounds the greeting, as
        # OpenSSH's does; the key exchange and the authentication that follow are CPU work on
        # both ends and get at least HANDSHAKE_MIN_S: a host busy with hundreds of sessions at
        # once (a launch's --fanout) is slow, not frozen.
        transport.banner_timeout = target.connect_timeout_s
        transport.handshake_timeout = handshake_timeout_s(target.connect_timeout_s)
        transport.auth_timeout = handshake_timeout_s(target.connect_timeout_s)
        known = load_known_hosts(target.known_hosts_files)
        names = self._host_key_names(target)
        preferred = [t for e in entries_for(known, names)
                     for t in (("rsa-sha2-512", "rsa-sha2-256") if e.blob_type == "ssh-rsa" else (e.blob_type,))]
        if entries_for(known, names, "@cert-authority"):  # a CA vouches for it: ask for certificates first
            preferred = [f"{t}{CERT_SUFFIX}" for t in (*preferred, *_PLAIN_KEY_TYPES)] + preferred
        if preferred:  # ask for the key type we can verify, as OpenSSH does
            options = transport.get_security_options()
            supported = set(options.key_types) | {f"{t}{CERT_SUFFIX}" for t in options.key_types}
            wanted = [t for t in dict.fromkeys(preferred) if t in supported]
            base = [t for t in options.key_types if not t.endswith(CERT_SUFFIX)]
            options.key_types = tuple(dict.fromkeys([*wanted, *base]))
        try:
            transport.start_client(timeout=handshake_timeout_s(target.connect_timeout_s))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if "banner" in str(exc):
                raise TransportError(
                    f"no SSH greeting from {target.hostname}:{target.port} within {target.connect_timeout_s:g} s",
                    _FROZEN_HINT, where) from None
            raise TransportError(f"SSH handshake failed: {exc or type(exc).__name__}",
                                 "is an SSH server listening there?", where) from None
        if not transport.is_active() or not getattr(transport, "initial_kex_done", True):
            # start_client returns quietly when its deadline passes mid-handshake
            raise TransportError(
                f"SSH handshake with {target.hostname}:{target.port} did not finish within "
                f"{handshake_timeout_s(target.connect_timeout_s):g} s", _FROZEN_HINT, where)
        self._verify_host_key(target, transport, known, names, where)
        self._authenticate(target, transport, where)
        transport.set_keepalive(min(KEEPALIVE_INTERVAL_S, target.server_alive_interval_s))
        return transport

    @staticmethod
    def _socket(target: SshTarget, via: paramiko.Transport | None, where: str) -> Any:
        if via is None and target.proxy_command and not target.proxy_jump:
            import paramiko

            try:  # ProxyCommand: the command's stdin/stdout is the connection
                return paramiko.ProxyCommand(target.proxy_command)
            except Exception as exc:
                raise TransportError(f"ProxyCommand failed to start: {exc}", "check ProxyCommand in the SSH config",
                                     where) from None
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

    def _verify_host_key(
        self, target: SshTarget, transport: paramiko.Transport, known: list[KnownHost], names: list[str], where: str
    ) -> None:
        key = transport.get_remote_server_key()
        blob = key.asbytes()
        key_type = key_blob_type(blob) or key.get_name()
        fingerprint = key.fingerprint
        revoked = revoked_line(known, names, blob)
        if revoked is not None:
            raise HostKeyError(
                f"the host key of {names[0]} ({key_type} {fingerprint}) is marked @revoked at {revoked.where}",
                "the key must not be trusted: ask the host's administrator for its new key",
                where,
            )
        cert = certificate_of(key)
        if cert is not None:
            self._verify_certificate(cert, known, names, target, where)
            return
        for name in names:
            matching = [e for e in entries_for(known, [name]) if e.blob_type == key_type]
            if not matching:
                continue
            if any(e.key_blob == blob for e in matching):
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
    def _verify_certificate(cert: HostCertificate, known: list[KnownHost], names: list[str], target: SshTarget,
                            where: str) -> None:
        """A host certificate: trusted only when a matching @cert-authority line signed it."""
        authorities = entries_for(known, names, "@cert-authority")
        revoked_ca = revoked_line(known, names, cert.signature_key)
        if revoked_ca is not None:
            raise HostKeyError(f"the CA that signed the host certificate of {names[0]} is marked @revoked at "
                               f"{revoked_ca.where}", "ask the host's administrator for a certificate from a valid CA",
                               where)
        principals = [target.hostname, target.alias]
        problems = [f"{ca.where}: {problem}" for ca in authorities
                    if (problem := certificate_problem(cert, ca, principals)) is not None]
        if authorities and len(problems) < len(authorities):
            return
        detail = "; ".join(problems) if problems else "no @cert-authority line matches the host"
        raise HostKeyError(
            f"host certificate of {names[0]} (key id {cert.key_id!r}) is not trusted: {detail}",
            "add the CA with '@cert-authority HOSTS KEYTYPE KEY' to known_hosts, or renew the certificate",
            where,
        )

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
                for cert in target.certificate_files:  # CertificateFile: offered first, with its key
                    with contextlib.suppress(Exception):  # a certificate of another key: not this one
                        certified = paramiko.PKey.from_path(path)
                        certified.load_certificate(cert)
                        keys.append((f"{path} with {cert}", certified))
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
            channel = self._transports[-1].open_session(timeout=handshake_timeout_s(self.target.connect_timeout_s))
        except TransportError as exc:
            return CommandResult(None, "", "", time.monotonic() - start, exc.one_line())
        except Exception as exc:
            return CommandResult(None, "", "", time.monotonic() - start, f"cannot open a session: {exc}")
        try:
            return self._run_on_channel(channel, command, stdin, timeout_s, start)
        except TransportError as exc:
            return CommandResult(None, "", "", time.monotonic() - start, exc.one_line())
        finally:
            channel.close()

    def _exec_on(self, channel: paramiko.Channel, command: str) -> None:
        """``channel.exec_command`` with a deadline: paramiko waits for the server's answer with
        none, so a frozen host would hold the caller for ever. Past the deadline the connection
        is closed, which wakes paramiko up with an error."""
        transport = self._transports[-1]
        limit_s = handshake_timeout_s(self.target.connect_timeout_s)  # the session's fork and shell: slow when busy
        timer = threading.Timer(limit_s, transport.close)
        timer.daemon = True
        timer.start()
        try:
            channel.exec_command(command)
        except Exception as exc:
            if timer.finished.is_set() or not transport.is_active():
                raise self._lost(f"no answer to the command request within {limit_s:g} s") \
                    from None
            raise TransportError(f"cannot start a command: {exc}", "is the host still up?", self.host) from None
        finally:
            timer.cancel()

    def _lost(self, why: str) -> TransportError:
        self.close()
        return TransportError(
            f"host lost: {why}",
            "is the host or its sshd frozen or overloaded? (ServerAliveInterval and ServerAliveCountMax "
            "in the SSH config set how long a silent host is waited for)",
            self.host,
        )

    def _run_on_channel(
        self, channel: paramiko.Channel, command: str, stdin: bytes | None, timeout_s: float | None, start: float
    ) -> CommandResult:
        self._exec_on(channel, command)
        if stdin:
            channel.sendall(stdin)
        channel.shutdown_write()
        stdout, stderr = bytearray(), bytearray()
        deadline = None if timeout_s is None else start + timeout_s
        liveness = Liveness(self._transports[-1], self.target.server_alive_interval_s,
                            self.target.server_alive_count_max, self.host)
        while not output_ended(channel):
            drain(channel, stdout, stderr, liveness)
            if output_ended(channel):
                break
            if liveness.lost():
                raise self._lost(f"no answer for {liveness.silence_limit_s:g} s while the command ran")
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return CommandResult(
                    None, stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace"),
                    time.monotonic() - start, f"timed out after {timeout_s:g} s",
                )
            select.select([channel], [], [], min(remaining, 1.0) if remaining is not None else 1.0)
        drain(channel, stdout, stderr, liveness)
        # Output has ended (EOF, or the channel closed): the exit status follows at once unless
        # the connection is gone; paramiko sets the event on close without one too.
        channel.status_event.wait(EXIT_STATUS_WAIT_S)
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
            channel = self._transports[-1].open_session(timeout=handshake_timeout_s(self.target.connect_timeout_s))
        except Exception as exc:
            raise TransportError(f"cannot start a command: {exc}", "is the host still up?", self.host) from None
        self._exec_on(channel, remote_command(argv))
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


EXIT_STATUS_WAIT_S = 5.0  # after the output's end, for the exit status to arrive


def output_ended(channel: paramiko.Channel) -> bool:
    """Both streams are over and nothing of them is left unread: the server sent EOF (or closed
    the channel). The exit status alone does not mean that: sshd may send it while the end of
    the output is still in flight, and stopping then loses that end."""
    ended = channel.eof_received or channel.closed
    return bool(ended) and not channel.recv_ready() and not channel.recv_stderr_ready()


def drain(channel: paramiko.Channel, stdout: bytearray, stderr: bytearray, liveness: Liveness) -> None:
    """Everything the channel holds now, of both streams."""
    while channel.recv_ready() or channel.recv_stderr_ready():
        while channel.recv_ready():
            stdout += channel.recv(65536)
            liveness.heard()
        while channel.recv_stderr_ready():
            stderr += channel.recv_stderr(65536)
            liveness.heard()


class Liveness:
    """OpenSSH's ServerAliveInterval / ServerAliveCountMax for one command: after
    ``interval_s`` without a byte from the server, ask it for a keep-alive reply (in a thread:
    paramiko waits for the answer); after ``interval_s * count_max`` of silence it is lost.

    TCP alone never notices a frozen peer: its kernel still acknowledges every packet.
    """

    def __init__(self, transport: paramiko.Transport, interval_s: float, count_max: int, host: str) -> None:
        self._transport = transport
        self._interval_s = interval_s
        self.silence_limit_s = interval_s * count_max
        self._host = host
        self._last_heard = time.monotonic()
        self._asking = threading.Event()

    def heard(self) -> None:
        self._last_heard = time.monotonic()

    def lost(self) -> bool:
        silent_s = time.monotonic() - self._last_heard
        if silent_s >= self.silence_limit_s:
            return True
        if silent_s >= self._interval_s and not self._asking.is_set():
            self._asking.set()
            threading.Thread(target=self._ask, daemon=True, name=f"fstrain-alive-{self._host}").start()
        return False

    def _ask(self) -> None:
        try:
            self._transport.global_request("keepalive@openssh.com", wait=True)
            if self._transport.is_active():  # a reply (OpenSSH answers "failure"): it is alive
                self.heard()
        except Exception:
            pass
        finally:
            self._asking.clear()


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
