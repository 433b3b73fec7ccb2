"""``fstrain doctor``: preflight checks across every selected host, each with a verdict and a fix.

Exit status: 0 every check ok (or skipped), 1 warnings only, 2 any failure (bad input is 2 as
well, with one ``error:`` line), 130 on Ctrl-C.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

import typer

from fstrain.cli import hostopts
from fstrain.cli.output import console, print_json

if TYPE_CHECKING:
    from fstrain.core.doctor import Check, CheckResult, DoctorFacts
    from fstrain.io.doctor import DoctorOptions

VERDICT_STYLE = {"ok": "green", "skipped": "dim", "warn": "yellow", "fail": "bold red"}


def register(app: typer.Typer) -> None:
    app.command("doctor", help="Preflight checks on every selected host: verdicts and fixes. "
                "Exit 0 all ok, 1 warnings, 2 failures.")(doctor_command)


def doctor_command(
    hostfile: str | None = hostopts.HOSTFILE,
    hosts: str | None = hostopts.HOSTS,
    include: str | None = hostopts.INCLUDE,
    exclude: str | None = hostopts.EXCLUDE,
    gpus_per_node: int | None = hostopts.GPUS_PER_NODE,
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    fanout: int = hostopts.FANOUT,
    plan: str | None = typer.Option(None, "--plan", help="plan.yaml: check GPU memory and disk against it."),
    checkpoint_dir: str | None = typer.Option(None, "--checkpoint-dir", help="Check space, speed and sharing."),
    master_port: int | None = typer.Option(None, "--master-port", min=1, max=65535, help="Rendezvous port to test."),
    python: str = typer.Option("python3", "--python", help="The program's interpreter on the hosts."),
    workdir: str | None = typer.Option(None, "--workdir", help="Working directory that must exist on every host."),
    only: str | None = typer.Option(None, "--only", help="Run only these checks or families: gpu,net.mtu."),
    skip: str | None = typer.Option(None, "--skip", help="Leave out these checks or families."),
    orphans: bool = typer.Option(False, "--orphans", help="List processes left by earlier fstrain runs."),
    kill_orphans: bool = typer.Option(False, "--kill-orphans", help="End them (by the runs' recorded ids only)."),
    write_test_mib: int = typer.Option(256, "--write-test-mib", min=0, help="MiB written to time --checkpoint-dir."),
    list_checks: bool = typer.Option(False, "--list", help="List the checks and exit (connects to nothing)."),
    bench: bool = typer.Option(False, "--bench", help="After the checks, run quick collectives and pairs "
                               "benchmarks (fstrain bench) and turn outliers into verdicts."),
    json_output: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
) -> None:
    """Probe every selected host and run the check catalogue over what was found."""
    from fstrain.core.doctor import select

    if list_checks:
        print_catalogue(json_output)
        return
    if (orphans or kill_orphans) and not only:
        only = "proc.orphans"  # the orphan listing alone, fast
    elif (orphans or kill_orphans) and only and "proc" not in only.split(","):
        only = f"{only},proc.orphans"
    checks = select(only, skip)
    from fstrain.io.doctor import load_plan

    needs = load_plan(plan) if plan else None  # bad input fails before anything is contacted
    from fstrain.api.hosts import resolve_hosts

    selection = resolve_hosts(hostfile, hosts, include, exclude, gpus_per_node)
    if not json_output and selection.source.startswith("localhost"):
        console().print(f"[dim]hosts: {selection.source}[/dim]")
    try:
        from fstrain.cli.slurm import allocation_connector
        from fstrain.core.doctor import stages
        from fstrain.io.connect import make_connector
        from fstrain.io.doctor import DoctorOptions

        # Inside a Slurm allocation its nodes are reached through srun.
        through_srun = allocation_connector(selection.source)
        connect = through_srun or make_connector(ssh_config, accept_new_hosts=accept_new_hosts)
        options = DoctorOptions(stages=stages(checks), python=python, workdir=workdir, checkpoint_dir=checkpoint_dir,
                                master_port=master_port, plan=needs, kill_orphans=kill_orphans,
                                write_test_bytes=write_test_mib << 20,
                                reached_through=f"srun in Slurm job {os.environ.get('SLURM_JOB_ID')}"
                                if through_srun else None)
        facts = gather(selection.hosts, connect, options, fanout)
        extra = run_bench_checks(selection.hosts, connect, options, fanout) if bench else []
    except KeyboardInterrupt:
        console().print("[red]interrupted[/red]")
        raise typer.Exit(130) from None
    raise typer.Exit(report(facts, checks, orphans or kill_orphans, json_output, extra))


def run_bench_checks(hosts: list[Any], connect: Any, options: DoctorOptions, fanout: int) -> list[CheckResult]:
    """``--bench``: the quick collectives and pairs suites through the launch path, as verdicts."""
    from pathlib import Path

    from fstrain.api.bench import BenchRequest, run_bench
    from fstrain.api.job import interface_env, new_run_id
    from fstrain.core.bench.checks import bench_checks, bench_failed
    from fstrain.core.doctor.result import CheckResult
    from fstrain.errors import FstrainError

    run_id = new_run_id()
    request = BenchRequest(hosts=hosts, suites=["collectives", "pairs"], run_id=run_id,
                           run_dir=Path("runs") / run_id, python=options.python, workdir=options.workdir,
                           master_port=options.master_port, extra=["--quick", "--seconds", "0.2"])
    console().print(f"[dim]bench {run_id}: quick collectives and pairs; logs in {request.run_dir}/logs[/dim]")
    names = [h.name for h in hosts]
    try:
        run = run_bench(request, connect, fanout=fanout, node_env=lambda ifname: interface_env(ifname, {}))
    except FstrainError as error:  # preflight or rendezvous: a verdict, beside the other checks
        return [CheckResult("bench.run", "fail", tuple(names), f"the benchmark could not start: {error.message}",
                            error.hint or "fix the hosts above and rerun")]
    if run.document is None:
        return bench_failed(run.outcome.exit_code, f"{request.run_dir}/logs", names)
    return bench_checks(run.document, names)


def gather(hosts: list[Any], connect: Any, options: DoctorOptions, fanout: int) -> DoctorFacts:
    """Every host's facts, with the hosts answered so far on stderr (live on a terminal)."""
    from fstrain.cli.progress_output import progress_reporter
    from fstrain.core.progress import Event
    from fstrain.io.doctor import collect

    total = len(hosts)
    answered: set[str] = set()
    unreachable: set[str] = set()
    with progress_reporter() as reporter:

        def update(host: str, what: str) -> None:  # collect calls it under its lock
            if what in ("done", "unreachable"):
                answered.add(host)
            if what == "unreachable":
                unreachable.add(host)
            reporter.event(Event("hosts", len(answered), total, f"{host}: {what}"))

        reporter.event(Event("hosts", 0, total))
        facts = collect(hosts, connect, options, fanout=fanout, progress=update)
        reporter.event(Event("hosts", total - len(unreachable), total, ended=True, failed=bool(unreachable),
                             text=f"{len(unreachable)} cannot be reached" if unreachable else ""))
    return facts


