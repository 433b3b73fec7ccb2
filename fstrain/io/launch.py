"""`fstrain launch`: start one watchdog-supervised job per node, stream it, tear it all down.

Stages (each a function, each taking what it needs as arguments):

1, 2. ``check_hosts`` (fstrain/io/hostcheck.py): open a listener on the first host on a port
   derived from the run id; then on every host, in one session, check the interpreter, the
   packages and the working directory, read the network facts (fstrain/io/remote/netcheck.py)
   and connect to each of the first host's addresses; keep the first address all of them reach,
   and note per host the interface that routes there (for NCCL/GLOO_SOCKET_IFNAME).
3. ``plan_launches`` (pure, fstrain/core/job/spec.py): the per-node commands.
   Before all this (``prewarm_nodes``, attached runs) every node's watchdog is started with the
   working directory and the user's environment only, so the launcher's Python imports torch
   while the hosts and the rendezvous are checked; ``run_nodes`` then sends each its full header.
4. ``run_nodes``: start the watchdog (fstrain/io/remote/watchdog.py) on every node with its
   header on stdin, stream every line, send heartbeats, and on the first failure, a lost host,
   Ctrl-C or SIGTERM, tell every watchdog to stop (SIGTERM, SIGKILL after the grace period).
5. ``write_manifest``: what ran where, with the environment masked.
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from fstrain import __version__
from fstrain.core.formats import KINDS
from fstrain.core.hosts.hostfile import Host
from fstrain.core.job.spec import (
    DIRECT_SCRIPT,
    SCRIPT_FLAGS,
    NodeLaunch,
    base_env,
    launcher_prefix,
    mask_env,
    redact,
    secret_values,
)
from fstrain.core.launch.supervisor import (
    COLLECT_STACKS,
    FROM_CANCELLED,
    FROM_LINE,
    FROM_RECORD,
    GAVE_UP,
    GIVE_UP,
    HANG_REPORT,
    KILL,
    LOST,
    TEARDOWN,
    Decision,
    Limits,
    Supervisor,
)
from fstrain.core.monitor.logtail import split_rank_prefix
from fstrain.core.monitor.noise import NodeNoise
from fstrain.core.monitor.rankexit import FailureReportReader, RankFailure, node_failure, rank_exit_report
from fstrain.core.progress import Event, RunStages
from fstrain.core.runs.limits import RunLimits
from fstrain.core.runs.manifest import Manifest, ManifestNode
from fstrain.core.slurm.job import CANCELLED_BY_SLURM, slurm_cancel_reason
from fstrain.errors import FstrainError
from fstrain.io.connect import is_local
from fstrain.io.documents import write_json_or_warn
from fstrain.io.fanout import HostPool
from fstrain.io.localout import describe, warn
from fstrain.io.relay import RelayQueue
from fstrain.io.remote import source
from fstrain.io.remote.watchdog import BOOTSTRAP, EVENT_PREFIX
from fstrain.io.stall import HangReports
from fstrain.io.transport.base import RunningCommand, Transport, start_command

HEARTBEAT_INTERVAL_S = 1.0
LIVENESS_INTERVAL_S = 2.0
# The run's verdict as the manifest and `fstrain runs` have always named it ("ok" for a success)
OUTCOME_REASONS = {"succeeded": "ok", "running": "ok"}
REMOTE_RUNS = ".fstrain/runs"  # under the remote home
REMOTE_STATE = "~/.fstrain/active"  # where watchdogs record active runs (for doctor --orphans)


class LaunchError(FstrainError):
    """The job could not be started (preflight, rendezvous)."""


@dataclass
class HostFacts:
    """What preflight learned about one host."""

    host: Host
    info: dict[str, Any]
    session_s: float = 0.0  # the preflight's session on it, start to end (what one session takes there now)


@dataclass(frozen=True)
class Rendezvous:
    master_addr: str
    master_port: int
    interfaces: tuple[str, ...]  # per host, the interface that routes to the master


# -- 1, 2. preflight, rendezvous: fstrain/io/hostcheck.py ------------------------------------


def start_watchdog(transport: Transport, python: str, header: bytes, close_stdin: bool) -> RunningCommand:
    """A node's watchdog (fstrain/io/remote/watchdog.py) started by its BOOTSTRAP, which reads
    ``header`` (one JSON line: the watchdog's source, the job, the run's settings) on stdin."""
    running = start_command(transport, [python, *SCRIPT_FLAGS, "-c", BOOTSTRAP])
    running.write(header)
    if close_stdin:
        running.close_stdin()
    return running


# -- 4. run -------------------------------------------------------------------------------------


@dataclass
class NodeState:
    launch: NodeLaunch
    running: RunningCommand | None = None
    transport: Transport | None = None
    started: float = 0.0
    ended: float | None = None
    exit_code: int | None = None
    error: str | None = None
    tail: list[str] = field(default_factory=list)
    rank_tails: dict[int, list[str]] = field(default_factory=dict)  # per local rank, its own last lines
    noise: NodeNoise = field(default_factory=NodeNoise)  # the launcher's boilerplate, folded on the terminal
    reader: FailureReportReader = field(default_factory=FailureReportReader)  # torchrun's root cause
    failure: RankFailure | None = None  # the failed rank behind a non-zero exit, where known
    # Its watchdog answers each heartbeat (a transport without a link check: srun steps); the
    # monotonic time it was last heard from (any line, answers included)
    answers: bool = False
    heard_s: float = 0.0

    @property
    def done(self) -> bool:
        return self.ended is not None


@dataclass
class RunOptions:
    run_id: str
    run_dir: Path
    limits: RunLimits = field(default_factory=RunLimits)
    workdir: str | None = None
    node_run_dirs: Sequence[str] = ()  # per node: where its watchdog writes files ({run_dir})
    node_files: Sequence[Mapping[str, str]] = ()  # per node: rendered configs to write there
    color: bool = False
    out: TextIO = sys.stdout
    metrics_textfile: str | None = None  # each node writes its Prometheus textfile into this folder
    on_line: Callable[[str], None] | None = None  # each line as the logs hold it, "[host rN] text" (trackers)
    # Inside a Slurm job: why Slurm ended it ("cancelled by Slurm (scancel)"), None while it runs.
    # Asked on fstrain's own SIGTERM and when the run ends.
    ended_by_slurm: Callable[[], str | None] | None = None
    progress: Callable[[Event], None] | None = None  # the stages: nodes up, first step, measurements
    first_step: bool = True  # a training job: waiting for its first step is a stage of the progress
    on_first_step: Callable[[int], None] | None = None  # told the first step a rank reports (the run's events)
    # told the node that failed first, the run's reason and code, once the supervisor names it (the run's events)
    on_first_failure: Callable[[NodeState, str, int | None], None] | None = None


@dataclass
class RunOutcome:
    exit_code: int
    reason: str  # "ok", "failed", "lost", "interrupted", "terminated", "cancelled" (by Slurm)
    first_failure: int | None  # node rank
    nodes: list[NodeState]
    started: float
    ended: float
    stall: dict[str, Any] | None = None  # the hang report (fstrain/io/stall.py), when stalled
    detail: str = ""  # what failed, in words: "rank 3 (local rank 1) on node2 exited with 7"


class _Stop:
    """Ctrl-C / SIGTERM handling: the first asks for a graceful stop, the second for SIGKILL."""

    def __init__(self) -> None:
        self.signals: list[int] = []
        self.event = threading.Event()

    def handler(self, signum: int, _frame: object) -> None:
        self.signals.append(signum)
        self.event.set()


COLORS = ("36", "33", "35", "32", "34", "31", "96", "93")


@dataclass
class Prewarmed:
    """A node's watchdog started before the preflight (``prewarm`` in its first header)."""

    prefix: tuple[str, ...]  # the launcher's command up to its module
    transport: Transport
    running: RunningCommand
    adopted: bool = False  # run_nodes took it over

    def close(self) -> None:
        """Unless adopted: end it (the watchdog ends the waiting interpreter on end of file)."""
        if not self.adopted:
            self.running.close()


