"""Slurm in the CLI: the launch options, which launcher runs the nodes, and `launch --slurm`.

- Inside an allocation (``--launcher srun``, or ``auto`` with ``SLURM_JOB_ID`` set and no
  ``--hosts``/``--hostfile``) every per-node command runs as an srun step (fstrain/io/slurm.py).
- ``launch --slurm`` renders a batch script whose one command is the same ``fstrain launch``,
  with ``--launcher srun``, submits it and follows the job's output file.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from fstrain.cli.output import console, print_json

if TYPE_CHECKING:
    from fstrain.api.requests import LaunchRequest, SlurmRequest
    from fstrain.core.hosts.hostfile import Host
    from fstrain.core.slurm.job import JobStatus
    from fstrain.io.transport.base import Transport

LAUNCHER = typer.Option("auto", "--launcher", help="How nodes run their part: ssh, srun (inside a Slurm "
                        "allocation, no SSH), or auto (srun when SLURM_JOB_ID is set and no hosts are given).")
SLURM = typer.Option(False, "--slurm", help="Submit the launch as a Slurm batch job (sbatch) and follow it.")
NODES = typer.Option(None, "--nodes", min=1, help="With --slurm: nodes to allocate (default 1).")
PARTITION = typer.Option(None, "--partition", help="With --slurm: the Slurm partition.")
TIME = typer.Option(None, "--time", help="With --slurm: the time limit (MINUTES, HH:MM:SS, D-HH:MM).")
ACCOUNT = typer.Option(None, "--account", help="With --slurm: the account to charge.")
QOS = typer.Option(None, "--qos", help="With --slurm: the quality of service.")
CONSTRAINT = typer.Option(None, "--constraint", help="With --slurm: required node features.")
EXCLUSIVE = typer.Option(False, "--exclusive", help="With --slurm: no other job on the nodes.")
SBATCH_ARG = typer.Option([], "--sbatch-arg", help="With --slurm: one more sbatch option, verbatim (repeatable).")
CONTAINER_IMAGE = typer.Option(None, "--container-image", help="Slurm with Pyxis: run every node's part in this "
                               "enroot image (srun --container-image).")
CONTAINER_MOUNTS = typer.Option(None, "--container-mounts", help="Slurm with Pyxis: SRC:DST[,...] mounted into it "
                                "(the working and run directories are mounted too).")
NO_DEFAULT_MOUNTS = typer.Option(False, "--no-default-mounts", help="Slurm with Pyxis: mount only --container-mounts, "
                                 "not the working and run directories.")
CPUS_PER_RANK = typer.Option(None, "--cpus-per-rank", min=1, help="With --slurm: CPUs for each rank (default 4); the "
                             "job asks for ranks per node x this as --cpus-per-task.")
RENDER_ONLY = typer.Option(False, "--slurm-render-only", hidden=True)

CANCELLED_EXIT_CODE = 143  # a job cancelled before it started: as one scancel stopped (SIGTERM)
# launch's own options that the batch job's `fstrain launch` does not take from the command line.
SUBMIT_ONLY = frozenset({
    "program", "slurm", "slurm_render_only", "nodes", "partition", "time_limit", "account", "qos", "constraint",
    "exclusive", "cpus_per_rank", "sbatch_args", "detach", "launcher", "run_dir", "env", "env_file", "hostfile",
    "hosts", "gpus_per_node", "json_output", "dry_run", "ssh_config", "accept_new_hosts",
})


def check_submit_flags(hostfile: str | None, hosts: str | None, launcher: str, dry_run: bool) -> None:
    """--slurm takes its nodes from Slurm and always runs them through srun."""
    from fstrain.errors import InputError

    if hostfile or hosts:
        flag = "--hostfile" if hostfile else "--hosts"
        raise InputError(f"{flag} cannot be combined with --slurm: Slurm chooses the nodes",
                         "give --nodes N (and --partition, --constraint, or --sbatch-arg=--nodelist=...)", flag)
    if launcher == "ssh":
        raise InputError("--launcher ssh cannot be combined with --slurm: the batch job runs its nodes with srun",
                         "drop --launcher", "--launcher")
    if dry_run:
        raise InputError("--dry-run cannot be combined with --slurm",
                         "write the batch script without submitting it: fstrain render --slurm -o DIR ...", "--dry-run")


def check_no_submit_flags(given: Mapping[str, object]) -> None:
    """The sbatch-only options without --slurm: one clear line instead of silently ignoring them."""
    from fstrain.errors import InputError

    for flag, value in given.items():
        if value:
            raise InputError(f"{flag} is an sbatch option", f"add --slurm to submit a batch job, or drop {flag}", flag)


def allocation_connector(source: str) -> Callable[[Host], Transport] | None:
    """srun for `doctor`, `exec` and `topo` when their hosts are the allocation's (they came
    from SLURM_JOB_NODELIST, inside the job); ``None``: the usual SSH connector."""
    if source != "SLURM_JOB_NODELIST" or not os.environ.get("SLURM_JOB_ID"):
        return None
    from fstrain.io.slurm import srun_connector

    console().print(f"[dim]Slurm job {os.environ['SLURM_JOB_ID']}: reaching its nodes through srun[/dim]")
    return srun_connector()


def plan_allocation(num_nodes: int | None, gpus_per_node: int | None, gpu: str | None, node_specs: list[str] | None,
                    python: str, fanout: int) -> tuple[int | None, int | None, list[Any] | None]:
    """`fstrain plan`/`render` inside an allocation, without --hostfile/--hosts: the allocation is
    the cluster. With --gpu, its node count and GPUs per node fill in what the flags leave out;
    without --gpu or --node, its nodes are probed through srun. Outside one: unchanged."""
    from fstrain.core.slurm.job import allocation_from_env, plan_shape

    allocation = allocation_from_env(os.environ)
    if allocation is None or node_specs:
        return num_nodes, gpus_per_node, None
    if gpu:
        nodes, gpus = plan_shape(allocation, num_nodes, gpus_per_node)
        console().print(f"[dim]cluster: Slurm job {allocation.job_id}, {nodes} nodes x "
                        f"{gpus if gpus is not None else 'default'} GPUs[/dim]")
        return nodes, gpus, None
    from fstrain.core.plan.plancluster import node_gpus_from_report
    from fstrain.errors import TransportError
    from fstrain.io.probe import probe_inventory
    from fstrain.io.slurm import srun_connector

    console().print(f"[dim]cluster: Slurm job {allocation.job_id}, probing its {allocation.num_nodes} nodes "
                    "through srun[/dim]")
    from fstrain.api.hosts import allocation_hosts

    hosts = allocation_hosts(allocation, None, None, None, None, None).hosts
    reports, failed = probe_inventory(hosts, srun_connector(), python=python, fanout=fanout)
    if failed:
        raise TransportError("could not probe " + "; ".join(error.one_line() for _, error in failed),
                             "check the nodes with `srun hostname`, or describe the cluster with --gpu",
                             "fstrain plan")
    return num_nodes, gpus_per_node, [node_gpus_from_report(r, h.label()) for h, r in zip(hosts, reports, strict=True)]


def inner_launch_args(ctx: typer.Context) -> list[str]:
    """The options given to this `fstrain launch`, as the batch job's `fstrain launch` takes them."""
    args: list[str] = []
    for param in ctx.command.params:
        name = param.name or ""
        source = ctx.get_parameter_source(name)
        if name in SUBMIT_ONLY or source is None or source.name not in ("COMMANDLINE", "ENVIRONMENT"):
            continue
        flag = next((o for o in param.opts if o.startswith("--")), param.opts[0])
        value = ctx.params[name]
        if getattr(param, "is_flag", False):
            if value:
                args.append(flag)
        elif getattr(param, "multiple", False):
            for item in value:
                args += [flag, str(item)]
        elif value is not None:
            args += [flag, str(value)]
    return args


