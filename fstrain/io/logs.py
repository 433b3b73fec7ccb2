"""A run's output for `fstrain logs` and `fstrain attach`, read at a bounded cost.

- A detached run: each node's ``node<I>.out``, read on the node itself by
  fstrain/io/remote/runctl.py (``lines``), every node at once (one thread each), the lines
  merged by the time in front of each. A tail of at most VIEW_LINES lines of a live run comes
  from the nodes' views that node 0's coordinator holds (one SSH session), where they hold it;
  so do a follow's new lines, where a view's last lines add up to exactly the bytes its node
  wrote since the last read.
- An attached run or a Slurm job: files on this machine (``RUN_DIR/logs/``, the job's output
  file), read here.

Both read through fstrain/core/monitor/logtail.py. With ``tail`` only the blocks at the end that hold
the last N (matching) lines are read, so the cost does not grow with the file; a whole read goes
forward a chunk at a time (at most about LIMIT_BYTES of a node's file per remote read), never
holding a file in memory. Offsets count bytes, so a read goes on exactly where the last one
ended, whatever bytes the lines hold.
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
import queue
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from fstrain.core.hosts.hostfile import Host
from fstrain.core.monitor import logtail
from fstrain.errors import FstrainError
from fstrain.io.remote import as_line, line_script

if TYPE_CHECKING:
    from fstrain.io.transport.base import Transport

LIMIT_BYTES = 2 << 20  # of a node's file per remote read: about what one node's answer holds here
READ_TIMEOUT_S = 120.0  # one remote read: LIMIT_BYTES over a slow link, or a tail
VIEW_LINES = 10  # the last lines of a node that its view on node 0 holds (coordinator.py TAIL_LINES)
BATCH_LINES = 1024  # lines handed from a node's reader to the merge at a time
QUEUE_BATCHES = 4  # per node, read but not printed yet (the reader waits beyond that)


@dataclass(frozen=True)
class NodeFile:
    """One node's output file, ``RUN_DIR/node<I>.out`` on ``host``, whose local ranks start at
    ``rank_offset`` (None: its lines name global ranks already)."""

    host: Host
    run_dir: str
    node_rank: int
    rank_offset: int | None


def _tagged(node: NodeFile, line: str) -> tuple[float, str]:
    """A line of ``node<I>.out`` -> (its time, the line as `logs` prints it: ``[host rN] text``)."""
    at, rank, rest = logtail.node_line(line, node.rank_offset)
    tag = node.host.name if rank is None else f"{node.host.name} r{rank}"
    return at, f"[{tag}] {rest}\n"


class Unread(Exception):
    """A node's output could not be read this time (the reason is the message)."""


