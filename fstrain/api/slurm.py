"""`launch --slurm`: the batch script, its submission, following the job, and the job's end;
and `plan`/`render` inside an allocation (the allocation is the cluster).

The batch script's one command is the same `fstrain launch`, with ``--launcher srun``: every
node runs as an srun step of the job (fstrain/io/slurm.py). What the command line says about
the submission and the job is the CLI's to print; these functions return it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from fstrain.api.requests import HostRequest, LaunchRequest, SlurmRequest
from fstrain.errors import InputError

if TYPE_CHECKING:
    from fstrain.core.plan.plancluster import NodeGpus
    from fstrain.core.runs.manifest import Manifest
    from fstrain.core.slurm.job import JobStatus

CANCELLED_EXIT_CODE = 143  # a job cancelled before it started: as one scancel stopped (SIGTERM)


@dataclass(frozen=True)
class SubmitRequest:
    """A launch to run as a Slurm batch job."""

    launch: LaunchRequest
    slurm: SlurmRequest
    # The options the batch job's own `fstrain launch` is given; None: those of ``launch``
    # (:func:`launch_args_of`). The command line passes what the user typed.
    launch_args: tuple[str, ...] | None = None
    render_only: bool = False  # write the script, do not submit it


@dataclass(frozen=True)
class Submitted:
    run_id: str
    run_dir: Path
    script: Path
    job_id: str | None = None  # None: only rendered
    output: Path | None = None  # the job's output file (every tagged line and fstrain's summary)


def submit(request: SubmitRequest) -> Submitted:
    """Render the batch script into the run directory and, unless only rendering, submit it. A
    refused submission leaves nothing behind that it made."""
    from fstrain.api.launch import container_step_args
    from fstrain.core.slurm.job import SbatchOptions, render_sbatch, srun_step_argv
    from fstrain.io.runs import claim_for_slurm, forget_submission, record_slurm, write_batch_script
    from fstrain.io.slurm import SbatchRefused
    from fstrain.io.slurm import submit as sbatch

    launch, slurm = request.launch, request.slurm
    from fstrain.api.job import new_run_id

    run_id, program, user_env = launch.run.run_id or new_run_id(), list(launch.job.program), dict(launch.job.env)
    folder = Path(launch.run.run_dir or Path("runs") / run_id).resolve()
    options = SbatchOptions(
        nodes=slurm.nodes or 1, job_name=f"fstrain-{run_id}", output=str(folder / "slurm-%j.out"),
        gpus_per_node=slurm.gpus_per_node, cpus_per_task=cpus_per_task(launch, slurm), partition=slurm.partition,
        time=slurm.time_limit, account=slurm.account, qos=slurm.qos, constraint=slurm.constraint,
        exclusive=slurm.exclusive, no_kill=launch.run.on_failure != "stop", extra=slurm.sbatch_args,
    )
    workdir = os.getcwd()
    step = srun_step_argv("NODE", extra=container_step_args(launch, "RUN_ID", workdir, f"{folder}/job-JOB_ID"),
                          cpus_per_task=options.cpus_per_task)
    inner = [sys.executable, "-m", "fstrain", "launch", "--launcher", "srun"]
    if user_env:
        inner += ["--env-file", str(folder / "launch.env")]
    inner += list(request.launch_args if request.launch_args is not None else launch_args_of(launch))
    script = render_sbatch(options, launch_argv=inner, workdir=workdir, run_id=run_id, step_prefix=step,
                           run_dir=str(folder), program=program)
    path, made = write_batch_script(folder, script, env_file_text(user_env) if user_env else None)
    if request.render_only:
        return Submitted(run_id, folder, path)
    if launch.trackers.any:
        ask_trackers_here(launch, run_id, folder)
    claim_for_slurm(folder, run_id)  # before sbatch: the job's own launch must find the folder claimed
    try:
        job_id = sbatch(path)
    except SbatchRefused:  # a refused job leaves nothing behind: what this launch made goes again
        forget_submission(folder, made)
        raise
    except BaseException:  # no sbatch here: the script stays, to submit where there is one
        forget_submission(folder, [])
        raise
    output = folder / f"slurm-{job_id}.out"
    record_slurm(folder, run_id=run_id, job_id=job_id, script=path, output=output, grace_s=launch.run.grace_s)
    return Submitted(run_id, folder, path, job_id, output)


def ask_trackers_here(launch: LaunchRequest, run_id: str, folder: Path) -> None:
    """The trackers asked once from this machine as the job is submitted: one that does not
    answer is said on stderr, and the job is submitted all the same. Its own launch, on its first
    node, asks again and ends before its nodes start if it gets no answer there; the login node
    may not reach what the compute nodes do, or the other way round."""
    from fstrain.api.launch import tracker_settings
    from fstrain.errors import FstrainError
    from fstrain.io.localout import warn
    from fstrain.io.trackers import senders

    try:
        senders(tracker_settings(launch.trackers, run_id, folder))
    except FstrainError as exc:
        warn(f"{exc.where}: {exc.message}, from this machine; the job is submitted all the same, and its launch "
             "asks again from the job's first node, ending before the nodes start if it gets no answer there")


# Each option of the batch job's `fstrain launch` that a request may carry: (the request's part,
# field, flag). A value equal to the request's default is left out, as the command line leaves it.
LAUNCH_FLAGS = (
    ("hosts", "include", "--include"), ("hosts", "exclude", "--exclude"), ("hosts", "fanout", "--fanout"),
    ("job", "nproc_per_node", "--nproc-per-node"), ("job", "backend", "--backend"),
    ("job", "no_local_rank", "--no-local-rank"), ("job", "workdir", "--workdir"), ("job", "python", "--python"),
    ("job", "plan", "--plan"), ("job", "model", "--model"), ("job", "recipe", "--recipe"),
    ("job", "strategy", "--strategy"), ("job", "micro_batch", "--micro-batch"), ("job", "precision", "--precision"),
    ("job", "steps", "--steps"), ("job", "tensorboard", "--tensorboard"),
    ("job", "checkpoint_interval", "--checkpoint-interval"),
    ("run", "master_port", "--master-port"), ("run", "max_restarts", "--max-restarts"),
    ("run", "on_failure", "--on-failure"), ("run", "min_nodes", "--min-nodes"),
    ("run", "checkpoint_dir", "--checkpoint-dir"), ("run", "grace_s", "--grace"),
    ("run", "heartbeat_timeout_s", "--heartbeat-timeout"), ("run", "stall_timeout_s", "--stall-timeout"),
    ("run", "finish_timeout_s", "--finish-timeout"), ("run", "metrics_textfile", "--metrics-textfile"),
    ("trackers", "mlflow", "--mlflow"), ("trackers", "mlflow_experiment", "--mlflow-experiment"),
    ("trackers", "wandb", "--wandb"), ("trackers", "wandb_offline", "--wandb-offline"),
)


def launch_args_of(request: LaunchRequest) -> list[str]:
    """The batch job's `fstrain launch` options for ``request`` (its program and environment are
    passed apart: the script's last argument and the run directory's launch.env)."""
    from dataclasses import fields

    args: list[str] = []
    for part, name, flag in LAUNCH_FLAGS:
        holder = getattr(request, part)
        value = getattr(holder, name)
        default = next(f.default for f in fields(holder) if f.name == name)
        if value == default:
            continue
        if isinstance(value, bool):
            args.append(flag)
        elif name.endswith("timeout_s") and flag in ("--stall-timeout", "--finish-timeout"):
            args += [flag, f"{value:g}s"]
        else:
            args += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    if request.container_image:
        args += ["--container-image", request.container_image]
    if request.container_mounts:
        args += ["--container-mounts", request.container_mounts]
    if not request.container_default_mounts:
        args.append("--no-default-mounts")
    return args


def cpus_per_task(request: LaunchRequest, slurm: SlurmRequest) -> int:
    """The CPUs of the one per-node task, which every rank of the node runs in: ranks per node
    (--nproc-per-node, else --gpus-per-node, else 1) x --cpus-per-rank (default 4)."""
    from fstrain.core.slurm.job import CPUS_PER_RANK

    ranks = request.job.nproc_per_node or slurm.gpus_per_node or 1
    return ranks * (slurm.cpus_per_rank or CPUS_PER_RANK)


def env_file_text(env: Mapping[str, str]) -> str:
    """NAME=VALUE lines that --env-file reads back unchanged."""
    for name, value in env.items():
        if "\n" in value or value != value.strip() or (len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""):
            raise InputError(f"the value of {name} cannot be passed to a batch job (a line break, surrounding "
                             "spaces or quotes)", "set it in the job's environment instead", "--env")
    return "".join(f"{name}={value}\n" for name, value in env.items())


def follow_job(job_id: str, output: Path, out: TextIO,
               on_state: Callable[[JobStatus], None] = lambda status: None) -> JobStatus | None:
    """The job's output file, relayed to ``out`` until the job ends (each new state said to
    ``on_state``); its last status (None: Slurm forgot it). A job Slurm can never start is
    given up: its last status is then not final (see :func:`give_up_pending`)."""
    from fstrain.io.slurm import follow as follow_output

    return follow_output(job_id, output, out, on_state=on_state)


def cancel_job(job_id: str) -> None:
    from fstrain.io.slurm import cancel as scancel

    scancel(job_id)


def give_up_pending(status: JobStatus) -> None:
    """A job Slurm will never start as submitted (Reason=PartitionConfig, ...): cancelled, and
    said in one line with the reason, instead of followed forever."""
    from fstrain.core.slurm.job import cannot_start
    from fstrain.io.slurm import partition_size

    cancel_job(status.job_id)
    why = cannot_start(status, partition_size(status.partition) if status.partition else None)
    raise InputError(f"Slurm job {status.job_id} cannot start: {why}; fstrain cancelled it",
                     "ask for what the partition has (`sinfo -o '%P %D %c %m %l'` lists nodes, CPUs, memory and "
                     "time limit per partition), or choose another --partition", "sbatch")


@dataclass(frozen=True)
class JobEnd:
    """How a followed job ended, and fstrain's exit code for it: the job's; 143 for a job
    cancelled before it started (it has none)."""

    job_id: str
    state: str  # Slurm's (COMPLETED, FAILED, CANCELLED, ...); UNKNOWN: Slurm forgot the job
    exit_code: int
    reason: str
    started: bool  # whether the job ran at all
    run_dir: Path
    job_dir: Path
    manifest: Manifest | None
    training_summary: dict[str, Any] | None

    def document(self) -> dict[str, Any]:
        manifest = self.manifest.to_dict(self.manifest.writer) if self.manifest is not None else None
        document: dict[str, Any] = {"job_id": self.job_id, "state": self.state, "exit_code": self.exit_code,
                                    "reason": self.reason, "run_dir": str(self.run_dir), "job_dir": str(self.job_dir),
                                    "manifest": manifest}
        if self.training_summary is not None:
            document["training_summary"] = self.training_summary
        return document


def job_end(job_id: str, status: JobStatus | None, folder: Path) -> JobEnd:
    """The job's end from Slurm's last status and the job's records in the run directory."""
    from fstrain.core.slurm.job import TIME_LIMIT_MARKER, job_dir_name
    from fstrain.core.slurm.state import slurm_run_state
    from fstrain.io.runs import read_manifest, read_summary

    job_dir = folder / job_dir_name(job_id)
    manifest = read_manifest(job_dir / "manifest.json")
    summary = read_summary(job_dir / "summary.json")
    if status is None:
        code = manifest.exit_code if manifest is not None and manifest.exit_code is not None else 1
        return JobEnd(job_id, "UNKNOWN", code, "", True, folder, job_dir, manifest, summary)
    run = slurm_run_state(status, manifest, time_limit_reached=(job_dir / TIME_LIMIT_MARKER).is_file())
    started = run.exit_code is not None
    code = status.shell_exit_code if started else CANCELLED_EXIT_CODE
    return JobEnd(job_id, status.state, code, run.reason, started, folder, job_dir, manifest, summary)