def submit_launch(ctx: typer.Context, request: LaunchRequest, slurm: SlurmRequest, *, render_only: bool,
                  json_output: bool) -> int:
    """Render the batch script into the run directory; unless only rendering, submit it and
    follow the job (or print its id at once with --detach). Returns the exit code."""
    from fstrain.api.launch import container_step_args
    from fstrain.core.slurm.job import SbatchOptions, render_sbatch, srun_step_argv

    run_id, program, user_env = str(request.run.run_id), list(request.job.program), dict(request.job.env)
    detach = request.run.detach
    folder = Path(request.run.run_dir or Path("runs") / run_id).resolve()
    options = SbatchOptions(
        nodes=slurm.nodes or 1, job_name=f"fstrain-{run_id}", output=str(folder / "slurm-%j.out"),
        gpus_per_node=slurm.gpus_per_node, cpus_per_task=cpus_per_task(request, slurm), partition=slurm.partition,
        time=slurm.time_limit, account=slurm.account, qos=slurm.qos, constraint=slurm.constraint,
        exclusive=slurm.exclusive, no_kill=request.run.on_failure != "stop", extra=slurm.sbatch_args,
    )
    workdir = os.getcwd()
    step = srun_step_argv("NODE", extra=container_step_args(request, "RUN_ID", workdir, f"{folder}/job-JOB_ID"),
                          cpus_per_task=options.cpus_per_task)
    inner = [sys.executable, "-m", "fstrain", "launch", "--launcher", "srun"]
    if user_env:
        inner += ["--env-file", str(folder / "launch.env")]
    inner += inner_launch_args(ctx)
    script = render_sbatch(options, launch_argv=inner, workdir=workdir, run_id=run_id, step_prefix=step,
                           run_dir=str(folder), program=program)
    made = _made_paths(folder, ["launch.env", "sbatch.sh"] if user_env else ["sbatch.sh"])
    folder.mkdir(parents=True, exist_ok=True)
    if user_env:  # values stay off the script and the command lines: a file only the user reads
        _write_private(folder / "launch.env", env_file_text(user_env))
    path = folder / "sbatch.sh"
    path.write_text(script)
    path.chmod(0o755)
    if render_only:
        return _report_rendered(path, folder, json_output)
    from fstrain.io.runs import SLURM_RECORD, claim_for_slurm, record_slurm
    from fstrain.io.slurm import SbatchRefused, submit

    claim_for_slurm(folder, run_id)  # before sbatch: the job's own launch must find the folder claimed
    try:
        job_id = submit(path)
    except SbatchRefused:  # a refused job leaves nothing behind: what this launch made goes again
        _remove([*made, folder / SLURM_RECORD])
        raise
    except BaseException:  # no sbatch here: the script stays, to submit where there is one
        (folder / SLURM_RECORD).unlink(missing_ok=True)
        raise
    (folder / "slurm_job_id").write_text(job_id + "\n")
    output = folder / f"slurm-{job_id}.out"
    grace = ctx.params.get("grace")
    record_slurm(folder, run_id=run_id, job_id=job_id, script=path, output=output,
                 grace_s=float(grace) if grace is not None else None)
    console().print(f"submitted Slurm job {job_id} as run {run_id}: script {path}, output {output}")
    if detach:
        if json_output:
            print_json({"job_id": job_id, "run_id": run_id, "run_dir": str(folder), "script": str(path),
                        "output": str(output)})
        else:
            console().print(f"`fstrain status {run_id}`, `fstrain logs {run_id} --follow`, `fstrain stop {run_id}`")
            sys.stdout.write(job_id + "\n")
            sys.stdout.flush()
        return 0
    return follow_job(job_id, output, folder, json_output)


