"""A listening port on one host, opened by netcheck's ``listen`` (fstrain/io/remote/netcheck.py)
in a session of its own: the launch's rendezvous check and the doctor's connection matrix both
open it here, let the other hosts connect to it, then close it.

The session's first line names the port it bound (the first free one of those asked for; none
where every one is busy), the ports it found busy and the host's IPv4 interfaces; ``done`` on
its stdin closes the port, and :meth:`Listening.close` waits until it is free, so the job that
needs it next finds it free.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fstrain.errors import FstrainError
from fstrain.io.remote import as_line, line_script
from fstrain.io.transport.base import RunningCommand, Transport, start_command


@dataclass
class Listening:
    """A listener that has answered: ``opened`` is its first line."""

    running: RunningCommand
    output: Iterator[tuple[str, str]]
    opened: dict[str, Any]
    closed: bool = False

    @property
    def port(self) -> int | None:
        """The port it listens on; None where every port asked for was busy."""
        port = self.opened.get("port")
        return int(port) if port is not None else None

    @property
    def busy(self) -> tuple[int, ...]:
        return tuple(self.opened.get("busy") or ())

    def close(self) -> None:
        """Free the port and wait until it is free (the listener exits once told, or once its
        session's stdin ends); then end the session. A second call does nothing."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.running.write(b"done\n"):
                self.running.close_stdin()
                for _ in self.output:
                    pass
                self.running.wait()
        finally:
            self.running.close()


def start_listener(transport: Transport, python: str, ports: Sequence[int]) -> Listening:
    """netcheck's ``listen`` on ``transport``'s host, trying ``ports`` in order, once it has
    answered. Raises FstrainError where it cannot start or exits before it answers, and
    ValueError where its first line is not JSON (the session is closed either way)."""
    running = start_command(transport, line_script(python, "listen", *map(str, ports)))
    try:
        running.write(as_line("netcheck"))
        output = running.lines()
        for stream, line in output:
            if stream == "stdout":
                return Listening(running, output, json.loads(line))
        code, why = running.wait()
        raise FstrainError(f"the listener on {running.host} exited ({why or f'exit {code}'}) before opening a port",
                           "run `fstrain doctor` on that host", running.host)
    except BaseException:
        running.close()
        raise
