"""``fstrain launch``: run a training job on every selected host and never leave an orphan."""

from __future__ import annotations

import shlex
import sys
from typing import TYPE_CHECKING

import typer

from fstrain.cli import hostopts
from fstrain.cli import slurm as slurmopts
from fstrain.cli.output import console, print_json

if TYPE_CHECKING:
    from fstrain.api.launch import Launched, Prepared
    from fstrain.api.requests import LaunchRequest
    from fstrain.core.job.spec import NodeLaunch


def register(app: typer.Typer) -> None:
    app.command(
        "launch",
        context_settings={"allow_interspersed_args": False},
        help="Launch a job on every selected host: fstrain launch --hostfile F -- python train.py ...",
    )(launch_command)


def launch_command(
    ctx: typer.Context,
    program: list[str] = typer.Argument(None, help="The program and its arguments (after --).", show_default=False),
    hostfile: str | None = hostopts.HOSTFILE,
    hosts: str | None = hostopts.HOSTS,
    include: str | None = hostopts.INCLUDE,
    exclude: str | None = hostopts.EXCLUDE,
    gpus_per_node: int | None = hostopts.GPUS_PER_NODE,
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    fanout: int = hostopts.FANOUT,
    nproc_per_node: str = typer.Option("auto", "--nproc-per-node", help="Processes per node, or 'auto' (slots)."),
    backend: str = typer.Option("torchrun", "--backend", help="torchrun, deepspeed, or direct (fstrain starts each "
                                "rank itself, with torchrun's environment; no torch needed to launch)."),
    no_local_rank: bool = typer.Option(False, "--no-local-rank", help="deepspeed backend: do not append "
                                       "--local_rank=N to the program's arguments (as deepspeed --no_local_rank)."),
    env: list[str] = typer.Option([], "--env", help="NAME=VALUE, or NAME to pass this environment's value, for "
                                  "every rank (repeatable)."),
    env_file: str | None = typer.Option(None, "--env-file", help="File of NAME=VALUE lines."),
    workdir: str | None = typer.Option(None, "--workdir", help="Working directory on every host (default: the "
                                       "current directory; checked first)."),
    python: str = typer.Option("python3", "--python", help="Interpreter on the hosts."),
    master_port: int | None = typer.Option(None, "--master-port", min=1, max=65535, help="Rendezvous port."),
    max_restarts: int = typer.Option(0, "--max-restarts", min=0, help="With --on-failure restart/exclude: "
                                     "attempts after the first; else torchrun worker-group restarts."),
    on_failure: str = typer.Option("stop", "--on-failure", help="After a failed attempt: stop, restart (the same "
                                   "hosts) or exclude (the hosts found guilty, spares in); see docs/recovery.md."),
    min_nodes: int = typer.Option(1, "--min-nodes", min=1, help="With --on-failure exclude: the fewest nodes a "
                                  "run may shrink to."),
    checkpoint_dir: str | None = typer.Option(None, "--checkpoint-dir", help="FSTRAIN_CHECKPOINT_DIR for every "
                                              "rank (default with --on-failure: node 0's RUN_DIR/checkpoints)."),
    checkpoint_interval: int = typer.Option(0, "--checkpoint-interval", min=0, help="The bundled trainer: "
                                            "checkpoint every N steps (0: at the end only)."),
    run_dir: str | None = typer.Option(None, "--run-dir", help="Logs and manifest (default runs/<run id>)."),
    grace: float = typer.Option(15.0, "--grace", min=0, help="Seconds between SIGTERM and SIGKILL on teardown."),
    heartbeat_timeout: float = typer.Option(
        30.0, "--heartbeat-timeout", min=1, help="Seconds without an answer before a host counts as lost."
    ),
    plan_path: str | None = typer.Option(None, "--plan", help="plan.yaml from `fstrain plan --out`: render it and "
                                         "train with it (the bundled trainer when no PROGRAM is given)."),
    model: str | None = typer.Option(None, "--model", help="A shipped recipe (e.g. tiny): train it data-parallel."),
    recipe: str | None = typer.Option(None, "--recipe", help="A recipe file: train it data-parallel."),
    strategy: str | None = typer.Option(None, "--strategy", help="With --model/--recipe: ddp, zero1-3, fsdp-full, "
                                        "fsdp-grad-op, fsdp-hybrid (default fsdp-full; zero3 for deepspeed)."),
    micro_batch: int = typer.Option(4, "--micro-batch", min=1, help="With --model/--recipe: sequences per rank."),
    precision: str = typer.Option(
        "bf16", "--precision", help="With --model/--recipe: bf16, fp16, fp32, bf16-pure, amp-bf16 or amp-fp16."),
    steps: int = typer.Option(20, "--steps", min=1, help="Optimizer steps for the bundled trainer."),
    tensorboard: str | None = typer.Option(None, "--tensorboard", help="The bundled trainer's rank 0 writes "
                                           "TensorBoard event files to this folder on node 0 ('{run_dir}/tb': in "
                                           "the run directory; needs the tensorboard package there)."),
    metrics_textfile: str | None = typer.Option(None, "--metrics-textfile", help="Each node writes "
                                                "fstrain_<run id>_node<I>.prom (Prometheus text format) to this "
                                                "folder on the node every few seconds, for node_exporter's "
                                                "textfile collector."),
    mlflow: str | None = typer.Option(None, "--mlflow", help="Log the run to this MLflow tracking server "
                                      "(http://host:5000, or a local store URI): its parameters, every rank's "
                                      "steps, its events and end; checked before anything starts."),
    mlflow_experiment: str = typer.Option("fstrain", "--mlflow-experiment", help="With --mlflow: the experiment "
                                          "the run goes into (created if missing)."),
    wandb: str | None = typer.Option(None, "--wandb", help="Log the run to this Weights & Biases project, as "
                                     "--mlflow logs it (needs the wandb package here)."),
    wandb_offline: bool = typer.Option(False, "--wandb-offline", help="With --wandb: write W&B's run files "
                                       "under RUN_DIR/wandb only (upload later with `wandb sync`)."),
    stall_timeout: str | None = typer.Option(None, "--stall-timeout", metavar="DURATION",
                                             help="No rank output for this long (e.g. 20m): collect every rank's "
                                             "stacks, name the odd ranks, stop the job (exit 124)."),
    finish_timeout: str | None = typer.Option(None, "--finish-timeout", metavar="DURATION",
                                              help="Some ranks finished and others still run after "
                                              "this long: the same as --stall-timeout."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Return the run id once every node started; the "
                                "nodes supervise the job themselves (see fstrain runs/status/logs/stop); with "
                                "--on-failure restart/exclude a keeper process here runs the attempts. "
                                "With --slurm: print the job id and return at once."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the per-node commands; connect to nothing."),
    json_output: bool = typer.Option(False, "--json", help="Print the summary as one JSON document on stdout."),
    launcher: str = slurmopts.LAUNCHER,
    slurm: bool = slurmopts.SLURM,
    nodes: int | None = slurmopts.NODES,
    partition: str | None = slurmopts.PARTITION,
    time_limit: str | None = slurmopts.TIME,
    account: str | None = slurmopts.ACCOUNT,
    qos: str | None = slurmopts.QOS,
    constraint: str | None = slurmopts.CONSTRAINT,
    exclusive: bool = slurmopts.EXCLUSIVE,
    sbatch_args: list[str] = slurmopts.SBATCH_ARG,
    container_image: str | None = slurmopts.CONTAINER_IMAGE,
    container_mounts: str | None = slurmopts.CONTAINER_MOUNTS,
    no_default_mounts: bool = slurmopts.NO_DEFAULT_MOUNTS,
    cpus_per_rank: int | None = slurmopts.CPUS_PER_RANK,
    slurm_render_only: bool = slurmopts.RENDER_ONLY,
) -> None:
    """Launch PROGRAM on every selected host (one torchrun or DeepSpeed launcher per node)."""
    from fstrain.api.job import collect_env, new_run_id, parse_nproc, stall_timeouts
    from fstrain.api.requests import HostRequest, JobRequest, LaunchRequest, RunSettings, TrackerRequest

    if slurm or slurm_render_only:
        slurmopts.check_submit_flags(hostfile, hosts, launcher, dry_run)
    else:
        slurmopts.check_no_submit_flags({"--nodes": nodes, "--partition": partition, "--time": time_limit,
                                         "--account": account, "--qos": qos, "--constraint": constraint,
                                         "--exclusive": exclusive, "--sbatch-arg": sbatch_args,
                                         "--cpus-per-rank": cpus_per_rank})
    stall_s, finish_s = stall_timeouts(stall_timeout, finish_timeout)
    request = LaunchRequest(
        hosts=HostRequest(hostfile=hostfile, hosts=hosts, include=include, exclude=exclude,
                          gpus_per_node=gpus_per_node, ssh_config=ssh_config, accept_new_hosts=accept_new_hosts,
                          fanout=fanout, launcher=launcher),
        job=JobRequest(program=tuple(program or ()), backend=backend, nproc_per_node=parse_nproc(nproc_per_node),
                       plan=plan_path, model=model, recipe=recipe, strategy=strategy, micro_batch=micro_batch,
                       precision=precision, steps=steps, tensorboard=tensorboard,
                       env=collect_env(env, env_file), python=python,
                       workdir=workdir, no_local_rank=no_local_rank, checkpoint_interval=checkpoint_interval),
        run=RunSettings(run_id=new_run_id(), run_dir=run_dir, master_port=master_port, max_restarts=max_restarts,
                        on_failure=on_failure, min_nodes=min_nodes, checkpoint_dir=checkpoint_dir,
                        grace_s=grace, heartbeat_timeout_s=heartbeat_timeout, stall_timeout_s=stall_s,
                        finish_timeout_s=finish_s, detach=detach, metrics_textfile=metrics_textfile),
        trackers=TrackerRequest(mlflow=mlflow, mlflow_experiment=mlflow_experiment, wandb=wandb,
                                wandb_offline=wandb_offline),
        container_image=container_image, container_mounts=container_mounts,
        container_default_mounts=not no_default_mounts)
    if slurm or slurm_render_only:
        from fstrain.api.requests import SlurmRequest

        _check_backend(backend)
        batch = SlurmRequest(nodes=nodes, gpus_per_node=gpus_per_node, partition=partition, time_limit=time_limit,
                             account=account, qos=qos, constraint=constraint, exclusive=exclusive,
                             cpus_per_rank=cpus_per_rank, sbatch_args=tuple(sbatch_args))
        raise typer.Exit(slurmopts.submit_launch(ctx, request, batch, render_only=slurm_render_only,
                                                 json_output=json_output))
    raise typer.Exit(run_launch(request, dry_run=dry_run, json_output=json_output))


def _check_backend(backend: str) -> None:
    from fstrain.core.job.spec import BACKENDS
    from fstrain.errors import InputError

    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}", f"use one of {', '.join(BACKENDS)}", "--backend")