def report(facts: DoctorFacts, checks: tuple[Check, ...], list_orphans: bool, json_output: bool,
           extra: list[CheckResult] | None = None) -> int:
    from fstrain.core.doctor import exit_code, run_checks, summary

    results = [*run_checks(facts, checks), *(extra or [])]
    totals = summary(results)
    if json_output:
        document: dict[str, Any] = {"checks": [r.to_dict() for r in results],
                                    "summary": {**totals, "hosts": [h.name for h in facts.hosts]}}
        if list_orphans:
            document["orphans"] = orphan_rows(facts)
        print_json(document)
    else:
        print_table(results, [h.name for h in facts.hosts])
        if list_orphans:
            print_orphans(facts)
        print_summary(totals)
    return exit_code(results)


def hosts_cell(hosts: tuple[str, ...], everyone: list[str]) -> str:
    from fstrain.core.hosts.hostfile import compress_hostlist

    if not hosts:
        return "-"
    if len(everyone) > 1 and set(hosts) == set(everyone):
        return f"all {len(everyone)}"
    return compress_hostlist(hosts)


def table_rows(results: list[CheckResult]) -> list[tuple[str, str, tuple[str, ...], str, str]]:
    """(check, verdict, hosts, message, fix) per row: a check's id on its first row only, and
    neighbouring checks skipped for the same reason on the same hosts merged into one row."""
    rows: list[tuple[str, str, tuple[str, ...], str, str]] = []
    previous = None
    for result in results:
        label = result.id if result.id != previous else ""
        last = rows[-1] if rows else None
        if (last is not None and result.verdict == "skipped" and label and last[1] == "skipped"
                and (last[2], last[3]) == (result.hosts, result.message)):
            rows[-1] = (f"{last[0]}, {result.id}", *last[1:])
        else:
            rows.append((label, result.verdict, result.hosts, result.message, result.fix))
        previous = result.id
    return rows


