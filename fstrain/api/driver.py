"""The one run driver: every run goes through the same stages, whatever starts it.

1. connect: one connection per host (SSH, or srun steps inside a Slurm allocation);
2. prewarm (attached runs): every node's launcher Python starts importing torch now;
3. preflight: interpreter, packages, working directory, interfaces on every host;
4. rendezvous: the master address every node reaches, and its port (3 and 4 in one session
   per host: fstrain/io/hostcheck.py);
5. the job: given what the checks found, what each node runs (launch's program or plan,
   the benchmark worker, ...), rendered files included;
6. start the nodes and supervise them (attached: fstrain/io/launch.py, the supervisor's rules
   here; detached: node 0's coordinator, the same rules there);
7. collect and the manifest (RUN_DIR/manifest.json).

With a recovery policy (``--on-failure restart|exclude``, fstrain/core/launch/recovery.py),
``drive_attempts`` runs these stages once per attempt: after a failed one it diagnoses who is
at fault, then stops, or starts the same hosts again, or the hosts left once the guilty ones
are excluded (spares taking their places), every rank told the checkpoint directory and the
restart count; the manifest lists every attempt.

`fstrain launch` (attached, detached, inside an allocation) and `fstrain bench` are jobs this
driver runs; the job is the only part that differs.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from fstrain.api import eventlog
from fstrain.core.hosts.hostfile import Host
from fstrain.core.job.spec import NodeLaunch
from fstrain.core.launch.blame import Evidence, Verdict
from fstrain.core.launch.recovery import Attempt, Checkpoints, Policy, steps_lost
from fstrain.core.progress import Event, Reporter, Silent
from fstrain.core.runs.limits import RunLimits
from fstrain.core.runs.manifest import Manifest
from fstrain.io.fanout import HostPool
from fstrain.io.hostcheck import check_hosts
from fstrain.io.launch import (
    HostFacts,
    Rendezvous,
    RunOptions,
    RunOutcome,
    RunSetup,
    manifest_of,
    prewarm_nodes,
    remote_run_dir,
    run_nodes,
    write_manifest,
)
from fstrain.io.runevents import EventLog
from fstrain.io.transport.base import Transport


@dataclass(frozen=True)
class NodeAccess:
    """Which hosts a run's nodes are, and how they are reached and checked."""

    hosts: Sequence[Host]
    python: str = "python3"
    workdir: str | None = None  # None: this directory, checked on every host (with ``here_by_default``)
    here_by_default: bool = True  # False: None leaves each node's command in its login directory
    packages: tuple[str, ...] = ("torch",)  # the preflight checks they import on every host
    fanout: int = 64
    ssh_config: str | None = None  # kept with a detached run, for later commands


@dataclass(frozen=True)
class RunOutput:
    """Where a run's output goes on this machine and on its nodes."""

    out: TextIO = sys.stdout  # the ranks' lines
    color: bool = False
    metrics_textfile: str | None = None  # each node's watchdog writes a Prometheus textfile here
    # An attached run: each rank's line as the logs hold it ("[host rN] text"), for its trackers;
    # called on the thread that watches the run, so it must not block
    lines: Callable[[str], None] | None = None


@dataclass(frozen=True)
class AttemptSettings:
    """Which attempt of a run this is (drive_attempts). Every rank gets FSTRAIN_CHECKPOINT_DIR
    (``checkpoint_dir``, or "" for node 0's RUN_DIR/checkpoints) and FSTRAIN_RESTART; a
    ``checkpoint_dir`` of None gives neither (a run without a recovery policy)."""

    checkpoint_dir: str | None = None
    restart: int = 0  # FSTRAIN_RESTART: 0 for the first attempt
    banner: str = ""  # a detached attempt's first line in every node's output


