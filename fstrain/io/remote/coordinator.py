"""Detached runs: the nodes' watchdogs supervise the job together, with no launcher connected.

Stdlib only (Python >= 3.8), loaded by the watchdog (fstrain/io/remote/watchdog.py) when its
header has ``detach``: ``{"role": "coordinator" | "member", "secret": hex, "nnodes": N,
"bind": address (coordinator), "coordinator": [address, port] (member)}``, and for an attempt of
a recovering run ``"banner"``: the line that marks where the attempt begins in ``node<I>.out``.

Start: the watchdog forks. The child starts a session of its own (the SSH session may end),
sends its own and the job's output through a pipe that it copies, line by line with the time
in front, to ``RUN_DIR/node<I>.out``, starts the job, and answers the parent with one JSON line
(``pid``, ``job_pid``, and for the coordinator the ``port`` it listens on); the parent prints
that line and exits, so `fstrain launch --detach` returns once every node has started.

Node 0's watchdog is the coordinator. It listens on the rendezvous address (every node reached
it before the start). Each member connects; TCP, one JSON object per line; the first line of
every connection carries the run's secret (compared in constant time; a wrong one closes the
connection): ``{"hello": node_rank}`` from a member, ``{"control": "stop", "how": "term" |
"kill"}`` from `fstrain stop` and ``{"control": "views"}`` from `fstrain status`, `logs --tail`
and the recovery keeper (both sent from node 0 itself by runctl.py). One thread reads every
connection. Then, both ways, a heartbeat every
``heartbeat_interval_s`` (1 s up to 512 nodes, then growing so that node 0 reads at most 512 a
second); a member reports ``{"exit": code, "failure": {...}}`` when its job ends.

The rules are the attached launcher's: the first node whose job fails (or which is lost: its
connection closes, or no heartbeat for ``heartbeat_timeout_s``, or it never joins) stops every
node (``term``: SIGTERM, SIGKILL after ``grace_s``); a member that loses the coordinator tears
its own job down. When every node has ended, the coordinator sends the run's record
(``state``, ``exit_code``, ``first_failure``) to every member; each node writes it to
``RUN_DIR/node<I>.json``, the coordinator also to ``RUN_DIR/run.json``.

A detached run without a recovery policy has no process on the launching machine once it has
started: the coordinator decides it, so it writes the run's events (``detach`` has ``events``,
the launching fstrain's version, which each line names as its writer):
``RUN_DIR/events.jsonl`` on node 0, a flushed line each as fstrain/core/runs/runevents.py
describes them (``started``, ``first_step`` from node 0's ranks, ``failure``, ``finished``).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
from typing import Any, NoReturn

EVENT_PREFIX = "fstrain-watchdog-event: "  # the watchdog's reports (as in watchdog.py), not job output
STACKS_WAIT_S = 30.0  # for every live node's stacks report, after a stall
HEARTBEAT_S = 1.0  # the heartbeat's interval, both ways, up to HEARTBEATS_PER_S nodes
# Node 0 reads every member's heartbeats: at most this many a second whatever the run's size
# (docs/scale.md: about 60 us of node 0's CPU each), so the interval grows past HEARTBEAT_S
# with the nodes, up to a quarter of the heartbeat timeout (four beats missed before a loss).
HEARTBEATS_PER_S = 512
STATE_EVERY_S = 2.0
JOIN_TIMEOUT_S = 120.0  # a member that has not connected by then is lost
TAIL_LINES = 10
SEND_TIMEOUT_S = 10.0  # a send to a peer that reads nothing gives up after this long
MAX_LINE_BYTES = 16 << 20  # a connection whose line grows past this is closed (a view is kilobytes)
GPUS_EVERY_S = 10.0  # how old a node's GPU figures in its view may be (nvidia-smi is a process)
# The format versions this file writes and reads (fstrain/core/formats.py KINDS, read there by
# name: this file runs alone on the node). Every message carries MESSAGE_FORMAT; a first
# message of a newer one (a newer fstrain's `fstrain stop`) is refused with one line.
MESSAGE_FORMAT = 1
NODE_FORMAT = 1  # node<I>.json
RUN_FORMAT = 1  # run.json, and the record in ``end``
COORDINATOR_FORMAT = 1  # coordinator.json
ENDED_VIEWS_FORMAT = 1  # ended-views.json
# Once the run is over, how long the coordinator waits for the members whose job ended to close
# their connections (each closes it just before its process exits) before it writes ended-views.json.
MEMBERS_GONE_WAIT_S = 10.0
EVENTS_FORMAT = 1  # each line of events.jsonl


def heartbeat_interval_s(nnodes: int, heartbeat_timeout_s: float) -> float:
    """Seconds between two heartbeats of one member (and of the coordinator to each member)."""
    return max(HEARTBEAT_S, min(nnodes / HEARTBEATS_PER_S, heartbeat_timeout_s / 4))


def write_json(path: str, document: dict[str, Any]) -> None:
    partial = f"{path}.{os.getpid()}.partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(document, handle, indent=1)
    os.replace(partial, path)


def unreadable(message: dict[str, Any]) -> str:
    """Why this coordinator cannot act on a message ('' when it can): one of a newer format."""
    found = message.get("format", 1)
    if isinstance(found, int) and not isinstance(found, bool) and 1 <= found <= MESSAGE_FORMAT:
        return ""
    return (f"the run's coordinator reads coordinator messages of format {MESSAGE_FORMAT}, this request is format "
            f"{found!r}: the run was started by an older fstrain")


class Link:
    """One TCP connection carrying JSON lines."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = sock.makefile("rb")
        self.lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> bool:
        return self.send_bytes((json.dumps({"format": MESSAGE_FORMAT, **message}) + "\n").encode())

    def send_bytes(self, data: bytes) -> bool:
        """A message encoded once for every link (the coordinator's heartbeat)."""
        with self.lock:
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                return False

    def messages(self) -> Any:
        while True:
            try:
                raw = self.reader.readline()
            except (OSError, ValueError):  # ValueError: closed by close() on another thread
                return
            if not raw:
                return
            try:
                message = json.loads(raw)
            except ValueError:
                return
            if isinstance(message, dict):
                yield message

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.reader.close()
        with contextlib.suppress(OSError):
            self.sock.close()


