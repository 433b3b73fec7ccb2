"""What of a launcher's own output reaches the terminal: the cause, not the boilerplate.

torchrun prints, besides the ranks' lines (tagged with their local rank): a warning that
``--node-rank`` is ignored under c10d (every multi-node run), a Python traceback ending in
``SignalException`` when it is stopped (every node, on every teardown), and, when a rank fails,
a traceback ending in ``ChildFailedError`` with a report naming the rank that failed first.
When one node ends, the others' torchruns print their lost rendezvous store as C++ frame dumps
and chained tracebacks: such a traceback (and, once the launcher is tearing the job down, any
traceback) folds into its exception line; the frame dumps are left out (the line before each
says what failed).
``NodeNoise`` folds each of these into at most one line and remembers which local rank failed,
so the summary can show that rank's own last lines. A rank's metric lines
(:mod:`fstrain.core.monitor.metricline`: one JSON line per rank and step) are left out too:
``status --watch`` and ``fstrain report`` read them. Everything still goes to the log files;
only the terminal is spared. Pure: lines in, lines out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fstrain.core.monitor.metricline import PREFIX as METRIC_PREFIX
from fstrain.core.monitor.rankexit import FailureReportReader, RankFailure

IGNORED = (
    re.compile(r"node_rank is only used for static rdzv_backend"),
)
TRACEBACK_START = "Traceback (most recent call last):"
CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
CXX_FRAMES = ("Exception raised from ", "frame #", "<omitting python frames>")
# Exceptions torchrun raises when its rendezvous store (on the first node) is gone.
TEARDOWN_EXCEPTIONS = ("RendezvousConnectionError", "RendezvousClosedError", "DistNetworkError", "DistStoreError")
MAX_BLOCK_LINES = 500  # a traceback longer than this is shown as it is
_SIGNAL = re.compile(r"SignalException: Process \d+ got signal: (\d+)")


@dataclass
class NodeNoise:
    """One node's launcher lines: ``feed`` each, show what it returns; ``flush`` at the end."""

    failed: RankFailure | None = None  # the rank torchrun's report names as the first failure
    block: list[str] = field(default_factory=list)
    stopping: bool = False  # the launcher is tearing the job down
    after_fold: bool = False  # the last launcher line was a folded traceback (chained ones follow)
    in_report: bool = False  # inside the report that follows "ChildFailedError:"
    rules_seen: int = 0  # "=====" lines seen in that report

    def feed(self, local_rank: int | None, text: str) -> list[str]:
        if text.lstrip().startswith(METRIC_PREFIX):  # for the live view, the report and the logs, not for reading
            return []
        if local_rank is not None:  # a rank's own line: always shown
            return [text]
        if self.block:
            return self._extend(text)
        if text.startswith(TRACEBACK_START):
            self.block = [text]
            self.after_fold = False
            return []
        if any(pattern.search(text) for pattern in IGNORED) or text.startswith(CXX_FRAMES):
            return []
        if (self.stopping or self.after_fold) and (not text.strip() or text.startswith(CHAINED)):
            return []
        self.after_fold = False
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
            self.after_fold = True
            return [f"torchrun stopped by signal {signal.group(1)} (its traceback is in the log)"]
        if "ChildFailedError" in text:
            self.in_report = True
            return []
        if self.stopping or any(name in text for name in TEARDOWN_EXCEPTIONS):
            self.flush()
            self.after_fold = True
            return [f"torchrun: {text.strip()} (its traceback is in the log)"]
        return self.flush()

    def _child_failed(self, text: str) -> list[str]:
        if text.startswith("====="):
            self.rules_seen += 1
            if self.rules_seen < 2:
                return []
            report = self.flush()
            reader = FailureReportReader()
            for line in report:
                reader.feed(line)
            self.failed = reader.root_cause
            if self.failed is None:
                return report
            return [f"torchrun: {self.failed.describe()}, failed first (its report is in the log)"]
        return []
