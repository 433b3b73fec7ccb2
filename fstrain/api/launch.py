"""``launch``: a training job on every selected host, through the one run driver.

Over SSH, or inside a Slurm allocation through srun steps; attached (returns when the job has
ended, every rank's lines on ``out``) or detached (returns once every node has started). The
checks that need no host come first: a bad request is one error before anything is contacted.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

from fstrain.api.job import Job, JobSpec, build_job, interface_env, job_spec, new_run_id, rendered_files, resolve_nprocs
from fstrain.api.requests import LaunchRequest
from fstrain.api.runs import Access, Run

if TYPE_CHECKING:
    from fstrain.api.driver import Checked, Driven, DriveRequest, NodeJob, Recovery
    from fstrain.api.hosts import HostSelection
    from fstrain.api.requests import TrackerRequest
    from fstrain.core.hosts.hostfile import Host
    from fstrain.core.job.spec import LaunchJob, NodeLaunch
    from fstrain.core.launch.blame import Verdict
    from fstrain.core.plan.planfile import PlanFile
    from fstrain.core.progress import Reporter
    from fstrain.core.runs.manifest import Manifest
    from fstrain.core.slurm.job import Allocation
    from fstrain.io.launch import NodeState as NodeState  # re-exported with RunOutcome: what print_summary reads
    from fstrain.io.launch import RunOutcome as RunOutcome
    from fstrain.io.runs import RunRecord
    from fstrain.io.trackers import TrackerSession, TrackerSettings
    from fstrain.io.transport.base import Transport

Report = Callable[[str], None]


def _to_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")


@dataclass(frozen=True)
class Prepared:
    """A request checked without contacting any host: the hosts, the job, the run's identity."""

    request: LaunchRequest
    selection: HostSelection
    allocation: Allocation | None  # inside a Slurm allocation: nodes run their part as srun steps
    spec: JobSpec
    run_id: str
    run_dir: Path


class Launched(Run):
    """A launch that has ended (attached) or started (detached): the run's handle (``state``,
    ``status``, ``logs``, ``stop``, ``wait``, as every run's) and what the launch returned."""

    def __init__(self, record: RunRecord, access: Access, driven: Driven, job: Job, hosts: list[Host]) -> None:
        super().__init__(record, access)
        self.driven = driven
        self.job = job
        self.hosts = hosts
        self.training_summary: dict[str, Any] | None = None

    @property
    def outcome(self) -> RunOutcome:
        """How the (last) attempt ended, per node."""
        return self.driven.outcome

    @property
    def exit_code(self) -> int:
        """The run's exit code (0 for a detached run that has started)."""
        return self.driven.outcome.exit_code

    @property
    def manifest(self) -> Manifest:
        """RUN_DIR/manifest.json as written."""
        return self.driven.manifest

    def manifest_document(self) -> dict[str, Any]:
        """The manifest as its file holds it (what `launch --json` prints)."""
        from fstrain import __version__

        return self.driven.manifest.to_dict(__version__)


def prepare(request: LaunchRequest) -> Prepared:
    """Everything that needs no host: backend, hosts, the job, timeouts, the run id."""
    from fstrain.api.hosts import allocation_hosts, choose_allocation, resolve_hosts
    from fstrain.core.job.spec import BACKENDS
    from fstrain.errors import InputError

    job, hosts, run = request.job, request.hosts, request.run
    if job.backend not in BACKENDS:
        raise InputError(f"unknown backend {job.backend!r}", f"use one of {', '.join(BACKENDS)}", "--backend")
    allocation = choose_allocation(hosts.launcher, hosts.hostfile, hosts.hosts)
    if allocation is not None and run.detach:
        # srun steps end with the srun that started them: a detached run would die with this terminal.
        raise InputError("--detach cannot outlive the terminal inside a Slurm allocation (its srun steps end "
                         "with this command)", "submit the job with --slurm --detach instead, or run without "
                         "--detach", "--detach")
    if allocation is not None:
        selection = allocation_hosts(allocation, hosts.hostfile, hosts.hosts, hosts.include, hosts.exclude,
                                     hosts.gpus_per_node)
    else:
        check_container_options(request)
        selection = resolve_hosts(hosts.hostfile, hosts.hosts, hosts.include, hosts.exclude, hosts.gpus_per_node)
    check_recovery(request)
    check_trackers(request)
    spec = job_spec(job)
    run_id = run.run_id or new_run_id()
    return Prepared(request, selection, allocation, spec, run_id, Path(run.run_dir or Path("runs") / run_id))


