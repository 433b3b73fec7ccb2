"""fstrain/core/monitor/logtail.py on values: whole lines and byte offsets, forward and backwards."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest

from fstrain.core.monitor.logtail import (
    backward_lines,
    forward_chunks,
    last_lines,
    node_filter,
    node_line,
    split_rank_prefix,
    whole_end,
    whole_lines,
)


class Counted:
    """A file in memory behind the readers logtail takes, counting the bytes they read."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.bytes_read = 0

    def read_at(self, start: int, size: int) -> bytes:
        self.bytes_read += size
        return self.data[start:start + size]


def test_whole_lines_stop_at_the_last_newline() -> None:
    assert whole_lines(b"") == ([], 0)
    assert whole_lines(b"partial") == ([], 0)
    assert whole_lines(b"a\n\nb\npart") == ([b"a", b"", b"b"], 5)
    # An invalid UTF-8 byte is one byte of the offset (decoded it would be U+FFFD, three bytes).
    assert whole_lines(b"\xff\xfe bad\nnext") == ([b"\xff\xfe bad"], 7)


@pytest.mark.parametrize("chunk_bytes", [1, 3, 7, 64, 1 << 20])
def test_forward_chunks_whatever_the_chunk_size(chunk_bytes: int) -> None:
    data = b"first\n" + b"x" * 50 + b"\xff\n" + b"\n" + b"third \xc3\n" + b"partial"
    handle = io.BytesIO(data)
    handle.seek(6)
    pieces = list(forward_chunks(handle.read, 6, chunk_bytes))
    assert b"".join(p for p, _ in pieces) == data[6:data.rindex(b"\n") + 1]
    assert all(p.endswith(b"\n") for p, _ in pieces)
    offsets = [o for _, o in pieces]
    assert offsets == sorted(offsets) and offsets[-1] == data.rindex(b"\n") + 1
    # Each offset is where the next piece starts in the file.
    starts = [6, *offsets[:-1]]
    assert all(data[s:o] == p for (p, o), s in zip(pieces, starts, strict=True))


def test_forward_chunks_of_a_file_without_a_whole_line() -> None:
    assert list(forward_chunks(io.BytesIO(b"no newline yet").read, 0, 4)) == []


@pytest.mark.parametrize("block_bytes", [1, 2, 5, 16, 4096])
def test_backward_lines_across_block_boundaries(block_bytes: int) -> None:
    lines = [b"one", b"", b"a longer line than some blocks \xff\xfe", b"\xe2\x82", b"last"]
    data = b"\n".join(lines) + b"\n"
    file = Counted(data)
    assert list(backward_lines(file.read_at, len(data), block_bytes)) == lines[::-1]
    assert list(backward_lines(file.read_at, 0, block_bytes)) == []
    assert list(backward_lines(file.read_at, 4, block_bytes)) == [b"one"]


@pytest.mark.parametrize("block_bytes", [1, 3, 4096])
def test_whole_end_ignores_a_partial_last_line(block_bytes: int) -> None:
    file = Counted(b"a\nbb\nccc")
    assert whole_end(file.read_at, 8, block_bytes) == 5
    assert whole_end(file.read_at, 5, block_bytes) == 5
    assert whole_end(Counted(b"no newline").read_at, 10, block_bytes) == 0


def test_last_lines_with_a_long_last_line_and_a_partial_one() -> None:
    long = b"L" * 10_000
    data = b"a\nb\n" + long + b"\npartial, still being written"
    file = Counted(data)
    assert last_lines(file.read_at, len(data), 2, block_bytes=64) == ([b"b", long], 4 + len(long) + 1)
    assert last_lines(file.read_at, len(data), 10, block_bytes=64) == ([b"a", b"b", long], 4 + len(long) + 1)
    assert last_lines(file.read_at, len(data), 0) == ([], 4 + len(long) + 1)