def cpus_per_task(request: LaunchRequest, slurm: SlurmRequest) -> int:
    """The CPUs of the one per-node task, which every rank of the node runs in: ranks per node
    (--nproc-per-node, else --gpus-per-node, else 1) x --cpus-per-rank (default 4)."""
    from fstrain.core.slurm.job import CPUS_PER_RANK

    ranks = request.job.nproc_per_node or slurm.gpus_per_node or 1
    return ranks * (slurm.cpus_per_rank or CPUS_PER_RANK)


def _made_paths(folder: Path, names: list[str]) -> list[Path]:
    """What a submission is about to make: the folder itself when it does not exist yet, else
    those of its files that are not there yet (what was there is the user's)."""
    if not folder.exists():
        return [folder]
    return [folder / name for name in names if not (folder / name).exists()]


def _remove(paths: list[Path]) -> None:
    import shutil

    for path in paths:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def env_file_text(env: Mapping[str, str]) -> str:
    """NAME=VALUE lines that --env-file reads back unchanged."""
    from fstrain.errors import InputError

    for name, value in env.items():
        if "\n" in value or value != value.strip() or (len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""):
            raise InputError(f"the value of {name} cannot be passed to a batch job (a line break, surrounding "
                             "spaces or quotes)", "set it in the job's environment instead", "--env")
    return "".join(f"{name}={value}\n" for name, value in env.items())


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _report_rendered(path: Path, folder: Path, json_output: bool) -> int:
    if json_output:
        print_json({"script": str(path), "run_dir": str(folder)})
    else:
        console().print(f"wrote {path}; submit it with: sbatch {path}", soft_wrap=True)
    return 0