def check_recovery(request: LaunchRequest) -> None:
    """The recovery policy and the checkpoint interval, checked as values."""
    from fstrain.core.launch.recovery import Policy
    from fstrain.errors import InputError

    run = request.run
    Policy(run.on_failure, run.max_restarts, run.min_nodes)
    if run.on_failure == "stop" and run.max_restarts and request.job.backend != "torchrun":
        raise InputError(f"--max-restarts without --on-failure restart/exclude restarts torchrun's worker group, and "
                         f"the {request.job.backend} backend has none",
                         "add --on-failure restart (fstrain starts the run again on the same hosts), "
                         "or launch with --backend torchrun", "--max-restarts")
    if request.job.checkpoint_interval < 0:
        raise InputError(f"--checkpoint-interval must be >= 0, got {request.job.checkpoint_interval}",
                         "give the steps between the bundled trainer's checkpoints (0: at the end only)",
                         "--checkpoint-interval")


def check_trackers(request: LaunchRequest) -> None:
    """A tracker's options without the tracker they belong to."""
    from fstrain.errors import InputError

    trackers = request.trackers
    if trackers.wandb_offline and not trackers.wandb:
        raise InputError("needs the W&B project to log to", "add --wandb PROJECT", "--wandb-offline")
    if trackers.mlflow_experiment != "fstrain" and not trackers.mlflow:
        raise InputError("needs the MLflow tracking server to log to", "add --mlflow URI",
                         "--mlflow-experiment")
    if not trackers.mlflow_experiment.strip():
        raise InputError("the experiment's name is empty", "name the experiment, or leave the flag out (fstrain)",
                         "--mlflow-experiment")


def check_container_options(request: LaunchRequest) -> None:
    """Pyxis containers are srun's: without Slurm there is nothing to run them."""
    from fstrain.errors import InputError

    if request.container_image or request.container_mounts:
        flag = "--container-image" if request.container_image else "--container-mounts"
        raise InputError(f"{flag} runs the nodes' steps in a Pyxis container, and this launch uses SSH",
                         "run inside a Slurm allocation (--launcher srun) or submit with --slurm", flag)


def container_step_args(request: LaunchRequest, run_id: str, workdir: str, run_dir: str) -> list[str]:
    """The Pyxis options of every srun step of a run: its image and mounts, one container that
    all its steps share (``--container-name=fstrain-<run id>``), and the working and run
    directories mounted at their own paths unless ``container_default_mounts`` is off."""
    from fstrain.core.slurm.job import pyxis_args

    defaults = (workdir, run_dir) if request.container_default_mounts else ()
    return pyxis_args(request.container_image, request.container_mounts, name=f"fstrain-{run_id}",
                      default_mounts=defaults)


@dataclass(frozen=True)
class DryRun:
    """The exact per-node commands a launch would run; nothing was contacted."""

    launches: list[NodeLaunch]
    job: Job
    master_addr: str
    master_port: int
    note: str = ("dry run: nothing was contacted; the master address and port are checked, and "
                 "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME chosen per node, at launch")


    def node_summaries(self) -> list[dict[str, Any]]:
        """Each node's command and (masked) environment, as the manifest lists them."""
        from fstrain.io.launch import node_summary

        return [node_summary(launch, None).to_dict() for launch in self.launches]


def dry_run(prepared: Prepared) -> DryRun:
    from fstrain.core.job.spec import master_port_candidates, plan_launches
    from fstrain.io.connect import is_local

    request, hosts = prepared.request, prepared.selection.hosts
    nprocs = resolve_nprocs(hosts, request.job.nproc_per_node, None)
    job = build_job(prepared.spec, hosts, nprocs, request.job.python)
    master = "127.0.0.1" if all(is_local(h) for h in hosts) else hosts[0].name
    port = request.run.master_port or master_port_candidates(prepared.run_id)[0]
    launches = plan_launches(hosts, nprocs, launch_job(prepared, job, master, port))
    return DryRun(launches, job, master, port)


