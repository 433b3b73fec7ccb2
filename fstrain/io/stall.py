"""Hang and straggler detection for a running launch (``--stall-timeout``, ``--finish-timeout``).

The launcher feeds this watch every rank line and every node exit. When no rank has printed
for ``stall_timeout_s``, or some node has finished with exit 0 while others still run after
``finish_timeout_s``, it asks every live node's watchdog for its ranks' stacks (the ``stacks``
control line; see fstrain/io/remote/stacks.py), waits for their reports, writes them into
``RUN_DIR/stacks/``, names the ranks that differ (fstrain/core/stacks.py) and tells the launcher
to tear the job down as ``stalled``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fstrain.core.stacks import hang_report, stall_reason

EXIT_STALLED = 124  # as timeout(1)
COLLECT_TIMEOUT_S = 30.0  # for every live node's stacks report


class _Node(Protocol):
    @property
    def done(self) -> bool: ...

    exit_code: int | None


@dataclass
class StallWatch:
    stall_timeout_s: float | None
    finish_timeout_s: float | None
    run_dir: Path
    clock: Callable[[], float] = time.monotonic
    last_progress: float | None = None  # the last rank line; None before the first
    first_finish: float | None = None
    reason: str = ""  # why stacks were requested: "" while all is well
    requested_at: float | None = None
    reports: dict[int, dict[str, Any]] = field(default_factory=dict)  # node rank -> its stacks report
    waiting_for: set[int] = field(default_factory=set)
    document: dict[str, Any] | None = None  # the report, once written

    def progress(self) -> None:
        self.last_progress = self.clock()

    def node_exited(self, exit_code: int | None) -> None:
        """A node (or a rank) finished: with exit 0, the finish timeout starts."""
        if exit_code == 0 and self.first_finish is None:
            self.first_finish = self.clock()

    def due(self, nodes: Sequence[_Node]) -> str:
        """Why stacks should be collected now, or "" (never twice)."""
        if self.reason:
            return ""
        now = self.clock()
        live = [n for n in nodes if not n.done]
        if not live:
            return ""
        self.reason = stall_reason(now, self.last_progress, self.first_finish, self.stall_timeout_s,
                                   self.finish_timeout_s)
        return self.reason

    def requested(self, live_nodes: Sequence[int]) -> None:
        self.requested_at = self.clock()
        self.waiting_for = set(live_nodes)

    def event(self, node_rank: int, payload: dict[str, Any]) -> None:
        """A watchdog's report: its ranks' stacks, or ranks whose process ended."""
        if "stacks" in payload:
            self.reports[node_rank] = payload["stacks"]
            self.waiting_for.discard(node_rank)
        if payload.get("ranks_gone"):
            self.node_exited(0)  # a failed rank fails its node at once; that is handled first

    def node_gone(self, node_rank: int) -> None:
        self.waiting_for.discard(node_rank)

    def collected(self) -> bool:
        """Every live node answered, or the wait is over."""
        if self.requested_at is None:
            return False
        return not self.waiting_for or self.clock() - self.requested_at > COLLECT_TIMEOUT_S

    def write(self) -> dict[str, Any]:
        """RUN_DIR/stacks/rank<R>.<tool>.txt per rank and report.json; returns the report."""
        folder = self.run_dir / "stacks"
        folder.mkdir(parents=True, exist_ok=True)
        document, files = hang_report(self.reports, self.reason, sorted(self.waiting_for))
        for name, text in files.items():
            (folder / name).write_text(text)
        document["folder"] = str(folder)
        (folder / "report.json").write_text(json.dumps(document, indent=2) + "\n")
        self.document = document
        return document