@dataclass(frozen=True)
class DriveRequest:
    """Where and how a run is driven; the job itself comes separately."""

    nodes: NodeAccess
    run_id: str
    run_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)  # the user's, for every rank
    master_port: int | None = None
    prewarm_backend: str | None = None  # attached: start this launcher's Python during the checks
    limits: RunLimits = field(default_factory=RunLimits)  # grace, heartbeat, stall, finish: as asked
    detach: bool = False
    record: bool = True  # list the run in this machine's index (`fstrain runs`)
    slurm_job_id: str | None = None  # inside a Slurm allocation: the job, asked whether Slurm ended it
    first_step: bool = True  # a training job: its progress waits for the first step
    output: RunOutput = field(default_factory=RunOutput)
    attempt: AttemptSettings = field(default_factory=AttemptSettings)
    # RUN_DIR/events.jsonl's writer, where this process decides the run (fstrain/api/eventlog.py);
    # a detached start writes none: its recovery keeper does, or (``coordinator_events``, a run
    # without a recovery policy: nothing here follows it) node 0's coordinator, on node 0
    events: EventLog | None = None
    coordinator_events: bool = False


@dataclass(frozen=True)
class Checked:
    """What the checks found: each host's facts, the rendezvous, each node's run directory."""

    facts: list[HostFacts]
    rendezvous: Rendezvous
    run_dirs: list[str]
    checkpoint_dir: str | None = None  # where the ranks checkpoint (a recovering run), absolute
    restart: int = 0  # the attempt's restart count (0: the first attempt)


@dataclass(frozen=True)
class NodeJob:
    """What a job runs on the nodes, fitted to what the checks found."""

    backend: str
    launches: list[NodeLaunch]
    node_files: list[dict[str, str]] = field(default_factory=list)  # per node: rendered files to write there
    plan: dict[str, Any] | None = None  # the plan it trains with, for the manifest
    replanned: str = ""  # after a restart on another world: what changed in the plan, in words


@dataclass
class Driven:
    checked: Checked
    job: NodeJob
    outcome: RunOutcome
    manifest: Manifest
    started: float
    answers: list[dict[str, Any]] = field(default_factory=list)  # detached: each node's start answer
    last_step: int | None = None  # a followed detached attempt: the highest step its ranks reported


def drive(request: DriveRequest, connect: Callable[[Host], Transport], job: Callable[[Checked], NodeJob],
          progress: Reporter | None = None) -> Driven:
    """Run the stages; never leaves a job running (a failure in any stage stops what started).
    ``progress`` hears where the stages are (connect, preflight, rendezvous, start, first step)."""
    hosts, nodes, output = list(request.nodes.hosts), request.nodes, request.output
    # Like DeepSpeed's launcher: by default this directory, checked on every host.
    workdir = nodes.workdir or (os.getcwd() if nodes.here_by_default else None)
    started = time.time()
    stages = progress or Silent()
    with HostPool(hosts, connect, fanout=nodes.fanout) as pool:
        connect_all(pool, stages)
        prewarmed = prewarm_nodes(pool, request.prewarm_backend, nodes.python, workdir, request.env,
                                  request.run_id) if request.prewarm_backend and not request.detach else []
        try:
            stages.event(Event("preflight", text="interpreter, packages, working directory, reachability"))
            facts, rendezvous = check_hosts(pool, nodes.python, workdir, request.run_id, request.master_port,
                                            packages=nodes.packages,
                                            workdir_is_default=nodes.workdir is None and workdir is not None)
            stages.event(Event("preflight", ended=True))
            stages.event(Event("rendezvous", text="the master address and port"))  # found with the preflight
            stages.event(Event("rendezvous", ended=True,
                               text=f"{rendezvous.master_addr}:{rendezvous.master_port}"))
            run_dirs = [remote_run_dir(h, f.info.get("home"), request.run_id, request.run_dir)
                        for h, f in zip(hosts, facts, strict=True)]
            checkpoint_dir = request.attempt.checkpoint_dir
            if checkpoint_dir == "":
                checkpoint_dir = f"{run_dirs[0]}/checkpoints"
            checked = Checked(facts, rendezvous, run_dirs, checkpoint_dir, request.attempt.restart)
            node_job = with_recovery_env(job(checked), checked)
            options = RunOptions(run_id=request.run_id, run_dir=request.run_dir, limits=request.limits,
                                 workdir=workdir, node_run_dirs=run_dirs, node_files=node_job.node_files,
                                 color=output.color, out=output.out, metrics_textfile=output.metrics_textfile,
                                 on_line=output.lines,
                                 ended_by_slurm=slurm_ended(request.slurm_job_id),
                                 progress=stages.event if progress is not None else None,
                                 first_step=request.first_step,
                                 on_first_step=eventlog.first_step(request.events, request.attempt.restart + 1),
                                 on_first_failure=eventlog.first_failure(request.events, request.attempt.restart + 1))
            if request.detach:
                return _start_detached(request, pool.transport, checked, node_job, options, started)
            if request.record:
                from fstrain.io.runs import register

                register(request.run_id, request.run_dir, detached=False)
            if request.attempt.restart == 0:  # a later attempt's start: drive_attempts says it
                eventlog.started(request.events, 1, [h.name for h in hosts])
            outcome = run_nodes(node_job.launches, pool.open_transport, nodes.python, options, prewarmed)
        finally:
            for node in prewarmed:
                if node is not None:
                    node.close()
    manifest = write_manifest(request.run_dir / "manifest.json",
                              manifest_of(run_setup(request, checked, node_job), outcome))
    return Driven(checked, node_job, outcome, manifest, started)


