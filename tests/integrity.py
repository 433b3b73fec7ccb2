"""Output-integrity helpers: a payload whose every byte is checked, and CPU hogs beside it.

Every path that moves output (SSH reads, pipes, relays) is tested by counting: the payload mixes
empty, short, multi-byte and 64 KiB+ lines, ends without a newline, and is compared byte for byte
after it has crossed the path, while busy loops compete for the CPUs.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOG_LIMIT_S = 600  # a hog ends by itself even if its test dies without stopping it


def payload_lines(total_bytes: int, seed: int = 1) -> list[str]:
    """Deterministic lines adding up to about ``total_bytes``: every length from 0 to 70,000
    characters turns up, with multi-byte characters and a line number in each."""
    lines: list[str] = []
    size, state, number = 0, seed, 0
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 é中€-_=+[]:;"
    while size < total_bytes:
        state = (state * 1103515245 + 12345) % 2**31
        length = (0, 1, 80, 200, 4096, 4097, 65536, 70000)[state % 8] if state % 5 == 0 else state % 300
        body = (alphabet[state % len(alphabet)] * length)[:length]
        line = f"{number}:{body}"
        lines.append(line)
        size += len(line.encode()) + 1
        number += 1
    return lines


def payload(total_bytes: int, seed: int = 1) -> str:
    """The payload as one text: its lines joined by newlines, the last one without a newline."""
    return "\n".join(payload_lines(total_bytes, seed))


_SPIN = "import time\nend = time.monotonic() + {limit_s}\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def cpu_hogs(count: int = 3, limit_s: float = HOG_LIMIT_S) -> Iterator[None]:
    """``count`` busy processes for the duration of the block (each ends by itself after ``limit_s``).

    Separate interpreters, not forks: a fork would inherit the test's open pipes and keep their
    readers from ever seeing end of file."""
    hogs = [subprocess.Popen([sys.executable, "-c", _SPIN.format(limit_s=limit_s)]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(10)


CAT_TWICE = ["sh", "-c", 'cat "$1"; cat "$1" >&2', "sh"]  # + a file: it on stdout, then on stderr


def started_lines(transport: Any, path: str) -> tuple[tuple[int | None, str | None], dict[str, list[str]]]:
    """Start ``cat PATH; cat PATH >&2`` with ``transport.start``: its exit and its lines per stream."""
    running = transport.start([*CAT_TWICE, path])
    running.close_stdin()
    got: dict[str, list[str]] = {"stdout": [], "stderr": []}
    for stream, line in running.lines():
        got[stream].append(line)
    ended = running.wait()
    running.close()
    return ended, got


# The line-integrity writer (tests/cluster/programs/lines.py): rank R's line N is a pure function
# of (R, N), so whoever reads the output back knows every line it must find, once and whole.
LINE_KINDS = ("plain", "two-part", "stderr", "bad-bytes", "64k")
LONG_LINE_BYTES = 65536


def line_kind(number: int, long_every: int) -> str:
    """Which kind line ``number`` is: one in ``long_every`` a 64 KiB line, then by number mod 4."""
    if long_every and number % long_every == long_every - 1:
        return "64k"
    return ("plain", "two-part", "stderr", "bad-bytes")[number % 4]


def rank_line(rank: int, number: int, long_every: int) -> bytes:
    """Line ``number`` of rank ``rank``, without its newline: a head naming both and the kind, a
    body (64 KiB for "64k", invalid UTF-8 bytes for "bad-bytes"), and " END"."""
    kind = line_kind(number, long_every)
    if kind == "64k":
        body = b"%d" % (number % 10) * LONG_LINE_BYTES
    elif kind == "bad-bytes":
        body = b"\xff\xfe bad \xc3 bytes \x80"
    else:
        body = b"x" * (number % 61)
    return b"R=%d N=%07d %s %s END" % (rank, number, kind.encode(), body)


def half_line(rank: int) -> bytes:
    """What the writer's failing attempt writes last, without a newline."""
    return b"R=%d attempt 0 ends in half a line" % rank


