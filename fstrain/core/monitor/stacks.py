"""Hang analysis: which ranks are not where the others are.

Input: each live rank's Python stacks as ``faulthandler.dump_traceback(all_threads=True)``
writes them (the hook fstrain installs answers SIGUSR1 with one), or as ``py-spy dump`` prints
them. Output: per rank the innermost frame of its main thread, and the ranks whose frame differs
from the one most ranks share: in a hang, the ranks waiting inside the same collective agree,
and the rank that never reached it stands out. Pure: text in, values out.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# faulthandler: 'Thread 0x00007f... (most recent call first):' then '  File "x.py", line 3 in f'
HANG_REPORT_FORMAT = 1  # report.json's "format" (fstrain/core/formats.py "hang_report"; this runs on nodes alone)
_FH_THREAD_RE = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):")
_FH_FRAME_RE = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
# py-spy dump: 'Thread 123 (idle): "MainThread"' then '    func (file.py:12)'
_PYSPY_THREAD_RE = re.compile(r'^Thread (0x[0-9A-Fa-f]+|\d+) \((\w+)\)(?:: "(.*)")?')
_PYSPY_FRAME_RE = re.compile(r"^\s+(\S.*) \((.*):(\d+)\)$")
# Functions that mean "waiting for the other ranks" (torch.distributed, DeepSpeed's comm).
COLLECTIVES = ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "broadcast", "barrier",
               "all_to_all", "alltoall", "reduce", "gather", "scatter", "send", "recv", "wait", "monitored_barrier")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def short(self) -> str:
        return f"{self.function} ({self.file.rsplit('/', 1)[-1]}:{self.line})"


@dataclass(frozen=True)
class Thread:
    ident: str
    name: str  # py-spy names threads; faulthandler does not
    frames: tuple[Frame, ...]  # innermost first


def parse_stacks(text: str) -> list[Thread]:
    """Threads from a faulthandler dump or a py-spy dump (empty when neither is recognised)."""
    threads: list[Thread] = []
    ident, name = "", ""
    current: list[Frame] | None = None
    for line in text.splitlines():
        head = _FH_THREAD_RE.match(line) or _PYSPY_THREAD_RE.match(line)
        if head:
            if current is not None:
                threads.append(Thread(ident, name, tuple(current)))
            ident = head.group(2) if head.re is _FH_THREAD_RE else head.group(1)
            name = "" if head.re is _FH_THREAD_RE else (head.group(3) or "")
            current = []
            continue
        if current is None:
            continue
        match = _FH_FRAME_RE.match(line)
        if match:
            current.append(Frame(match.group(1), int(match.group(2)), match.group(3)))
            continue
        match = _PYSPY_FRAME_RE.match(line)
        if match:
            current.append(Frame(match.group(2), int(match.group(3)), match.group(1)))
    if current is not None:
        threads.append(Thread(ident, name, tuple(current)))
    return threads


def main_thread(threads: list[Thread]) -> Thread | None:
    """The main thread: named so by py-spy, else the one not started by ``threading`` (whose
    outermost frame is ``_bootstrap`` in threading.py)."""
    for thread in threads:
        if thread.name == "MainThread":
            return thread
    for thread in threads:
        if thread.frames and not (thread.frames[-1].file.endswith("threading.py")
                                  and thread.frames[-1].function.startswith("_bootstrap")):
            return thread
    return threads[0] if threads else None


def where(text: str) -> Frame | None:
    """The innermost frame of the main thread of one rank's dump."""
    thread = main_thread(parse_stacks(text))
    return thread.frames[0] if thread is not None and thread.frames else None


def in_collective(frame: Frame | None) -> bool:
    return frame is not None and frame.function in COLLECTIVES


@dataclass(frozen=True)
class HangReport:
    """Where each rank is, and the ranks that are not where most of the others are."""

    where: Mapping[int, Frame | None]  # rank -> innermost frame of its main thread (None: no dump)
    odd_ranks: tuple[int, ...]
    common: Frame | None  # the frame most ranks share, if at least two share it

    def lines(self) -> list[str]:
        out = []
        if self.common is not None:
            waiting = sorted(r for r, f in self.where.items() if f == self.common)
            out.append(f"ranks {_ranks(waiting)} are in {self.common.short()}")
        for rank in self.odd_ranks:
            frame = self.where.get(rank)
            out.append(f"rank {rank} is in {frame.short()}" if frame else f"rank {rank}: no stack could be read")
        return out


def _ranks(ranks: list[int]) -> str:
    return ",".join(map(str, ranks))


