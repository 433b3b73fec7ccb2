"""Slurm in the CLI: the launch options, which launcher runs the nodes, and `launch --slurm`.

- Inside an allocation (``--launcher srun``, or ``auto`` with ``SLURM_JOB_ID`` set and no
  ``--hosts``/``--hostfile``) every per-node command runs as an srun step (fstrain/io/slurm.py).
- ``launch --slurm`` renders a batch script whose one command is the same ``fstrain launch``,
  with ``--launcher srun``, submits it and follows the job's output file.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from fstrain.cli.output import console, print_json

if TYPE_CHECKING:
    from fstrain.api.requests import LaunchRequest, SlurmRequest
    from fstrain.core.slurm.job import JobStatus

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
    from fstrain.api.slurm import SubmitRequest, submit

    submitted = submit(SubmitRequest(request, slurm, tuple(inner_launch_args(ctx)), render_only=render_only))
    folder, path, job_id, output = submitted.run_dir, submitted.script, submitted.job_id, submitted.output
    if job_id is None or output is None:
        if json_output:
            print_json({"script": str(path), "run_dir": str(folder)})
        else:
            console().print(f"wrote {path}; submit it with: sbatch {path}", soft_wrap=True)
        return 0
    run_id = submitted.run_id
    console().print(f"submitted Slurm job {job_id} as run {run_id}: script {path}, output {output}")
    if request.run.detach:
        if json_output:
            print_json({"job_id": job_id, "run_id": run_id, "run_dir": str(folder), "script": str(path),
                        "output": str(output)})
        else:
            console().print(f"`fstrain status {run_id}`, `fstrain logs {run_id} --follow`, `fstrain stop {run_id}`")
            sys.stdout.write(job_id + "\n")
            sys.stdout.flush()
        return 0
    return follow_job(job_id, output, folder, json_output)


def follow_job(job_id: str, output: Path, folder: Path, json_output: bool) -> int:
    """Follow until the job ends; Ctrl-C asks whether to cancel it (on a terminal; elsewhere the
    job is left running). The exit code is the job's."""
    from fstrain.api.slurm import cancel_job, follow_job, give_up_pending

    out = sys.stderr if json_output else sys.stdout
    while True:
        try:
            status = follow_job(job_id, output, out, on_state=_say_state)
            break
        except KeyboardInterrupt:
            if not _ask_cancel(job_id):
                console().print(f"[yellow]job {job_id} keeps running[/yellow]: its output is {output}; "
                                f"stop it with `scancel {job_id}`")
                return 130
            cancel_job(job_id)
            console().print(f"cancelled job {job_id}; waiting for its nodes to stop")
    if status is not None and not status.final:  # pending for good: `follow` gave it up
        give_up_pending(status)
    if not output.exists() and (status is None or status.nodes):  # a job that never started wrote none
        console().print(f"[yellow]warning: the job's output {output} never appeared here[/yellow]: the run "
                        "directory must be on a file system the nodes share with this machine (--run-dir)")
    return report_job(job_id, status, folder, json_output)


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
    from fstrain.api.slurm import job_end

    end = job_end(job_id, status, folder)
    if end.state == "UNKNOWN":
        console().print(f"[yellow]Slurm no longer knows job {job_id}[/yellow]; exit code from its manifest: "
                        f"{end.exit_code}")
    else:
        colour = "green" if end.state == "COMPLETED" and end.exit_code == 0 else "red"
        words = f"{end.state} before it started" if not end.started else f"{end.state}, exit code {end.exit_code}"
        why = f": {end.reason}" if end.reason and end.state not in end.reason else ""
        console().print(f"Slurm job {job_id}: {words}{why}", style=colour, markup=False)
    if json_output:
        print_json(end.document())
    return end.exit_code


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