class Output:
    """Copies the job's output (a pipe) to RUN_DIR/node<I>.out with the time in front of each
    line, and remembers per local rank the time and text of its last line, its latest numbers
    (``progress``, read from its lines and its bar's draws) and the line they come from
    (``progress_line``: its last metric line once it printed one, else its last progress line),
    which `fstrain status` reads.

    ``newer_step``: fstrain/core/monitor/metricline.py's (sent in the header as ``metricline``),
    the one rule `status` and its live view read a rank's numbers by."""

    def __init__(self, read_fd: int, path: str, secrets: list[str], newer_step: Any) -> None:
        self.on_event: Any = None  # called with the watchdog's own reports (stacks, ranks gone)
        self.rank_exit: dict[str, Any] | None = None  # the watchdog's report of the first rank to fail
        self.read_fd = read_fd
        self.path = path
        self.secrets = [s.encode() for s in secrets]  # values written as **** (the launcher's rule)
        self.last_at: float | None = None  # the time of day of the last rank line (shown by `fstrain status`)
        self.last_output_mono: float | None = None  # the same on this node's monotonic clock (for the rules)
        self.ranks: dict[str, dict[str, Any]] = {}
        self.newer_step = newer_step
        self.readings: dict[str, Any] = {}  # local rank -> the StepReading its progress_line gave
        self.tail: list[str] = []
        self.tail_at: list[float] = []  # the time in front of each of them in the file
        self.out_bytes = 0  # the file's size after the last of them: where a read after them starts
        self.out_bytes_known = False  # out_bytes is the file's size (copy() has measured it)
        self.lock = threading.Lock()
        self.last_write = time.monotonic()

    def copy(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        size = os.fstat(fd).st_size  # this process alone appends to it from here on
        with self.lock:  # what is there before the first line (a recovering run's banner)
            self.out_bytes, self.out_bytes_known = size, True
        with os.fdopen(self.read_fd, "rb") as source, os.fdopen(fd, "ab", buffering=0) as sink:
            for raw in source:
                if raw.startswith(EVENT_PREFIX.encode()):
                    with contextlib.suppress(ValueError):
                        payload = json.loads(raw[len(EVENT_PREFIX):])
                        self.rank_exit = payload.get("rank_exit") or self.rank_exit
                        if isinstance(payload.get("draw"), dict):
                            self.note_draw(time.time(), payload["draw"])
                        if self.on_event is not None:
                            self.on_event(payload)
                    continue
                now = time.time()
                for secret in self.secrets:
                    raw = raw.replace(secret, b"****")
                line = raw.rstrip(b"\n").decode(errors="replace")
                written = b"%.3f " % now + raw if raw.endswith(b"\n") else b"%.3f " % now + raw + b"\n"
                sink.write(written)
                size += len(written)
                self.note(now, line, size)
                self.last_write = time.monotonic()

    def settle(self, quiet_s: float = 0.5, limit_s: float = 5.0) -> None:
        """Wait until the job's last lines are copied (the pipe stays open: this process
        holds it as its own stdout, so its end is a quiet moment, not end of file)."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and time.monotonic() - self.last_write < quiet_s:
            time.sleep(0.1)

    def note(self, now: float, line: str, size: int | None = None) -> None:
        local = None
        if line.startswith("[") and "]:" in line:
            tag = line[1:line.index("]:")]
            digits = tag.lstrip("abcdefghijklmnopqrstuvwxyz")
            if digits.isdigit() and tag[: len(tag) - len(digits)] in ("default", "rank", "local"):
                local = digits
        with self.lock:
            self.tail = [*self.tail[-(TAIL_LINES - 1):], line]
            self.tail_at = [*self.tail_at[-(TAIL_LINES - 1):], now]
            if size is not None:
                self.out_bytes = size
            if local is None:
                return
            self.last_at = now
            self.last_output_mono = time.monotonic()
            entry = self.ranks.setdefault(local, {})
            entry.update(last_output_at=now, last_line=line[-300:])
            self.read(local, entry, now, line)

    def note_draw(self, now: float, draw: dict[str, Any]) -> None:
        """The newest draws of a rank's bar, a line it is still writing (the watchdog's ``draw``
        event): read for the rank's numbers and as its output (a rank that draws is not
        stalled), but no line: neither in the output file nor in the last lines."""
        local, text = draw.get("local"), draw.get("text")
        if isinstance(local, bool) or not isinstance(local, int) or not isinstance(text, str):
            return
        with self.lock:
            self.last_at = now
            self.last_output_mono = time.monotonic()
            entry = self.ranks.setdefault(str(local), {})
            entry.update(last_output_at=now)
            self.read(str(local), entry, now, f"[local{local}]:{text}")

    def read(self, local: str, entry: dict[str, Any], now: float, line: str) -> None:
        """The rank's numbers once ``line`` is read: ``progress`` (a metric line's object, the
        version in it), and ``progress_line``, the line they come from."""
        held = self.readings.get(local)
        reading = self.newer_step(held, line)
        if reading is not held:
            self.readings[local] = reading
            # A metric line is kept whole (a cut one would not read again); metricline reads
            # none over MAX_LINE_BYTES. A progress line's numbers are at its end.
            entry.update(progress_at=now, progress_line=line if reading.from_metric_line else line[-300:],
                         progress=reading.metrics.as_dict())

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"last_output_at": self.last_at, "ranks": json.loads(json.dumps(self.ranks)),
                    "last_lines": list(self.tail), "last_lines_at": list(self.tail_at), "out_bytes": self.out_bytes,
                    "out_bytes_known": self.out_bytes_known}


class Peer:
    """A connection to the coordinator: its link, what was read of an unfinished line, and the
    member it is (None until its hello)."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.buffer = bytearray()  # appended to in place: a long line is not copied at each read
        self.rank: int | None = None
        self.open = True
        self.answering = False  # handed to a thread that answers and closes it


