"""What of a launcher's own output reaches the terminal: the cause, not the boilerplate.

torchrun prints, besides the ranks' lines (tagged with their local rank): a warning that
``--node-rank`` is ignored under c10d (every multi-node run), a Python traceback ending in
``SignalException`` when it is stopped (every node, on every teardown), and, when a rank fails,
a traceback ending in ``ChildFailedError`` with a report naming the rank that failed first.
Once the launcher is tearing the job down (``stopping``), the other nodes' torchruns print
their lost rendezvous store as C++ frame dumps and chained tracebacks: each traceback folds
into its exception line, the frame dumps and their blank lines are left out.
``NodeNoise`` folds each of these into at most one line and remembers which local rank failed,
so the summary can show that rank's own last lines. Everything still goes to the log files;
only the terminal is spared. Pure: lines in, lines out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

IGNORED = (
    re.compile(r"node_rank is only used for static rdzv_backend"),
)
TRACEBACK_START = "Traceback (most recent call last):"
CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
CXX_FRAMES = ("Exception raised from ", "frame #", "<omitting python frames>")
MAX_BLOCK_LINES = 500  # a traceback longer than this is shown as it is
_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_EXIT_CODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_SIGNAL = re.compile(r"SignalException: Process \d+ got signal: (\d+)")


@dataclass
class NodeNoise:
    """One node's launcher lines: ``feed`` each, show what it returns; ``flush`` at the end."""

    failed_rank: int | None = None  # global rank that failed first, from torchrun's report
    failed_local_rank: int | None = None
    failed_exit_code: int | None = None
    block: list[str] = field(default_factory=list)
    stopping: bool = False  # the launcher is tearing the job down
    in_report: bool = False  # inside the report that follows "ChildFailedError:"
    rules_seen: int = 0  # "=====" lines seen in that report

    def feed(self, local_rank: int | None, text: str) -> list[str]:
        if local_rank is not None:  # a rank's own line: always shown
            return [text]
        if self.block:
            return self._extend(text)
        if text.startswith(TRACEBACK_START):
            self.block = [text]
            return []
        if any(pattern.search(text) for pattern in IGNORED):
            return []
        if self.stopping and (not text.strip() or text.startswith(CXX_FRAMES + CHAINED)):
            return []
        return [text]

    def flush(self) -> list[str]:
        block, self.block, self.rules_seen, self.in_report = self.block, [], 0, False
        return block

    def _extend(self, text: str) -> list[str]:
        block = self.block
        block.append(text)
        if len(block) > MAX_BLOCK_LINES:
            return self.flush()
        if self.in_report:
            return self._child_failed(text)
        if text[:1].isspace() or text.startswith((TRACEBACK_START, *CHAINED)) or not text.strip():
            return []  # still inside the traceback
        # The exception line ends an ordinary traceback.
        signal = _SIGNAL.search(text)
        if signal:
            self.flush()
            return [f"torchrun stopped by signal {signal.group(1)} (its traceback is in the log)"]
        if "ChildFailedError" in text:
            self.in_report = True
            return []
        if self.stopping:
            self.flush()
            return [f"torchrun: {text.strip()} (its traceback is in the log)"]
        return self.flush()

    def _child_failed(self, text: str) -> list[str]:
        if text.startswith("====="):
            self.rules_seen += 1
            if self.rules_seen < 2:
                return []
            report = self.flush()
            self._read_root_cause(report)
            if self.failed_local_rank is None:
                return report
            return [f"torchrun: local rank {self.failed_local_rank} (rank {self.failed_rank}) failed first, "
                    f"exit code {self.failed_exit_code} (its report is in the log)"]
        return []

    def _read_root_cause(self, report: list[str]) -> None:
        lines = report[next((i for i, t in enumerate(report) if t.startswith("Root Cause")), len(report)):]
        for line in lines:
            rank = _ROOT_RANK.match(line)
            if rank and self.failed_local_rank is None:
                self.failed_rank, self.failed_local_rank = int(rank.group(1)), int(rank.group(2))
            code = _EXIT_CODE.match(line)
            if code and self.failed_exit_code is None:
                self.failed_exit_code = int(code.group(1))
