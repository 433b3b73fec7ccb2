"""The attached launcher's hang report (``--stall-timeout``, ``--finish-timeout``).

When and why stacks are collected is the supervisor's decision (fstrain/core/launch/supervisor.py);
this keeps each node's stacks report as it arrives and writes ``RUN_DIR/stacks/``: one file per
rank and stack tool, and ``report.json`` naming the ranks that differ (fstrain/core/launch/stacks.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fstrain.core.launch.stacks import hang_report


@dataclass
class HangReports:
    run_dir: Path
    reports: dict[int, dict[str, Any]] = field(default_factory=dict)  # node rank -> its stacks report
    document: dict[str, Any] | None = None  # the report, once written

    def add(self, node_rank: int, stacks: dict[str, Any]) -> None:
        self.reports[node_rank] = stacks

    def write(self, reason: str, unanswered: Sequence[int]) -> dict[str, Any]:
        """RUN_DIR/stacks/rank<R>.<tool>.txt per rank and report.json; returns the report."""
        folder = self.run_dir / "stacks"
        folder.mkdir(parents=True, exist_ok=True)
        document, files = hang_report(self.reports, reason, sorted(unanswered))
        for name, text in files.items():
            (folder / name).write_text(text)
        document["folder"] = str(folder)
        (folder / "report.json").write_text(json.dumps(document, indent=2) + "\n")
        self.document = document
        return document
