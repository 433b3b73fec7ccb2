"""``fstrain runs``, ``status``, ``logs``, ``attach``, ``stop``, ``gc``: runs that outlive the
launcher (``fstrain launch --detach``), looked at from any later fstrain process."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import typer

from fstrain.cli import hostopts
from fstrain.cli.launch_output import describe_failure, describe_state, print_attempts
from fstrain.cli.output import console, print_json
from fstrain.cli.watch_output import duration

if TYPE_CHECKING:
    from fstrain.api.runs import Access, Outputs, Run
    from fstrain.core.runs.runstate import RunState

PYTHON = typer.Option("python3", "--python", help="Interpreter on the hosts.")
FOLLOW_POLL_S = 1.0
STATE_EVERY_S = 3.0  # --follow: how often the run's end is asked for


def register(app: typer.Typer) -> None:
    app.command("runs", help="Runs started from this machine, with their state.")(runs_command)
    app.command("status", help="A run's state per node and per rank.")(status_command)
    app.command("logs", help="A run's output, tagged like an attached run's.")(logs_command)
    app.command("attach", help="Follow a detached run (Ctrl-C detaches; the run goes on).")(attach_command)
    app.command("stop", help="Stop a run on every host (the same teardown as Ctrl-C).")(stop_command)
    app.command("gc", help="Remove finished runs' folders on the hosts.")(gc_command)


# -- helpers ------------------------------------------------------------------------------------


def _access(ssh_config: str | None, accept_new_hosts: bool, python: str) -> Access:
    from fstrain.api.runs import Access

    return Access(ssh_config, accept_new_hosts, python)


def _open(run: str, ssh_config: str | None, accept_new_hosts: bool, python: str) -> Run:
    from fstrain.api.runs import open_run

    return open_run(run, _access(ssh_config, accept_new_hosts, python))


# -- fstrain runs -------------------------------------------------------------------------------


def runs_command(
    all_runs: bool = typer.Option(False, "--all", help="Also finished runs (default: only live ones)."),
    state: list[str] = typer.Option([], "--state", help="Only runs in this state, ended or not "
                                    "(repeatable): pending, starting, running, stalled, succeeded, failed, "
                                    "stopped, lost."),
    hostfile: str | None = hostopts.HOSTFILE,
    hosts: str | None = hostopts.HOSTS,
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    python: str = PYTHON,
    json_output: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
) -> None:
    """Runs started from this machine: state, duration, nodes, exit code, step and ETA."""
    from rich.table import Table

    from fstrain.api.requests import HostRequest
    from fstrain.api.runs import run_rows

    on_hosts = HostRequest(hostfile=hostfile, hosts=hosts, ssh_config=ssh_config,
                           accept_new_hosts=accept_new_hosts) if hostfile or hosts else None
    rows = run_rows(all_runs, _access(ssh_config, accept_new_hosts, python), on_hosts, state)
    if json_output:
        print_json({"runs": rows})
        return
    table = Table(show_edge=False, pad_edge=False)
    for column in ("run", "state", "exit", "started", "duration", "step", "ETA", "nodes", "mode", "attempts",
                   "first failure"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["run_id"], row["state"], "" if row["exit_code"] is None else str(row["exit_code"]),
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(row["started"])) if row["started"] else "",
                      duration(row["seconds"] or 0), step_cell(row), "" if row["eta_s"] is None else
                      duration(row["eta_s"]), ",".join(row["nodes"]),
                      row.get("mode") or ("detached" if row["detached"] else "attached"),
                      str(len(row.get("attempts") or [])) if row.get("attempts") else "",
                      describe_failure(row["first_failure"]) if row.get("first_failure") else "")
    if rows:
        console().print(table)
    elif state:
        console().print(f"no runs {' or '.join(state)}")
    else:
        console().print("no runs" + ("" if all_runs else " running (--all lists finished ones)"))


def step_cell(row: dict[str, Any]) -> str:
    """``120/200``, ``120`` without a known final step, "" before any step."""
    if row.get("step") is None:
        return ""
    return f"{row['step']}/{row['steps']}" if row.get("steps") else str(row["step"])


# -- fstrain status -----------------------------------------------------------------------------


def status_command(
    run: str = typer.Argument(..., metavar="RUN", help="Run id (or a unique prefix), or its local run directory."),
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    python: str = PYTHON,
    json_output: bool = typer.Option(False, "--json", help="One JSON document on stdout (with --watch: one "
                                     "per change, a line each, until the run ends)."),
    watch: bool = typer.Option(False, "--watch", help="A live view, redrawn until the run ends (Ctrl-C stops "
                               "watching; the run goes on)."),
    interval: float = typer.Option(2.0, "--interval", min=0.5, help="--watch: seconds between refreshes."),
) -> None:
    """A run's state per node and per rank: alive, last output, last step/loss/tokens/s, GPUs."""
    from rich.table import Table

    from fstrain.core.monitor.gpuusage import usage_cell

    handle = _open(run, ssh_config, accept_new_hosts, python)
    if watch:
        _watch(handle, interval, json_output)
    record = handle.record
    document = handle.status()
    if json_output:
        print_json(document)
        return
    if handle.kind == "slurm":
        from fstrain.cli.slurm import print_slurm_status

        print_slurm_status(document)
        return
    out = console()
    state = f"{document['state']}" + (f", exit {document['exit_code']}" if document["exit_code"] is not None else "")
    out.print(f"run {record.run_id}: {state}" + (f" ({document['reason']})" if document["reason"] else ""),
              markup=False)
    if document.get("first_failure"):
        out.print(f"first failure: {describe_failure(document['first_failure'])}", markup=False)
    print_attempts(document.get("attempts") or [])
    keeper = document.get("keeper")
    if keeper and keeper["alive"]:
        out.print(f"keeper: pid {keeper['pid']} follows the run (its log: {keeper['log']})", markup=False)
    table = Table(show_edge=False, pad_edge=False)
    for column in ("host", "rank", "alive", "last output", "step", "loss", "tokens/s", "gpus"):
        table.add_column(column)
    now = time.time()
    for node in document["nodes"] if not record.detached else ():  # an attached run's ended nodes
        if node["exit_code"] is not None or node["error"]:
            out.print(f"  {node['host']} (node {node['node_rank']}): exit {node['exit_code']}"
                      + (f" ({node['error']})" if node["error"] else ""), markup=False)
    for node in document["nodes"]:
        gpus = usage_cell(node.get("gpus") or [], node.get("gpus_error"))
        if node.get("reachable") is False:
            table.add_row(node["host"], "", "unreachable", "", "", "", "", "")
        for rank in node["ranks"]:
            progress = rank["progress"] or {}
            ago = f"{now - rank['last_output_at']:.0f} s ago" if rank["last_output_at"] else ""
            alive = "" if rank["alive"] is None else "yes" if rank["alive"] else "no"
            table.add_row(node["host"], str(rank["rank"]), alive, ago,
                          str(progress.get("step") or ""), str(progress.get("loss") or ""),
                          f"{progress['tokens_per_s']:,.0f}" if progress.get("tokens_per_s") else "", gpus)
    out.print(table)