def launch(request: LaunchRequest | Prepared, *, out: TextIO | None = None, report: Report | Reporter = _to_stderr,
           color: bool = False) -> Launched:
    """Run the job (attached: to its end; detached: until every node has started). The ranks'
    lines go to ``out`` (stdout by default), lines said once to ``report``; a ``report`` with
    an ``event`` method (fstrain.core.progress.Reporter) also hears where each stage is."""
    prepared = request if isinstance(request, Prepared) else prepare(request)
    return _execute(prepared, out or sys.stdout, report, color)


def _connector(prepared: Prepared) -> Callable[[Host], Transport]:
    from fstrain.api.hosts import connector
    from fstrain.io.connect import check_distinct_endpoints

    request = prepared.request
    if prepared.allocation is not None:
        workdir = request.job.workdir or os.getcwd()
        return connector(prepared.allocation, request.hosts,
                         container_step_args(request, prepared.run_id, workdir, str(prepared.run_dir.resolve())))
    return connector(None, request.hosts, config=check_distinct_endpoints(prepared.selection.hosts,
                                                                          request.hosts.ssh_config))


def rank_packages(backend: str, bundled_trainer: bool, tensorboard: bool = False) -> tuple[str, ...]:
    """What every host's interpreter must import for the ranks to start: torch (its launcher, or the
    bundled trainer's; the direct backend's own script needs only the standard library), DeepSpeed
    for its backend, fstrain itself where the ranks run the bundled trainer, and what its
    ``--tensorboard`` writer imports (rank 0 writes, and any host can be node 0 once a
    recovery has left hosts out)."""
    from fstrain.core.job.plan import TENSORBOARD_PACKAGE

    launcher = () if backend == "direct" and not bundled_trainer else ("torch",)  # direct: the ranks' own imports
    return (*launcher, *(("deepspeed",) if backend == "deepspeed" else ()), *(("fstrain",) if bundled_trainer else ()),
            *((TENSORBOARD_PACKAGE,) if tensorboard else ()))


def _execute(prepared: Prepared, out: TextIO, report: Report | Reporter, color: bool) -> Launched:
    from fstrain.api.driver import drive, drive_attempts
    from fstrain.io.runs import launched_record

    request = prepared.request
    job_request, run = request.job, request.run
    if not run.detach:  # its log files stay open here until the run ends
        check_attached_limits(prepared)
    trackers = track(prepared, follows=not run.detach)  # their preflight: before anything is contacted
    connect = _connector(prepared)
    drive_request, node_job, built = _driving(prepared, out, report, color, trackers)
    progress = cast("Reporter", report) if hasattr(report, "event") else None
    recovery = recovery_of(prepared, connect)

    def run_it() -> Driven:
        if run.detach and (recovery is not None or request.trackers.any):  # its keeper writes its events
            return _start_kept(prepared, drive_request, connect, node_job, built, recovery, progress, report)
        if recovery is None:  # detached: node 0's coordinator decides the run, and writes its events
            driven = drive(replace(drive_request, coordinator_events=run.detach), connect, node_job, progress)
        else:
            driven = drive_attempts(drive_request, connect, node_job, recovery, report, progress)
        if not run.detach:  # before the trackers' last read of the events
            from fstrain.api import eventlog

            eventlog.finished(drive_request.events, attempt_count(driven.manifest), driven.manifest)
        return driven

    driven = tracked(trackers, run_it)
    job = built[-1]
    hosts = [facts.host for facts in driven.checked.facts]  # the last attempt's
    access = Access(request.hosts.ssh_config, request.hosts.accept_new_hosts, job_request.python)
    record = launched_record(prepared.run_id, prepared.run_dir, detached=run.detach)
    launched = Launched(record, access, driven, job, list(hosts))
    if job.bundled_trainer and not run.detach and driven.outcome.exit_code == 0:
        launched.training_summary = fetch_training_summary(hosts[0], driven.checked.run_dirs[0], connect,
                                                           prepared.run_dir, report)
        if launched.training_summary is not None:
            from fstrain.io.launch import write_manifest

            driven.manifest = write_manifest(prepared.run_dir / "manifest.json",
                                             replace(driven.manifest, training_summary=launched.training_summary))
    return launched


