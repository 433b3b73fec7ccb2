"""The launcher's relay of node output: bounded, so a job that prints faster than fstrain can
write its output (a slow terminal, a pipe, a busy disk) is slowed down instead of filling
fstrain's memory.

Back-pressure runs end to end: a full relay queue stops the node's pump thread, whose reader
stops reading the SSH channel (or pipe); the channel's window then closes, the remote sshd
stops reading the watchdog's pipe, and the job's own writes block until fstrain catches up.
Control events (a node's exit, a lost host) never wait for room: the watcher must always see
them.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

# Lines waiting between the nodes' pumps and the watcher, all nodes together. At ~100 bytes a
# line this is a few MiB at most; the watcher writes tens of thousands of lines a second.
RELAY_MAX_LINES = 10_000

Event = tuple[str, int, Any, Any]  # (kind, node rank, a, b): ("line", rank, stream, text), ...


class RelayQueue(queue.Queue[Event]):
    """A queue of node events where ``line`` events wait for room and all others never wait."""

    def __init__(self, max_lines: int = RELAY_MAX_LINES) -> None:
        super().__init__()
        self._room = threading.Semaphore(max_lines)

    def put(self, item: Event, block: bool = True, timeout: float | None = None) -> None:
        if item[0] == "line":
            self._room.acquire()
        super().put(item, block, timeout)

    def get(self, block: bool = True, timeout: float | None = None) -> Event:
        item = super().get(block, timeout)
        if item[0] == "line":
            self._room.release()
        return item
