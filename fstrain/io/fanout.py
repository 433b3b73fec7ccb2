"""Bounded-concurrency fan-out: run commands on many hosts, get every host's result back.

A :class:`HostPool` opens at most one connection per host (lazily, at most ``fanout`` at a
time) and reuses it for every command of a CLI invocation; it checks first that this machine's
limits hold a connection per host (fstrain/io/clientlimits.py). A host that cannot be reached,
refuses authentication or times out gets a result with ``error`` set; the others go on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from fstrain.core.hosts.hostfile import Host
from fstrain.errors import FstrainError
from fstrain.io.transport.base import CommandResult, RunningCommand, Transport, start_command

DEFAULT_FANOUT = 64

Connector = Callable[[Host], Transport]
T = TypeVar("T")


@dataclass(frozen=True)
class HostResult:
    """One host's answer to one command (``exit_code`` None when it never finished)."""

    host: str
    exit_code: int | None
    stdout: str
    stderr: str
    seconds: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_code == 0

    def to_dict(self) -> dict[str, object]:
        return {
            "host": self.host,
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "seconds": round(self.seconds, 4),
            "error": self.error,
        }

    @classmethod
    def from_command(cls, host: str, result: CommandResult) -> HostResult:
        return cls(host, result.exit_code, result.stdout, result.stderr, result.seconds, result.error)


class HostPool:
    """Connections to a set of hosts, opened on first use and closed together.

    ``connect(host)`` returns a transport; it may raise :class:`FstrainError` (unreachable,
    unknown host key, auth), which becomes that host's error. Use as a context manager.
    """

    def __init__(self, hosts: Sequence[Host], connect: Connector, *, fanout: int = DEFAULT_FANOUT) -> None:
        from fstrain.core.launch.clientlimits import connection_needs
        from fstrain.io.clientlimits import ensure

        if fanout < 1:
            raise ValueError("fanout must be at least 1")
        ensure(connection_needs(len(hosts), fanout), len(hosts), "connecting to")  # room for a connection per host
        self.hosts = list(hosts)
        self.fanout = fanout
        self._connect = connect
        self._transports: dict[str, Transport] = {}
        self._errors: dict[str, str] = {}
        self._failures: dict[str, FstrainError] = {}  # the exception behind each error text
        self._lock = threading.Lock()

    def __enter__(self) -> HostPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _transport(self, host: Host) -> Transport | str:
        """The host's transport, or the reason it has none (remembered: one try per pool)."""
        key = host.label()
        with self._lock:
            if key in self._transports:
                return self._transports[key]
            if key in self._errors:
                return self._errors[key]
        try:
            transport = self._connect(host)
            opener = getattr(transport, "connect", None)
            if callable(opener):
                opener()
        except FstrainError as exc:
            with self._lock:
                self._errors[key] = exc.message + (f" (hint: {exc.hint})" if exc.hint else "")
                self._failures[key] = exc
            return self._errors[key]
        with self._lock:
            self._transports[key] = transport
        return transport

    def open_transport(self, host: Host) -> Transport:
        """The host's own open transport (connecting now if not yet tried): to start a streaming
        command on it. The pool still closes it."""
        transport = self._transport(host)
        if isinstance(transport, str):
            raise self._failures[host.label()]
        return transport

    def connect_error(self, host: Host) -> str | None:
        """Why ``host`` cannot be reached (connecting now if not yet tried), or None when it can."""
        transport = self._transport(host)
        return transport if isinstance(transport, str) else None

    def run_one(
        self, host: Host, argv: Sequence[str], *, stdin: bytes | None = None, timeout_s: float | None = None
    ) -> HostResult:
        start = time.monotonic()
        transport = self._transport(host)
        if isinstance(transport, str):
            return HostResult(host.label(), None, "", "", time.monotonic() - start, transport)
        result = transport.run(argv, stdin=stdin, timeout_s=timeout_s)
        return HostResult(host.label(), result.exit_code, result.stdout, result.stderr,
                          time.monotonic() - start, result.error)

    def run_all(
        self,
        argv: Sequence[str] | Callable[[Host], Sequence[str]],
        *,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
        on_result: Callable[[HostResult], None] | None = None,
        only: Sequence[Host] | None = None,
    ) -> list[HostResult]:
        """Run on every host (``only``: on these of the pool's hosts), at most ``fanout`` at a
        time; results in inventory order.

        ``argv`` may be a function of the host, for per-host commands.
        """

        def one(host: Host) -> HostResult:
            command = argv(host) if callable(argv) else argv
            result = self.run_one(host, command, stdin=stdin, timeout_s=timeout_s)
            if on_result is not None:
                on_result(result)
            return result

        return self.map(one, only)

    def map(self, work: Callable[[Host], T], only: Sequence[Host] | None = None) -> list[T]:
        """``work(host)`` for every host (or ``only`` these), at most ``fanout`` at a time;
        results in inventory order."""
        hosts = self.hosts if only is None else list(only)
        if not hosts:
            return []
        with ThreadPoolExecutor(max_workers=min(self.fanout, len(hosts)), thread_name_prefix="fstrain-fanout") as pool:
            return list(pool.map(work, hosts))

    def transport(self, host: Host) -> PooledTransport:
        """A Transport view of ``host`` whose commands reuse the pool's connection."""
        return PooledTransport(self, host)

    def close(self) -> None:
        with self._lock:
            transports = list(self._transports.values())
            self._transports.clear()
        for transport in transports:
            transport.close()


class PooledTransport:
    """One host of a :class:`HostPool` as a Transport (for code written against one transport,
    such as the probe). Closing it is a no-op: the pool owns the connection."""

    def __init__(self, pool: HostPool, host: Host) -> None:
        self.host = host.label()
        self._pool = pool
        self._inventory_host = host

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout_s: float | None = None) -> CommandResult:
        result = self._pool.run_one(self._inventory_host, argv, stdin=stdin, timeout_s=timeout_s)
        return CommandResult(result.exit_code, result.stdout, result.stderr, result.seconds, result.error)

    def start(self, argv: Sequence[str]) -> RunningCommand:
        """A streaming command on the pool's open connection (a detached start): the host's
        next session needs no new SSH handshake (at 200 hosts, one per host per stage is seconds
        of both ends' CPU)."""
        return start_command(self._pool.open_transport(self._inventory_host), argv)

    def close(self) -> None:
        """The pool closes its connections itself."""