def test_the_cost_of_a_tail_does_not_grow_with_the_file() -> None:
    line = b"1765000000.000 [default0]:step 1 loss 2.0\n"

    def tail_cost(size_lines: int) -> int:
        size = len(line) * size_lines

        def read_at(start: int, size_bytes: int) -> bytes:  # the same line over and over, never built
            nonlocal bytes_read
            bytes_read += size_bytes
            return (line * (size_bytes // len(line) + 2))[start % len(line):][:size_bytes]

        bytes_read = 0
        found, end = last_lines(read_at, size, 5)
        assert found == [line[:-1]] * 5 and end == size
        return bytes_read

    small, huge = tail_cost(100_000), tail_cost(10 ** 12 // len(line))  # 4.2 MB and 1 TB
    assert small == huge <= 2 * (1 << 16)


def test_a_filtered_tail_reads_back_until_enough_lines_match() -> None:
    rank1 = b"100.000 [default1]:rank one\n"
    data = rank1 + b"".join(b"%d.000 [default0]:step %d\n" % (200 + i, i) for i in range(5000))
    file = Counted(data)
    keep = node_filter(rank_offset=0, rank=1, since=None)
    assert last_lines(file.read_at, len(data), 3, keep) == ([rank1[:-1]], len(data))
    assert file.bytes_read >= len(data)  # to the start of the file: only one line matched
    file = Counted(data)
    keep = node_filter(rank_offset=0, rank=0, since=None)
    found, _ = last_lines(file.read_at, len(data), 3, keep, block_bytes=1024)
    assert found == [b"%d.000 [default0]:step %d" % (200 + i, i) for i in (4997, 4998, 4999)]
    assert file.bytes_read < len(data) / 10


def test_since_stops_reading_back_at_the_first_older_line() -> None:
    data = b"".join(b"%d.500 [default0]:line %d\n" % (i, i) for i in range(1, 10001))
    file = Counted(data)
    found, _ = last_lines(file.read_at, len(data), 1000, node_filter(None, None, since=9998.0), block_bytes=1024)
    assert found == [b"9998.500 [default0]:line 9998", b"9999.500 [default0]:line 9999",
                     b"10000.500 [default0]:line 10000"]
    assert file.bytes_read < len(data) / 10
    # A line without a time (not written by a watchdog) is skipped, not taken as the start.
    data = b"5.0 [default0]:old\n20.0 [default0]:new\nno time here\n21.0 [default1]:newer\n"
    assert last_lines(Counted(data).read_at, len(data), 10, node_filter(None, None, 10.0))[0] == [
        b"20.0 [default0]:new", b"21.0 [default1]:newer"]


def test_node_line_and_its_global_rank() -> None:
    assert node_line("1765000000.125 [default1]:hi there", 2) == (1765000000.125, 3, "hi there")
    assert node_line("1765000000.125 [default1]:hi there", None) == (1765000000.125, 1, "hi there")
    assert node_line("1765000000.125 launcher says", 2) == (1765000000.125, None, "launcher says")
    assert node_line("no-time [local0]:x", 4) == (0.0, None, "no-time [local0]:x")
    assert node_line("7.0 [local0]:\ufffd bad bytes", 4) == (7.0, 4, "\ufffd bad bytes")


@pytest.mark.parametrize(
    ("line", "expected"),
    [("[default3]:hello", (3, "hello")), ("[rank12]:x: y", (12, "x: y")),
     ("plain [1]: text", (None, "plain [1]: text")),
     ("[W1129 20:31:59 socket.cpp:207] warn", (None, "[W1129 20:31:59 socket.cpp:207] warn"))],
)
def test_rank_prefix(line: str, expected: tuple[int | None, str]) -> None:
    assert split_rank_prefix(line) == expected


def test_no_filter_means_no_keep() -> None:
    assert node_filter(3, None, None) is None
    keep: Callable[[bytes], bool | None] | None = node_filter(3, 4, None)
    assert keep is not None
    assert keep(b"1.0 [default1]:x") is True and keep(b"1.0 [default0]:x") is False
    assert keep(b"1.0 launcher") is False