class Node:
    """What every detached watchdog does: start, write its state, report its end."""

    def __init__(self, header: dict[str, Any], watchdog_class: Any) -> None:
        self.header = header
        self.detach = header["detach"]
        self.node_rank = int(header.get("node_rank", 0))
        self.run_dir = os.path.expanduser(header.get("run_dir") or ".")
        self.state_path = os.path.join(self.run_dir, f"node{self.node_rank}.json")

        class Detached(watchdog_class):
            heartbeat_source = "the coordinator"

            def control_loop(self) -> None:
                return  # control comes over the network, not stdin

        self.watchdog = Detached(header)
        self.output: Output | None = None
        self.started = time.time()
        self.exit_code: int | None = None
        self.failure: dict[str, Any] | None = None
        self.final: dict[str, Any] | None = None
        self.ended: float | None = None
        self.note = ""
        self.result: dict[str, Any] = {}
        self.gpus: dict[str, Any] = {}
        self.gpus_at = 0.0

    def state(self) -> dict[str, Any]:
        child = self.watchdog.child
        document: dict[str, Any] = {
            "format": NODE_FORMAT,
            "run_id": self.header.get("run_id"), "node_rank": self.node_rank, "role": self.detach["role"],
            "hostname": socket.gethostname(), "watchdog_pid": os.getpid(),
            "job_pid": child.pid if child is not None else None, "started": self.started, "ended": self.ended,
            "exit_code": self.exit_code, "failure": self.failure, "note": self.note, "final": self.final,
            "rank_offset": self.header.get("rank_offset"), "nproc": self.header.get("nproc"),
            "updated": time.time(),
        }
        if self.output is not None:
            document.update(self.output.snapshot())
        return document

    def write_state(self) -> None:
        with contextlib.suppress(OSError):
            write_json(self.state_path, self.state())

    def read_gpus(self, runctl: Any) -> None:
        self.gpus = runctl.gpus()
        self.gpus_at = time.monotonic() + GPUS_EVERY_S

    def view(self) -> dict[str, Any]:
        """What runctl's ``state`` answers for this node (fstrain/io/remote/runctl.py), from this
        process: its record, its job's live ranks (its own processes, not every one in /proc)
        and the GPUs (read at most every GPUS_EVERY_S, apart: the view has the last reading)."""
        runctl = self.watchdog.module("runctl")
        if time.monotonic() >= self.gpus_at:  # on a thread of its own: a hung nvidia-smi never delays a heartbeat
            self.gpus_at = time.monotonic() + GPUS_EVERY_S + 20  # runctl's own nvidia-smi timeout is 20 s
            threading.Thread(target=self.read_gpus, args=(runctl,), daemon=True).start()
        match = {"FSTRAIN_RUN_ID": str(self.header.get("run_id", "")), "FSTRAIN_NODE_RANK": str(self.node_rank)}
        return {"node": self.state(), "run": None, "watchdog_alive": True,
                "ranks_alive": runctl.ranks_alive(match, self.watchdog.job_processes()), "gpus": self.gpus}

    def keep_writing_state(self) -> None:
        while self.ended is None:
            self.write_state()
            time.sleep(STATE_EVERY_S)

    def start_job(self, ready_fd: int, extra: dict[str, Any]) -> threading.Thread:
        """Run the job in a thread; answer the parent once it started (or could not)."""
        result = self.result

        def run() -> None:
            result["code"] = self.watchdog.run()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        while self.watchdog.child is None and thread.is_alive():
            time.sleep(0.02)
        if self.watchdog.child is None:
            thread.join()
            answer = {"error": f"the job did not start (exit {result.get('code')})", **extra}
        else:
            answer = {"pid": os.getpid(), "job_pid": self.watchdog.child.pid, **extra}
        os.write(ready_fd, (json.dumps(answer) + "\n").encode())
        os.close(ready_fd)
        threading.Thread(target=self.keep_writing_state, daemon=True).start()
        return thread

    def job_ended(self, thread: threading.Thread) -> None:
        thread.join()
        code = self.result.get("code")
        self.exit_code = code if code is not None else 127
        if self.output is not None:
            self.output.settle()
        self.failure = self.read_failure()
        self.write_state()

    def read_failure(self) -> dict[str, Any] | None:
        """The failed rank behind a non-zero exit (torchrun's root cause; for DeepSpeed, the rank
        the watchdog saw exit first, else just the launcher's code)."""
        if "rankexit" not in (self.header.get("modules") or {}) or not self.exit_code:
            return None
        module = self.watchdog.module("rankexit")
        reader = module.FailureReportReader()
        with contextlib.suppress(OSError), open(self.output.path if self.output else "", errors="replace") as handle:
            for line in handle:
                reader.feed(line.split(" ", 1)[-1])
        reader.observed(module.rank_exit_report(self.output.rank_exit if self.output else None))
        failure = module.node_failure(self.header.get("backend", "torchrun"), self.exit_code, reader.root_cause,
                                      self.header.get("rank_offset"))
        if failure is None:
            return None
        return {"rank": failure.rank, "local_rank": failure.local_rank, "exit_code": failure.exit_code,
                "signal": failure.signal_name or None}