def connect_all(pool: HostPool, stages: Reporter) -> None:
    """One connection per host, all at once, each counted as it answers (a host that cannot
    be reached is named by the preflight next)."""
    total = len(pool.hosts)
    answered: list[str] = []
    lock = threading.Lock()
    stages.event(Event("connect", 0, total))

    def one(host: Host) -> str | None:
        error = pool.connect_error(host)
        with lock:
            answered.append(host.label())
            stages.event(Event("connect", len(answered), total, host.label()))
        return error

    failed = [e for e in pool.map(one) if e is not None]
    stages.event(Event("connect", total - len(failed), total, f"{len(failed)} cannot be reached" if failed else "",
                       ended=True, failed=bool(failed)))
def with_recovery_env(node_job: NodeJob, checked: Checked) -> NodeJob:
    """Every rank told where checkpoints go and which restart this is (docs/recovery.md)."""
    if checked.checkpoint_dir is None:
        return node_job
    from dataclasses import replace

    from fstrain.core.launch.recovery import CHECKPOINT_DIR_ENV, RESTART_ENV

    added = {CHECKPOINT_DIR_ENV: checked.checkpoint_dir, RESTART_ENV: str(checked.restart)}
    return replace(node_job, launches=[replace(launch, env={**launch.env, **added}) for launch in node_job.launches])


def slurm_ended(job_id: str | None) -> Callable[[], str | None] | None:
    if job_id is None:
        return None
    from fstrain.io.slurm import slurm_ended_run

    return lambda: slurm_ended_run(job_id)


def run_setup(request: DriveRequest, checked: Checked, node_job: NodeJob) -> RunSetup:
    return RunSetup(request.run_id, node_job.backend, node_job.launches, checked.rendezvous, checked.facts,
                    request.env, node_job.plan)


def _start_detached(request: DriveRequest, connect: Callable[[Host], Transport], checked: Checked,
                    node_job: NodeJob, options: RunOptions, started: float) -> Driven:
    """Every node's watchdog started detached (node 0 the coordinator), recorded here: before
    the first starts, so that a launch killed half-way leaves a run that `runs` lists and
    `stop` ends; then with node 0's answer (its coordinator's port); then with every node's."""
    from fstrain.io.runs import read_manifest, record_detached, register, start_detached

    setup = run_setup(request, checked, node_job)
    reach = (request.nodes.ssh_config, request.nodes.python)

    def record(answers: Sequence[dict[str, Any]]) -> None:
        record_detached(request.run_dir, setup, checked.run_dirs, answers, options, reach, started)

    record([{}] * len(node_job.launches))
    try:
        answers = start_detached(node_job.launches, connect, request.nodes.python, options, checked.rendezvous, record,
                                 request.attempt.banner, events=request.coordinator_events,
                                 fanout=request.nodes.fanout)
    except BaseException:
        # This process no longer starts it (it may live on: the API's caller): what shows on
        # the nodes decides the run's state from now on.
        register(request.run_id, request.run_dir, detached=True, launching=False)
        raise
    record(answers)
    earlier = read_manifest(request.run_dir / "manifest.json") if request.attempt.restart else None
    # A later attempt keeps the record of those before.
    manifest = write_manifest(request.run_dir / "manifest.json", replace(
        manifest_of(setup, None), reason="detached", started=started, detached=True,
        attempts=earlier.attempts if earlier is not None else ()))
    outcome = RunOutcome(0, "detached", None, [], started, time.time())
    return Driven(checked, node_job, outcome, manifest, started, answers)


