"""Which rank failed first, and with what exit code: read from the launchers' own output.

torchrun ends a failed worker group with exit code 1 whatever the rank did; the rank's own
code is in the failure report it prints on stderr, whose "Root Cause (first observed failure)"
record names the global rank, the local rank and the exit code (negative for a signal)::

    Root Cause (first observed failure):
    [0]:
      time      : 2026-11-30_15:10:48
      host      : node2
      rank      : 3 (local_rank: 1)
      exitcode  : -11 (pid: 10059)  (SIGSEGV)

DeepSpeed's per-node launcher exits with the failing rank's own return code, which a negative
(signal) code turns into ``256 + code`` (``sys.exit(-11)`` is 245), and never says which rank
that was: the node's watchdog catches the first rank that exits non-zero and reports it
(``rank_exit``, read with ``rank_exit_report``). The direct backend's script (fstrain's own,
fstrain/io/remote/ranks.py) reports the first failure in that same event and exits with its code.

Pure and stdlib-only: fed one output line at a time, by the launcher and by the detached
coordinator alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ROOT_CAUSE = "Root Cause (first observed failure):"
_FIELD_RE = re.compile(r"^\s*(time|host|rank|exitcode)\s*:\s*(.*?)\s*$")
_RANK_RE = re.compile(r"^(-?\d+) \(local_rank: (\d+)\)")
_EXITCODE_RE = re.compile(r"^(-?\d+)")
_END_RE = re.compile(r"^[=]{10,}\s*$")
# Linux signal numbers (the same on x86-64 and aarch64), so this module needs no ``signal``.
SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 5: "SIGTRAP", 6: "SIGABRT", 7: "SIGBUS",
                8: "SIGFPE", 9: "SIGKILL", 10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2", 13: "SIGPIPE",
                14: "SIGALRM", 15: "SIGTERM", 24: "SIGXCPU", 25: "SIGXFSZ", 31: "SIGSYS"}


@dataclass(frozen=True)
class RankFailure:
    """One rank's failure: its global rank (where known), local rank, and the code fstrain
    returns for it (128 + signal for a signal death, as a shell reports it)."""

    rank: int | None
    local_rank: int | None
    exit_code: int
    host: str = ""

    @property
    def signal_name(self) -> str:
        return signal_name(self.exit_code)

    def describe(self) -> str:
        """``rank 3 (local rank 1), exit 139 (SIGSEGV)``."""
        who = f"rank {self.rank}" if self.rank is not None else "a rank"
        if self.local_rank is not None:
            who += f" (local rank {self.local_rank})"
        return f"{who}, exit {describe_code(self.exit_code)}"


def shell_code(raw: int) -> int:
    """A process status as a shell reports it: a signal death (negative) is 128 + signal."""
    return 128 - raw if raw < 0 else raw


def signal_name(code: int) -> str:
    """``SIGSEGV`` for 139, "" when ``code`` is not 128 + a known signal."""
    return SIGNAL_NAMES.get(code - 128, "") if code > 128 else ""


def describe_code(code: int) -> str:
    name = signal_name(code)
    return f"{code} ({name})" if name else str(code)


def deepspeed_launcher_code(code: int) -> int:
    """DeepSpeed's launcher passes a rank's negative (signal) return code to ``sys.exit``,
    which the OS truncates to ``256 + code``: 245 is SIGSEGV, reported as 139."""
    if 256 - 64 < code < 256:  # -1 .. -63: the signals
        return 128 + (256 - code)
    return code


class FailureReportReader:
    """Feed torchrun's output lines; ``root_cause`` is set once its record has been read."""

    def __init__(self) -> None:
        self.root_cause: RankFailure | None = None
        self._in_root = False
        self._fields: dict[str, str] = {}

    def feed(self, line: str) -> None:
        text = line.rstrip("\n")
        if _ROOT_CAUSE in text:
            self._in_root, self._fields = True, {}
            return
        if not self._in_root:
            return
        if _END_RE.match(text.strip()):
            self._finish()
            return
        match = _FIELD_RE.match(text)
        if match:
            self._fields[match.group(1)] = match.group(2)
            if "exitcode" in self._fields and "rank" in self._fields:
                self._finish()

    def observed(self, failure: RankFailure | None) -> None:
        """A failure seen another way (the watchdog caught the rank's exit): kept unless the
        launcher's own record already named one."""
        if failure is not None and self.root_cause is None:
            self.root_cause = failure

    def _finish(self) -> None:
        self._in_root = False
        fields, self._fields = self._fields, {}
        code = _EXITCODE_RE.match(fields.get("exitcode", ""))
        if code is None:
            return
        rank = _RANK_RE.match(fields.get("rank", ""))
        self.root_cause = RankFailure(
            rank=int(rank.group(1)) if rank else None,
            local_rank=int(rank.group(2)) if rank else None,
            exit_code=shell_code(int(code.group(1))),
            host=fields.get("host", ""),
        )


def node_failure(backend: str, node_exit_code: int | None, root_cause: RankFailure | None,
                 rank_offset: int | None = None) -> RankFailure | None:
    """The rank failure behind a node's non-zero exit: torchrun's root-cause record (its own
    exit code is always 1), or DeepSpeed's launcher code (the rank's own, signals folded back
    to 128 + signal). None for a node that exited 0 or was lost."""
    if node_exit_code is None or node_exit_code == 0:
        return None
    if backend == "torchrun":
        if root_cause is None:
            return None
        rank = root_cause.rank
        if rank is None and rank_offset is not None and root_cause.local_rank is not None:
            rank = rank_offset + root_cause.local_rank
        return RankFailure(rank, root_cause.local_rank, root_cause.exit_code, root_cause.host)
    if root_cause is not None:  # the watchdog (direct: fstrain's own rank script) saw which rank exited first
        return root_cause
    if backend == "direct":  # the script exits with the rank's code as a shell reports it
        return RankFailure(None, None, node_exit_code)
    return RankFailure(None, None, deepspeed_launcher_code(node_exit_code))


def rank_exit_report(report: object) -> RankFailure | None:
    """The watchdog's ``rank_exit`` report, ``{"rank", "local_rank", "exit_code"}``, as a
    RankFailure; None for anything else."""
    if not isinstance(report, dict):
        return None
    rank, local_rank, code = report.get("rank"), report.get("local_rank"), report.get("exit_code")
    if not isinstance(rank, int) or not isinstance(code, int) or not 0 < code < 256:
        return None
    return RankFailure(rank, local_rank if isinstance(local_rank, int) else None, code)