class Coordinator:
    """Node 0: the members' links and the run's record. The rules are the supervisor's
    (fstrain/core/launch/supervisor.py, sent in the header as ``supervisor``), on this node's
    monotonic clock: members report how long ago their ranks printed, never a time of day."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.secret = str(node.detach["secret"])
        self.nnodes = int(node.detach["nnodes"])
        header = node.header
        self.rules = node.watchdog.module("supervisor")
        self.analysis = node.watchdog.module("analysis")
        names = node.detach.get("names") or [f"node {i}" for i in range(self.nnodes)]
        limits = self.rules.Limits(
            stall_timeout_s=header.get("stall_timeout_s"), finish_timeout_s=header.get("finish_timeout_s"),
            heartbeat_timeout_s=float(header.get("heartbeat_timeout_s", 30)), join_timeout_s=JOIN_TIMEOUT_S,
            grace_s=float(header.get("grace_s", 15)), stacks_wait_s=STACKS_WAIT_S)
        self.run = self.rules.Supervisor(names, limits, time.monotonic(), joined=False)
        self.interval_s = heartbeat_interval_s(self.nnodes, limits.heartbeat_timeout_s)
        # Node 0's own job is ended by this coordinator's decisions only: a tick running late
        # (node 0 loaded) is fstrain's slowness, never a reason to stop a healthy job.
        node.watchdog.heartbeat_timeout_s = float("inf")
        self.lock = threading.RLock()
        self.links: dict[int, Link] = {}
        self.closed: set[int] = set()  # members whose connection has closed
        self.views: dict[int, Any] = {}  # member -> its latest view (sent with its heartbeats)
        self.ended_at: dict[int, float] = {}  # node -> the time of day it ended, for the record
        self.stacks: dict[int, Any] = {}
        self.stall: dict[str, Any] | None = None
        self.started = time.time()
        self.listener: socket.socket | None = None
        self.finished = False
        self.events_path = os.path.join(node.run_dir, "events.jsonl") if node.detach.get("events") else None
        self.stepped = False  # the first step is written (node 0's ranks' lines show it)

    # -- events in ------------------------------------------------------------------------------

    def event(self, rank: int, payload: dict[str, Any]) -> None:
        """A node's watchdog report: its ranks' stacks, or ranks whose process ended."""
        with self.lock:
            if "stacks" in payload:
                self.stacks[rank] = payload["stacks"]
                self.run.stacks_reported(rank)
            if payload.get("ranks_gone"):
                self.run.rank_finished(time.monotonic(), rank, bool(payload.get("ranks_ended")))

    def output_age(self, age_s: Any) -> None:
        """A node's ranks printed ``age_s`` seconds ago (measured there, on its own clock)."""
        if isinstance(age_s, (int, float)) and not isinstance(age_s, bool) and age_s >= 0:
            with self.lock:
                self.run.output(time.monotonic() - float(age_s))

    def node_exit(self, rank: int, code: Any, failure: Any) -> None:
        with self.lock:
            code = code if isinstance(code, int) and not isinstance(code, bool) else None
            first = self.run.first_failure
            self.carry_out(self.run.node_exited(rank, code, time.monotonic(), failure,
                                                None if code is not None else "no exit status came back"))
            self.ended_at.setdefault(rank, time.time())
            self.failure_event(first)

    def lost(self, rank: int, why: str) -> None:
        with self.lock:
            first = self.run.first_failure
            self.carry_out(self.run.node_lost(rank, why, time.monotonic()))
            self.ended_at.setdefault(rank, time.time())
            self.failure_event(first)

    # -- the run's events -------------------------------------------------------------------------

    def write_event(self, kind: str, text: str, **fields: Any) -> None:
        """One line of RUN_DIR/events.jsonl, appended and flushed (where this run has the file)."""
        if self.events_path is None:
            return
        writer = self.node.detach.get("events")
        line = {"format": EVENTS_FORMAT, **({"fstrain": writer} if isinstance(writer, str) else {}), "kind": kind,
                "time": time.time(), "run_id": self.node.header.get("run_id"), "attempt": 1, **fields, "text": text}
        with contextlib.suppress(OSError), open(self.events_path, "a") as handle:  # the run goes on without it
            handle.write(json.dumps(line) + "\n")

    def failure_event(self, before: int | None) -> None:
        """The run's first failure, once the supervisor has named it (called with the lock held)."""
        first = self.run.first_failure
        if before is not None or first is None:
            return
        node = self.run.nodes[first]
        failure = node.failure if isinstance(node.failure, dict) else {}
        code = failure.get("exit_code")
        code = code if isinstance(code, int) else node.exit_code if node.exit_code is not None else \
            self.rules.EXIT_LOST_HOST
        self.write_event("failure", self.run.reason, host=node.name, rank=failure.get("rank"), exit_code=code,
                         signal=failure.get("signal") or None)

    def step_event(self) -> None:
        """The first step one of node 0's ranks reported (its lines are this node's to read)."""
        output = self.node.output
        if self.stepped or self.events_path is None or output is None:
            return
        with output.lock:
            steps = [reading.metrics.step for reading in output.readings.values() if reading is not None]
        if steps:
            self.stepped = True
            self.write_event("first_step", f"first step reported: step {min(steps)}", step=min(steps))

    def stop(self, how: str, state: str, reason: str, grace_s: Any = None) -> None:
        grace = float(grace_s) if isinstance(grace_s, (int, float)) and not isinstance(grace_s, bool) else None
        with self.lock:
            code = self.rules.EXIT_SIGKILL if how == "kill" else self.rules.EXIT_SIGTERM  # what it was sent
            self.carry_out(self.run.stop(how, state, reason, code, time.monotonic(), grace))

    # -- decisions out ----------------------------------------------------------------------------

    def carry_out(self, decisions: list[Any]) -> None:
        """Do what the supervisor decided (called with the lock held)."""
        for decision in decisions:
            if decision.action in (self.rules.TEARDOWN, self.rules.KILL):
                how = "kill" if decision.action == self.rules.KILL else "term"
                grace = decision.grace_s
                if grace is not None:
                    self.node.watchdog.grace_s = grace
                for rank in decision.nodes:
                    if rank == 0:
                        self.node.watchdog.request(how)
                    elif rank in self.links:
                        self.links[rank].send({"stop": how, "grace_s": grace})
            elif decision.action == self.rules.COLLECT_STACKS:
                for rank in decision.nodes:
                    if rank == 0:
                        threading.Thread(target=self.node.watchdog.report_stacks, daemon=True).start()
                    elif rank in self.links:
                        self.links[rank].send({"stacks": True})
            elif decision.action == self.rules.HANG_REPORT:
                self.stall = self.write_hang_report(decision.nodes)
            elif decision.action == self.rules.GIVE_UP:
                for rank in decision.nodes:
                    self.ended_at.setdefault(rank, time.time())

    def write_hang_report(self, unanswered: Any) -> dict[str, Any]:
        """RUN_DIR/stacks: a file per rank and stack tool, and report.json (fstrain/core/monitor/stacks.py
        names the odd ranks)."""
        document, files = self.analysis.hang_report(self.stacks, self.run.stall_reason, sorted(unanswered),
                                                    [n.name for n in self.run.nodes])
        with contextlib.suppress(OSError):  # the run's end is recorded all the same
            self.node.watchdog.module("stacks").write_report(self.node.run_dir, document, files)
        return document

    # -- links ---------------------------------------------------------------------------------

    def listen(self, address: str) -> int:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, 0))
        sock.listen(max(64, min(self.nnodes, 4096)))  # every member may connect at once (somaxconn caps it)
        self.listener = sock
        threading.Thread(target=self.serve, daemon=True).start()
        return int(sock.getsockname()[1])

    def serve(self) -> None:
        """Every connection, read by this one thread whatever the number of members (a thread
        per member was 4,098 threads at 4,096 nodes): whole lines, each handled as it comes."""
        assert self.listener is not None
        selector = selectors.DefaultSelector()
        try:
            selector.register(self.listener, selectors.EVENT_READ, None)
        except ValueError:  # closed already
            return
        while True:
            try:
                ready = selector.select(timeout=1.0)
            except (OSError, ValueError):  # the listener was closed: the coordinator is done
                ready = []
            if self.listener.fileno() < 0:
                for key in list(selector.get_map().values()):
                    if key.data is not None:
                        key.data.link.close()
                return
            for key, _ in ready:
                if key.data is None:
                    try:
                        conn, _ = self.listener.accept()
                    except OSError:
                        continue
                    conn.settimeout(SEND_TIMEOUT_S)  # sends block at most this long; reads only when ready
                    selector.register(conn, selectors.EVENT_READ, Peer(Link(conn)))
                    continue
                peer: Peer = key.data
                try:
                    data = peer.link.sock.recv(65536)
                except OSError:
                    data = b""
                peer.buffer += data
                if b"\n" in data:  # whole lines: each handled, the unfinished rest kept
                    *lines, rest = bytes(peer.buffer).split(b"\n")
                    peer.buffer = bytearray(rest)
                    for line in lines:
                        if peer.open:
                            self.handle(peer, line)
                if not data or len(peer.buffer) > MAX_LINE_BYTES or not peer.open:
                    selector.unregister(peer.link.sock)
                    self.hang_up(peer)

    def handle(self, peer: Peer, line: bytes) -> None:
        """One line from a connection: its first says who it is (a member, or `fstrain stop` and
        `status` through runctl), the rest are a member's messages."""
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            peer.open = False
            return
        if peer.rank is not None:
            self.member_message(peer.rank, message)
            return
        if not hmac.compare_digest(str(message.get("secret", "")).encode(), self.secret.encode()):
            peer.open = False
            return
        refused = unreadable(message)
        control = message.get("control")
        if refused or control in ("stop", "views"):  # answered apart: a stop waits, views are big
            peer.open, peer.answering = False, True
            threading.Thread(target=self.answer, args=(peer.link, message, refused), daemon=True).start()
            return
        rank = message.get("hello")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 < rank < self.nnodes:
            peer.open = False
            return
        peer.rank = rank
        with self.lock:
            self.links[rank] = peer.link
            self.carry_out(self.run.node_joined(rank, time.monotonic()))

    def answer(self, link: Link, request: dict[str, Any], refused: str) -> None:
        """A request on a connection of its own: its one answer, then the connection closes."""
        try:
            if refused:
                link.send({"refused": refused, "hint": "stop it with the fstrain that started it"})
            elif request.get("control") == "stop":
                how = "kill" if request.get("how") == "kill" else "term"
                self.stop(how, "stopped", f"stopped by `fstrain stop` ({how})", request.get("grace_s"))
                link.send({"ok": True, "state": self.record()})
            else:  # `fstrain status`, `logs --tail`, the keeper: every node over one connection
                link.send({"views": self.all_views()})
        finally:
            link.close()

    def member_message(self, rank: int, message: dict[str, Any]) -> None:
        with self.lock:
            self.run.heard(rank, time.monotonic())
        if isinstance(message.get("view"), dict):
            self.views[rank] = message["view"]
        if "output_age_s" in message:
            self.output_age(message["output_age_s"])
        if "event" in message:
            self.event(rank, message["event"])
        if "exit" in message:
            self.node_exit(rank, message.get("exit"), message.get("failure"))

    def hang_up(self, peer: Peer) -> None:
        """A connection ends (the peer went, or was refused): its socket goes with it, and a
        member whose job has not ended is lost."""
        if not peer.answering:
            peer.link.close()
        if peer.rank is None:
            return
        self.closed.add(peer.rank)
        if not self.run.nodes[peer.rank].done:
            self.lost(peer.rank, "its watchdog's connection closed")

    def tick(self) -> None:
        """Heartbeats out (every ``interval_s``), this node's own output and liveness in, and
        time passing (every HEARTBEAT_S)."""
        beat_at = 0.0
        while not self.all_ended():
            now = time.monotonic()
            with self.lock:
                links = dict(self.links)
                self.run.heard(0, now)
                output = self.node.output
                if output is not None and output.last_output_mono is not None:
                    self.run.output(output.last_output_mono)
            if now >= beat_at:
                beat_at = now + self.interval_s
                beat = (json.dumps({"format": MESSAGE_FORMAT, "hb": time.time()}) + "\n").encode()
                for link in links.values():
                    link.send_bytes(beat)
            self.step_event()
            self.heard_unread(links, time.monotonic())
            with self.lock:
                first = self.run.first_failure
                self.carry_out(self.run.tick(time.monotonic()))
                self.failure_event(first)
                if not self.finished:  # for `fstrain status` and `fstrain runs` while the run lasts
                    with contextlib.suppress(OSError):
                        write_json(os.path.join(self.node.run_dir, "run.json"), self.record())
            time.sleep(HEARTBEAT_S)

    def heard_unread(self, links: dict[int, Link], now: float) -> None:
        """A member whose words wait unread on its connection has been heard: this process, not
        the member, was slow (``serve`` behind on a loaded node 0). Looked at only for members
        silent for half the heartbeat timeout, before the silence rule judges them."""
        timeout_s = self.run.limits.heartbeat_timeout_s
        if timeout_s is None:
            return
        for rank, link in links.items():
            record = self.run.nodes[rank]
            if now - record.last_heard_s > timeout_s / 2 and self.node.watchdog.has_unread_bytes(link.sock.fileno()):
                with self.lock:
                    self.run.heard(rank, now)

    def all_views(self) -> list[Any]:
        """Every node's view as its runctl ``state`` gives it, node 0's with the run's record;
        a member's as it last sent it (one heartbeat interval old at most), None for one that
        has sent none yet (the client asks that node itself)."""
        own = {**self.node.view(), "run": self.record()}
        members = [self.views.get(rank) for rank in range(1, self.nnodes)]
        for rank, view in enumerate(members, start=1):
            if view is not None:  # alive while its connection is: a dead watchdog's link closes
                members[rank - 1] = {**view, "watchdog_alive": rank in self.links and rank not in self.closed}
        return [own, *members]

    # -- the record -----------------------------------------------------------------------------

    def all_ended(self) -> bool:
        with self.lock:
            return bool(self.run.ended)

    def record(self) -> dict[str, Any]:
        with self.lock:
            state, exit_code, reason = self.run.verdict()
            first = self.run.first_failure
            ended = self.all_ended()
            nodes = {str(i): {"name": n.name, "joined": n.joined, "ended": self.ended_at.get(i),
                              "exit_code": n.exit_code, "failure": n.failure, "error": n.error}
                     for i, n in enumerate(self.run.nodes)}
            return {
                "format": RUN_FORMAT,
                "run_id": self.node.header.get("run_id"), "state": state,
                "exit_code": exit_code if ended or state not in self.rules.LIVE_STATES else None,
                "reason": reason, "first_failure_node_rank": first,
                "first_failure_host": self.run.nodes[first].name if first is not None else None,
                "first_failure": self.run.nodes[first].failure if first is not None else None,
                "started": self.started, "ended": None if not ended else time.time(),
                "nodes": nodes, "stall": self.stall,
            }

    def ended_with_status(self) -> list[int]:
        """The members whose job ended with an exit status (not lost); call with the lock held."""
        return [rank for rank in range(1, self.nnodes)
                if self.run.nodes[rank].done and self.run.nodes[rank].exit_code is not None]

    def gone_members(self) -> dict[str, Any]:
        """Node rank -> its last view, for each member whose job ended with an exit status and
        whose watchdog then closed its connection: nothing of that run lives there any more."""
        gone: dict[str, Any] = {}
        with self.lock:
            for rank in self.ended_with_status():
                record, view = self.run.nodes[rank], self.views.get(rank)
                if rank in self.closed and isinstance(view, dict):
                    node = {**(view.get("node") or {}), "ended": self.ended_at.get(rank),
                            "exit_code": record.exit_code}
                    gone[str(rank)] = {**view, "node": node, "watchdog_alive": False, "ranks_alive": []}
        return gone

    def write_ended_views(self) -> None:
        """RUN_DIR/ended-views.json, once the run is over: the members known to be gone
        (:meth:`gone_members`, after up to MEMBERS_GONE_WAIT_S for their connections to close),
        which runctl's ``views`` answers from once this process has exited, so that `fstrain
        stop`, `status` and `gc` of an ended run ask node 0 alone, not every node."""
        deadline = time.monotonic() + MEMBERS_GONE_WAIT_S
        while time.monotonic() < deadline:
            with self.lock:
                waiting = [rank for rank in self.ended_with_status() if rank not in self.closed]
            if not waiting:
                break
            time.sleep(0.05)
        with contextlib.suppress(OSError):
            write_json(os.path.join(self.node.run_dir, "ended-views.json"),
                       {"format": ENDED_VIEWS_FORMAT, "run_id": self.node.header.get("run_id"),
                        "nnodes": self.nnodes, "views": self.gone_members()})

    def finish(self) -> dict[str, Any]:
        with self.lock:
            self.finished = True
        record = self.record()
        with contextlib.suppress(OSError):
            write_json(os.path.join(self.node.run_dir, "run.json"), record)
        said = f" ({record['reason']})" if record["reason"] else ""
        self.write_event("finished", f"run {record['state']}, exit code {record['exit_code']}{said}",
                         state=record["state"], exit_code=record["exit_code"])
        for link in list(self.links.values()):
            link.send({"end": record})
        return record


