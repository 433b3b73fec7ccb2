"""A detached run's coordinator driving the supervisor, over its real protocol on loopback: what
it records and what it tells its members (the job itself is not started here)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from tests.coordinators import SECRET, ask, make_coordinator


class Member:
    """A member node's side of the link: hello, then messages both ways."""

    def __init__(self, port: int, rank: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.reader = self.sock.makefile("rb")
        self.send({"hello": rank, "secret": SECRET})

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall((json.dumps(message) + "\n").encode())

    def next_order(self) -> dict[str, Any]:
        """The coordinator's next message that is not a heartbeat."""
        while True:
            message: dict[str, Any] = json.loads(self.reader.readline())
            if "hb" not in message:
                return message

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def test_a_members_failure_is_named_by_host_and_rank_and_stops_the_others(tmp_path: Path) -> None:
    from fstrain.core.runs.runevents import parse_lines

    running = make_coordinator(tmp_path, nnodes=3, names=["node1", "node2", "node3"], events=True)
    port = running.listen("127.0.0.1")
    members = {rank: Member(port, rank) for rank in (1, 2)}
    try:
        members[2].send({"exit": 1, "failure": {"rank": 5, "local_rank": 1, "exit_code": 7, "signal": None}})
        assert members[1].next_order()["stop"] == "term"  # the others are torn down
        record = running.record()
        assert (record["state"], record["exit_code"]) == ("failed", 7)  # the rank's own code
        assert record["reason"] == "rank 5 (local rank 1) on node3 exited with 7"
        assert (record["first_failure_node_rank"], record["first_failure_host"]) == (2, "node3")
        # The coordinator decides this run: its events file has the failure once, as the record reads it.
        members[1].send({"exit": 143})
        running.node_exit(0, 143, None)
        running.finish()
        lines = (tmp_path / "events.jsonl").read_text().splitlines()
        assert all(json.loads(line)["fstrain"] == "9.9" for line in lines)  # the launching fstrain's version
        events, skipped = parse_lines(lines, "events.jsonl")
        assert skipped == 0 and [e.kind for e in events] == ["failure", "finished"]
        assert (events[0].host, events[0].rank, events[0].exit_code, events[0].signal) == ("node3", 5, 7, None)
        assert events[0].text == "rank 5 (local rank 1) on node3 exited with 7"
        assert (events[1].state, events[1].exit_code, events[1].run_id) == ("failed", 7, "r")
    finally:
        for member in members.values():
            member.close()
        assert running.listener is not None
        running.listener.close()


def test_stop_force_records_the_signal_it_sent(tmp_path: Path) -> None:
    running = make_coordinator(tmp_path, nnodes=2, names=["node1", "node2"])
    port = running.listen("127.0.0.1")
    member = Member(port, 1)
    try:
        answer = ask(port, {"secret": SECRET, "control": "stop", "how": "kill"})
        state: Any = answer["state"]
        assert (state["state"], state["exit_code"]) == ("stopped", 137)
        assert state["reason"] == "stopped by `fstrain stop` (kill)"
        assert member.next_order()["stop"] == "kill"
    finally:
        member.close()
        assert running.listener is not None
        running.listener.close()


def test_a_member_joining_a_stopping_run_is_told_to_stop(tmp_path: Path) -> None:
    running = make_coordinator(tmp_path, nnodes=2, names=["node1", "node2"], grace_s=15)
    port = running.listen("127.0.0.1")
    ask(port, {"secret": SECRET, "control": "stop", "how": "term", "grace_s": 3})
    late = Member(port, 1)
    try:
        assert late.next_order() == {"format": 1, "stop": "term", "grace_s": 3.0}
        assert running.node.watchdog.grace_s == 3.0
    finally:
        late.close()
        assert running.listener is not None
        running.listener.close()


def test_output_ages_are_taken_on_the_coordinators_own_clock(tmp_path: Path) -> None:
    """A member reports how long ago its ranks printed; a time of day would carry its clock's skew."""
    running = make_coordinator(tmp_path, nnodes=2, names=["node1", "node2"])
    running.output_age(5.0)
    first = running.run.last_output_s
    running.output_age(60.0)  # older news changes nothing
    assert running.run.last_output_s == first
    running.output_age("soon")  # not a duration: ignored
    running.output_age(-1)
    assert running.run.last_output_s == first


def _open_sockets() -> int:
    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # the directory's own descriptor, gone by now
            count += os.readlink(fd).startswith("socket:")
    return count


def four_node_run(run_dir: Path) -> tuple[Any, dict[int, Member]]:
    """A coordinator of four nodes listening on loopback, its coordinator.json where runctl
    reads it, and members 1-3 joined."""
    running = make_coordinator(run_dir, nnodes=4, names=["node1", "node2", "node3", "node4"])
    port = running.listen("127.0.0.1")
    (run_dir / "coordinator.json").write_text(json.dumps({"format": 1, "address": "127.0.0.1", "port": port,
                                                          "secret": SECRET}))
    return running, {rank: Member(port, rank) for rank in (1, 2, 3)}


def test_a_member_that_hangs_up_leaves_no_socket_open(tmp_path: Path) -> None:
    """A coordinator lives as long as its run: every connection it accepted is closed when the
    peer goes, whether it was a member, a `fstrain stop` or a caller without the secret."""
    running = make_coordinator(tmp_path, nnodes=2, names=["node1", "node2"])
    port = running.listen("127.0.0.1")
    before = _open_sockets()
    try:
        member = Member(port, 1)
        member.close()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as stranger:
            stranger.sendall(b'{"secret": "wrong"}\n')
            assert stranger.recv(1) == b""  # refused: the coordinator hung up
        deadline = time.monotonic() + 10
        while _open_sockets() > before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _open_sockets() == before
    finally:
        assert running.listener is not None
        running.listener.close()


def test_node0_reads_at_most_512_heartbeats_a_second_and_four_fit_in_the_timeout() -> None:
    from fstrain.io.remote.coordinator import heartbeat_interval_s

    assert heartbeat_interval_s(64, 30.0) == 1.0  # a small run beats every second
    assert heartbeat_interval_s(1024, 30.0) == 2.0  # 1,024 nodes / 2 s = 512 a second
    assert heartbeat_interval_s(4096, 30.0) == 7.5  # capped: four beats within the 30 s timeout
    assert heartbeat_interval_s(4096, 4.0) == 1.0  # a short timeout: once a second, never faster


def test_the_coordinators_own_job_is_never_stopped_for_a_late_tick(tmp_path: Path) -> None:
    running = make_coordinator(tmp_path, nnodes=2, names=["node1", "node2"], heartbeat_timeout_s=5)
    assert running.node.watchdog.heartbeat_timeout_s == float("inf")  # its decisions end node 0's job
    assert running.run.limits.heartbeat_timeout_s == 5.0  # the members' rule is the run's


def test_every_nodes_view_is_read_from_the_coordinator_over_one_connection(tmp_path: Path) -> None:
    from fstrain.io.remote import runctl

    running, members = four_node_run(tmp_path)
    try:
        view = {"node": {"node_rank": 1, "ranks": {"0": {"last_line": "step 3"}}}, "ranks_alive": [4, 5],
                "watchdog_alive": True, "gpus": {}}
        members[1].send({"hb": 1.0, "view": view})
        members[2].send({"hb": 1.0, "view": {**view, "node": {"node_rank": 2}}})
        members[2].close()  # its watchdog is gone: its link closes
        deadline = time.monotonic() + 10
        while (2 not in running.closed or 1 not in running.views) and time.monotonic() < deadline:
            time.sleep(0.02)
        answer = runctl.ask_coordinator(str(tmp_path), {"control": "views"})  # what runctl's `views` prints
        views: Any = answer["views"]
        assert len(views) == 4 and views[0]["run"]["run_id"] == "r" and views[0]["node"]["node_rank"] == 0
        assert views[1]["node"]["ranks"]["0"]["last_line"] == "step 3" and views[1]["ranks_alive"] == [4, 5]
        assert views[1]["watchdog_alive"] is True and views[2]["watchdog_alive"] is False
        assert views[3] is None  # nothing sent yet: the client asks node 3 itself
    finally:
        for rank in (1, 3):
            members[rank].close()
        assert running.listener is not None
        running.listener.close()


def test_the_listen_backlog_holds_every_member_connecting_at_once(tmp_path: Path, monkeypatch: Any) -> None:
    backlogs: list[int] = []
    listen = socket.socket.listen
    monkeypatch.setattr(socket.socket, "listen", lambda self, n: (backlogs.append(n), listen(self, n))[1])
    for nnodes, expected in ((4, 64), (1000, 1000), (10000, 4096)):
        running = make_coordinator(tmp_path, nnodes=nnodes)
        running.listen("127.0.0.1")
        assert running.listener is not None
        running.listener.close()
        assert backlogs[-1] == expected, nnodes


def test_a_hung_nvidia_smi_never_delays_a_nodes_view(tmp_path: Path) -> None:
    running = make_coordinator(tmp_path, nnodes=2)
    runctl = running.node.watchdog.module("runctl")
    release = threading.Event()
    runctl.gpus = lambda: (release.wait(10), {"csv": "index\n0\n"})[1]  # nvidia-smi hanging
    try:
        started = time.monotonic()
        view = running.node.view()
        assert time.monotonic() - started < 1.0 and view["gpus"] == {}  # no reading yet, no wait
    finally:
        release.set()
    deadline = time.monotonic() + 10
    while running.node.view()["gpus"] == {} and time.monotonic() < deadline:
        time.sleep(0.01)
    assert running.node.view()["gpus"] == {"csv": "index\n0\n"}  # the reading, once it came


def test_messages_split_across_reads_or_sharing_one_are_each_read_whole(tmp_path: Path) -> None:
    running = make_coordinator(tmp_path, nnodes=2, names=["node1", "node2"])
    port = running.listen("127.0.0.1")
    member = Member(port, 1)
    try:
        first = json.dumps({"hb": 1.0, "view": {"node": {"node_rank": 1, "note": "x" * 200_000}}}).encode()
        member.sock.sendall(first[:100])  # a line in pieces, the next two in one write
        time.sleep(0.05)
        member.sock.sendall(first[100:] + b"\n" + json.dumps({"hb": 2.0, "output_age_s": 3.0}).encode() + b"\n")
        deadline = time.monotonic() + 10
        while 1 not in running.views and time.monotonic() < deadline:
            time.sleep(0.02)
        assert running.views[1]["node"]["note"] == "x" * 200_000
        while running.run.last_output_s is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert running.run.last_output_s is not None  # the second message was read too
        assert 1 in running.links and 1 not in running.closed
    finally:
        member.close()
        assert running.listener is not None
        running.listener.close()


def test_a_members_unread_heartbeat_counts_as_heard_on_a_slow_node0(tmp_path: Path) -> None:
    """node 0 loaded: its reader is behind, a member's heartbeat waits unread on the connection.
    Silence is judged on what arrived, so the member is heard, not lost; a member with nothing
    waiting stays silent and the rule judges it as before."""
    from fstrain.io.remote.coordinator import Link

    running = make_coordinator(tmp_path, nnodes=3, names=["node1", "node2", "node3"], heartbeat_timeout_s=4)
    pairs = {rank: socket.socketpair() for rank in (1, 2)}
    try:
        links = {rank: Link(ours) for rank, (ours, _) in pairs.items()}
        start = time.monotonic()
        for rank in (1, 2):
            running.run.node_joined(rank, start)
        pairs[1][1].sendall(b'{"hb": 1}\n')  # node2's heartbeat, sent, not read by the coordinator
        later = start + 3  # past half the timeout, before the rule would judge
        running.heard_unread(links, later)
        assert running.run.nodes[1].last_heard_s == later
        assert running.run.nodes[2].last_heard_s == start  # nothing waits from node3
        running.run.tick(start + 5)  # 5 s after the join: node3 past the 4 s timeout, node2 2 s after its word
        assert running.run.nodes[2].error is not None and "no heartbeat" in running.run.nodes[2].error
        assert running.run.nodes[1].error is None
    finally:
        for ours, theirs in pairs.values():
            ours.close()
            theirs.close()


def test_a_member_reading_late_keeps_its_job_while_the_coordinators_words_wait(tmp_path: Path) -> None:
    """A member's watchdog whose reader fell behind (a loaded node) finds the coordinator's
    heartbeat waiting on its link: the coordinator spoke, so the job keeps running; with nothing
    waiting, silence past the timeout stops it."""
    import subprocess
    import sys

    from fstrain.io.remote.watchdog import Watchdog, has_unread_bytes

    read_end, write_end = os.pipe()
    try:
        assert not has_unread_bytes(read_end)
        os.write(write_end, b"hb\n")
        assert has_unread_bytes(read_end)
        for waiting in (True, False):
            dog = Watchdog({"heartbeat_timeout_s": 0.2, "grace_s": 0})
            dog.heartbeat_fd = read_end if waiting else os.pipe()[0]
            dog.child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
            try:
                dog.last_heartbeat = time.monotonic() - 1  # silent for longer than the timeout
                stopper = threading.Timer(0.6, dog.request, args=("kill",))
                stopper.start()
                dog.supervise()
                stopper.cancel()
                assert dog.stop_requested == ("kill" if waiting else "term")
            finally:
                with contextlib.suppress(ProcessLookupError):
                    dog.child.kill()
                dog.child.wait()
    finally:
        os.close(read_end)
        os.close(write_end)


def test_an_ended_runs_gone_members_are_read_from_node0_after_the_coordinator(tmp_path: Path,
                                                                             monkeypatch: Any) -> None:
    """Once the run is over the coordinator writes which members are gone (their job ended with
    a status, then their watchdog closed its connection); runctl's `views` answers from that
    after the coordinator has exited, so `stop` and `status` ask node 0 alone for those. A member
    still connected, or lost, is left to the client to ask."""
    from fstrain.io.remote import coordinator, runctl

    monkeypatch.setattr(coordinator, "MEMBERS_GONE_WAIT_S", 0.5)
    running, members = four_node_run(tmp_path)
    try:
        for rank, member in members.items():
            member.send({"hb": 1.0, "view": {"node": {"format": 1, "node_rank": rank, "exit_code": None},
                                             "ranks_alive": [7], "watchdog_alive": True, "gpus": {}}})
        for rank in (1, 2):
            members[rank].send({"exit": 0})
        members[1].close()  # its watchdog exits
        members[3].close()  # lost: no exit status
        running.node_exit(0, 0, None)
        deadline = time.monotonic() + 10
        while not ({1, 3} <= running.closed and running.all_ended()) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert running.all_ended()
        running.write_ended_views()
        assert running.listener is not None
        running.listener.close()  # the coordinator has exited
        deadline = time.monotonic() + 10
        while "error" not in runctl.ask_coordinator(str(tmp_path), {"control": "views"}) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        answer = runctl.views(str(tmp_path))
        views: Any = answer["views"]
        assert answer["format"] == 1 and len(views) == 4
        assert views[0]["watchdog_alive"] is False  # node 0 itself, read on the spot
        assert views[1]["watchdog_alive"] is False and views[1]["ranks_alive"] == []
        assert views[1]["node"]["exit_code"] == 0 and views[1]["node"]["ended"] is not None
        assert views[2] is None, "still connected: its watchdog may live"
        assert views[3] is None, "lost: asked itself"
    finally:
        for member in members.values():
            member.close()


def test_without_an_ended_record_views_say_the_coordinator_does_not_answer(tmp_path: Path) -> None:
    from fstrain.io.remote import runctl

    assert "error" in runctl.views(str(tmp_path))
    (tmp_path / "ended-views.json").write_text(json.dumps({"format": 99, "nnodes": 2, "views": {}}))
    assert "error" in runctl.views(str(tmp_path)), "a newer record is not misread: each node is asked"
