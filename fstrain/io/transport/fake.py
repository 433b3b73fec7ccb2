"""A fake transport for unit tests: answers commands from a table, records what it was asked."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fstrain.io.transport.base import CommandResult

Responder = Callable[[Sequence[str], bytes | None], CommandResult]


@dataclass
class FakeTransport:
    """Replies to each command with ``responder(argv, stdin)``; keeps every call in ``calls``."""

    host: str
    responder: Responder
    calls: list[tuple[tuple[str, ...], bytes | None]] = field(default_factory=list)
    closed: bool = False

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
    ) -> CommandResult:
        self.calls.append((tuple(argv), stdin))
        return self.responder(argv, stdin)

    def close(self) -> None:
        self.closed = True