@dataclass
class LineReport:
    """What came back of ``ranks`` x ``count`` writer lines: each expected line whole once, or
    lost, or more than once; anything else tagged with a rank is a broken (split or glued) line."""

    checked: int = 0
    whole: int = 0
    lost: int = 0
    duplicated: int = 0
    broken: int = 0
    out_of_order: int = 0  # ranks whose stdout lines did not come in the order written
    kinds: dict[str, list[int]] = field(default_factory=dict)  # kind -> [whole, expected]
    examples: list[str] = field(default_factory=list)  # a few broken lines, cut short

    @property
    def ok(self) -> bool:
        return self.whole == self.checked and not (self.duplicated or self.broken or self.out_of_order)

    def summary(self) -> str:
        kinds = ", ".join(f"{kind} {w}/{n}" for kind, (w, n) in self.kinds.items())
        return (f"{self.whole}/{self.checked} whole, {self.lost} lost, {self.duplicated} duplicated, "
                f"{self.broken} broken, {self.out_of_order} ranks out of order ({kinds})"
                + (f"; broken e.g. {self.examples}" if self.examples else ""))


def check_lines(got: Iterable[tuple[int, bytes]], ranks: int, count: int, long_every: int,
                decoded: bool) -> LineReport:
    """Count the writer's lines in ``got`` ((global rank, line) in the order read). ``decoded``:
    the path decoded the bytes (invalid ones became U+FFFD), so compare with the same decoding."""
    def expected(rank: int, number: int) -> bytes:
        line = rank_line(rank, number, long_every)
        return line.decode(errors="replace").encode() if decoded else line

    index = {expected(r, n): (r, n) for r in range(ranks) for n in range(count)}
    seen: Counter[tuple[int, int]] = Counter()
    last: dict[int, int] = {}
    disordered: set[int] = set()
    report = LineReport(checked=ranks * count)
    for rank, line in got:
        found = index.get(line)
        if found is None or found[0] != rank:
            report.broken += 1
            if len(report.examples) < 3:
                report.examples.append(repr(line[:80]))
            continue
        seen[found] += 1
        if line_kind(found[1], long_every) != "stderr":  # one stream: its lines keep their order
            if found[1] < last.get(rank, -1):
                disordered.add(rank)
            last[rank] = found[1]
    for kind in LINE_KINDS:
        report.kinds[kind] = [0, 0]
    for rank in range(ranks):
        for number in range(count):
            times = seen[(rank, number)]
            tally = report.kinds[line_kind(number, long_every)]
            tally[1] += 1
            if times:
                report.whole += 1
                tally[0] += 1
                report.duplicated += times - 1
            else:
                report.lost += 1
    report.out_of_order = len(disordered)
    return report


_SHOWN_RE = re.compile(rb"^\[\S+ r(\d+)\] (.*)$", re.DOTALL)


def shown_lines(text: bytes) -> list[tuple[int, bytes]]:
    """``[host rN] text`` lines (fstrain launch, fstrain logs) -> (N, text); others are left out."""
    found = []
    for line in text.split(b"\n"):
        match = _SHOWN_RE.match(line)
        if match:
            found.append((int(match.group(1)), match.group(2)))
    return found


_NODE_OUT_RE = re.compile(rb"^\d+\.\d+ \[(?:default|rank|local)(\d+)\]:(.*)$", re.DOTALL)


def node_out_lines(raw: bytes, rank_offset: int) -> list[tuple[int, bytes]]:
    """A detached node's ``node<I>.out`` (``TIME [localL]:line``, the bytes as the ranks wrote them)
    -> (global rank, line) of its rank lines."""
    found = []
    for line in raw.split(b"\n"):
        match = _NODE_OUT_RE.match(line)
        if match:
            found.append((int(match.group(1)) + rank_offset, match.group(2)))
    return found


WRITER = str(Path(__file__).resolve().parent / "cluster" / "programs" / "lines.py")


def writer_launch_args(backend: str, lines: int, long_every: int, pause_s: float) -> list[str]:
    """`fstrain launch` options and program for the line-integrity writer on ``backend``."""
    repo = str(Path(__file__).resolve().parent.parent)
    return ["--backend", backend, "--env", f"PYTHONPATH={repo}", "--env", f"FSTRAIN_TEST_LINES={lines}",
            "--env", f"FSTRAIN_TEST_LONG_EVERY={long_every}", "--env", f"FSTRAIN_TEST_PAUSE_S={pause_s}",
            *(["--no-local-rank"] if backend == "deepspeed" else []), "--", "python3", WRITER]
