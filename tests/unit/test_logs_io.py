"""fstrain/io/logs.py: a detached run's node files read by the real runctl script (through the
local transport, as for `localhost` nodes), and local log files."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from fstrain.core.hosts.hostfile import Host
from fstrain.core.monitor.metricline import PREFIX as METRIC_MARK
from fstrain.errors import TransportError
from fstrain.io import logs
from fstrain.io.logs import FileOutputs, NodeFile, NodeOutputs
from fstrain.io.transport.base import CommandResult, Transport
from fstrain.io.transport.local import LocalTransport


class Recording(LocalTransport):
    """The local transport, keeping each command's request (runctl's last argument)."""

    def __init__(self, host: str, requests: list[str]) -> None:
        super().__init__(host)
        self.requests = requests

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout_s: float | None = None) -> CommandResult:
        self.requests.append(argv[-1])
        return super().run(argv, stdin=stdin, timeout_s=timeout_s)


def two_nodes(tmp_path: Path) -> list[NodeFile]:
    """Two nodes' output files as their watchdogs write them: the time in front of each line."""
    (tmp_path / "n0").mkdir()
    (tmp_path / "n1").mkdir()
    (tmp_path / "n0" / "node0.out").write_bytes(
        b"10.000 [default0]:ready rank=0\n"
        b"12.000 [default1]:bad byte \xff then more\n"
        b"14.000 [default0]:step 1\n"
        b"15.000 [default1]:after the bad byte\n")
    (tmp_path / "n1" / "node1.out").write_bytes(
        b"11.000 [default0]:ready rank=2\n"
        b"13.000 torchrun's own line\n"
        b"16.000 [default1]:step 1 on rank 3\n"
        b"17.000 [default0]:partial, no newl")
    return [NodeFile(Host("localhost"), str(tmp_path / "n0"), 0, 0),
            NodeFile(Host("localhost", port=None, user=None), str(tmp_path / "n1"), 1, 2)]


def local(host: Host) -> Transport:
    return LocalTransport(host.name)


def test_every_node_merged_by_time_and_tagged(tmp_path: Path) -> None:
    outputs = NodeOutputs(two_nodes(tmp_path), local, sys.executable)
    assert list(outputs.read()) == [
        "[localhost r0] ready rank=0\n", "[localhost r2] ready rank=2\n",
        "[localhost r1] bad byte \ufffd then more\n", "[localhost] torchrun's own line\n",
        "[localhost r0] step 1\n", "[localhost r1] after the bad byte\n", "[localhost r3] step 1 on rank 3\n"]
    assert outputs.failed == {}


def test_following_goes_on_at_the_byte_after_the_last_whole_line(tmp_path: Path) -> None:
    """An invalid byte counts one (decoded it is U+FFFD, three): rank tags stay whole after it."""
    nodes = two_nodes(tmp_path)
    outputs = NodeOutputs(nodes, local, sys.executable)
    assert list(outputs.read(tail=2)) == ["[localhost r1] after the bad byte\n", "[localhost r3] step 1 on rank 3\n"]
    sizes = [(tmp_path / "n0" / "node0.out").stat().st_size, (tmp_path / "n1" / "node1.out").stat().st_size]
    assert outputs.offsets == [sizes[0], sizes[1] - len(b"17.000 [default0]:partial, no newl")]
    with (tmp_path / "n1" / "node1.out").open("ab") as handle:
        handle.write(b"ine\n18.000 [default1]:\xfe\xfe\n")
    with (tmp_path / "n0" / "node0.out").open("ab") as handle:
        handle.write(b"19.000 [default0]:last\n")
    assert list(outputs.read()) == ["[localhost r2] partial, no newline\n", "[localhost r3] \ufffd\ufffd\n",
                                    "[localhost r0] last\n"]
    assert list(outputs.read()) == []


def test_filters_run_on_the_node(tmp_path: Path) -> None:
    requests: list[str] = []
    nodes = two_nodes(tmp_path)
    outputs = NodeOutputs(nodes, lambda h: Recording(h.name, requests), sys.executable, rank=1)
    assert list(outputs.read()) == ["[localhost r1] bad byte \ufffd then more\n",
                                    "[localhost r1] after the bad byte\n"]
    assert all('"rank": 1' in r for r in requests) and len(requests) == 2
    outputs = NodeOutputs(nodes, local, sys.executable, since=14.5)
    assert list(outputs.read(tail=10)) == ["[localhost r1] after the bad byte\n", "[localhost r3] step 1 on rank 3\n"]
    assert list(NodeOutputs(nodes, local, sys.executable, rank=3).read(tail=5)) == [
        "[localhost r3] step 1 on rank 3\n"]