def run_launch(request: LaunchRequest, *, dry_run: bool, json_output: bool) -> int:
    """The launch through the API, printed: rank lines on stdout (stderr with --json, whose
    stdout is one document), progress on stderr, the summary at the end. Returns the exit code."""
    from fstrain.api.launch import final_write, guarded_stream, launch, prepare

    prepared = prepare(request)
    if prepared.selection.source.startswith("localhost"):
        console().print(f"[dim]hosts: {prepared.selection.source}[/dim]")  # stderr: --json's stdout stays one doc
    if prepared.selection.spares:
        console().print(f"[dim]spare hosts, held back from the first world: "
                        f"{', '.join(h.label() for h in prepared.selection.spares)}[/dim]")
    if dry_run:
        print_dry_run(prepared, json_output)
        return 0
    if prepared.allocation is not None and not json_output:
        console().print(f"[dim]Slurm job {prepared.allocation.job_id}: every node runs its part as an srun step[/dim]")
    from fstrain.cli.progress_output import progress_reporter

    out = guarded_stream(*((sys.stderr, "stderr") if json_output else (sys.stdout, "stdout")))
    with progress_reporter() as reporter:  # the stages on stderr: live on a terminal, else plain lines
        launched = launch(prepared, out=reporter.routed(out), report=reporter,
                          color=sys.stdout.isatty() and not json_output)
    if request.run.detach:
        print_detached(launched, json_output)
        return 0
    if json_output:
        with final_write():
            print_json(launched.manifest_document())
        return launched.exit_code
    from fstrain.cli.launch_output import print_attempts, print_summary, print_training_summary

    print_summary(launched.outcome)
    print_attempts(list(launched.manifest.attempts))
    if launched.training_summary is not None:
        with final_write():
            print_training_summary(launched.training_summary)
    return launched.exit_code


