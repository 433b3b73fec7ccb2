"""Output-integrity helpers: a payload whose every byte is checked, and CPU hogs beside it.

Every path that moves output (SSH reads, pipes, relays) is tested by counting: the payload mixes
empty, short, multi-byte and 64 KiB+ lines, ends without a newline, and is compared byte for byte
after it has crossed the path, while busy loops compete for the CPUs.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
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