def test_metric_lines_are_left_out_on_the_node_and_in_local_files(tmp_path: Path) -> None:
    """``hide``: lines carrying the mark are not read back, and a tail counts the others."""
    (tmp_path / "node0.out").write_bytes(b"1.000 [default0]:step 1\n2.000 [default0]:FSTRAIN_METRICS {}\n"
                                         b"3.000 [default1]:step 1\n4.000 [default1]:FSTRAIN_METRICS {}\n")
    node = [NodeFile(Host("localhost"), str(tmp_path), 0, 0)]
    shown = ["[localhost r0] step 1\n", "[localhost r1] step 1\n"]
    assert list(NodeOutputs(node, local, sys.executable, hide=METRIC_MARK).read()) == shown
    assert list(NodeOutputs(node, local, sys.executable, hide=METRIC_MARK).read(tail=2)) == shown
    assert list(NodeOutputs(node, local, sys.executable, rank=1, hide=METRIC_MARK).read(tail=2)) == shown[1:]
    log = tmp_path / "node1.log"
    log.write_bytes(b"[node1 r0] a\n[node1 r0] FSTRAIN_METRICS {}\n[node1 r0] b\n[node1 r0] FSTRAIN_METRICS {}\n")
    outputs = FileOutputs(lambda: [log], METRIC_MARK)
    assert list(outputs.read(tail=2)) == ["[node1 r0] a\n", "[node1 r0] b\n"]
    assert outputs.offsets == {log: log.stat().st_size}  # a hidden last line is not read again
    assert list(FileOutputs(lambda: [log], METRIC_MARK).read()) == ["[node1 r0] a\n", "[node1 r0] b\n"]


def test_a_big_file_is_read_a_bounded_piece_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "LIMIT_BYTES", 1000)
    (tmp_path / "node0.out").write_bytes(b"".join(b"%d.000 [default0]:line %d\n" % (i, i) for i in range(1, 2001)))
    requests: list[str] = []
    outputs = NodeOutputs([NodeFile(Host("localhost"), str(tmp_path), 0, 0)], lambda h: Recording(h.name, requests),
                          sys.executable)
    lines = list(outputs.read())
    assert lines == [f"[localhost r0] line {i}\n" for i in range(1, 2001)]
    size = (tmp_path / "node0.out").stat().st_size
    offsets = [json.loads(r)["offset"] for r in requests] + [size]
    assert outputs.offsets == [size] and offsets == sorted(offsets)
    # Each read stops after the 1000-byte block that reaches the limit, at a line's end.
    assert max(b - a for a, b in itertools.pairwise(offsets)) < 2000 + 30 and len(requests) > size / 2030


def test_a_node_that_cannot_be_read_is_named_and_the_others_are_read(tmp_path: Path) -> None:
    nodes = two_nodes(tmp_path)
    nodes[1] = NodeFile(Host("node2"), nodes[1].run_dir, 1, 2)

    def connect(host: Host) -> Transport:
        if host.name == "node2":
            raise TransportError("cannot connect: Connection refused", "is sshd running?", "node2")
        return LocalTransport(host.name)

    outputs = NodeOutputs(nodes, connect, sys.executable)
    assert len(list(outputs.read())) == 4
    assert outputs.failed == {"node2": "cannot connect: Connection refused (hint: is sshd running?)"}
    # A node whose Python fails is named with what it said.
    outputs = NodeOutputs(nodes[:1], local, "/nonexistent/python3")
    assert list(outputs.read()) == []
    assert outputs.failed == {"localhost": "/nonexistent/python3: command not found"}
    # An unexpected failure in a node's reader names the node too (no traceback from its thread).

    class Broken(LocalTransport):
        def run(self, argv: Sequence[str], *, stdin: bytes | None = None,
                timeout_s: float | None = None) -> CommandResult:
            raise RuntimeError("channel closed")

    outputs = NodeOutputs(nodes[:1], lambda h: Broken(h.name), sys.executable)
    assert list(outputs.read()) == [] and outputs.failed == {"localhost": "RuntimeError: channel closed"}


def test_a_node_file_not_written_yet_is_empty(tmp_path: Path) -> None:
    outputs = NodeOutputs([NodeFile(Host("localhost"), str(tmp_path / "none"), 0, 0)], local, sys.executable)
    assert list(outputs.read(tail=5)) == [] and outputs.failed == {} and outputs.offsets == [0]


def test_local_files_tail_across_files_and_follow(tmp_path: Path) -> None:
    first, second, missing = tmp_path / "a.log", tmp_path / "b.log", tmp_path / "c.log"
    first.write_bytes(b"a1\na2\na3\n")
    second.write_bytes(b"b1\n\xffb2\nb3 partial")
    outputs = FileOutputs(lambda: [first, second, missing])
    assert "".join(outputs.read(tail=4)) == "a2\na3\nb1\n\ufffdb2\n"
    assert outputs.offsets == {first: 9, second: 7}
    with second.open("ab") as handle:
        handle.write(b" done\n")
    missing.write_bytes(b"c1\n")
    assert "".join(outputs.read()) == "b3 partial done\nc1\n"
    assert "".join(outputs.read()) == ""
    assert "".join(FileOutputs(lambda: [first, second]).read()) == "a1\na2\na3\nb1\n\ufffdb2\nb3 partial done\n"
    assert "".join(FileOutputs(lambda: [first]).read(tail=0)) == ""