def print_detached(launched: Launched, json_output: bool) -> None:
    """The run id once every node has started (stdout), and how to follow it (stderr)."""
    run_id = launched.run_id
    if json_output:
        print_json({"run_id": run_id, "run_dir": str(launched.run_dir), "nodes": launched.driven.answers})
        return
    console().print(f"run {run_id} started detached on {len(launched.hosts)} nodes; `fstrain status {run_id}`, "
                    f"`fstrain logs {run_id} --follow`, `fstrain stop {run_id}`")
    sys.stdout.write(run_id + "\n")
    sys.stdout.flush()


def print_dry_run(prepared: Prepared, json_output: bool) -> None:
    """The exact per-node commands and (masked) environment; no connection is opened."""
    from fstrain.api.launch import describe_plan, dry_run

    planned = dry_run(prepared)
    if json_output:
        print_json({"run_id": prepared.run_id, "dry_run": True, "note": planned.note,
                    "master_addr": planned.master_addr, "master_port": planned.master_port,
                    "spares": [h.label() for h in prepared.selection.spares],
                    "plan": planned.job.plan.to_dict() if planned.job.plan else None,
                    "nodes": planned.node_summaries()})
        return
    if planned.job.plan is not None:
        console().print(describe_plan(planned.job.plan), markup=False)
    print_launches(planned.launches)
    console().print(f"[dim]{planned.note}[/dim]")


def print_launches(launches: list[NodeLaunch]) -> None:
    from fstrain.core.job.spec import mask_env

    for launch in launches:
        processes = "process" if launch.nproc == 1 else "processes"
        sys.stdout.write(f"# node {launch.node_rank}: {launch.host.label()} ({launch.nproc} {processes})\n")
        for name, value in mask_env(launch.env).items():
            sys.stdout.write(f"{name}={shlex.quote(value)}\n")
        sys.stdout.write(shlex.join(launch.argv) + "\n")
    sys.stdout.flush()