def _member_link(node: Node, address: str, port: int, secret: str) -> Link:
    deadline = time.monotonic() + 30
    while True:
        try:
            sock = socket.create_connection((address, port), timeout=5)
            sock.settimeout(None)
            link = Link(sock)
            link.send({"hello": node.node_rank, "secret": secret})
            return link
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _detach(node: Node) -> int:
    """Fork; the parent relays the child's ready line and exits. Returns the ready pipe's write
    end in the child, which runs on in a session of its own with its output to node<I>.out."""
    os.makedirs(node.run_dir, mode=0o700, exist_ok=True)
    ready_r, ready_w = os.pipe()
    if os.fork() > 0:
        os.close(ready_w)
        with os.fdopen(ready_r, "rb") as ready:
            answer = ready.readline() or b'{"error": "the detached watchdog exited before it started the job"}\n'
        os.write(1, answer)
        os._exit(0 if b'"error"' not in answer else 1)
    os.close(ready_r)
    os.setsid()
    out_r, out_w = os.pipe()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_w, 1)
    os.dup2(out_w, 2)
    os.close(out_w)
    os.close(devnull)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - lives as long as the process
    node.output = Output(out_r, os.path.join(node.run_dir, f"node{node.node_rank}.out"),
                         list(node.detach.get("redact") or []), node.watchdog.module("metricline").newer_step)
    if node.detach.get("banner"):  # an attempt of a recovering run: where its lines begin
        with contextlib.suppress(OSError), open(node.output.path, "ab") as handle:
            handle.write(b"%.3f %s\n" % (time.time(), str(node.detach["banner"]).encode()))
    threading.Thread(target=node.output.copy, daemon=True).start()
    return ready_w


