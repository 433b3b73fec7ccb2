"""A simulated cluster for measuring the control plane at sizes no test machine hosts.

Built on the fake transport's idea (a responder answers each command, nothing leaves this
process), with what a real cluster adds: a connection takes ``connect_s`` and each command a
round trip of ``latency_s`` (plus up to ``jitter_s``, drawn from a seeded generator, so a run is
repeatable); ``slow`` hosts add ``slow_s`` to both; ``failing`` hosts refuse the connection
(a :class:`TransportError`, as an unreachable SSH host gives). Every connection, command and
byte is counted, with the most commands in flight at once, so a caller reads what a command of
fstrain costs the nodes: SSH sessions opened and processes started there.

``benchmarks/control_plane_sim.py`` drives the real fan-out, status and start code through it.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from fstrain.errors import TransportError
from fstrain.io.transport.base import CommandResult

# What a node answers: (host, argv, stdin) -> (exit code, stdout, stderr).
NodeResponder = Callable[[str, Sequence[str], bytes], tuple[int, str, str]]


def script_arguments(argv: Sequence[str]) -> list[str]:
    """What follows the script in ``[python, flags..., -c, SCRIPT, ARGS...]`` (runctl's command
    and its arguments: ``["state", RUN_DIR, ...]``); [] for a command without ``-c``."""
    argv = list(argv)
    return argv[argv.index("-c") + 2:] if "-c" in argv else []


@dataclass
class Counts:
    """What the cluster was asked, summed over every host."""

    connections: int = 0
    refused: int = 0
    commands: int = 0  # each one an SSH session that starts a process on the node
    bytes_sent: int = 0  # to the nodes (stdin)
    bytes_received: int = 0  # from the nodes (stdout and stderr)
    in_flight_max: int = 0


@dataclass
class SimulatedCluster:
    """Every host's network and answers; ``transport(host)`` is the connector fstrain calls."""

    respond: NodeResponder
    latency_s: float = 0.0
    jitter_s: float = 0.0
    connect_s: float = 0.0
    slow: frozenset[str] = frozenset()
    slow_s: float = 0.0
    failing: frozenset[str] = frozenset()
    seed: int = 0
    counts: Counts = field(default_factory=Counts)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._random = random.Random(self.seed)
        self._in_flight = 0

    def transport(self, host: object) -> SimulatedTransport:
        name = str(getattr(host, "name", host))
        return SimulatedTransport(name, self)

    def delay_s(self, host: str, base_s: float) -> float:
        with self._lock:
            jitter = self._random.uniform(0.0, self.jitter_s) if self.jitter_s else 0.0
        return base_s + jitter + (self.slow_s if host in self.slow else 0.0)

    def connect(self, host: str) -> None:
        time.sleep(self.delay_s(host, self.connect_s))
        with self._lock:
            if host in self.failing:
                self.counts.refused += 1
                raise TransportError(f"cannot connect to {host}:22: Connection refused (simulated)", "", host)
            self.counts.connections += 1

    def command(self, host: str, argv: Sequence[str], stdin: bytes | None) -> tuple[int, str, str]:
        with self._lock:
            self.counts.commands += 1
            self.counts.bytes_sent += len(stdin or b"")
            self._in_flight += 1
            self.counts.in_flight_max = max(self.counts.in_flight_max, self._in_flight)
        try:
            time.sleep(self.delay_s(host, self.latency_s))
            code, out, err = self.respond(host, argv, stdin or b"")
        finally:
            with self._lock:
                self._in_flight -= 1
        with self._lock:
            self.counts.bytes_received += len(out) + len(err)
        return code, out, err


class SimulatedTransport:
    """One host of a :class:`SimulatedCluster`: connects on first use, as the SSH transport does."""

    def __init__(self, host: str, cluster: SimulatedCluster) -> None:
        self.host = host
        self._cluster = cluster
        self._connected = False

    def connect(self) -> None:
        if not self._connected:
            self._cluster.connect(self.host)
            self._connected = True

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout_s: float | None = None) -> CommandResult:
        start = time.monotonic()
        try:
            self.connect()
        except TransportError as exc:
            return CommandResult(None, "", "", time.monotonic() - start, exc.message)
        code, out, err = self._cluster.command(self.host, argv, stdin)
        return CommandResult(code, out, err, time.monotonic() - start)

    def start(self, argv: Sequence[str]) -> SimulatedCommand:
        """A streaming command (the watchdog's start): its stdin is what the node answers to."""
        self.connect()
        return SimulatedCommand(self, list(argv))

    def close(self) -> None:
        self._connected = False


class SimulatedCommand:
    """A started command: it runs when its stdin is closed, its stdout arrives as lines."""

    def __init__(self, transport: SimulatedTransport, argv: list[str]) -> None:
        self.host = transport.host
        self._transport = transport
        self._argv = argv
        self._stdin = b""
        self._result: tuple[int, str, str] | None = None

    def write(self, data: bytes) -> bool:
        self._stdin += data
        return True

    def close_stdin(self) -> None:
        self._result = self._transport._cluster.command(self.host, self._argv, self._stdin)

    def lines(self) -> Iterator[tuple[str, str]]:
        if self._result is None:
            self.close_stdin()
        assert self._result is not None
        _, out, err = self._result
        for line in out.splitlines():
            yield "stdout", line
        for line in err.splitlines():
            yield "stderr", line

    def wait(self) -> tuple[int | None, str | None]:
        return (self._result[0] if self._result else None), None

    def close(self) -> None:
        """Nothing stays open."""