class NodeOutputs:
    """A detached run's output files, one per node, read over each node's transport; each read
    goes on from where the node's last one ended. Only global rank ``rank``'s lines, only lines
    from ``since`` (Unix seconds) on, none that carries the text ``hide``, when given (filtered
    on the node)."""

    def __init__(self, nodes: Sequence[NodeFile], connect: Callable[[Host], Transport], python: str, *,
                 rank: int | None = None, since: float | None = None, hide: str | None = None,
                 views: Callable[[], Mapping[int, Mapping[str, Any] | None]] | None = None) -> None:
        self.nodes = list(nodes)
        self._views = views  # node rank -> its view, as node 0's coordinator holds it (a live run)
        self.failed: dict[str, str] = {}  # host label -> why its last read failed
        self.offsets = [0] * len(self.nodes)
        self._connect = connect
        self._python = python
        self._rank = rank
        self._since = since
        self._hide = hide
        self._transports: dict[int, Transport] = {}
        self._stdin = as_line("runctl") + (json.dumps(Path(logtail.__file__).read_text()) + "\n").encode()

    def read(self, tail: int | None = None, *, views: bool = True) -> Iterator[str]:
        """Every node's whole lines since its last read, tagged ``[host rN]``, merged by time,
        each ending with a newline; with ``tail``, only the last ``tail`` of them (each node's
        last ``tail``, read backwards from the end, then merged). What the nodes' views on node
        0 hold exactly is taken from them (one SSH session), the rest read on each node;
        ``views=False`` reads every node itself (the last read of a run that has ended). Once it
        is exhausted, :attr:`failed` names the hosts that could not be read."""
        channels: list[queue.Queue[list[tuple[float, str]] | None]] = [queue.Queue(QUEUE_BATCHES)
                                                                       for _ in self.nodes]
        served: dict[int, list[tuple[float, str]]] = {}
        if views and self._views is not None:
            served = self._tails_from_views(tail) if tail is not None else self._news_from_views()
        for index, batch in served.items():
            channels[index].put(batch)
            channels[index].put(None)
        threads = [threading.Thread(target=self._pump, args=(index, tail, channel), daemon=True,
                                    name=f"fstrain-logs-{node.host.label()}")
                   for index, (node, channel) in enumerate(zip(self.nodes, channels, strict=True))
                   if index not in served]
        for thread in threads:
            thread.start()
        merged: Iterable[tuple[float, str]] = heapq.merge(
            *(itertools.chain.from_iterable(iter(c.get, None)) for c in channels), key=lambda item: item[0])
        if tail is not None:
            merged = deque(merged, maxlen=tail)
        for _, line in merged:
            yield line
        for thread in threads:
            thread.join()

    def _pump(self, index: int, tail: int | None, channel: queue.Queue[list[tuple[float, str]] | None]) -> None:
        """Read one node's new lines into ``channel`` in batches (None at the end), a remote read
        at a time."""
        node = self.nodes[index]
        try:
            while True:
                text, answer = self._ask(index, tail)
                batch: list[tuple[float, str]] = []
                for line in text.split("\n")[:-1]:
                    batch.append(_tagged(node, line.rstrip("\r")))
                    if len(batch) == BATCH_LINES:
                        channel.put(batch)
                        batch = []
                if batch:
                    channel.put(batch)
                self.offsets[index] = int(answer["offset"])
                if tail is not None or not answer.get("more"):
                    break
            self.failed.pop(node.host.label(), None)
        except Exception as exc:  # in this thread it would be a traceback and a node silently missing
            why = str(exc) if isinstance(exc, Unread) else f"{type(exc).__name__}: {exc}"
            for name in (node.host.label(), node.host.name):  # the host is named where the reason is shown
                why = why.removeprefix(f"{name}: ")
            self.failed[node.host.label()] = why
            transport = self._transports.pop(index, None)  # a fresh connection next time
            if transport is not None:
                transport.close()
        finally:
            channel.put(None)

    def _tails_from_views(self, tail: int) -> dict[int, list[tuple[float, str]]]:
        """Each node's last ``tail`` (matching) lines from its view on node 0 (its last
        VIEW_LINES lines, with their times and the file's size after them), by node index: one
        SSH session for every node. A node whose view is missing, or holds fewer matching lines
        than asked, is read on the node itself."""
        if self._views is None or tail > VIEW_LINES:
            return {}
        views = self._views()
        served: dict[int, list[tuple[float, str]]] = {}
        for index, node in enumerate(self.nodes):
            keep = logtail.node_filter(node.rank_offset, self._rank, self._since, self._hide)
            found = _view_tail(views, node)
            if found is None:
                continue
            lines, times, size = found.lines, found.times, found.size
            picked: list[str] = []
            enough = False
            for text, at in zip(reversed(lines), reversed(times), strict=True):
                raw = _file_line(at, text)
                wanted = keep(raw.encode()) if keep is not None else True
                if wanted is None:  # older than --since: none before it is either
                    enough = True
                    break
                if wanted:
                    picked.append(raw)
                    if len(picked) == tail:
                        enough = True
                        break
            if not enough and not _whole_file(lines, times, size):
                continue
            served[index] = [_tagged(node, raw) for raw in reversed(picked)]
            self.offsets[index] = size  # a read after this one goes on after these lines
        return served

    def _news_from_views(self) -> dict[int, list[tuple[float, str]]]:
        """Each node's lines since its last read from its view on node 0, by node index, where
        the view holds exactly those: the bytes of its last lines, as the watchdog wrote them,
        add up to the file's size after them less what was read before (none: nothing new). One
        SSH session for every node; a node whose view is missing, older than the last read, or
        short of lines is read on the node itself."""
        assert self._views is not None
        views = self._views()
        served: dict[int, list[tuple[float, str]]] = {}
        for index, node in enumerate(self.nodes):
            found = _view_tail(views, node)
            offset = self.offsets[index]
            if found is None or found.size < offset:
                continue
            if found.size == offset == 0 and not found.lines and not found.size_known:
                continue  # a view from before the node measured its file: a line may be there
            raws = _lines_adding_up(found.lines, found.times, found.size - offset)
            if raws is None:
                continue
            keep = logtail.node_filter(node.rank_offset, self._rank, self._since, self._hide)
            served[index] = [_tagged(node, raw) for raw in raws if keep is None or keep(raw.encode())]
            self.offsets[index] = found.size
        return served

    def _ask(self, index: int, tail: int | None) -> tuple[str, dict[str, Any]]:
        """One remote read of node ``index``'s file: (its lines, runctl's answer)."""
        node = self.nodes[index]
        request = {"offset": self.offsets[index], "tail": tail, "rank": self._rank, "since": self._since,
                   "hide": self._hide, "rank_offset": node.rank_offset, "limit_bytes": LIMIT_BYTES}
        try:
            transport = self._transports.get(index) or self._transports.setdefault(index, self._connect(node.host))
        except FstrainError as exc:
            raise Unread(exc.one_line()) from None
        argv = line_script(self._python, "lines", node.run_dir, str(node.node_rank), json.dumps(request))
        result = transport.run(argv, stdin=self._stdin, timeout_s=READ_TIMEOUT_S)
        said = result.stderr.strip().splitlines()
        try:
            answer = json.loads(said[-1]) if said and said[-1].startswith("{") else {}
        except ValueError:
            answer = {}
        if result.ok and "offset" in answer:
            return result.stdout, answer
        why = result.error or answer.get("error") or (said[-1] if said else f"exit {result.exit_code}")
        raise Unread(str(why))

    def close(self) -> None:
        for transport in self._transports.values():
            transport.close()
        self._transports.clear()