def check_attached_limits(prepared: Prepared) -> None:
    """Room on this machine for an attached launch's connections and log files (a host's
    processes: its selected slots, else --nproc-per-node, else 1 while a probe has not said)."""
    from fstrain.core.launch.clientlimits import attached_launch_needs
    from fstrain.io.clientlimits import ensure

    hosts = prepared.selection.hosts
    nproc = prepared.request.job.nproc_per_node
    ranks = [host.num_selected_slots or nproc or 1 for host in hosts]
    ensure(attached_launch_needs(ranks), len(hosts), "an attached launch on")


def _start_kept(prepared: Prepared, drive_request: DriveRequest, connect: Callable[[Host], Transport],
                node_job: Callable[[Checked], NodeJob], built: list[Job], recovery: Recovery | None,
                progress: Reporter | None, report: Report) -> Driven:
    """A detached run whose keeper follows it (fstrain/api/keeper.py): its first attempt started
    here, then the keeper, which runs the attempts after it (a recovery policy) and sends the
    run to its trackers."""
    from fstrain.api.driver import attempt_request, drive
    from fstrain.api.keeper import start_keeper

    run = prepared.request.run
    first = drive_request if recovery is None else \
        attempt_request(drive_request, 1, prepared.selection.hosts, recovery.checkpoint_dir)
    driven = drive(first, connect, node_job, progress)
    keeper = start_keeper(prepared.run_id, prepared.run_dir, (prepared, driven, built[0]))
    does = [f"runs the attempts (--on-failure {run.on_failure}, --max-restarts {run.max_restarts})"] \
        if recovery is not None else []
    does += ["sends the run to its trackers"] if prepared.request.trackers.any else []
    report(f"keeper (pid {keeper.pid}) {' and '.join(does)}; its log: {keeper.log}")
    return driven


def track(prepared: Prepared, follows: bool = True) -> TrackerSession | None:
    """The run's trackers (``--mlflow``, ``--wandb``), each checked now: one that does not answer
    is an error before anything starts. None where none was asked for, or where this process
    does not follow the run (``follows`` False: a detached launch, which its keeper follows)."""
    trackers = prepared.request.trackers
    if not trackers.any:
        return None
    from fstrain.io.trackers import senders, start_session

    settings = tracker_settings(trackers, prepared.run_id, prepared.run_dir)
    if not follows:
        senders(settings)
        return None
    return start_session(settings)


def tracker_settings(trackers: TrackerRequest, run_id: str, run_dir: Path) -> TrackerSettings:
    """What the trackers flags ask for, for run ``run_id`` kept in ``run_dir``."""
    from fstrain.io.trackers import TrackerSettings

    return TrackerSettings(run_id, run_dir, trackers.mlflow, trackers.mlflow_experiment, trackers.wandb,
                           trackers.wandb_offline)


def tracker_start(trackers: TrackerSession, prepared: Prepared, job: Job, node: NodeJob) -> None:
    """The run's parameters and tags, sent as its first attempt's job is known."""
    from fstrain.core.job.spec import redact, secret_values
    from fstrain.core.track.calls import launch_params

    env = {k: v for launch in node.launches for k, v in launch.env.items()}
    program = [redact(arg, secret_values(env)) for arg in job.program]
    params = launch_params(prepared.run_id, node.backend, [n.host.name for n in node.launches],
                           [n.nproc for n in node.launches], program, node.plan)
    trackers.start(params, {"fstrain.run_id": prepared.run_id, "fstrain.run_dir": str(prepared.run_dir.resolve()),
                            "fstrain.backend": node.backend})


