"""The attached launcher's hang report (``--stall-timeout``, ``--finish-timeout``).

When and why stacks are collected is the supervisor's decision (fstrain/core/launch/supervisor.py);
this keeps each node's stacks report as it arrives and writes ``RUN_DIR/stacks/``: one file per
rank and stack tool, and ``report.json`` naming the ranks that differ (fstrain/core/monitor/stacks.py),
with the writer a detached run's coordinator uses (fstrain/io/remote/stacks.py ``write_report``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fstrain.core.monitor.stacks import hang_report
from fstrain.io.remote.stacks import write_report


@dataclass
class HangReports:
    run_dir: Path
    names: Sequence[str] = ()  # the nodes' hosts by node rank: where each NCCL trace is
    reports: dict[int, dict[str, Any]] = field(default_factory=dict)  # node rank -> its stacks report
    document: dict[str, Any] | None = None  # the report, once written

    def add(self, node_rank: int, stacks: dict[str, Any]) -> None:
        self.reports[node_rank] = stacks

    def write(self, reason: str, unanswered: Sequence[int]) -> dict[str, Any]:
        """RUN_DIR/stacks/rank<R>.<tool>.txt per rank and report.json; returns the report."""
        document, files = hang_report(self.reports, reason, sorted(unanswered), self.names)
        self.document = write_report(str(self.run_dir), document, files)
        return self.document