class FileOutputs:
    """Log files on this machine (``files()`` is asked at each read: files appear as ranks start),
    read by whole lines, each read going on from where that file's last one ended. A file
    that does not exist yet is read once it does. Lines that carry the text ``hide`` are left
    out (and not counted by ``tail``)."""

    def __init__(self, files: Callable[[], Sequence[Path]], hide: str | None = None) -> None:
        self.files = files
        self._keep = logtail.without(hide)
        self.offsets: dict[Path, int] = {}
        self.failed: dict[str, str] = {}  # as NodeOutputs': no host is read over the network here

    def close(self) -> None:
        """Nothing is held between reads: each read opens and closes its files."""

    def read(self, tail: int | None = None, *, views: bool = True) -> Iterator[str]:
        """The files' new whole lines, one file after the other, one line at a time (text ending
        with a newline, as NodeOutputs gives them); with ``tail``, only the last ``tail`` lines
        of them all. (``views``: NodeOutputs'; the files here are always read.)"""
        paths = list(self.files())
        if tail is not None:
            yield from self._tail(paths, tail)
            return
        for path in paths:
            try:
                handle = path.open("rb")
            except OSError:  # not written yet
                continue
            with handle:
                start = self.offsets.get(path, 0)
                handle.seek(start)
                for piece, end in logtail.forward_chunks(handle.read, start):
                    offset = end - len(piece)
                    for line in logtail.whole_lines(piece)[0]:
                        offset += len(line) + 1
                        self.offsets[path] = offset  # a reader that stops here goes on after this line
                        if self._keep is None or self._keep(line):
                            yield line.decode(errors="replace") + "\n"

    def _tail(self, paths: Sequence[Path], count: int) -> Iterator[str]:
        """The last ``count`` lines of the files taken one after the other: read backwards from
        the end of the last file, then of the one before it while lines are missing."""
        found: list[list[bytes]] = []
        for path in reversed(paths):
            try:
                handle = path.open("rb")
            except OSError:
                continue
            with handle:
                lines, self.offsets[path] = logtail.last_lines(_reader_at(handle.fileno()),
                                                               os.fstat(handle.fileno()).st_size, count,
                                                               self._keep)
            found.append(lines)
            count -= len(lines)
        for lines in reversed(found):
            for line in lines:
                yield line.decode(errors="replace") + "\n"


def _file_line(at: Any, text: Any) -> str:
    """A line of ``node<I>.out`` as the watchdog writes it: its time, then the line."""
    return f"{float(at):.3f} {text}"


class ViewTail(NamedTuple):
    """What a node's view on node 0 holds of its output file: its last lines, their times, the
    file's size after them, and whether that size counts what the file held before its first
    line too (the watchdog measures the file as it starts copying: a recovering run's banner)."""

    lines: list[Any]
    times: list[Any]
    size: int
    size_known: bool


def _view_tail(views: Mapping[int, Mapping[str, Any] | None], node: NodeFile) -> ViewTail | None:
    """The node's view's :class:`ViewTail`; None where the view is missing or malformed."""
    record = (views.get(node.node_rank) or {}).get("node") or {}
    lines, times, size = record.get("last_lines"), record.get("last_lines_at"), record.get("out_bytes")
    if not isinstance(lines, list) or not isinstance(times, list) or len(lines) != len(times) \
            or not isinstance(size, int) or isinstance(size, bool):
        return None
    return ViewTail(lines, times, size, record.get("out_bytes_known") is True)


