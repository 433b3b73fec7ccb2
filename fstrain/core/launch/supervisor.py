"""One run's supervision rules: events in, decisions out.

Every kind of run drives this one machine: the attached launcher (fstrain/io/launch.py, fed by
the nodes' SSH channels and the user's signals) and a detached run's coordinator on node 0
(fstrain/io/remote/coordinator.py, fed by the members' links). Each driver turns what it sees
into events (a node's job exited, a node was lost or joined or was heard from, a rank printed,
a rank finished, stacks arrived, a stop was asked) and the passing of time into ``tick``; the
machine answers with decisions (tear the job down, kill it, collect every live rank's stacks,
write the hang report, give up on nodes that did not stop) and keeps the run's verdict: its
state, exit code, reason and first failure.

Time: every ``now_s`` is one monotonic clock of the process that drives the machine. Nothing
measured on another machine is compared with it as a point in time: a node reports how long
ago its ranks printed (a duration), and the driver subtracts that from its own clock.

Pure and stdlib-only (Python >= 3.8): the coordinator runs it on node 0, where fstrain need not
be installed; it travels there as source text, like rankexit.py and stacks.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

EXIT_STALLED = 124  # as timeout(1)
EXIT_LOST_HOST = 255  # like ssh when the connection is lost
EXIT_SIGINT = 130
EXIT_SIGTERM = 143
EXIT_SIGKILL = 137
FINISHED_REASON = "some ranks finished"  # how a --finish-timeout reason starts
GAVE_UP = "did not stop in time; its watchdog ends it"

# Decisions
TEARDOWN = "teardown"  # ask every live node to stop its job (SIGTERM, SIGKILL after the grace period)
KILL = "kill"  # SIGKILL every live node's job now
COLLECT_STACKS = "collect_stacks"  # ask these nodes for their ranks' stacks
HANG_REPORT = "hang_report"  # write the hang report; ``nodes`` never answered
GIVE_UP = "give_up"  # these nodes did not stop in time: their watchdogs end them alone
LOST = "lost"  # these nodes are lost (silent, unreachable): stop waiting for them

# States a run is in while it lasts, and the verdicts it can end with
LIVE_STATES = ("starting", "running")
ASKED_STOPS = ("interrupted", "terminated", "stalled")  # verdicts that a scheduler's ending does not replace

# Where word of a scheduler ending the job comes from (``Supervisor.scheduler_ends``)
FROM_LINE = "line"  # a node printed the scheduler's own cancel line (slurmstepd's ``*** ... CANCELLED ...``)
FROM_RECORD = "record"  # the scheduler's record of the job says it is ending (COMPLETING, NODE_FAIL)
FROM_CANCELLED = "cancelled"  # the record says the job was cancelled: the scheduler's final word


@dataclass(frozen=True)
class Limits:
    """What the run allows. None: the rule is off (or its driver detects that case itself)."""

    stall_timeout_s: float | None = None  # no rank printed for this long: stalled
    finish_timeout_s: float | None = None  # some ranks done with 0 this long, others still running
    heartbeat_timeout_s: float | None = None  # a joined node silent this long is lost
    # A node not joined this long after the start, or after the last node that joined, is lost:
    # a start that goes on (hundreds of nodes started --fanout at a time) is never cut short.
    join_timeout_s: float | None = None
    grace_s: float = 15.0  # SIGTERM to SIGKILL, on every node
    stacks_wait_s: float = 30.0  # for every live node's stacks, once asked
    straggler_margin_s: float = 10.0  # past the grace period, before a node is given up


@dataclass(frozen=True)
class Decision:
    action: str
    nodes: tuple[int, ...] = ()
    grace_s: float | None = None  # TEARDOWN: a grace period other than the run's


@dataclass
class NodeRecord:
    """What the supervisor knows of one node."""

    name: str
    joined: bool
    last_heard_s: float
    ended_s: float | None = None
    exit_code: int | None = None
    failure: Mapping[str, Any] | None = None  # the failed rank: rank, local_rank, exit_code, signal
    error: str | None = None  # why it ended without an exit code (lost, given up)
    watched: bool = True  # the heartbeat rule applies: silence for heartbeat_timeout_s is loss
    ranks_ended: bool = False  # every rank's process ended while the node's job runs on (its launcher exits)

    @property
    def done(self) -> bool:
        return self.ended_s is not None


@dataclass
class Supervisor:
    """The run's rules. ``joined``: whether the nodes are there from the start (attached) or
    must each join first (a detached run's members; node 0, the driver's own, always is)."""

    names: Sequence[str]
    limits: Limits
    now_s: float
    joined: bool = True
    nodes: list[NodeRecord] = field(init=False)
    state: str = field(init=False)
    exit_code: int | None = None
    reason: str = ""
    first_failure: int | None = None  # node index
    stopping_since_s: float | None = None
    kill_sent: bool = False
    grace_s: float = field(init=False)
    last_output_s: float | None = None
    first_finish_s: float | None = None
    stall_reason: str = ""
    stacks_asked_s: float | None = None
    stacks_waiting: set[int] = field(default_factory=set)
    stall_reported: bool = False
    scheduler_ending: bool = False  # the scheduler (Slurm) is ending the job: it signals every process itself
    # Which nodes the heartbeat rule watches (None: all): an attached node answers heartbeats only
    # where its transport has no link check of its own (an srun step).
    heard_from: Sequence[bool] | None = None

    def __post_init__(self) -> None:
        self.started_s = self.now_s
        self.last_join_s = self.now_s  # the start, then each node's join: the join timeout counts from it
        self.nodes = [NodeRecord(name, self.joined or i == 0, self.now_s,
                                 watched=self.heard_from is None or bool(self.heard_from[i]))
                      for i, name in enumerate(self.names)]
        self.waiting = sum(not n.joined for n in self.nodes)  # counted, not searched: one join is O(1)
        self.state = "running" if not self.waiting else "starting"
        self.grace_s = self.limits.grace_s

    # -- events ------------------------------------------------------------------------------

    def node_joined(self, node: int, now_s: float) -> list[Decision]:
        """A node's watchdog reported for the run. A node joining a run already stopping is
        told to stop at once."""
        record = self.nodes[node]
        if not record.joined:
            self.waiting -= 1
        record.joined, record.last_heard_s = True, now_s
        self.last_join_s = max(self.last_join_s, now_s)
        if self.state == "starting" and not self.waiting:
            self.state = "running"
        if self.stopping_since_s is not None and not record.done:
            return [Decision(KILL if self.kill_sent else TEARDOWN, (node,), self._grace_if_changed())]
        return []

    def heard(self, node: int, now_s: float) -> None:
        """Anything from the node (a heartbeat, a line): it is alive."""
        self.nodes[node].last_heard_s = max(self.nodes[node].last_heard_s, now_s)

    def output(self, at_s: float) -> None:
        """A rank printed at ``at_s`` (this clock: a node's report of how long ago, subtracted)."""
        if self.last_output_s is None or at_s > self.last_output_s:
            self.last_output_s = at_s

    def rank_finished(self, now_s: float, node: int | None = None, all_ended: bool = False) -> None:
        """A rank's process ended with 0 while its node's job runs on: the finish timeout starts.
        ``all_ended``: it was the node's last rank; what the node does until its job exits
        (torchrun's exit barrier and rendezvous shutdown) is no rank's silence."""
        if self.first_finish_s is None:
            self.first_finish_s = now_s
        if all_ended and node is not None:
            self.nodes[node].ranks_ended = True

    def node_exited(self, node: int, exit_code: int | None, now_s: float,
                    failure: Mapping[str, Any] | None = None, error: str | None = None) -> list[Decision]:
        """A node's job ended: ``exit_code`` None when no exit status came back (``error`` says
        why); ``failure`` the rank behind a non-zero code, where known."""
        record = self.nodes[node]
        if record.done:
            return []
        record.ended_s, record.exit_code, record.failure, record.error = now_s, exit_code, failure, error
        self.stacks_waiting.discard(node)
        if exit_code == 0:
            self.rank_finished(now_s)
            return []
        if exit_code is None:
            return self._first_failure(node, "lost", EXIT_LOST_HOST,
                                       f"{record.name}: {error or 'no exit status came back'}", now_s)
        code = _int(failure.get("exit_code")) if failure else None
        return self._first_failure(node, "failed", exit_code if code is None else code,
                                   describe_failure(record.name, exit_code, failure), now_s)

    def node_lost(self, node: int, why: str, now_s: float) -> list[Decision]:
        """The node stopped answering (or never joined): its job counts as failed."""
        record = self.nodes[node]
        if record.done:
            return []
        record.ended_s, record.error = now_s, why
        self.stacks_waiting.discard(node)
        return [Decision(LOST, (node,)),
                *self._first_failure(node, "lost", EXIT_LOST_HOST, f"{record.name} was lost: {why}", now_s)]

    def stop(self, how: str, state: str, reason: str, exit_code: int, now_s: float,
             grace_s: float | None = None) -> list[Decision]:
        """Someone asked the run to stop (a signal, `fstrain stop`). The first request sets the
        verdict and tears down (``how`` ``kill`` skips the grace period); a later ``kill``
        kills what is left."""
        if grace_s is not None:
            self.grace_s = grace_s
        if self.stopping_since_s is None:
            self.state, self.reason, self.exit_code = state, reason, exit_code
            return self._teardown(now_s, kill=how == "kill")
        if how == "kill" and not self.kill_sent:
            self.kill_sent = True
            return [Decision(KILL, self.live())]
        return []

    def signalled(self, interrupt: bool, now_s: float) -> list[Decision]:
        """The driver's process got SIGINT (``interrupt``) or SIGTERM. A SIGTERM while the
        scheduler ends the job is the scheduler's own: it reached every process of the job at
        once, and a second one from us would cut the launchers' own shutdown short (torchrun then
        abandons it; its watchdog SIGKILLs it at the grace limit). Otherwise the first signal
        stops the run within the grace period and a later one kills what is left."""
        if not interrupt and self.scheduler_ending:
            return []
        state, code = ("interrupted", EXIT_SIGINT) if interrupt else ("terminated", EXIT_SIGTERM)
        how = "term" if self.stopping_since_s is None else "kill"
        return self.stop(how, state, f"{state} ({'SIGINT' if interrupt else 'SIGTERM'})", code, now_s)

    def scheduler_ends(self, reason: str, source: str, now_s: float) -> None:
        """The scheduler (Slurm's ``scancel``, time limit, a failed node) is ending the job this
        run lives in and sends SIGTERM to every process of it itself: nothing more is sent, and
        the node failures seen meanwhile are its consequences, not a first failure. The verdict
        becomes the scheduler's (``cancelled``, ``reason``), except where the user asked for the
        stop or the run stalled first; a reason read from the job's record (``FROM_RECORD``)
        does not replace one a node's line gave, the record's final word (``FROM_CANCELLED``) does."""
        self.scheduler_ending = True
        if self.stopping_since_s is None:
            self.stopping_since_s = now_s
        if self.state in ASKED_STOPS or reason == self.reason:
            return
        if source == FROM_RECORD and self.state == "cancelled":
            return
        self.state, self.reason, self.exit_code, self.first_failure = "cancelled", reason, EXIT_SIGTERM, None

    def stacks_reported(self, node: int) -> None:
        self.stacks_waiting.discard(node)

    def tick(self, now_s: float) -> list[Decision]:
        """What the passing of time decides: silent or absent nodes lost, a stall, stragglers."""
        decisions: list[Decision] = []
        for index in self.live():
            why = self._silence(index, now_s)
            if why:
                decisions += self.node_lost(index, why, now_s)
        decisions += self._check_stall(now_s)
        if self.stopping_since_s is not None and now_s - self.stopping_since_s > \
                self.grace_s + self.limits.straggler_margin_s:
            late = self.live()
            for index in late:
                self.nodes[index].ended_s, self.nodes[index].error = now_s, self.nodes[index].error or GAVE_UP
            if late:
                decisions.append(Decision(GIVE_UP, late))
        return decisions

    # -- the verdict -------------------------------------------------------------------------

    def live(self) -> tuple[int, ...]:
        return tuple(i for i, n in enumerate(self.nodes) if not n.done)

    def ranks_running(self) -> bool:
        """Some live node may still have a rank running (not every one reported its ranks ended)."""
        return any(not n.done and not n.ranks_ended for n in self.nodes)

    @property
    def ended(self) -> bool:
        return all(n.done for n in self.nodes)

    def verdict(self) -> tuple[str, int, str]:
        """(state, exit code, reason) as of now; once every node has ended, the final one."""
        if self.state not in LIVE_STATES or not self.ended:
            return self.state, self.exit_code if self.exit_code is not None else 0, self.reason
        failed = [n for n in self.nodes if n.exit_code != 0]
        if not failed:
            return "succeeded", 0, ""
        return "failed", failed[0].exit_code if failed[0].exit_code is not None else EXIT_LOST_HOST, self.reason

    # -- rules -------------------------------------------------------------------------------

    def _first_failure(self, node: int, state: str, exit_code: int, reason: str, now_s: float) -> list[Decision]:
        """The first node to fail names the run's failure and tears everything down; failures
        while stopping are consequences, not causes."""
        if self.first_failure is not None or self.stopping_since_s is not None:
            return []
        self.first_failure, self.state, self.exit_code, self.reason = node, state, exit_code, reason
        return self._teardown(now_s)

    def _teardown(self, now_s: float, kill: bool = False) -> list[Decision]:
        self.stopping_since_s = now_s
        self.kill_sent = kill
        return [Decision(KILL if kill else TEARDOWN, self.live(), self._grace_if_changed())]

    def _grace_if_changed(self) -> float | None:
        return self.grace_s if self.grace_s != self.limits.grace_s else None

    def _silence(self, index: int, now_s: float) -> str:
        record, limits = self.nodes[index], self.limits
        if not record.watched:
            return ""
        if not record.joined:
            if limits.join_timeout_s is not None and now_s - self.last_join_s > limits.join_timeout_s:
                return f"its watchdog did not connect within {limits.join_timeout_s:g} s (and no other node did)"
            return ""
        if limits.heartbeat_timeout_s is not None and now_s - record.last_heard_s > limits.heartbeat_timeout_s:
            return f"no heartbeat for {limits.heartbeat_timeout_s:g} s"
        return ""

    def _check_stall(self, now_s: float) -> list[Decision]:
        """--stall-timeout / --finish-timeout: ask every live node for its stacks once, then,
        when all answered or the wait is over, the hang report and the teardown as stalled."""
        if self.stopping_since_s is not None or not self.live():
            return []
        if not self.stall_reason:
            silent_since_s = self.last_output_s if self.ranks_running() else None
            self.stall_reason = stall_reason(now_s, silent_since_s, self.first_finish_s,
                                             self.limits.stall_timeout_s, self.limits.finish_timeout_s)
            if not self.stall_reason:
                return []
            self.stacks_asked_s = now_s
            self.stacks_waiting = set(self.live())
            return [Decision(COLLECT_STACKS, tuple(sorted(self.stacks_waiting)))]
        assert self.stacks_asked_s is not None
        if self.stall_reported or (self.stacks_waiting and now_s - self.stacks_asked_s < self.limits.stacks_wait_s):
            return []
        self.stall_reported = True
        self.state, self.exit_code, self.reason = "stalled", EXIT_STALLED, self.stall_reason
        return [Decision(HANG_REPORT, tuple(sorted(self.stacks_waiting))), *self._teardown(now_s)]


@dataclass
class AttemptEnd:
    """When a detached attempt, followed from outside through its nodes' records (the recovery
    keeper), counts as ended: every record final and no watchdog alive, and node 0's record read
    (it holds the run's verdict). Node 0 out of reach counts as the end only once it has stayed
    so for ``unreachable_s`` (a moment's loss of the link is no end)."""

    unreachable_s: float
    unreachable_since_s: float | None = None

    def ended(self, final: bool, watchdogs_alive: bool, node0_read: bool, now_s: float) -> bool:
        if not final or watchdogs_alive:
            self.unreachable_since_s = None
            return False
        if node0_read:
            return True
        if self.unreachable_since_s is None:
            self.unreachable_since_s = now_s
        return now_s - self.unreachable_since_s > self.unreachable_s


def stop_step(elapsed_s: float, grace_s: float, wait_s: float, killed: bool) -> str:
    """What a stop that asked the scheduler for SIGTERM does next, ``elapsed_s`` after asking:
    KILL once the grace period is over (SIGKILL to every step, unless done already), GIVE_UP
    once ``wait_s`` more have passed, else "" (wait)."""
    if not killed and elapsed_s > grace_s:
        return KILL
    if elapsed_s > grace_s + wait_s:
        return GIVE_UP
    return ""


def stall_reason(now_s: float, last_output_s: float | None, first_finish_s: float | None,
                 stall_timeout_s: float | None, finish_timeout_s: float | None) -> str:
    """Why the run counts as hung at ``now_s``, or "": some ranks finished ``finish_timeout_s``
    ago while others run on, or no rank printed for ``stall_timeout_s`` since the last rank line
    (one clock for all). Before any rank printed (``last_output_s`` None) nothing counts as
    stalled: start-up (imports on a busy node, the rendezvous) has its own timeouts."""
    if finish_timeout_s is not None and first_finish_s is not None and now_s - first_finish_s >= finish_timeout_s:
        return f"{FINISHED_REASON} {finish_timeout_s:g} s ago and others are still running"
    if stall_timeout_s is not None and last_output_s is not None and now_s - last_output_s >= stall_timeout_s:
        return f"no rank printed anything for {stall_timeout_s:g} s"
    return ""


def describe_failure(name: str, exit_code: int, failure: Mapping[str, Any] | None) -> str:
    """``rank 3 (local rank 1) on node2 exited with 7`` or ``... was killed by SIGSEGV``; the
    node's own code where the failed rank is not known."""
    if not failure or (failure.get("rank") is None and failure.get("local_rank") is None):
        return f"the job on {name} exited with {exit_code}"
    rank = failure.get("rank")
    local = failure.get("local_rank")
    who = f"rank {rank}" if rank is not None else f"local rank {local}"
    if rank is not None and local is not None:
        who += f" (local rank {local})"
    signal_name = failure.get("signal")
    how = f"was killed by {signal_name}" if signal_name else f"exited with {failure.get('exit_code', exit_code)}"
    return f"{who} on {name} {how}"


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None

