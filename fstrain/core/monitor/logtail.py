"""Reading log files by whole lines at a bounded cost: forward in fixed-size chunks from a byte
offset, or backwards from the end for the last N lines, with the exact byte offset where the
next read starts.

Offsets count the bytes of the file, never the text they decode to: an invalid UTF-8 byte is one
byte here (decoded, it becomes U+FFFD, three bytes), so a reader that goes on from an offset
never skips or repeats a byte. A partial last line (no newline yet) is never returned; the
offset stays in front of it, and the next read gets it whole.

The file is reached through a reader passed in (``read(n)`` forward, ``read_at(start, n)``
backwards), so this module does no I/O itself; it is stdlib only and imports nothing from
fstrain, because it also travels to the nodes with fstrain/io/remote/runctl.py, which reads a
detached run's output files there.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

TAIL_BLOCK_BYTES = 1 << 16  # read backwards this much at a time: a few lines' worth, many times over
CHUNK_BYTES = 1 << 20  # read forward this much at a time

# The local-rank tag of a line: the watchdog's relay of the ranks' log files ([local3]:, both
# backends), or torchrun's own --tee prefix ([default3]:, [rank3]: in newer releases), which the
# node files of runs started by earlier fstrain releases hold. A word before the number is
# required: torchrun's failure report prints "[0]:" headers that are not rank tags.
_RANK_PREFIX_RE = re.compile(r"^\[(?:default|rank|local)(\d+)\]:(.*)$")


def whole_lines(chunk: bytes) -> tuple[list[bytes], int]:
    """The whole lines of ``chunk`` (without their newline) and the bytes they take, i.e. the
    offset from the chunk's start just after its last newline; what follows it is a partial line."""
    end = chunk.rfind(b"\n") + 1
    return (chunk[: end - 1].split(b"\n") if end else []), end


def forward_chunks(read: Callable[[int], bytes], offset: int,
                   chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[bytes, int]]:
    """From a file positioned at byte ``offset``: pieces of whole lines (each ending with a
    newline) of about ``chunk_bytes``, each with the file's offset just after it. A line longer
    than a chunk comes whole in one piece; a partial line at the end of the file is not read."""
    partial: list[bytes] = []  # the start of a line whose newline has not been read yet
    while True:
        block = read(chunk_bytes)
        if not block:
            return
        end = block.rfind(b"\n") + 1
        if not end:
            partial.append(block)
            continue
        piece = b"".join([*partial, block[:end]]) if partial else block[:end]
        partial = [block[end:]] if end < len(block) else []
        offset += len(piece)
        yield piece, offset


def backward_lines(read_at: Callable[[int, int], bytes], end: int,
                   block_bytes: int = TAIL_BLOCK_BYTES) -> Iterator[bytes]:
    """The lines of the file's first ``end`` bytes, last first, read backwards in blocks.
    ``end`` is 0 or just after a newline (see :func:`whole_end`); lines come without it."""
    if end <= 0:
        return
    position = end - 1  # the last line's newline: not part of any line
    pieces: list[bytes] = []  # the line being assembled, its last piece first
    while position > 0:
        start = max(0, position - block_bytes)
        parts = read_at(start, position - start).split(b"\n")
        position = start
        if len(parts) == 1:
            pieces.append(parts[0])
            continue
        pieces.append(parts[-1])
        yield b"".join(reversed(pieces))
        yield from reversed(parts[1:-1])
        pieces = [parts[0]]
    yield b"".join(reversed(pieces))


def whole_end(read_at: Callable[[int, int], bytes], size: int, block_bytes: int = TAIL_BLOCK_BYTES) -> int:
    """The offset just after the last newline of the file's first ``size`` bytes (0 if none)."""
    position = size
    while position > 0:
        start = max(0, position - block_bytes)
        newline = read_at(start, position - start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        position = start
    return 0


def last_lines(read_at: Callable[[int, int], bytes], size: int, count: int,
               keep: Callable[[bytes], bool | None] | None = None,
               block_bytes: int = TAIL_BLOCK_BYTES) -> tuple[list[bytes], int]:
    """The last ``count`` whole lines of a file of ``size`` bytes for which ``keep(line)`` is
    true, in file order, and the offset just after the last whole line (where following goes
    on). ``keep`` returning None stops the search there (a line older than --since: the ones
    before it are older still). Only the blocks that hold those lines are read."""
    end = whole_end(read_at, size, block_bytes)
    found: list[bytes] = []
    if count > 0:
        for line in backward_lines(read_at, end, block_bytes):
            verdict = True if keep is None else keep(line)
            if verdict is None:
                break
            if verdict:
                found.append(line)
                if len(found) == count:
                    break
    found.reverse()
    return found, end


def split_rank_prefix(line: str) -> tuple[int | None, str]:
    """The local-rank tag of a line -> (local rank, text); lines without one (the launchers'
    own) -> (None, line)."""
    match = _RANK_PREFIX_RE.match(line)
    if match is None:
        return None, line
    return int(match.group(1)), match.group(2)


def node_line(line: str, rank_offset: int | None) -> tuple[float, int | None, str]:
    """A line of a detached node's output file (``node<I>.out``: the time, a space, the line)
    -> (time, global rank or None, text without the rank tag). A line without a time gets 0."""
    stamp, _, rest = line.partition(" ")
    try:
        at = float(stamp)
    except ValueError:
        at, rest = 0.0, line
    local, text = split_rank_prefix(rest)
    return at, (None if local is None else local + (rank_offset or 0)), text


def without(hide: str | None) -> Callable[[bytes], bool] | None:
    """``keep`` for :func:`last_lines`: every line but those that carry the text ``hide``
    (`fstrain logs --no-metrics`: the metric lines). None when nothing is hidden."""
    if hide is None:
        return None
    mark = hide.encode()
    return lambda raw: mark not in raw


def node_filter(rank_offset: int | None, rank: int | None, since: float | None,
                hide: str | None = None) -> Callable[[bytes], bool | None] | None:
    """``keep`` for :func:`last_lines` over a node's output file: only global rank ``rank``'s
    lines, only lines at ``since`` (Unix seconds) or later, stopping at the first older one
    (each node writes its lines in time order), none that carries ``hide``. None when nothing
    is filtered."""
    shown = without(hide)
    if rank is None and since is None:
        return shown

    def keep(raw: bytes) -> bool | None:
        at, line_rank, _ = node_line(raw.decode(errors="replace"), rank_offset)
        if since is not None and at < since:
            return None if at > 0 else False
        return (rank is None or line_rank == rank) and (shown is None or shown(raw))

    return keep