def plan_allocation(num_nodes: int | None, gpus_per_node: int | None, gpu: str | None,
                    node_specs: Sequence[str] | None, python: str, fanout: int,
                    report: Callable[[str], None]) -> tuple[int | None, int | None, list[NodeGpus] | None]:
    """`fstrain plan`/`render` inside an allocation, without --hostfile/--hosts: the allocation is
    the cluster. With --gpu, its node count and GPUs per node fill in what the flags leave out;
    without --gpu or --node, its nodes are probed through srun. Outside one: unchanged."""
    from fstrain.api.hosts import allocation_hosts, connector
    from fstrain.core.plan.plancluster import node_gpus_from_report
    from fstrain.core.slurm.job import allocation_from_env, plan_shape
    from fstrain.errors import TransportError
    from fstrain.io.probe import probe_inventory

    allocation = allocation_from_env(os.environ)
    if allocation is None or node_specs:
        return num_nodes, gpus_per_node, None
    if gpu:
        nodes, gpus = plan_shape(allocation, num_nodes, gpus_per_node)
        report(f"cluster: Slurm job {allocation.job_id}, {nodes} nodes x {gpus if gpus is not None else 'default'} "
               "GPUs")
        return nodes, gpus, None
    report(f"cluster: Slurm job {allocation.job_id}, probing its {allocation.num_nodes} nodes through srun")
    hosts = allocation_hosts(allocation, None, None, None, None, None).hosts
    reports, failed = probe_inventory(hosts, connector(allocation, HostRequest()), python=python, fanout=fanout)
    if failed:
        raise TransportError("could not probe " + "; ".join(error.one_line() for _, error in failed),
                             "check the nodes with `srun hostname`, or describe the cluster with --gpu",
                             "fstrain plan")
    return num_nodes, gpus_per_node, [node_gpus_from_report(r, h.label()) for h, r in zip(hosts, reports, strict=True)]