@dataclass(frozen=True)
class Recovery:
    """A run's recovery policy and what it works with (docs/recovery.md)."""

    policy: Policy
    spares: tuple[Host, ...] = ()  # hostfile hosts marked spare: not in the first world
    checkpoint_dir: str = ""  # "": node 0's RUN_DIR/checkpoints (found at the first attempt)
    # The suspects' tests (fstrain.api.launch.suspect_tester): (guilty, why per host); None:
    # nobody is tested, so nobody is excluded
    test: Callable[[Sequence[Host], Verdict], tuple[tuple[str, ...], dict[str, str]]] | None = None
    # A detached run's keeper (fstrain/api/keeper.py): each started attempt followed to its end,
    # and why no further attempt may start ("": none asked; `fstrain stop` asks)
    follow: Callable[[Driven], Driven] | None = None
    stop_requested: Callable[[], str] | None = None


def drive_attempts(request: DriveRequest, connect: Callable[[Host], Transport],
                   job: Callable[[Checked], NodeJob], recovery: Recovery, report: Callable[[str], None],
                   progress: Reporter | None = None, first: Driven | None = None) -> Driven:
    """``drive`` once per attempt until one succeeds, is stopped, or the policy says stop; the
    last attempt's result, its manifest listing every attempt. An attempt that cannot start
    (a host that no longer answers the checks) ends the run with the last failure's code.
    ``first``: the first attempt, already started detached (by ``attempt_request(request, 1,
    ...)``), which ``recovery.follow`` follows to its end like every later one."""
    from dataclasses import replace

    from fstrain.core.launch.blame import blame
    from fstrain.core.launch.recovery import decide
    from fstrain.errors import FstrainError

    hosts, spares = list(request.nodes.hosts), list(recovery.spares)
    attempts: list[Attempt] = []
    checkpoint_dir, before = recovery.checkpoint_dir, Checkpoints()
    previous: Driven | None = None
    while True:
        number = len(attempts) + 1
        offsets = mark_attempt(request, number, hosts)
        stop = recovery.stop_requested() if recovery.stop_requested is not None and previous else ""
        try:
            if stop:  # between attempts: the one that failed is the run's last
                raise FstrainError(stop)
            if number > 1:  # the first attempt's start is drive's (or, detached, the keeper's) to say
                eventlog.started(request.events, number, [h.name for h in hosts])
                eventlog.resumed(request.events, number, before.step)
            driven = first if first is not None and number == 1 else \
                drive(attempt_request(request, number, hosts, checkpoint_dir), connect, job, progress)
            if recovery.follow is not None:
                driven = recovery.follow(driven)
        except FstrainError as exc:
            if previous is None:
                raise
            why = stop or f"attempt {number} could not start: {exc.message}"
            report(why)
            attempts[-1] = replace(attempts[-1], next_action="stop", next_why=why)
            return finish_attempts(request, previous, attempts)
        checkpoint_dir = driven.checked.checkpoint_dir or ""
        outcome = driven.outcome
        named = [h.name for h in hosts]
        failed = outcome.exit_code != 0 and outcome.reason not in ("interrupted", "terminated", "cancelled")
        verdict = blame(attempt_evidence(outcome)) if failed else None
        guilty: tuple[str, ...] = ()
        tested: dict[str, str] = {}
        if verdict is not None and recovery.test is not None and should_test(recovery.policy, verdict, number - 1):
            report(f"attempt {number} failed ({outcome.detail or outcome.reason}); verdict {verdict.kind}: "
                   f"{verdict.why}; testing {', '.join(verdict.suspects)}")
            guilty, tested = recovery.test(hosts, verdict)
        eventlog.blame(request.events, number, verdict, tested)
        after = _checkpoints(hosts, outcome, connect, request.nodes.python, checkpoint_dir)
        next_ = (decide(recovery.policy, number - 1, named, [s.name for s in spares], verdict, guilty)
                 if verdict else None)
        attempts.append(Attempt(
            number=number, hosts=tuple(named), started=outcome.started, ended=outcome.ended,
            exit_code=outcome.exit_code, reason=outcome.reason, detail=outcome.detail, verdict=verdict, tested=tested,
            replanned=driven.job.replanned,
            excluded=next_.excluded if next_ else (), spares_used=next_.spares_used if next_ else (),
            next_action=next_.action if next_ else "stop", next_why=next_.why if next_ else "",
            resumed_from=before.step if number > 1 else None, last_checkpoint=after.step,
            progress=after.newer_than(before) if number > 1 else None,
            recover_s=round(outcome.started - previous.outcome.ended, 3) if previous else None,
            steps_lost=steps_lost(driven.last_step if request.detach else last_step(request.run_dir / "logs", offsets),
                                  after.step) if failed else None))
        eventlog.excluded(request.events, number, next_)
        if next_ is None or next_.action == "stop":
            if next_ is not None and failed:
                report(f"attempt {number} failed ({outcome.detail or outcome.reason}); {next_.why}: the run ends "
                       f"with exit code {outcome.exit_code}")
            return finish_attempts(request, driven, attempts)
        report(restart_line(attempts[-1], next_.hosts, before))
        by_name = {h.name: h for h in [*hosts, *spares]}
        hosts = [by_name[name] for name in next_.hosts]
        spares = [s for s in spares if s.name not in next_.spares_used]
        before, previous = after, driven
        interim_manifest(request, driven, attempts)


