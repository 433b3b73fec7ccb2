"""The time rules of a run, as one value: given once (``RunSettings``, a bench's request) and
handed down unchanged to the driver, the launcher, the supervisor and every node's watchdog."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunLimits:
    grace_s: float = 15.0  # SIGTERM to SIGKILL on teardown, on every node
    heartbeat_timeout_s: float = 30.0  # silence before a host counts as lost
    stall_timeout_s: float | None = None  # no rank output for this long: stacks, then stop (124)
    finish_timeout_s: float | None = None  # some ranks finished this long ago, others still run: the same