def analyse(dumps: Mapping[int, str], after_finish: bool = False) -> HangReport:
    """Name the ranks that differ. With some ranks already finished (the finish timeout), every
    live rank is a straggler; otherwise the ranks outside the largest group of identical frames
    are (all of them when no two ranks share a frame)."""
    found = {rank: where(text) for rank, text in sorted(dumps.items())}
    counts = Counter(frame for frame in found.values() if frame is not None)
    common: Frame | None = None
    if counts:
        (top, top_count), *rest = counts.most_common()
        if top_count >= 2 and not (rest and rest[0][1] == top_count):
            common = top
    if after_finish:
        odd = tuple(sorted(found))
    else:
        odd = tuple(rank for rank, frame in found.items() if frame != common or frame is None)
    return HangReport(found, odd, common)


FINISHED_REASON = "some ranks finished"  # how a --finish-timeout reason starts (fstrain/core/launch/supervisor.py)


def flight_recorder_lag(records: Mapping[int, Mapping[str, Any]]) -> tuple[list[int], list[str]]:
    """Ranks behind the others by their flight recorders (rank -> ``{"pg_status": {pg:
    {"last_enqueued_collective": ...}}, "entries": [...]}``, torch's ``_dump_fr_trace_json``):
    for each process group, the ranks that enqueued fewer collectives than the most any rank did
    never reached the collective the others wait in. Returns (those ranks, one line per group)."""
    enqueued: dict[str, dict[int, int]] = {}
    for rank, record in records.items():
        for pg, status in (record.get("pg_status") or {}).items():
            with contextlib.suppress(TypeError, ValueError, AttributeError):
                enqueued.setdefault(str(pg), {})[rank] = int(status.get("last_enqueued_collective", -1))
    behind: set[int] = set()
    lines: list[str] = []
    for pg, counts in sorted(enqueued.items()):
        top = max(counts.values())
        late = sorted(r for r, n in counts.items() if n < top)
        if not late:
            continue
        behind.update(late)
        name = _collective_name(records, pg, top)
        ranks = ", ".join(f"rank {r} ({counts[r]})" for r in late)
        lines.append(f"flight recorder, process group {pg}: {ranks} behind the others' collective {top}"
                     + (f" ({name})" if name else ""))
    return sorted(behind), lines


def _collective_name(records: Mapping[int, Mapping[str, Any]], pg: str, seq: int) -> str:
    for record in records.values():
        for entry in record.get("entries") or []:
            if str(entry.get("pg_id")) == pg and entry.get("collective_seq_id") == seq:
                return str(entry.get("profiling_name") or "")
    return ""


def hang_report(reports: Mapping[int, Mapping[str, Any]], reason: str,
                unanswered: Sequence[int], names: Sequence[str] = ()) -> tuple[dict[str, Any], dict[str, str]]:
    """The hang report and its stack files from every node's stacks report (node rank ->
    ``{"ranks": {rank: {"faulthandler", "py_spy"}}, "nccl_traces": [...]}``, as the watchdog's
    fstrain/io/remote/stacks.py collects them): (report document, file name -> text).
    ``names``: the nodes' hosts by node rank, to name where each NCCL trace is."""
    dumps: dict[int, str] = {}
    nodes_of: dict[int, int] = {}
    traces: list[str] = []
    files: dict[str, str] = {}
    recorders: dict[int, Mapping[str, Any]] = {}
    for node_rank, payload in sorted(reports.items()):
        where = names[node_rank] if 0 <= node_rank < len(names) else f"node rank {node_rank}"
        traces += [f"{where}: {path}" for path in payload.get("nccl_traces", [])]
        for rank_text, record in (payload.get("flight_recorder") or {}).items():
            recorders[int(rank_text)] = record
            files[f"rank{rank_text}.flight-recorder.json"] = json.dumps(
                {"pg_status": record.get("pg_status"), "entries": record.get("entries")}, indent=1)
        for rank_text, entry in payload.get("ranks", {}).items():
            rank = int(rank_text)
            dumps[rank], nodes_of[rank] = entry.get("faulthandler") or entry.get("py_spy") or "", node_rank
            for kind in ("faulthandler", "py_spy"):
                if entry.get(kind):
                    files[f"rank{rank}.{kind.replace('_', '-')}.txt"] = entry[kind]
    hang = analyse(dumps, after_finish=reason.startswith(FINISHED_REASON))
    document = {
        "format": HANG_REPORT_FORMAT,
        "reason": reason,
        "odd_ranks": list(hang.odd_ranks),
        "where": {str(r): (f.short() if f else None) for r, f in hang.where.items()},
        "node_of_rank": {str(r): n for r, n in nodes_of.items()},
        "common": hang.common.short() if hang.common else None,
        "summary": hang.lines(),
        "nccl_traces": traces,
        "unanswered_nodes": list(unanswered),
    }
    if recorders:
        behind, lines = flight_recorder_lag(recorders)
        document["flight_recorder_behind"] = behind
        document["summary"] = [*hang.lines(), *lines]
    return document, files