def _watch(handle: Run, interval_s: float, json_lines: bool = False) -> None:
    """The live view (``json_lines``: a JSON line per change on stdout) until the run ends
    (exit: the run's exit code, 1 for a run that ended without one unless it succeeded); Ctrl-C
    exits 0 and leaves the run alone."""
    from fstrain.cli.watch_output import watch_json, watch_run

    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        view = watch_json(handle, interval_s) if json_lines else watch_run(handle, interval_s)
    except KeyboardInterrupt:
        console().print(f"stopped watching run {handle.run_id}; it goes on (`fstrain status {handle.run_id} "
                        "--watch`)", markup=False)
        raise typer.Exit(0) from None
    finally:
        signal.signal(signal.SIGINT, previous)
    code = view.exit_code if view.exit_code is not None else 0 if view.state == "succeeded" else 1
    raise typer.Exit(code)


# -- fstrain logs / attach ----------------------------------------------------------------------


def _write(lines: Iterable[str]) -> bool:
    """Print the lines (each ends with a newline) as they come; whether there was any."""
    printed = False
    for text in lines:
        sys.stdout.write(text)
        printed = True
    sys.stdout.flush()
    return printed


def _say_unread(failed: dict[str, str], said: set[str]) -> None:
    """One line on stderr for each host whose output could not be read, once per outage."""
    for host, why in failed.items():
        if host not in said:
            sys.stderr.write(f"error: {host}: its output could not be read: {why}\n")
    said.intersection_update(failed)
    said.update(failed)