def print_table(results: list[CheckResult], everyone: list[str]) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(show_edge=False, pad_edge=False, expand=False)
    table.add_column("check", overflow="fold", max_width=24)
    table.add_column("verdict", no_wrap=True)
    table.add_column("hosts", overflow="fold", max_width=24)
    table.add_column("what", overflow="fold")
    table.add_column("fix", overflow="fold")
    for check, verdict, hosts, message, fix in table_rows(results):
        style = VERDICT_STYLE[verdict]
        table.add_row(check, f"[{style}]{verdict}[/{style}]", hosts_cell(hosts, everyone), escape(message),
                      escape(fix))
    console().print(table)


def print_summary(totals: dict[str, Any]) -> None:
    style = VERDICT_STYLE[str(totals["verdict"])]
    console().print(f"{totals['checks']} checks: {totals['ok']} ok, {totals['skipped']} skipped, "
                    f"{totals['warn']} warn, {totals['fail']} fail; verdict [{style}]{totals['verdict']}[/{style}] "
                    f"(exit {totals['exit_code']})")


def orphan_rows(facts: DoctorFacts) -> list[dict[str, Any]]:
    rows = []
    for host in facts.hosts:
        for run in host.runs or ():
            if run.state != "stale" or run.removed:
                rows.append({"host": host.name, "run_id": run.run_id, "node_rank": run.node_rank, "state": run.state,
                             "watchdog_pid": run.watchdog_pid, "job_pid": run.job_pid, "pids": list(run.pids),
                             "started": run.started, "argv": list(run.argv), "killed": list(run.killed),
                             "survivors": list(run.survivors), "record": run.record, "removed": run.removed,
                             "note": run.note})
    return rows


def print_orphans(facts: DoctorFacts) -> None:
    import shlex
    import time

    from rich.markup import escape
    from rich.table import Table

    rows = orphan_rows(facts)
    if not rows:
        console().print("no run records left by earlier fstrain runs")
        return
    table = Table(title="run records", show_edge=False, pad_edge=False)
    for column in ("host", "run", "node", "state", "pids", "started", "command", "ended"):
        table.add_column(column, overflow="fold")
    for row in rows:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(row["started"])) if row["started"] else "?"
        table.add_row(row["host"], row["run_id"], str(row["node_rank"]), row["state"],
                      ",".join(map(str, row["pids"])) or "-", started, escape(shlex.join(row["argv"])),
                      ",".join(map(str, row["killed"])) or "-")
    console().print(table)


def print_catalogue(json_output: bool) -> None:
    from fstrain.core.doctor import CHECKS

    if json_output:
        print_json({"checks": [{"id": c.id, "title": c.title, "needs": list(c.needs)} for c in CHECKS]})
        return
    width = max(len(c.id) for c in CHECKS)
    for check in CHECKS:
        sys.stdout.write(f"{check.id:<{width}}  {check.title}\n")