def _lines_adding_up(lines: list[Any], times: list[Any], wanted: int) -> list[str] | None:
    """The last of a view's lines, as the watchdog wrote them (``TIME LINE``), whose bytes add
    up to exactly ``wanted`` (oldest first; none for 0); None where no run of them does."""
    picked: list[str] = []
    total = 0
    try:
        for text, at in zip(reversed(lines), reversed(times), strict=True):
            if total >= wanted:
                break
            raw = _file_line(at, text)
            total += len(raw.encode()) + 1
            picked.append(raw)
    except (TypeError, ValueError):
        return None
    return list(reversed(picked)) if total == wanted else None


def _whole_file(lines: list[Any], times: list[Any], size: int) -> bool:
    """Whether a view's last lines are the node's whole output file: all of them add up to the
    file's size (:func:`_lines_adding_up`), so the node has no line the view lacks and a tail
    longer than what it printed needs no read on the node."""
    raws = _lines_adding_up(lines, times, size)
    return raws is not None and len(raws) == len(lines)


def _reader_at(fd: int) -> Callable[[int, int], bytes]:
    """``read_at(start, size)`` for :func:`fstrain.core.monitor.logtail.last_lines` on an open file."""
    return lambda start, size: os.pread(fd, size, start)


# -- a run's log folder on this machine (RUN_DIR/logs/<host>[.r<rank>].log) ----------------------

LOG_NAME_RE = re.compile(r"(.+?)(?:\.r(\d+))?\.log")
LOG_SCAN_BYTES = 65536  # the end of a rank's log read for its last line and progress


def log_files(folder: Path, hosts: Sequence[str], rank: int | None) -> list[Path]:
    """The host logs (``rank`` None) or the rank's logs in ``folder``, of ``hosts`` (all where empty)."""
    paths = []
    for path in sorted(folder.glob("*.log")) if folder.is_dir() else []:
        match = LOG_NAME_RE.fullmatch(path.name)
        if match is None or (hosts and match.group(1) not in hosts):
            continue
        if (rank is None and match.group(2) is None) or (rank is not None and match.group(2) == str(rank)):
            paths.append(path)
    return paths


def logged_hosts(folder: Path) -> list[str]:
    """The hosts that have a log in ``folder``."""
    return sorted({match.group(1) for path in (folder.glob("*.log") if folder.is_dir() else [])
                   if (match := LOG_NAME_RE.fullmatch(path.name))})


@dataclass(frozen=True)
class RankLogEnd:
    rank: int
    modified_at: float  # the file's mtime: when the rank last printed
    lines: list[str]  # the lines in its last LOG_SCAN_BYTES


def rank_log_ends(folder: Path, host: str) -> list[RankLogEnd]:
    """The end of each of ``host``'s rank logs in ``folder``, by rank."""
    ends = []
    for path in folder.glob(f"{host}.r*.log") if folder.is_dir() else []:
        match = re.fullmatch(re.escape(host) + r"\.r(\d+)\.log", path.name)
        if match is None:
            continue
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - LOG_SCAN_BYTES))
            lines = handle.read().decode(errors="replace").splitlines()
        ends.append(RankLogEnd(int(match.group(1)), path.stat().st_mtime, lines))
    return sorted(ends, key=lambda end: end.rank)


def append_to_logs(folder: Path, names: Iterable[str], line: str) -> dict[str, int]:
    """``line`` appended to each log ``names`` in ``folder`` (and to every log already there);
    where each file ends after it, by name. OSError where the folder cannot be written."""
    folder.mkdir(parents=True, exist_ok=True)
    offsets: dict[str, int] = {}
    for name in sorted({p.name for p in folder.glob("*.log")} | set(names)):
        with (folder / name).open("a") as handle:
            handle.write(line + "\n")
            offsets[name] = handle.tell()
    return offsets


def lines_after(folder: Path, offsets: Mapping[str, int]) -> Iterator[str]:
    """Each line of the logs ``offsets`` names, from its offset on (a file that cannot be read is skipped)."""
    for name, offset in offsets.items():
        try:
            with (folder / name).open("rb") as handle:
                handle.seek(offset)
                for raw in handle:
                    yield raw.decode(errors="replace").rstrip("\n")
        except OSError:
            continue
