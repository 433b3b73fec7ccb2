"""The line-integrity writer: every rank writes FSTRAIN_TEST_LINES lines (tests/integrity.py
``rank_line``: plain lines, lines in two writes, lines on stderr, lines with invalid UTF-8 bytes,
and one in FSTRAIN_TEST_LONG_EVERY a 64 KiB line), then exits 0.

A two-part line is written as ``print(..., end='')`` then the rest would be: its first half, a
pause of FSTRAIN_TEST_PAUSE_S, then the rest with its newline, so a reader of the output sees
the half line alone. With FSTRAIN_TEST_FAIL_FIRST_ATTEMPT=1, torchrun's first attempt
(TORCHELASTIC_RESTART_COUNT 0) ends its lines with ``half_line(rank)``, without a newline, and
exits 3 once every rank of the node has written as much; the attempt after the restart writes
the same lines and exits 0."""

from __future__ import annotations

import os
import time

from tests.integrity import half_line, line_kind, rank_line


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def main() -> None:
    rank = int(os.environ.get("RANK", "0"))
    count = int(os.environ.get("FSTRAIN_TEST_LINES", "1000"))
    long_every = int(os.environ.get("FSTRAIN_TEST_LONG_EVERY", "25"))
    pause_s = float(os.environ.get("FSTRAIN_TEST_PAUSE_S", "0.002"))
    for number in range(count):
        line = rank_line(rank, number, long_every)
        kind = line_kind(number, long_every)
        fd = 2 if kind == "stderr" else 1
        if kind == "two-part":
            cut = len(line) // 2
            write_all(fd, line[:cut])
            if pause_s:
                time.sleep(pause_s)
            write_all(fd, line[cut:] + b"\n")
        else:
            write_all(fd, line + b"\n")
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if os.environ.get("FSTRAIN_TEST_FAIL_FIRST_ATTEMPT") == "1" and first_attempt:
        write_all(1, half_line(rank))
        # Exit once every rank of the node has written all: the first exit ends the others.
        written = os.path.join(os.environ["FSTRAIN_RUN_DIR"], "lines-written")
        os.makedirs(written, exist_ok=True)
        open(os.path.join(written, str(rank)), "w").close()
        deadline = time.monotonic() + 60
        while len(os.listdir(written)) < int(os.environ.get("LOCAL_WORLD_SIZE", "1")) and time.monotonic() < deadline:
            time.sleep(0.05)
        os._exit(3)


if __name__ == "__main__":
    main()