def tracked(trackers: TrackerSession | None, run: Callable[[], Driven]) -> Driven:
    """``run()``, its end sent to the run's trackers: the run's outcome, or the error that
    ended the launch before the run did."""
    if trackers is None:
        return run()
    try:
        driven = run()
    except BaseException as exc:
        end_tracking(trackers, None, getattr(exc, "message", type(exc).__name__))
        raise
    end_tracking(trackers, driven)
    return driven


def end_tracking(trackers: TrackerSession, driven: Driven | None, error: str = "") -> None:
    """The run's end sent to its trackers: its status, exit code and reason (or the error that
    ended the launch before the run did)."""
    from fstrain.core.track.calls import tracker_status

    if driven is None:
        trackers.finish("FAILED", {"fstrain.state": "error", "fstrain.error": error})
        return
    outcome = driven.outcome
    trackers.finish(tracker_status(outcome.exit_code, outcome.reason),
                    {"fstrain.exit_code": str(outcome.exit_code), "fstrain.reason": outcome.reason,
                     **({"fstrain.detail": outcome.detail} if outcome.detail else {})})


def _driving(prepared: Prepared, out: TextIO, report: Report | Reporter, color: bool,
             trackers: TrackerSession | None = None) -> tuple[DriveRequest, Callable[[Checked], NodeJob], list[Job]]:
    """The driver's request for this launch, and its job: fitted to each attempt's hosts (the
    first attempt's plan re-planned for another world), every job built kept in the list."""
    from fstrain.api.driver import AttemptSettings, DriveRequest, NodeAccess, RunOutput
    from fstrain.io.runevents import EventLog

    request, hosts = prepared.request, prepared.selection.hosts
    job_request, run = request.job, request.run
    built: list[Job] = []

    def node_job(checked: Checked) -> NodeJob:
        job, node = fit_job(prepared, checked, built[0].plan if built else None)
        if trackers is not None and not built:
            tracker_start(trackers, prepared, job, node)
        built.append(job)
        if node.replanned:
            report(f"replanned: {node.replanned}")
        if job.plan is not None:
            first = checked.facts[0].host.name
            report(describe_plan(job.plan, f"each node's run directory ({first}: {checked.run_dirs[0]})"))
        report(describe_start(prepared, checked, node.launches))
        return node

    nodes = NodeAccess(hosts, job_request.python, job_request.workdir,
                       packages=rank_packages(job_request.backend, prepared.spec.bundled_trainer,
                                              bool(prepared.spec.tensorboard)),
                       fanout=request.hosts.fanout, ssh_config=request.hosts.ssh_config)
    drive_request = DriveRequest(
        nodes, prepared.run_id, prepared.run_dir, env=dict(job_request.env), master_port=run.master_port,
        prewarm_backend=job_request.backend if job_request.backend != "direct" else None,  # direct: nothing to import
        limits=run.limits, detach=run.detach,
        slurm_job_id=prepared.allocation.job_id if prepared.allocation is not None else None,
        output=RunOutput(out, color, run.metrics_textfile, trackers.line if trackers is not None else None),
        attempt=AttemptSettings(run.checkpoint_dir), events=EventLog.in_folder(prepared.run_dir.resolve(),
                                                                               prepared.run_id))
    return drive_request, node_job, built


def attempt_count(manifest: Manifest) -> int:
    """How many attempts the run made: its manifest's list, 1 for a run without a recovery policy."""
    return max(1, len(manifest.attempts))