def _fail_start(ready_w: int, why: str) -> NoReturn:
    os.write(ready_w, (json.dumps({"error": why}) + "\n").encode())
    os._exit(1)


def run_coordinator(node: Node, ready_w: int) -> None:
    """Node 0: listen, start the job, apply the rules until every node has ended."""
    detach = node.detach
    coordinator = Coordinator(node)
    try:
        port = coordinator.listen(str(detach["bind"]))
    except OSError as exc:
        _fail_start(ready_w, f"cannot listen on {detach['bind']}: {exc}")
    signal.signal(signal.SIGTERM, lambda *_: coordinator.stop("term", "stopped", "SIGTERM to the coordinator"))
    with contextlib.suppress(OSError):
        write_json(os.path.join(node.run_dir, "coordinator.json"),
                   {"format": COORDINATOR_FORMAT,
                    "address": detach["bind"], "port": port, "secret": coordinator.secret, "pid": os.getpid()})
    if node.output is not None:
        node.output.on_event = lambda payload: coordinator.event(0, payload)
    job = node.start_job(ready_w, {"port": port})
    names = [n.name for n in coordinator.run.nodes]
    coordinator.write_event("started", f"run {node.header.get('run_id')} started on {len(names)} node"
                            f"{'' if len(names) == 1 else 's'} ({', '.join(names)})", hosts=names)
    threading.Thread(target=coordinator.tick, daemon=True).start()
    node.job_ended(job)
    coordinator.node_exit(0, node.exit_code, node.failure)
    while not coordinator.all_ended():
        time.sleep(0.2)
    node.final = coordinator.finish()
    coordinator.write_ended_views()  # the members read the record and close their connections meanwhile