def attempt_request(request: DriveRequest, number: int, hosts: Sequence[Host], checkpoint_dir: str) -> DriveRequest:
    """The request of attempt ``number`` on ``hosts``: listed in the index by the first only,
    every rank told the checkpoint directory and the restart count."""
    from dataclasses import replace

    from fstrain.core.launch.recovery import attempt_banner

    return replace(request, nodes=replace(request.nodes, hosts=tuple(hosts)), record=request.record and number == 1,
                   attempt=AttemptSettings(checkpoint_dir, number - 1, attempt_banner(number, [h.name for h in hosts])))


def should_test(policy: Policy, verdict: Verdict, restarts_done: int) -> bool:
    """Suspects are tested only where a test can change what follows: under ``exclude``, with
    budget left, for a verdict that is not the application's."""
    from fstrain.core.launch.blame import APPLICATION

    return (policy.on_failure == "exclude" and bool(verdict.suspects) and verdict.kind != APPLICATION
            and restarts_done < policy.max_restarts)


def attempt_evidence(outcome: RunOutcome) -> Evidence:
    """What an ended attempt left (fstrain/core/launch/blame.py): the first failure; every rank
    whose own last lines end in a traceback or a fault, though its node was torn down; the hosts
    that stopped answering; the host a stall's stacks show behind."""
    from fstrain.core.launch.blame import Evidence, RankEnd, read_end, stalled_host
    from fstrain.core.launch.supervisor import EXIT_LOST_HOST
    from fstrain.core.monitor.rankexit import RankFailure

    hosts = tuple(n.launch.host.name for n in outcome.nodes)
    lost = tuple(n.launch.host.name for n in outcome.nodes if n.exit_code is None and n.error)
    first = outcome.first_failure
    failed: list[RankEnd] = []
    for node in outcome.nodes:
        host = node.launch.host.name
        for local, tail in sorted(node.rank_tails.items()):
            lines = [line.partition("] ")[2] for line in tail]
            offset = node.launch.rank_offset
            failure = node.failure if node.failure is not None and node.failure.local_rank == local else \
                RankFailure(offset + local if offset is not None else None, local,
                            node.exit_code if node.exit_code is not None else EXIT_LOST_HOST, host)
            end = RankEnd.of(failure, host, lines)
            is_first = node.launch.node_rank == first and (node.failure is None or node.failure.local_rank == local)
            if is_first or read_end(end).cause in ("exception", "device", "comm"):
                failed.append(end)
    stall = stalled_host(outcome.stall, hosts) if outcome.stall else None
    return Evidence(hosts, tuple(failed), lost, stall,
                    outcome.nodes[first].launch.host.name if first is not None else None,
                    stalled=outcome.stall is not None)


