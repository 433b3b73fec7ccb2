"""The recovery keeper of a detached run (``launch --detach --on-failure restart|exclude``).

`fstrain launch --detach` starts the first attempt as every detached run starts, then this
process on the launching machine: a session of its own (closing the terminal does not end it),
stdin from /dev/null, its output to ``RUN_DIR/keeper.log``, its pid in ``RUN_DIR/keeper.json``.
It runs the one recovery loop (fstrain/api/driver.py ``drive_attempts``): each attempt is a
detached start, followed to its end through its nodes' records (what `fstrain status` reads),
then blamed and decided on as an attached run's attempt is; the manifest lists every attempt.

`fstrain stop` sends it SIGTERM: no further attempt starts, and the current one is stopped
through its coordinator. A keeper that dies (the machine reboots) leaves the current attempt to
run to its end under its coordinator; no attempt follows it (`fstrain status` says so).

The process is fstrain/api/keeper_process.py. The launch hands the keeper its prepared request
and the first attempt on its stdin (fstrain/io/keeper.py: a format line checked before anything
is built from what follows), one process of the same fstrain to another, never written to disk.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fstrain.core.runs.runrecord import KeeperRecord

if TYPE_CHECKING:
    from fstrain.api.driver import Driven, DriveRequest
    from fstrain.core.hosts.hostfile import Host
    from fstrain.core.job.spec import NodeLaunch
    from fstrain.core.runs.runstate import RunState
    from fstrain.io.launch import RunOutcome
    from fstrain.io.logs import NodeOutputs
    from fstrain.io.runs import RunRecord
    from fstrain.io.transport.base import Transport

POLL_S = 2.0  # between two looks at the attempt's nodes
KEEPER_FILE = "keeper.json"
KEEPER_LOG = "keeper.log"
STOPPED = "stopped by `fstrain stop`"


def start_keeper(run_id: str, run_dir: Path, hand_off: tuple[Any, ...]) -> KeeperRecord:
    """The keeper process for a run whose first attempt has just started detached, given
    ``hand_off`` (the prepared launch, the first attempt, its job: what fstrain/api/launch.py
    ``keep`` takes); its record (RUN_DIR/keeper.json) is written before this returns, so `stop`
    and `status` find it."""
    from fstrain import __version__
    from fstrain.io.documents import write_json_atomic
    from fstrain.io.keeper import spawn_keeper

    log = run_dir.resolve() / KEEPER_LOG
    pid = spawn_keeper("fstrain.api.keeper_process", hand_off, log, __version__)
    record = KeeperRecord(run_id, pid, time.time(), str(log))
    write_json_atomic(run_dir / KEEPER_FILE, record.to_dict(__version__))
    return record


class OutputFeed:
    """Every node's new output lines of a detached run, handed to ``lines`` (its trackers) as
    ``[host rN] text``: each look reads each node's file on from where the last read ended, in
    this attempt and the next (a node's file is appended to), over one connection per node."""

    def __init__(self, lines: Callable[[str], None], connect: Callable[[Host], Transport], python: str) -> None:
        self.lines = lines
        self.connect = connect
        self.python = python
        self.offsets: dict[tuple[str, str], int] = {}  # (host, its run directory) -> bytes read
        self.outputs: NodeOutputs | None = None

    def attach(self, record: RunRecord) -> None:
        """Read the nodes of the attempt ``record`` (its detached.json) from now on."""
        from fstrain.io.logs import NodeFile, NodeOutputs

        assert record.detached is not None
        self.detach()
        nodes = [NodeFile(n.host, n.run_dir, n.node_rank, n.rank_offset) for n in record.detached.nodes]
        self.outputs = NodeOutputs(nodes, self.connect, self.python)
        self.outputs.offsets = [self.offsets.get((n.host.label(), n.run_dir), 0) for n in nodes]

    def read(self) -> None:
        """The lines written since the last read, every node's (a node that does not answer is
        read next time, from where it was)."""
        if self.outputs is None:
            return
        for line in self.outputs.read():
            self.lines(line.rstrip("\n"))
        for node, offset in zip(self.outputs.nodes, self.outputs.offsets, strict=True):
            self.offsets[(node.host.label(), node.run_dir)] = offset

    def detach(self) -> None:
        if self.outputs is not None:
            self.outputs.close()
            self.outputs = None


def follow(driven: Driven, request: DriveRequest, connect: Callable[[Host], Transport], stop: threading.Event,
           poll_s: float = POLL_S, feed: OutputFeed | None = None) -> Driven:
    """A started detached attempt, followed to its end (every node's record final and no
    watchdog alive): its outcome as an attached attempt's, and the manifest written with it.
    A stop asked meanwhile is passed to the attempt's coordinator. Node 0 unreachable counts
    as the end only once it has stayed so for the heartbeat timeout. The attempt's first step
    (the first look that shows one) and its first failure go to the run's events. ``feed``
    reads the nodes' output at each look, and once more at the end."""
    from fstrain.api import eventlog
    from fstrain.api.driver import Driven, run_setup
    from fstrain.core.launch.supervisor import AttemptEnd
    from fstrain.core.runs.runstate import FINAL, from_nodes
    from fstrain.io.launch import manifest_of, write_manifest
    from fstrain.io.runs import launched_record, node_views, stop_on_node

    record = launched_record(request.run_id, request.run_dir, detached=True)  # this attempt's detached.json
    assert record.detached is not None
    node0 = record.detached.nodes[0]
    names = [h.label() for h in record.hosts]
    stopping, end = False, AttemptEnd(request.limits.heartbeat_timeout_s)
    highest: int | None = None  # over every look: a node's last record may no longer hold the line
    attempt = driven.checked.restart + 1
    stepped = eventlog.first_step(request.events, attempt)
    if feed is not None:
        feed.attach(record)
    while True:
        if feed is not None:
            feed.read()
        views = node_views(record, connect, request.nodes.python)
        state = from_nodes(views, names)
        highest = max((s for s in (highest, reported_step(views)) if s is not None), default=None)
        if highest is not None and stepped is not None:
            stepped(highest)
            stepped = None
        if stop.is_set() and not stopping:
            stopping = True
            stop_on_node(connect, node0.host, request.nodes.python, node0.run_dir, "term")
        if end.ended(state.state in FINAL, any((v or {}).get("watchdog_alive") for v in views), views[0] is not None,
                     time.monotonic()):
            break
        time.sleep(poll_s)
    if feed is not None:
        feed.read()
        feed.detach()
    outcome, last = attempt_outcome(views, driven.job.launches, state, driven.started)
    last = max((s for s in (highest, last) if s is not None), default=None)
    eventlog.outcome_failure(request.events, attempt, outcome)
    manifest = write_manifest(request.run_dir / "manifest.json", replace(
        manifest_of(run_setup(request, driven.checked, driven.job), outcome), detached=True,
        attempts=driven.manifest.attempts))
    return Driven(driven.checked, driven.job, outcome, manifest, driven.started, driven.answers, last)


def attempt_outcome(views: Sequence[Mapping[str, Any] | None], launches: Sequence[NodeLaunch], state: RunState,
                    started: float) -> tuple[RunOutcome, int | None]:
    """An ended detached attempt as the recovery loop reads an attached one: per node its exit,
    the failed rank, the error of a node lost, each rank's last lines; the run's reason, first
    failure and hang report from the coordinator's record. And the highest step any rank
    reported (its last progress line, the metric lines among the node's last lines)."""
    from fstrain.core.launch.supervisor import EXIT_LOST_HOST
    from fstrain.core.monitor.logtail import split_rank_prefix
    from fstrain.core.monitor.rankexit import RankFailure
    from fstrain.core.runs.runstate import attempt_reason
    from fstrain.io.launch import NodeState, RunOutcome

    final = next((((v or {}).get("node") or {}).get("final") for v in views
                  if ((v or {}).get("node") or {}).get("final")), None) or (views[0] or {}).get("run") or {}
    recorded = final.get("nodes") or {}
    nodes: list[NodeState] = []
    for index, launch in enumerate(launches):
        view = views[index] if index < len(views) else None
        own = (view or {}).get("node") or {}
        entry = recorded.get(str(index)) or {}
        host = launch.host.name
        node = NodeState(launch, started=float(own.get("started") or started),
                         ended=entry.get("ended") or own.get("ended") or time.time())
        node.exit_code = entry["exit_code"] if "exit_code" in entry else own.get("exit_code")
        node.error = entry.get("error") or (None if view is not None or node.exit_code is not None
                                            else f"{host} cannot be reached")
        failure = entry.get("failure") or own.get("failure")
        if isinstance(failure, dict) and node.exit_code:
            node.failure = RankFailure(failure.get("rank"), failure.get("local_rank"),
                                       int(failure.get("exit_code") or node.exit_code), host)
        offset = launch.rank_offset or 0
        for line in own.get("last_lines") or []:
            local, text = split_rank_prefix(line)
            if local is not None:
                node.rank_tails.setdefault(local, []).append(f"[{host} r{offset + local}] {text.lstrip()}")
            node.tail.append(line)
        for local_text, rank in sorted((own.get("ranks") or {}).items()):
            local, last = int(local_text), split_rank_prefix(str(rank.get("last_line") or ""))[1].lstrip()
            if local not in node.rank_tails and last:  # none of the node's last lines is this rank's
                node.rank_tails[local] = [f"[{host} r{offset + local}] {last}"]
        if node.failure is not None and node.failure.local_rank is not None:
            node.rank_tails.setdefault(node.failure.local_rank, [])  # the failed rank is evidence, lines or not
        nodes.append(node)
    exit_code = state.exit_code if state.exit_code is not None else EXIT_LOST_HOST
    outcome = RunOutcome(exit_code, attempt_reason(state.state), final.get("first_failure_node_rank"), nodes,
                         float(final.get("started") or started), float(final.get("ended") or time.time()),
                         final.get("stall"), str(final.get("reason") or state.reason))
    return outcome, reported_step(views)


def reported_step(views: Sequence[Mapping[str, Any] | None]) -> int | None:
    """The highest step the nodes' records show a rank reported: in each rank's latest numbers
    and last progress line, and in the metric and progress lines among each node's last lines."""
    from fstrain.api.driver import line_step
    from fstrain.core.monitor.logtail import split_rank_prefix
    from fstrain.core.monitor.metricline import from_mapping

    steps = []
    for view in views:
        own = (view or {}).get("node") or {}
        texts = [text for local, text in map(split_rank_prefix, own.get("last_lines") or []) if local is not None]
        texts += [split_rank_prefix(str(rank.get("progress_line") or ""))[1]
                  for rank in (own.get("ranks") or {}).values()]
        steps += [step for step in map(line_step, (t.lstrip() for t in texts)) if step is not None]
        steps += [found.step for found in (from_mapping(rank.get("progress"))
                                           for rank in (own.get("ranks") or {}).values()) if found is not None]
    return max(steps) if steps else None