def keep(prepared: Prepared, first: Driven, first_job: Job, stop: threading.Event) -> Driven:
    """A detached run after its launch started the first attempt (fstrain/api/keeper.py): with
    a recovery policy, the one recovery loop, each attempt followed to its end on its nodes;
    without, the one attempt followed. The keeper writes the run's events, and its trackers,
    where asked for, are sent every node's output as it is read. ``stop`` set: no further
    attempt, and the current one stopped."""
    from fstrain.api import eventlog
    from fstrain.api.driver import drive_attempts
    from fstrain.api.keeper import STOPPED, OutputFeed, follow
    from fstrain.errors import FstrainError

    connect = _connector(prepared)
    try:
        trackers = track(prepared)
    except FstrainError as exc:  # the launch's preflight passed: a tracker gone since never stops the run
        _to_stderr(f"warning: {exc.one_line()}; the run goes on without it")
        trackers = None
    drive_request, node_job, built = _driving(prepared, sys.stdout, _to_stderr, False, trackers)
    # The keeper writes the run's events: the first attempt started before it did.
    eventlog.started(drive_request.events, 1, [h.name for h in prepared.selection.hosts], at=first.started)
    built.append(first_job)  # the plan a smaller world is re-planned from
    feed = OutputFeed(trackers.line, connect, prepared.request.job.python) if trackers is not None else None
    if trackers is not None:
        tracker_start(trackers, prepared, first_job, first.job)
    recovery = recovery_of(prepared, connect)

    def run_it() -> Driven:
        if recovery is None:
            driven = follow(first, drive_request, connect, stop, feed=feed)
        else:
            kept = replace(recovery, follow=lambda driven: follow(driven, drive_request, connect, stop, feed=feed),
                           stop_requested=lambda: STOPPED if stop.is_set() else "")
            driven = drive_attempts(drive_request, connect, node_job, kept, _to_stderr, first=first)
        eventlog.finished(drive_request.events, attempt_count(driven.manifest), driven.manifest)
        return driven

    return tracked(trackers, run_it)


def recovery_of(prepared: Prepared, connect: Callable[[Host], Transport]) -> Recovery | None:
    """The run's recovery policy, None for ``--on-failure stop`` (one attempt, as always)."""
    from fstrain.api.driver import Recovery
    from fstrain.core.launch.recovery import Policy

    run = prepared.request.run
    policy = Policy(run.on_failure, run.max_restarts, run.min_nodes)
    if not policy.recovers:
        return None
    return Recovery(policy, tuple(prepared.selection.spares), run.checkpoint_dir or "",
                    suspect_tester(connect, prepared))


def suspect_tester(connect: Callable[[Host], Transport], prepared: Prepared) \
        -> Callable[[Sequence[Host], Verdict], tuple[tuple[str, ...], dict[str, str]]]:
    """The suspects tested beside the attempt's other hosts: a quick doctor, and a short bench
    of the pairs (a connection error) or of the compute (a GPU fault) where the verdict says so."""
    from fstrain.api.diagnose import test_suspects

    def test(hosts: Sequence[Host], verdict: Verdict) -> tuple[tuple[str, ...], dict[str, str]]:
        why = verdict.why.lower()
        suites = (("pairs",) if "connection error" in why else ()) + \
            (("compute",) if any(w in why for w in ("ecc", "xid", "cuda", "gpu")) else ())
        job = prepared.request.job
        found = test_suspects(hosts, verdict.suspects, connect, job.python, bench_suites=suites,
                              workdir=job.workdir or os.getcwd(), fanout=prepared.request.hosts.fanout,
                              env=dict(job.env))
        return found.guilty, dict(found.why)

    return test



def fit_job(prepared: Prepared, checked: Checked, first_plan: PlanFile | None = None) -> tuple[Job, NodeJob]:
    """The job for the hosts the checks found: processes per node (slots, else GPUs), the
    plan fitted to the world size, each node's launcher command and rendered files. After a
    restart on another world, ``first_plan`` (the first attempt's) is re-planned for it: the
    same model and global batch (fstrain/core/plan/replan.py)."""
    from fstrain.api.driver import NodeJob
    from fstrain.core.job.spec import plan_launches

    request, hosts = prepared.request, [facts.host for facts in checked.facts]  # this attempt's
    job_request = request.job
    gpus = [int(f.info.get("nvidia_gpus") or 0) for f in checked.facts]
    nprocs = resolve_nprocs(hosts, job_request.nproc_per_node, gpus)
    spec, replanned = prepared.spec, ""
    if first_plan is not None and first_plan.knobs.world_size != sum(nprocs) and len(set(nprocs)) == 1:
        from fstrain.core.plan.replan import replan_file

        plan, replanned = replan_file(first_plan, tuple(h.name for h in hosts), nprocs[0])
        spec = replace(spec, plan=plan)
    job = build_job(spec, hosts, nprocs, job_request.python,
                    "gpu (not planned: see fstrain plan)" if any(gpus) else "cpu")
    if job.bundled_trainer and checked.checkpoint_dir is not None:
        job = replace(job, program=[*job.program, *checkpoint_args(checked, job_request.checkpoint_interval)])
    per_node = [interface_env(ifname, dict(job_request.env)) for ifname in checked.rendezvous.interfaces]
    launches = plan_launches(hosts, nprocs, launch_job(prepared, job, checked.rendezvous.master_addr,
                                                       checked.rendezvous.master_port), per_node)
    node_files = [rendered_files(job.plan, d, job.steps) for d in checked.run_dirs] if job.plan else []
    return job, NodeJob(job_request.backend, launches, node_files, job.plan.to_dict() if job.plan else None,
                        replanned)