def _follow(handle: Run, outputs: Outputs, *, tail: int | None, follow: bool) -> RunState | None:
    """Print the run's lines, then, with ``follow``, new ones until the run has ended (its
    state then; None without ``follow``). Hosts that could not be read are named on stderr and
    left in ``outputs.failed``. The end is asked before each read, so the last read comes
    after it."""
    first, final, last_check = True, None, 0.0
    said: set[str] = set()
    try:
        while True:
            if follow and final is None and time.monotonic() - last_check > STATE_EVERY_S:
                last_check = time.monotonic()
                final = handle.finished()
            # Once the run has ended, every node is read itself: a view may lag its last lines.
            printed = _write(outputs.read(tail if first else None, views=final is None))
            _say_unread(outputs.failed, said)
            first = False
            if not follow:
                return None
            if final is not None and not printed:
                return final
            time.sleep(FOLLOW_POLL_S)
    finally:
        outputs.close()


def logs_command(
    run: str = typer.Argument(..., metavar="RUN", help="Run id (or a unique prefix), or its local run directory."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines until the run has ended."),
    host: list[str] = typer.Option([], "--host", help="Only this host's lines (repeatable)."),
    rank: int | None = typer.Option(None, "--rank", min=0, help="Only this global rank's lines."),
    since: str | None = typer.Option(None, "--since", metavar="DURATION", help="Only lines of the last DURATION."),
    tail: int | None = typer.Option(None, "--tail", min=0, help="Start with the last N lines only."),
    no_metrics: bool = typer.Option(False, "--no-metrics", help="Leave out the metric lines "
                                    "(FSTRAIN_METRICS {...}); --tail counts the lines shown."),
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    python: str = PYTHON,
) -> None:
    """A run's output from the nodes' files, tagged ``[host rN]`` like an attached run's."""
    from fstrain.core.launch.duration import parse_duration_s

    since_s = parse_duration_s(since, "--since") if since else None
    handle = _open(run, ssh_config, accept_new_hosts, python)
    outputs = handle.outputs(hosts=host, rank=rank, since_s=since_s,  # bad --host/--rank: one line, first
                             metrics=not no_metrics)
    _say_slurm_job(handle)
    _follow(handle, outputs, tail=tail, follow=follow)
    if outputs.failed:
        raise typer.Exit(1)


def _say_slurm_job(handle: Run) -> None:
    """Which job's lines these are: a batch script submitted more than once has several."""
    from fstrain.api.runs import SlurmRun

    if isinstance(handle.backend, SlurmRun):
        console().print(f"run {handle.run_id}: Slurm job {handle.backend.slurm.job_id}", style="dim",
                        markup=False)


def attach_command(
    run: str = typer.Argument(..., metavar="RUN", help="Run id (or a unique prefix), or its local run directory."),
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    python: str = PYTHON,
) -> None:
    """Follow a detached run's output as an attached launch would print it; at its end, its
    state and exit code. Ctrl-C detaches: the run goes on."""
    from fstrain.errors import InputError

    handle = _open(run, ssh_config, accept_new_hosts, python)
    if handle.kind == "attached":
        raise InputError(f"run {handle.run_id} was not started with --detach", "`fstrain logs` shows its lines",
                         "RUN")
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        final = _follow(handle, handle.outputs(), tail=20, follow=True)
    except KeyboardInterrupt:
        console().print(f"detached from run {handle.run_id}; it goes on (`fstrain attach {handle.run_id}`)")
        raise typer.Exit(0) from None
    finally:
        signal.signal(signal.SIGINT, previous)
    assert final is not None
    _print_end(handle, final)
    raise typer.Exit(final.exit_code or 0)


def _print_end(handle: Run, state: RunState) -> None:
    """How the run ended: its hang report, its first failure, the training summary, its state."""
    from fstrain.api.runs import SshRun, first_final
    from fstrain.core.runs.runstate import first_failure

    out = console()
    reason = f": {state.reason}" if state.reason else ""
    if not isinstance(handle.backend, SshRun):  # a Slurm job: its output file said the rest
        out.print(f"run {handle.run_id} {describe_state(state)}{reason}")
        return
    views = handle.backend.views()
    final = first_final(views) or {}
    if final.get("stall"):
        from fstrain.cli.launch_output import print_stall

        print_stall(final["stall"], [h.label() for h in handle.record.hosts])
    failure = first_failure(views)
    if failure:
        out.print(f"[red]first failure: {describe_failure(failure)}[/red]")
    summary = handle.backend.training_summary()
    if summary is not None:
        from fstrain.cli.launch_output import print_training_summary

        print_training_summary(summary)
    colour = "green" if state.state == "succeeded" else "red"
    out.print(f"[{colour}]run {handle.run_id} {describe_state(state)}[/{colour}]{reason}")


# -- fstrain stop -------------------------------------------------------------------------------


def stop_command(
    run: str = typer.Argument(..., metavar="RUN", help="Run id (or a unique prefix), or its local run directory."),
    grace: float | None = typer.Option(None, "--grace", min=0, help="Seconds between SIGTERM and SIGKILL "
                                       "(default: the run's --grace at launch)."),
    force: bool = typer.Option(False, "--force", help="SIGKILL at once, no grace period."),
    wait: float = typer.Option(60.0, "--wait", min=0, help="Seconds to wait for every node to end."),
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    python: str = PYTHON,
) -> None:
    """Stop a run on every host: SIGTERM, SIGKILL after the run's grace period."""
    handle = _open(run, ssh_config, accept_new_hosts, python)
    stopped = handle.stop(force=force, grace_s=grace, wait_s=wait)
    if stopped.already_ended:
        console().print(f"run {handle.run_id} has already ended: {describe_state(stopped.state)}")
    else:
        console().print(f"run {handle.run_id} {describe_state(stopped.state)}")


# -- fstrain gc ---------------------------------------------------------------------------------


def gc_command(
    older_than: str = typer.Option("7d", "--older-than", metavar="DURATION",
                                   help="Only runs that started at least this long ago."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would be removed."),
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    python: str = PYTHON,
) -> None:
    """Remove finished runs' folders on the hosts (~/.fstrain/runs/<id>) and their entries here;
    a run still running, or whose state cannot be told, is kept. A run whose folder could not be
    removed on some host keeps its entry (a later `gc` tries again); exit 1 then."""
    from fstrain.api.runs import collect
    from fstrain.core.launch.duration import parse_duration_s

    age_s = parse_duration_s(older_than, "--older-than")
    out = console()
    results = collect(age_s, dry_run=dry_run, access=_access(ssh_config, accept_new_hosts, python))
    for done in results:
        if done.outcome == "kept":
            out.print(f"{done.run_id}: kept ({done.why})", markup=False)
            continue
        if done.outcome == "would remove":
            out.print(f"{done.run_id}: would be removed ({done.state.state})", markup=False)
            continue
        if done.slurm_job is not None:
            out.print(f"{done.run_id}: Slurm job {done.slurm_job}: forgotten here; its run directory "
                      f"{done.run_dir} is kept",
                      markup=False)
        for folder in done.folders:
            verdict = f"kept: {folder.why}" if folder.verdict == "kept" else folder.verdict
            out.print(f"{done.run_id}: {folder.host}: {verdict}", markup=False)
        if done.left:
            hosts = ", ".join(f.host for f in done.left)
            out.print(f"{done.run_id}: its entry here is kept until its folder is gone from {hosts}: "
                      "run `fstrain gc` again once they answer", markup=False)
    if dry_run:
        out.print("dry run: nothing removed")
        return
    out.print(f"{sum(d.outcome == 'removed' for d in results)} run(s) removed")
    if any(d.outcome == "retry" for d in results):
        raise typer.Exit(1)