def prewarm_nodes(pool: HostPool, backend: str, python: str, workdir: str | None, env: Mapping[str, str],
                  run_id: str) -> list[Prewarmed | None]:
    """Start every node's watchdog now, with only what is known before the preflight (the
    working directory and the user's environment): its launcher's Python imports torch while
    fstrain checks the hosts and the rendezvous. None for a host where it cannot start (the
    preflight says why)."""
    prefix = launcher_prefix(backend, python)

    def one(host: Host) -> Prewarmed | None:
        header = {"format": KINDS["header"].current, "source": source("watchdog"), "prewarm": list(prefix),
                  "workdir": workdir, "env": base_env(env),
                  "run_id": run_id, "node_rank": pool.hosts.index(host), "state_dir": REMOTE_STATE}
        try:
            transport = pool.open_transport(host)
            header["answer_heartbeats"] = answers_heartbeats(transport)
            running = start_watchdog(transport, python, (json.dumps(header) + "\n").encode(), close_stdin=False)
        except FstrainError:
            return None
        return Prewarmed(prefix, transport, running)

    return pool.map(one)


def run_nodes(launches: Sequence[NodeLaunch], connect: Callable[[Host], Transport], python: str,
              options: RunOptions, prewarmed: Sequence[Prewarmed | None] = ()) -> RunOutcome:
    """Start every node's watchdog (or give a prewarmed one its command), stream, watch, and
    tear down. Never leaves a job running."""
    nodes = [NodeState(launch) for launch in launches]
    events: queue.Queue[tuple[str, int, Any, Any]] = RelayQueue()  # bounded: back-pressure
    logs = _Logs(options.run_dir / "logs")
    secrets = secret_values({k: v for n in launches for k, v in n.env.items()})
    stop = _Stop()
    previous = {sig: signal.signal(sig, stop.handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    started = time.time()
    stages = RunStages(len(nodes), options.progress, options.first_step, options.on_first_step)
    try:
        stages.begin()
        for index, node in enumerate(nodes):
            _start_node(node, connect, python, options, events, prewarmed[index] if prewarmed else None)
        threading.Thread(target=_heartbeats, args=(nodes, events, options), daemon=True).start()
        hangs = HangReports(options.run_dir, [node.launch.host.name for node in nodes])
        run = _watch(nodes, events, stop, logs, secrets, options, hangs, stages)
    finally:
        stages.end()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for node in nodes:
            if node.running is not None:
                node.running.close()
            if node.transport is not None:
                node.transport.close()
        logs.close()
    state, exit_code, detail = run.verdict()
    return RunOutcome(exit_code, OUTCOME_REASONS.get(state, state), run.first_failure, nodes, started, time.time(),
                      hangs.document if state == "stalled" else None, detail)


def _start_node(node: NodeState, connect: Callable[[Host], Transport], python: str, options: RunOptions,
                events: queue.Queue[tuple[str, int, Any, Any]], prewarmed: Prewarmed | None = None) -> None:
    launch = node.launch
    node.started, node.heard_s = time.time(), time.monotonic()
    header = watchdog_header(launch, options)
    if prewarmed is not None and tuple(launch.argv[:len(prewarmed.prefix)]) == prewarmed.prefix:
        prewarmed.adopted = True  # the full header, without the watchdog's source it already runs
        node.transport, node.running = prewarmed.transport, prewarmed.running
        node.answers = header["answer_heartbeats"] = answers_heartbeats(node.transport)
        node.running.write((json.dumps({k: v for k, v in header.items() if k != "source"}) + "\n").encode())
        threading.Thread(target=_pump, args=(node, events), daemon=True,
                         name=f"fstrain-node{launch.node_rank}").start()
        return
    if prewarmed is not None:
        prewarmed.close()
    try:
        node.transport = connect(launch.host)
        node.answers = header["answer_heartbeats"] = answers_heartbeats(node.transport)
        node.running = start_watchdog(node.transport, python, (json.dumps(header) + "\n").encode(),
                                      close_stdin=False)
    except FstrainError as exc:
        events.put(("lost", launch.node_rank, exc.message, None))
        return
    threading.Thread(target=_pump, args=(node, events), daemon=True, name=f"fstrain-node{launch.node_rank}").start()


def answers_heartbeats(transport: Transport) -> bool:
    """Whether the node's watchdog must answer heartbeats: its transport has no link check of
    its own (an srun step: a dead node's ``srun`` keeps waiting, silent, until Slurm declares
    the node down, minutes later), so the answers are how a lost node shows."""
    return bool(getattr(transport, "answers_heartbeats", False))


def watchdog_header(launch: NodeLaunch, options: RunOptions) -> dict[str, Any]:
    """What a node's watchdog reads from its stdin: its job, files and limits."""
    rank = launch.node_rank
    run_dir = node_run_dir(launch.host, rank, options)
    header: dict[str, Any] = {
        "format": KINDS["header"].current,
        "source": source("watchdog"),
        "argv": list(launch.argv),
        "env": dict(launch.env),
        "workdir": options.workdir,
        "files": dict(options.node_files[rank]) if options.node_files else {},
        "run_dir": run_dir,
        "state_dir": REMOTE_STATE,
        "run_id": options.run_id,
        "node_rank": rank,
        "nproc": launch.nproc,
        "rank_log_dir": launch.rank_log_dir,
        "cleanup": [launch.rank_log_dir] if launch.rank_log_dir else [],
        "grace_s": options.limits.grace_s,
        "heartbeat_timeout_s": options.limits.heartbeat_timeout_s,
        "backend": launch.backend,
        "rank_offset": launch.rank_offset,
    }
    limits = options.limits
    if limits.stall_timeout_s or limits.finish_timeout_s:  # ranks answer SIGUSR1 with their stacks
        header.update(stacks=True, modules={"stacks": source("stacks")}, stall_timeout_s=limits.stall_timeout_s,
                      finish_timeout_s=limits.finish_timeout_s)
    if launch.backend == "direct":  # fstrain's own script starts the ranks (and reports the first failure)
        header["files"] = {**header["files"], DIRECT_SCRIPT: source("ranks")}
    if launch.backend == "deepspeed":  # its launcher does not say which rank failed: the watchdog looks
        header.update(watch_rank_exits=True, modules={**header.get("modules", {}), "stacks": source("stacks")})
    if options.metrics_textfile:  # the node's .prom file: its ranks' lines, alive ranks from /proc
        monitor = Path(__file__).resolve().parent.parent / "core" / "monitor"  # pure, stdlib-only: the nodes run them
        header.update(metrics_textfile=options.metrics_textfile,
                      modules={**header.get("modules", {}), "stacks": source("stacks"),
                               "promfile": (monitor / "promfile.py").read_text(),
                               "metricline": (monitor / "metricline.py").read_text()})
    return header


def node_run_dir(host: Host, node_rank: int, options: RunOptions) -> str:
    """The run directory on a node: the local run dir for localhost, else under the remote home."""
    if options.node_run_dirs:
        return options.node_run_dirs[node_rank]
    return remote_run_dir(host, None, options.run_id, options.run_dir)


def remote_run_dir(host: Host, home: str | None, run_id: str, local_run_dir: Path) -> str:
    """Absolute where the home is known: rendered configs name their own paths, so ``~`` is
    resolved with the probed home."""
    if is_local(host):
        return str(local_run_dir.resolve())
    return f"{home or '~'}/{REMOTE_RUNS}/{run_id}"


def _pump(node: NodeState, events: queue.Queue[tuple[str, int, Any, Any]]) -> None:
    assert node.running is not None
    rank = node.launch.node_rank
    for stream, line in node.running.lines():
        node.heard_s = time.monotonic()
        events.put(("line", rank, stream, line))
    code, why = node.running.wait()
    events.put(("exit", rank, code, why))


def _heartbeats(nodes: Sequence[NodeState], events: queue.Queue[tuple[str, int, Any, Any]],
                options: RunOptions) -> None:
    """Tell every watchdog the launcher lives (those that answer heartbeats reply: the supervisor
    takes a node whose replies stop as lost); report a host whose server stops answering."""
    last_liveness = 0.0
    while not all(n.done for n in nodes):
        for node in nodes:
            if node.running is not None and not node.done:
                node.running.write(b"hb\n")
        if time.monotonic() - last_liveness > LIVENESS_INTERVAL_S:
            last_liveness = time.monotonic()
            for node in nodes:
                alive = getattr(node.transport, "alive", None)
                if alive is not None and not node.done:
                    threading.Thread(target=_check_alive, args=(node, alive, events, options),
                                     daemon=True).start()
        time.sleep(HEARTBEAT_INTERVAL_S)


def _check_alive(node: NodeState, alive: Callable[[float], bool], events: queue.Queue[tuple[str, int, Any, Any]],
                 options: RunOptions) -> None:
    if not alive(options.limits.heartbeat_timeout_s) and not node.done:
        events.put(("lost", node.launch.node_rank,
                    f"no answer from the host for {options.limits.heartbeat_timeout_s:g} s", None))


def _watch(nodes: list[NodeState], events: queue.Queue[tuple[str, int, Any, Any]], stop: _Stop, logs: _Logs,
           secrets: Sequence[str], options: RunOptions, hangs: HangReports, stages: RunStages) -> Supervisor:
    """Feed the supervisor what the nodes and the user do, and carry out what it decides,
    until every node has ended."""
    clock = time.monotonic
    run = Supervisor([n.launch.host.name for n in nodes],
                     supervision_limits(options.limits), clock(),
                     heard_from=[n.answers for n in nodes])
    handled_signals, heard_at_s = 0, clock()
    tell_failure = options.on_first_failure
    while not run.ended:
        for signum in stop.signals[handled_signals:]:  # the first asks for a graceful stop, the next kills
            if signum == signal.SIGTERM:
                _ask_slurm(run, options, clock())
            _carry_out(run.signalled(signum == signal.SIGINT, clock()), nodes, run, hangs, options)
        handled_signals = len(stop.signals)
        try:
            kind, rank, a, b = events.get(timeout=0.2)
        except queue.Empty:
            kind, rank, a, b = "", -1, None, None
        node = nodes[rank] if kind else None
        if kind == "line" and node is not None:
            if b.startswith(EVENT_PREFIX):  # the watchdog's report, not the job's output
                payload = json.loads(b[len(EVENT_PREFIX):])
                node.reader.observed(rank_exit_report(payload.get("rank_exit")))
                if "stacks" in payload:
                    hangs.add(rank, payload["stacks"])
                    run.stacks_reported(rank)
                if payload.get("ranks_gone"):
                    run.rank_finished(clock(), rank, bool(payload.get("ranks_ended")))
                if isinstance(payload.get("draw"), dict):  # a rank's bar drawn: output, in no log
                    run.output(clock())
                    stages.line(rank, True, str(payload["draw"].get("text") or ""))
                continue
            why = slurm_cancel_reason(b) if options.ended_by_slurm is not None else None
            if why:
                run.scheduler_ends(why, FROM_LINE, clock())
            node.reader.feed(b)
            local_rank, text = split_rank_prefix(b)
            if local_rank is not None:
                run.output(clock())
            stages.line(rank, local_rank is not None, text)
            _emit(node, a, redact(b, secrets), logs, options)
        elif kind == "exit" and node is not None and not node.done:
            _show(node, node.launch.host.name, node.noise.flush(), options)
            node.ended = time.time()
            node.exit_code, node.error = a, b
            node.failure = node_failure(node.launch.backend, a, node.reader.root_cause, node.launch.rank_offset)
            _carry_out(run.node_exited(rank, a, clock(), failure_summary(node.failure), b), nodes, run, hangs,
                       options)
        elif kind == "lost" and node is not None and not node.done:
            _carry_out(run.node_lost(rank, a, clock()), nodes, run, hangs, options)
        if clock() - heard_at_s >= HEARTBEAT_INTERVAL_S:  # once a beat, not once a line: O(nodes) each
            heard_at_s = clock()
            for index, each in enumerate(nodes):  # when its reader last read from it (queued lines are older)
                run.heard(index, each.heard_s)
        _carry_out(run.tick(clock()), nodes, run, hangs, options)
        if tell_failure is not None and run.first_failure is not None:  # once, as soon as it is named
            tell_failure(nodes[run.first_failure], run.reason, run.exit_code)
            tell_failure = None
    _ask_slurm(run, options, clock())
    return run


def supervision_limits(limits: RunLimits) -> Limits:
    """The supervisor's rules from the run's limits (its own module is stdlib-only: it runs on nodes)."""
    return Limits(stall_timeout_s=limits.stall_timeout_s, finish_timeout_s=limits.finish_timeout_s,
                  heartbeat_timeout_s=limits.heartbeat_timeout_s, grace_s=limits.grace_s)


def _ask_slurm(run: Supervisor, options: RunOptions, now_s: float) -> None:
    """Inside a Slurm job: whether Slurm is ending it (scancel), from its record, for the supervisor."""
    why = options.ended_by_slurm() if options.ended_by_slurm is not None else None
    if why:
        run.scheduler_ends(why, FROM_CANCELLED if why == CANCELLED_BY_SLURM else FROM_RECORD, now_s)


def _carry_out(decisions: Sequence[Decision], nodes: Sequence[NodeState], run: Supervisor, hangs: HangReports,
               options: RunOptions) -> None:
    for decision in decisions:
        chosen = [nodes[i] for i in decision.nodes]
        if decision.action in (TEARDOWN, KILL):
            _stop_all(nodes, chosen, "kill" if decision.action == KILL else "term")
        elif decision.action == COLLECT_STACKS:
            options.out.write(f"fstrain: {run.stall_reason}: collecting every live rank's stacks\n")
            options.out.flush()
            _stop_all(nodes, chosen, "stacks")
        elif decision.action == HANG_REPORT:
            hangs.write(run.stall_reason, decision.nodes)
        elif decision.action == LOST:
            for lost in chosen:
                _abandon(lost, run.nodes[lost.launch.node_rank].error, options)
        elif decision.action == GIVE_UP:  # no answer after the grace period: its watchdog cleans up alone
            for straggler in chosen:
                straggler.ended = time.time()
                straggler.error = straggler.error or GAVE_UP


def _abandon(node: NodeState, why: str | None, options: RunOptions) -> None:
    """A node the supervisor holds lost: its end, and no more waiting for its client."""
    _show(node, node.launch.host.name, node.noise.flush(), options)
    node.ended, node.error = time.time(), why
    if node.running is not None:
        abandon = getattr(node.running, "abandon", None)
        if abandon is not None:  # a client that would wait for the lost node (srun): ended here
            abandon()
        node.running.close()


def _stop_all(nodes: Sequence[NodeState], chosen: Sequence[NodeState], how: str) -> None:
    """Send ``how`` (term, kill, stacks) to the chosen nodes' watchdogs."""
    if how != "stacks":
        for node in nodes:
            node.noise.stopping = True  # from now on, the launchers' teardown tracebacks are folded
    for node in chosen:
        if node.running is not None and not node.done:
            node.running.write(f"{how}\n".encode())


def _emit(node: NodeState, stream: str, line: str, logs: _Logs, options: RunOptions) -> None:
    host = node.launch.host.name
    local_rank, text = split_rank_prefix(line)
    rank = local_rank if local_rank is None or node.launch.rank_offset is None else node.launch.rank_offset + local_rank
    tag = f"{host} r{rank}" if rank is not None else host
    _show(node, tag, node.noise.feed(local_rank, text), options)
    logs.write(host, rank, f"[{tag}] {text}")
    if options.on_line is not None:
        options.on_line(f"[{tag}] {text}")
    node.tail = [*node.tail[-19:], f"[{tag}] {text}"]
    if local_rank is not None:
        node.rank_tails[local_rank] = [*node.rank_tails.get(local_rank, [])[-19:], f"[{tag}] {text}"]


def _show(node: NodeState, tag: str, texts: Sequence[str], options: RunOptions) -> None:
    """Lines on the terminal (stdout), prefixed with their node (and rank)."""
    if not texts:
        return
    prefix = f"[{tag}]"
    if options.color:
        prefix = f"\x1b[{COLORS[node.launch.node_rank % len(COLORS)]}m{prefix}\x1b[0m"
    options.out.write("".join(f"{prefix} {text}\n" for text in texts))
    options.out.flush()


def last_lines(node: NodeState, count: int = 10) -> list[str]:
    """A failed node's most telling lines: the first failed rank's own (torchrun names it),
    else the node's last lines."""
    cause = node.reader.root_cause
    if cause is not None and cause.local_rank is not None and node.rank_tails.get(cause.local_rank):
        return node.rank_tails[cause.local_rank][-count:]
    return node.tail[-count:]


class _Logs:
    """RUN_DIR/logs/<host>.log, and <host>.r<rank>.log where the rank is known (the global
    rank where ranks are fixed before the start, else the local rank).

    A local write failure (a full disk) is said once and ends the local copy; the job runs on."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.files: dict[str, TextIO] = {}
        self.lost: str | None = None
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._fail(exc)

    def write(self, host: str, local_rank: int | None, line: str) -> None:
        if self.lost is not None:
            return
        names = [f"{host}.log"] + ([f"{host}.r{local_rank}.log"] if local_rank is not None else [])
        try:
            for name in names:
                handle = self.files.get(name)
                if handle is None:
                    handle = self.files[name] = (self.folder / name).open("a")
                handle.write(line + "\n")
                handle.flush()
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        self.lost = describe(exc)
        warn(f"cannot write the logs in {self.folder} ({self.lost}); the job keeps running and its "
             "output still streams, but the local log files stop here")
        self.close()

    def close(self) -> None:
        for handle in self.files.values():
            with contextlib.suppress(OSError):
                handle.close()
        self.files = {}


# -- 5. manifest --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSetup:
    """What a run was started with, as its manifest describes it."""

    run_id: str
    backend: str
    launches: Sequence[NodeLaunch]
    rendezvous: Rendezvous | None = None
    facts: Sequence[HostFacts] = ()
    env: Mapping[str, str] = field(default_factory=dict)  # the user's (masked in the manifest)
    plan: Mapping[str, Any] | None = None  # the plan it trains with


def manifest_of(setup: RunSetup, outcome: RunOutcome | None) -> Manifest:
    """What ``setup`` ran and how ``outcome`` ended it (no outcome: a run that started detached,
    its end kept by its nodes); the caller adds its marks with :func:`dataclasses.replace`."""
    states = {n.launch.node_rank: n for n in outcome.nodes} if outcome else {}
    versions = {f.host.label(): {k: f.info.get(k) for k in ("hostname", "python", "torch", "deepspeed")}
                for f in setup.facts}
    rendezvous = setup.rendezvous
    first = outcome.first_failure if outcome else None
    return Manifest(
        run_id=setup.run_id,
        backend=setup.backend,
        master_addr=rendezvous.master_addr if rendezvous else None,
        master_port=rendezvous.master_port if rendezvous else None,
        env=mask_env(setup.env),
        plan=setup.plan,
        versions=versions,
        started=outcome.started if outcome else None,
        ended=outcome.ended if outcome else None,
        exit_code=outcome.exit_code if outcome else None,
        reason=outcome.reason if outcome else "dry-run",
        stall=outcome.stall if outcome else None,
        detail=outcome.detail if outcome else None,
        first_failure_node_rank=first,
        first_failure=failure_summary(outcome.nodes[first].failure) if outcome and first is not None else None,
        nodes=tuple(node_summary(launch, states.get(launch.node_rank)) for launch in setup.launches),
    )


def write_manifest(path: Path, manifest: Manifest) -> Manifest:
    """RUN_DIR/manifest.json, the only writer of the file: at a run's end, at a detached start,
    between a recovering run's attempts, with the training summary added."""
    write_json_or_warn(path, manifest.to_dict(__version__))  # a full disk loses the file, never the job's result
    return manifest


def node_summary(launch: NodeLaunch, state: NodeState | None) -> ManifestNode:
    node = ManifestNode(launch.host.label(), launch.node_rank, launch.nproc, tuple(launch.argv), mask_env(launch.env))
    if state is None:
        return node
    return replace(node, exit_code=state.exit_code, error=state.error, started=state.started, ended=state.ended,
                   seconds=round((state.ended or time.time()) - state.started, 3),
                   last_lines=tuple(last_lines(state)), failed_rank=failure_summary(state.failure))


def failure_summary(failure: RankFailure | None) -> dict[str, Any] | None:
    """The failed rank as the manifest records it."""
    if failure is None:
        return None
    return {"rank": failure.rank, "local_rank": failure.local_rank, "exit_code": failure.exit_code,
            "signal": failure.signal_name or None}