def checkpoint_args(checked: Checked, interval: int) -> list[str]:
    """The bundled trainer's checkpoint flags: where, how often, and ``--resume`` after a restart."""
    return ["--checkpoint-dir", str(checked.checkpoint_dir), "--checkpoint-interval", str(interval),
            *(["--resume"] if checked.restart else [])]


def launch_job(prepared: Prepared, job: Job, master_addr: str, master_port: int) -> LaunchJob:
    """What every node runs, and where the nodes meet."""
    from fstrain.core.job.spec import LaunchJob

    request = prepared.request
    # Under a recovery policy --max-restarts is fstrain's budget: torchrun keeps its static world.
    torchrun_restarts = request.run.max_restarts if request.run.on_failure == "stop" else 0
    return LaunchJob(request.job.backend, job.program, request.job.python, master_addr, master_port, prepared.run_id,
                     torchrun_restarts, dict(request.job.env), request.job.no_local_rank)


def describe_plan(plan: PlanFile, where: str = "each node's run directory at launch") -> str:
    from fstrain.core.job.plan import trainer_backend
    from fstrain.core.plan.planner import describe_knobs

    k = plan.knobs
    return (f"plan: {plan.model.name}: {describe_knobs(k)}, {k.precision}, global batch {k.global_batch_size} x "
            f"{k.seq_len} tokens; trainer backend {trainer_backend(plan)}; configs rendered into {where}")


def describe_start(prepared: Prepared, checked: Checked, launches: list[NodeLaunch]) -> str:
    nprocs = [launch.nproc for launch in launches]
    procs: Any = nprocs[0] if len(set(nprocs)) == 1 else nprocs
    nodes = len(launches)
    where = ("output in each node's run directory (fstrain logs)" if prepared.request.run.detach
             else f"logs in {prepared.run_dir}/logs")
    return (f"run {prepared.run_id}: {nodes} node{'' if nodes == 1 else 's'} x {procs} "
            f"{'process' if procs == 1 else 'processes'}, {prepared.request.job.backend}, master "
            f"{checked.rendezvous.master_addr}:{checked.rendezvous.master_port}; {where}")


def fetch_training_summary(host: Host, run_dir: str, connect: Callable[[Host], Transport], folder: Path,
                           report: Report) -> dict[str, Any] | None:
    """Rank 0's summary.json (node 0), copied into the local run directory."""
    from fstrain.io.runs import copy_training_summary

    summary, error = copy_training_summary(connect, host, run_dir, folder)
    if summary is None:
        report(f"no training summary on {host.label()}: {error}")
    return summary


def guarded_stream(stream: TextIO, name: str) -> TextIO:
    """``stream`` for the ranks' lines, its first write failure (a closed pipe, a full disk)
    said once and later writes dropped: losing the terminal's copy never stops the job."""
    from fstrain.io.localout import GuardedStream

    return cast(TextIO, GuardedStream(stream, name))  # writes and flushes like the stream it guards


@contextlib.contextmanager
def final_write(name: str = "stdout") -> Iterator[None]:
    """Around a last write to stdout (the JSON document, the summary): a failure is said once."""
    from fstrain.io.localout import stdout_may_fail

    with stdout_may_fail(name):
        yield


def failure_lines(node: NodeState, count: int = 10) -> list[str]:
    """A failed node's most telling lines: the first failed rank's own, else the node's last."""
    from fstrain.io.launch import last_lines

    return last_lines(node, count)