def follow_job(job_id: str, output: Path, folder: Path, json_output: bool) -> int:
    """Follow until the job ends; Ctrl-C asks whether to cancel it (on a terminal; elsewhere the
    job is left running). The exit code is the job's."""
    from fstrain.io.slurm import cancel, follow

    out = sys.stderr if json_output else sys.stdout
    while True:
        try:
            status = follow(job_id, output, out, on_state=_say_state)
            break
        except KeyboardInterrupt:
            if not _ask_cancel(job_id):
                console().print(f"[yellow]job {job_id} keeps running[/yellow]: its output is {output}; "
                                f"stop it with `scancel {job_id}`")
                return 130
            cancel(job_id)
            console().print(f"cancelled job {job_id}; waiting for its nodes to stop")
    if status is not None and not status.final:  # pending for good: `follow` gave it up
        give_up_pending(status)
    if not output.exists() and (status is None or status.nodes):  # a job that never started wrote none
        console().print(f"[yellow]warning: the job's output {output} never appeared here[/yellow]: the run "
                        "directory must be on a file system the nodes share with this machine (--run-dir)")
    return report_job(job_id, status, folder, json_output)


def give_up_pending(status: JobStatus) -> None:
    """A job Slurm will never start as submitted (Reason=PartitionConfig, ...): cancelled, and
    said in one line with the reason, instead of followed forever."""
    from fstrain.core.slurm.job import cannot_start
    from fstrain.errors import InputError
    from fstrain.io.slurm import cancel, partition_size

    cancel(status.job_id)
    why = cannot_start(status, partition_size(status.partition) if status.partition else None)
    raise InputError(f"Slurm job {status.job_id} cannot start: {why}; fstrain cancelled it",
                     "ask for what the partition has (`sinfo -o '%P %D %c %m %l'` lists nodes, CPUs, memory and "
                     "time limit per partition), or choose another --partition", "sbatch")


def _say_state(status: JobStatus) -> None:
    if status.state == "PENDING":
        why = f" ({status.reason})" if status.reason else ""
        console().print(f"Slurm job {status.job_id}: pending{why}", style="dim", markup=False)
    elif status.state == "RUNNING":
        console().print(f"[dim]Slurm job {status.job_id}: running on {status.nodes}[/dim]")


def _ask_cancel(job_id: str) -> bool:
    if not sys.stdin.isatty():
        return False
    try:
        return typer.confirm(f"\ncancel Slurm job {job_id}?", default=False, err=True)
    except (KeyboardInterrupt, typer.Abort, EOFError):
        return False


