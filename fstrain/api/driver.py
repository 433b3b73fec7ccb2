"""The one run driver: every run goes through the same stages, whatever starts it.

1. connect: one connection per host (SSH, or srun steps inside a Slurm allocation);
2. prewarm (attached runs): every node's launcher Python starts importing torch now;
3. preflight: interpreter, packages, working directory, interfaces on every host;
4. rendezvous: the master address every node reaches, and its port;
5. the job: given what the checks found, what each node runs (launch's program or plan,
   the benchmark worker, ...), rendered files included;
6. start the nodes and supervise them (attached: fstrain/io/launch.py, the supervisor's rules
   here; detached: node 0's coordinator, the same rules there);
7. collect and the manifest (RUN_DIR/manifest.json).

`fstrain launch` (attached, detached, inside an allocation) and `fstrain bench` are jobs this
driver runs; the job is the only part that differs.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from fstrain.core.hosts.hostfile import Host
from fstrain.core.launch.spec import NodeLaunch
from fstrain.core.progress import Event, Reporter, Silent
from fstrain.io.fanout import HostPool
from fstrain.io.launch import (
    HostFacts,
    Rendezvous,
    RunOptions,
    RunOutcome,
    RunSetup,
    choose_rendezvous,
    preflight,
    prewarm_nodes,
    remote_run_dir,
    run_nodes,
    write_manifest,
)
from fstrain.io.transport.base import Transport


@dataclass(frozen=True)
class DriveRequest:
    """Where and how a run is driven; the job itself comes separately."""

    hosts: Sequence[Host]
    run_id: str
    run_dir: Path
    python: str = "python3"
    workdir: str | None = None  # None: this directory, checked on every host (with ``here_by_default``)
    here_by_default: bool = True  # False: None leaves each node's command in its login directory
    packages: tuple[str, ...] = ("torch",)  # the preflight checks they import on every host
    env: Mapping[str, str] = field(default_factory=dict)  # the user's, for every rank
    master_port: int | None = None
    fanout: int = 64
    prewarm_backend: str | None = None  # attached: start this launcher's Python during the checks
    grace_s: float = 15.0
    heartbeat_timeout_s: float = 30.0
    stall_timeout_s: float | None = None
    finish_timeout_s: float | None = None
    detach: bool = False
    metrics_textfile: str | None = None  # each node's watchdog writes a Prometheus textfile here
    record: bool = True  # list the run in this machine's index (`fstrain runs`)
    ssh_config: str | None = None  # kept with a detached run, for later commands
    color: bool = False
    out: TextIO = sys.stdout  # the ranks' lines
    slurm_job_id: str | None = None  # inside a Slurm allocation: the job, asked whether Slurm ended it
    first_step: bool = True  # a training job: its progress waits for the first step


@dataclass(frozen=True)
class Checked:
    """What the checks found: each host's facts, the rendezvous, each node's run directory."""

    facts: list[HostFacts]
    rendezvous: Rendezvous
    run_dirs: list[str]


@dataclass(frozen=True)
class NodeJob:
    """What a job runs on the nodes, fitted to what the checks found."""

    backend: str
    launches: list[NodeLaunch]
    node_files: list[dict[str, str]] = field(default_factory=list)  # per node: rendered files to write there
    plan: dict[str, Any] | None = None  # the plan it trains with, for the manifest


@dataclass
class Driven:
    checked: Checked
    job: NodeJob
    outcome: RunOutcome
    manifest: dict[str, Any]
    started: float
    answers: list[dict[str, Any]] = field(default_factory=list)  # detached: each node's start answer


def drive(request: DriveRequest, connect: Callable[[Host], Transport], job: Callable[[Checked], NodeJob],
          progress: Reporter | None = None) -> Driven:
    """Run the stages; never leaves a job running (a failure in any stage stops what started).
    ``progress`` hears where the stages are (connect, preflight, rendezvous, start, first step)."""
    hosts = list(request.hosts)
    # Like DeepSpeed's launcher: by default this directory, checked on every host.
    workdir = request.workdir or (os.getcwd() if request.here_by_default else None)
    started = time.time()
    stages = progress or Silent()
    with HostPool(hosts, connect, fanout=request.fanout) as pool:
        connect_all(pool, stages)
        prewarmed = prewarm_nodes(pool, request.prewarm_backend, request.python, workdir, request.env,
                                  request.run_id) if request.prewarm_backend and not request.detach else []
        try:
            stages.event(Event("preflight", text="interpreter, packages, working directory"))
            facts = preflight(pool, request.python, workdir, packages=request.packages,
                              workdir_is_default=request.workdir is None and workdir is not None)
            stages.event(Event("preflight", ended=True))
            stages.event(Event("rendezvous", text="the master address and port"))
            rendezvous = choose_rendezvous(pool, connect, facts, request.python, request.run_id, request.master_port)
            stages.event(Event("rendezvous", ended=True,
                               text=f"{rendezvous.master_addr}:{rendezvous.master_port}"))
            run_dirs = [remote_run_dir(h, f.info.get("home"), request.run_id, request.run_dir)
                        for h, f in zip(hosts, facts, strict=True)]
            checked = Checked(facts, rendezvous, run_dirs)
            node_job = job(checked)
            options = RunOptions(run_id=request.run_id, run_dir=request.run_dir, grace_s=request.grace_s,
                                 heartbeat_timeout_s=request.heartbeat_timeout_s, workdir=workdir,
                                 node_run_dirs=run_dirs, node_files=node_job.node_files, color=request.color,
                                 out=request.out, stall_timeout_s=request.stall_timeout_s,
                                 finish_timeout_s=request.finish_timeout_s,
                                 metrics_textfile=request.metrics_textfile,
                                 ended_by_slurm=slurm_ended(request.slurm_job_id),
                                 progress=stages.event if progress is not None else None,
                                 first_step=request.first_step)
            if request.detach:
                return _start_detached(request, connect, checked, node_job, options, started)
            if request.record:
                from fstrain.io.runs import register

                register(request.run_id, request.run_dir, detached=False)
            outcome = run_nodes(node_job.launches, pool.open_transport, request.python, options, prewarmed)
        finally:
            for node in prewarmed:
                if node is not None:
                    node.close()
    manifest = write_manifest(request.run_dir / "manifest.json", run_setup(request, checked, node_job), outcome)
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
    from fstrain.io.runs import record_detached, register, start_detached, write_json

    setup = run_setup(request, checked, node_job)
    reach = (request.ssh_config, request.python)

    def record(answers: Sequence[dict[str, Any]]) -> None:
        record_detached(request.run_dir, setup, checked.run_dirs, answers, options, reach, started)

    record([{}] * len(node_job.launches))
    try:
        answers = start_detached(node_job.launches, connect, request.python, options, checked.rendezvous, record)
    except BaseException:
        # This process no longer starts it (it may live on: the API's caller): what shows on
        # the nodes decides the run's state from now on.
        register(request.run_id, request.run_dir, detached=True, launching=False)
        raise
    record(answers)
    manifest = write_manifest(request.run_dir / "manifest.json", setup, None)
    manifest.update(reason="detached", started=started, detached=True)
    write_json(request.run_dir / "manifest.json", manifest)
    outcome = RunOutcome(0, "detached", None, [], started, time.time())
    return Driven(checked, node_job, outcome, manifest, started, answers)
