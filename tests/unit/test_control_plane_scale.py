"""What the launching machine's commands cost a large detached run, on the simulated cluster
(fstrain/io/transport/simulated.py): sessions per node, concurrency, bytes of the headers."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from fstrain.core.hosts.hostfile import Host
from fstrain.core.job.spec import NodeLaunch
from fstrain.io.launch import Rendezvous, RunOptions
from fstrain.io.runs import RunRecord
from fstrain.io.transport.simulated import SimulatedCluster, script_arguments


def test_a_detached_start_is_bounded_by_fanout_and_only_node0_gets_the_host_list(tmp_path: Path) -> None:
    from fstrain.io.runs import start_detached

    headers: dict[str, dict[str, object]] = {}

    def node(host: str, argv: Sequence[str], stdin: bytes) -> tuple[int, str, str]:
        headers[host] = json.loads(stdin.splitlines()[0])["detach"]
        return 0, json.dumps({"pid": 10, "job_pid": 11, "port": 4000}) + "\n", ""

    cluster = SimulatedCluster(node, latency_s=0.01)
    launches = [NodeLaunch(Host(f"n{i}"), i, 1, ("true",)) for i in range(24)]
    answers = start_detached(launches, cluster.transport, "python3", RunOptions("r", tmp_path),
                             Rendezvous("10.0.0.1", 29500, ()), fanout=4)
    assert len(answers) == 24 and all(a["port"] == 4000 for a in answers)
    assert cluster.counts.commands == 24 and cluster.counts.in_flight_max <= 4
    assert headers["n0"]["names"] == [f"n{i}" for i in range(24)]  # the coordinator names the hosts
    assert all("names" not in headers[f"n{i}"] for i in range(1, 24))  # N members x N names: no more


def _record(tmp_path: Path, count: int) -> RunRecord:
    from fstrain.core.runs.runrecord import DetachedNode, DetachedRecord

    nodes = tuple(DetachedNode(Host(f"n{i}"), i, 1, i, f"~/.fstrain/runs/r{i}", 1, 2) for i in range(count))
    return RunRecord("r", tmp_path, DetachedRecord("r", "torchrun", 0.0, "python3", 5.0, None, "10.0.0.1", 4000,
                                                   nodes), None, None)


def _view(rank: int, source: str) -> dict[str, object]:
    return {"node": {"node_rank": rank, "source": source}, "watchdog_alive": True}


def test_a_live_runs_views_cost_one_session_on_node0_and_one_per_node_it_lacks(tmp_path: Path) -> None:
    from fstrain.io.runs import node_views

    def node(host: str, argv: Sequence[str], stdin: bytes) -> tuple[int, str, str]:
        if script_arguments(argv)[0] == "views":  # the coordinator has every view but node 5's (not sent yet)
            views = [None if i == 5 else _view(i, "coordinator") for i in range(30)]
            return 0, json.dumps({"format": 1, "views": views}), ""
        assert script_arguments(argv)[0] == "state" and host == "n5"
        return 0, json.dumps(_view(5, "node")), ""

    cluster = SimulatedCluster(node)
    views = node_views(_record(tmp_path, 30), cluster.transport, "python3")
    assert [(v or {}).get("node", {}).get("node_rank") for v in views] == list(range(30))
    assert [v["node"]["source"] for v in views if v] == ["coordinator"] * 5 + ["node"] + ["coordinator"] * 24
    assert cluster.counts.commands == 2 and cluster.counts.connections == 2  # node 0, then node 5


def test_without_a_coordinator_every_node_is_asked_itself(tmp_path: Path) -> None:
    from fstrain.io.runs import node_views

    def node(host: str, argv: Sequence[str], stdin: bytes) -> tuple[int, str, str]:
        command, *args = script_arguments(argv)
        if command == "views":  # the run has ended: no coordinator listens
            return 0, json.dumps({"error": "the coordinator does not answer"}), ""
        assert command == "state"
        return 0, json.dumps(_view(int(args[1]), "node")), ""

    cluster = SimulatedCluster(node, failing=frozenset({"n7"}))
    views = node_views(_record(tmp_path, 30), cluster.transport, "python3")
    assert views[7] is None  # refused: unreachable, the others answer
    assert [(v or {}).get("node", {}).get("node_rank") for v in views] == [None if i == 7 else i for i in range(30)]
    assert cluster.counts.refused == 1 and cluster.counts.commands == 30  # node 0's question, then 29 nodes


def test_a_members_live_ranks_are_read_from_its_own_processes() -> None:
    import os
    import subprocess

    from fstrain.io.remote.runctl import ranks_alive

    match = {"FSTRAIN_RUN_ID": "r-scale", "FSTRAIN_NODE_RANK": "1"}
    rank = subprocess.Popen(["sleep", "30"], env={**os.environ, **match, "RANK": "9"})
    try:
        deadline = time.monotonic() + 10  # forked, but its environment is its own once it has exec'd
        while ranks_alive(match, [rank.pid]) != [9] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ranks_alive(match, [rank.pid]) == [9]
        assert ranks_alive(match, []) == []  # its own job only: nothing else in /proc is read
    finally:
        rank.kill()
        rank.wait()


def test_a_short_tail_of_a_live_run_comes_from_node0_where_the_views_hold_it() -> None:
    from fstrain.io.logs import NodeFile, NodeOutputs

    def view(rank: int, lines: list[str]) -> dict[str, object]:
        return {"node": {"last_lines": lines, "last_lines_at": [100.0 + rank + i / 10 for i in range(len(lines))],
                         "out_bytes": 5000 + rank}}

    views = {0: view(0, ["[local0]:a0", "[local1]:b0", "[local0]:c0"]),
             1: view(1, ["[local0]:a1", "[local0]:b1"]),  # rank 2 (its local 0) printed only two lines here
             2: None}  # node 2 has sent no view yet

    def node(host: str, argv: Sequence[str], stdin: bytes) -> tuple[int, str, str]:
        assert script_arguments(argv)[0] == "lines" and host in ("n1", "n2")
        return 0, f"90.000 [local0]:old on {host}\n95.000 [local0]:from {host}\n", json.dumps({"offset": 77})

    cluster = SimulatedCluster(node)
    files = [NodeFile(Host(f"n{i}"), "~/r", i, 2 * i) for i in range(3)]
    outputs = NodeOutputs(files, cluster.transport, "python3", views=lambda: views)
    try:
        assert list(outputs.read(tail=2)) == ["[n1 r2] a1\n", "[n1 r2] b1\n"]  # the last two of all, by time
        assert cluster.counts.commands == 1  # node 2 alone, asked itself
        assert outputs.offsets == [5000, 5001, 77]  # a follow goes on after the lines shown
    finally:
        outputs.close()
    ranked = NodeOutputs(files[1:2], cluster.transport, "python3", rank=2, views=lambda: views)
    try:
        assert list(ranked.read(tail=3)) == ["[n1 r2] old on n1\n", "[n1 r2] from n1\n"]  # two in the view: asked
        assert list(NodeOutputs(files[:1], cluster.transport, "python3", rank=0,
                                views=lambda: views).read(tail=2)) == ["[n0 r0] a0\n", "[n0 r0] c0\n"]
        assert cluster.counts.commands == 2  # node 1 again; node 0's view held rank 0's two
    finally:
        ranked.close()


def test_a_view_holding_a_nodes_whole_output_answers_a_longer_tail() -> None:
    """A node that printed one line: its view holds the whole file (the lines' bytes add up to
    its size), so `logs --tail 5` needs no read on the node; a view whose bytes fall short of
    the file (lines before the view) is read on the node as before."""
    from fstrain.io.logs import NodeFile, NodeOutputs

    line, at = "[local0]:FSTBENCH ready rank=0", 100.25
    whole = len(b"%.3f " % at + line.encode() + b"\n")
    views = {0: {"node": {"last_lines": [line], "last_lines_at": [at], "out_bytes": whole}},
             1: {"node": {"last_lines": [line], "last_lines_at": [at], "out_bytes": whole + 40}}}

    def node(host: str, argv: Sequence[str], stdin: bytes) -> tuple[int, str, str]:
        assert host == "n1"  # node 0's view is its whole file
        return 0, f"90.000 [local0]:earlier on {host}\n", json.dumps({"offset": whole + 40})

    cluster = SimulatedCluster(node)
    files = [NodeFile(Host(f"n{i}"), "~/r", i, i) for i in range(2)]
    outputs = NodeOutputs(files, cluster.transport, "python3", views=lambda: views)
    try:
        assert list(outputs.read(tail=5)) == ["[n1 r1] earlier on n1\n", "[n0 r0] FSTBENCH ready rank=0\n"]
        assert cluster.counts.commands == 1
        assert outputs.offsets == [whole, whole + 40]
    finally:
        outputs.close()


def test_a_follow_reads_on_the_nodes_only_what_their_views_on_node0_do_not_hold_exactly() -> None:
    """`logs --follow` and `attach` read what came since the last read: from node 0's views
    where a view's last lines add up to exactly the new bytes (none new: nothing to read),
    on the node itself where they do not (lines before the view, a view older than the last
    read, an older watchdog's view that does not know the file's size before its first line);
    every node itself once the run has ended (``views=False``)."""
    from fstrain.io.logs import NodeFile, NodeOutputs

    def written(lines: list[tuple[float, str]]) -> int:
        return sum(len(b"%.3f " % at + text.encode() + b"\n") for at, text in lines)

    def view(lines: list[tuple[float, str]], size: int, known: bool = True) -> dict[str, object]:
        node: dict[str, object] = {"last_lines": [t for _, t in lines], "last_lines_at": [a for a, _ in lines],
                                   "out_bytes": size}
        return {"node": {**node, "out_bytes_known": True} if known else node}

    n0 = [(100.0, "[local0]:a"), (101.5, "[local0]:bé ✓")]  # all of node 0's file, in its view
    n1_before = [(90.0, "[local0]:early")]  # node 1's file begins before its view's lines
    n1 = [(102.0, "[local0]:x")]
    banner = [(99.0, "=== fstrain: attempt 2 ===")]  # node 3: a banner, no rank line yet
    asked: list[tuple[str, int]] = []
    answers = {"n1": (written(n1_before + n1), n1_before + n1), "n3": (written(banner), banner)}

    def node(host: str, argv: Sequence[str], stdin: bytes) -> tuple[int, str, str]:
        request = json.loads(script_arguments(argv)[3])
        asked.append((host, request["offset"]))
        size, lines = answers[host]
        text = "".join(f"{at:.3f} {line}\n" for at, line in lines)[request["offset"]:]
        return 0, text, json.dumps({"offset": size})

    views = {0: view(n0, written(n0)), 1: view(n1, written(n1_before + n1)), 2: view([], 0),
             3: view([], 0, known=False)}
    cluster = SimulatedCluster(node)
    files = [NodeFile(Host(f"n{i}"), "~/r", i, i) for i in range(4)]
    outputs = NodeOutputs(files, cluster.transport, "python3", views=lambda: views)
    try:
        assert sorted(outputs.read()) == sorted(["[n0 r0] a\n", "[n0 r0] bé ✓\n", "[n1 r1] early\n", "[n1 r1] x\n",
                                                 "[n3] === fstrain: attempt 2 ===\n"])
        assert sorted(asked) == [("n1", 0), ("n3", 0)]
        assert outputs.offsets == [written(n0), written(n1_before + n1), 0, written(banner)]
        # Node 0 printed one more line; node 1 nothing; node 3's view is older than the read.
        n0.append((103.0, "[local0]:c"))
        views[0] = view(n0[-10:], written(n0))
        asked.clear()
        assert list(outputs.read()) == ["[n0 r0] c\n"]
        assert asked == [("n3", written(banner))]
        # A line of node 1 that its view lacks (sent on its next heartbeat) waits for that view,
        # or for the read that ends a run.
        n1.append((104.0, "[local0]:y"))
        answers["n1"] = (written(n1_before + n1), n1_before + n1)
        asked.clear()
        assert list(outputs.read()) == []
        assert list(outputs.read(views=False)) == ["[n1 r1] y\n"]
        assert sorted(host for host, _ in asked) == ["n0", "n1", "n2", "n3", "n3"]
    finally:
        outputs.close()