def report_job(job_id: str, status: JobStatus | None, folder: Path, json_output: bool) -> int:
    """The job's end on stderr (`--json`: one document on stdout) and fstrain's exit code: the
    job's; 143 for a job cancelled before it started (it has none)."""
    from fstrain.core.slurm.job import TIME_LIMIT_MARKER, job_dir_name
    from fstrain.core.slurm.state import slurm_run_state
    from fstrain.io.runs import read_document

    job_dir = folder / job_dir_name(job_id)
    manifest = read_document(job_dir / "manifest.json", "manifest")
    reason = ""
    if status is None:
        code = int(manifest["exit_code"]) if manifest and manifest.get("exit_code") is not None else 1
        state = "UNKNOWN"
        console().print(f"[yellow]Slurm no longer knows job {job_id}[/yellow]; exit code from its manifest: {code}")
    else:
        run = slurm_run_state(status, manifest, time_limit_reached=(job_dir / TIME_LIMIT_MARKER).is_file())
        state, reason = status.state, run.reason
        code = status.shell_exit_code if run.exit_code is not None else CANCELLED_EXIT_CODE
        colour = "green" if state == "COMPLETED" and code == 0 else "red"
        words = f"{state} before it started" if run.exit_code is None else f"{state}, exit code {code}"
        why = f": {reason}" if reason and state not in reason else ""
        console().print(f"Slurm job {job_id}: {words}{why}", style=colour, markup=False)
    if json_output:
        document: dict[str, Any] = {"job_id": job_id, "state": state, "exit_code": code, "reason": reason,
                                    "run_dir": str(folder), "job_dir": str(job_dir), "manifest": manifest}
        summary = job_dir / "summary.json"
        if summary.is_file():
            document["training_summary"] = json.loads(summary.read_text())
        print_json(document)
    return code


def render_batch_script(out: Path, plan: Path | None, args: list[str], json_output: bool) -> int:
    """`fstrain render --slurm -o DIR [launch options] [-- PROGRAM]`: launch --slurm's script
    (and run directory) in DIR, not submitted."""
    from fstrain.cli.main import app

    # ``args``: launch's options, then the program (click drops the ``--``); launch stops reading
    # options at its first argument, so the program reaches it whole, whatever it looks like.
    argv = ["launch", "--slurm-render-only", "--run-dir", str(out), *(["--plan", str(plan)] if plan else []),
            *(["--json"] if json_output else []), *args]
    code = app(argv, prog_name="fstrain", standalone_mode=False)
    return int(code or 0)


# -- runs submitted with --slurm: fstrain runs/status/logs/stop ----------------------------------



def print_slurm_status(document: dict[str, Any]) -> None:
    import time

    from rich.table import Table

    from fstrain.core.monitor.gpuusage import usage_cell

    out = console()
    job = document["job"]
    state = document["state"] + (f", exit {document['exit_code']}" if document["exit_code"] is not None else "")
    out.print(f"run {document['run_id']}: {state}" + (f" ({document['reason']})" if document["reason"] else ""),
              markup=False)
    out.print(f"Slurm job {job.get('job_id')}: {job.get('state', 'unknown')}"
              + (f" on {job['nodes']}" if job.get("nodes") else "")
              + (f", ran {job['run_time_s']} s" if job.get("run_time_s") is not None else "")
              + (f"; output {document['output']}" if document.get("output") else ""), markup=False)
    table = Table(show_edge=False, pad_edge=False)
    for column in ("host", "rank", "alive", "last output", "step", "loss", "tokens/s", "gpus", "last line"):
        table.add_column(column)
    now = time.time()
    for node in document["nodes"]:
        gpus = usage_cell(node["gpus"], node["gpus_error"])
        if node["reachable"] is False:
            table.add_row(node["host"], "", "unreachable", "", "", "", "", "", "srun --overlap on the node failed")
        if not node["ranks"]:
            table.add_row(node["host"], "", "", "", "", "", "", gpus, "exit " + str(node["exit_code"])
                          if node["exit_code"] is not None else "(no rank output yet)")
        for rank in node["ranks"]:
            progress = rank["progress"] or {}
            alive = "" if rank["alive"] is None else "yes" if rank["alive"] else "no"
            table.add_row(node["host"], str(rank["rank"]), alive, f"{now - rank['last_output_at']:.0f} s ago",
                          str(progress.get("step") or ""), str(progress.get("loss") or ""),
                          f"{progress['tokens_per_s']:,.0f}" if progress.get("tokens_per_s") else "", gpus,
                          (rank["last_line"] or "")[-60:])
    out.print(table)