def last_step(folder: Path, offsets: Mapping[str, int]) -> int | None:
    """The highest step any rank reported in this attempt: its metric lines, or the bundled
    trainer's progress lines, in the hosts' log files from where the attempt began."""
    from fstrain.io.logs import lines_after

    steps = [step for line in lines_after(folder, offsets)
             if (step := line_step(line.partition("] ")[2])) is not None]
    return max(steps) if steps else None


def line_step(text: str) -> int | None:
    """The step a rank's line reports (metricline.read_step: its metric line, else a progress
    line); None for other lines."""
    from fstrain.core.monitor.metricline import read_step

    reading = read_step(text, any_program=True)
    return reading.metrics.step if reading is not None else None


def _checkpoints(hosts: Sequence[Host], outcome: RunOutcome, connect: Callable[[Host], Transport], python: str,
                 directory: str) -> Checkpoints:
    """The checkpoint folder as a host that still answers sees it (the first in rank order)."""
    from fstrain.errors import FstrainError
    from fstrain.io.checkpoints import read_checkpoints

    lost = {n.launch.host.name for n in outcome.nodes if n.exit_code is None and n.error}
    for host in hosts:
        if host.name in lost:
            continue
        try:
            transport = connect(host)
        except FstrainError:
            continue
        try:
            return read_checkpoints(transport, python, directory)
        finally:
            transport.close()
    return Checkpoints()


def restart_line(attempt: Attempt, hosts: Sequence[str], before: Checkpoints) -> str:
    """What the user reads when an attempt failed and the next starts."""
    verdict = attempt.verdict
    out = f"; excluded {', '.join(attempt.excluded)}" if attempt.excluded else ""
    spares = f"; spare {', '.join(attempt.spares_used)} in" if attempt.spares_used else ""
    resume = (f"resuming from step {attempt.last_checkpoint}" if attempt.last_checkpoint is not None
              else "no checkpoint to resume from: starting over")
    progress = ("" if attempt.progress is not False
                else f"; no checkpoint newer than at its start (step {before.step}): this restart made no progress")
    return (f"attempt {attempt.number} failed ({attempt.detail or attempt.reason}); verdict "
            f"{verdict.kind if verdict else '-'}: {verdict.why if verdict else ''}{out}{spares}{progress}; "
            f"attempt {attempt.number + 1} on {len(hosts)} nodes ({', '.join(hosts)}), {resume}")


def mark_attempt(request: DriveRequest, number: int, hosts: Sequence[Host]) -> dict[str, int]:
    """The attempt's first line on the terminal and in every host's log file of the run; where
    each host's file then ends. A detached attempt's output is on its nodes: the watchdogs
    write the line there (``DriveRequest.banner``)."""
    from fstrain.core.launch.recovery import attempt_banner
    from fstrain.io.localout import describe, warn
    from fstrain.io.logs import append_to_logs

    line = attempt_banner(number, [h.name for h in hosts])
    request.output.out.write(line + "\n")
    request.output.out.flush()
    if request.detach:
        return {}
    folder = request.run_dir / "logs"
    offsets: dict[str, int] = {}
    try:
        offsets = append_to_logs(folder, [f"{h.name}.log" for h in hosts], line)
    except OSError as exc:
        warn(f"cannot mark attempt {number} in {folder} ({describe(exc)})")
    return {f"{h.name}.log": offsets.get(f"{h.name}.log", 0) for h in hosts}


def interim_manifest(request: DriveRequest, driven: Driven, attempts: Sequence[Attempt]) -> None:
    """Between attempts: the manifest lists the attempts so far, and the run has not ended."""
    driven.manifest = write_manifest(request.run_dir / "manifest.json", replace(
        driven.manifest, ended=None, reason="restarting", attempts=tuple(a.to_dict() for a in attempts)))


def finish_attempts(request: DriveRequest, driven: Driven, attempts: Sequence[Attempt]) -> Driven:
    """The run's manifest as its last attempt ended, with every attempt listed."""
    last = attempts[-1]
    reason = driven.outcome.reason if driven.manifest.reason == "restarting" else driven.manifest.reason
    driven.manifest = write_manifest(request.run_dir / "manifest.json", replace(
        driven.manifest, attempts=tuple(a.to_dict() for a in attempts), exit_code=last.exit_code,
        ended=driven.outcome.ended or time.time(), reason=reason))
    return driven