def run_member(node: Node, ready_w: int) -> None:
    """Any other node: join the coordinator, start the job, follow its orders, report the end."""
    detach = node.detach
    address, port = detach["coordinator"]
    signal.signal(signal.SIGTERM, lambda *_: node.watchdog.request("term"))
    try:
        link = _member_link(node, str(address), int(port), str(detach["secret"]))
    except OSError as exc:
        _fail_start(ready_w, f"cannot reach the coordinator {address}:{port}: {exc}")
    node.watchdog.last_heartbeat = time.monotonic()  # the timeout counts from the join, not the process's start
    node.watchdog.heartbeat_fd = link.sock.fileno()  # silence is judged on what arrived, read or not
    interval_s = heartbeat_interval_s(int(detach["nnodes"]), node.watchdog.heartbeat_timeout_s)
    ended = threading.Event()

    def listen() -> None:
        for message in link.messages():
            node.watchdog.last_heartbeat = time.monotonic()  # any word from the coordinator: it lives
            if "stop" in message:
                if message.get("grace_s") is not None:
                    node.watchdog.grace_s = float(message["grace_s"])
                node.watchdog.request("kill" if message["stop"] == "kill" else "term")
            if "stacks" in message:
                threading.Thread(target=node.watchdog.report_stacks, daemon=True).start()
            if "end" in message:
                node.final = message["end"]
                ended.set()
        if not ended.is_set():  # the coordinator is gone: nothing may run on unsupervised
            node.note = "lost the coordinator"
            node.watchdog.request("term")
            ended.set()

    sent: dict[str, Any] = {}

    def changed_view() -> dict[str, Any]:
        """This node's view for the coordinator (status reads it there), when it changed; never
        raises: the heartbeat that carries it must go out whatever the view's trouble."""
        try:
            view = node.view()
        except Exception:
            return {}
        same = {**view, "node": {**view["node"], "updated": None}}
        if same == sent:
            return {}
        sent.clear()
        sent.update(same)
        return {"view": view}

    def beat() -> None:
        while not ended.is_set():
            last = node.output.last_output_mono if node.output else None
            link.send({"hb": time.time(), "output_age_s": None if last is None else time.monotonic() - last,
                       **changed_view()})
            time.sleep(interval_s)

    if node.output is not None:
        node.output.on_event = lambda payload: link.send({"event": payload})
    threading.Thread(target=listen, daemon=True).start()
    threading.Thread(target=beat, daemon=True).start()
    job = node.start_job(ready_w, {})
    node.job_ended(job)
    link.send({"exit": node.exit_code, "failure": node.failure, **changed_view()})
    ended.wait(node.watchdog.heartbeat_timeout_s + float(node.header.get("grace_s", 15)) + 10)
    link.close()


def main(header: dict[str, Any], watchdog_class: Any) -> None:
    node = Node(header, watchdog_class)
    ready_w = _detach(node)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    if node.detach["role"] == "coordinator":
        run_coordinator(node, ready_w)
    else:
        run_member(node, ready_w)
    node.ended = time.time()
    node.write_state()
    os._exit(node.exit_code if node.exit_code is not None else 1)
