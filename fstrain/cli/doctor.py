"""``fstrain doctor``: preflight checks across every selected host, each with a verdict and a fix.

Exit status: 0 every check ok (or skipped), 1 warnings only, 2 any failure (bad input is 2 as
well, with one ``error:`` line), 130 on Ctrl-C.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import typer

from fstrain.cli import hostopts
from fstrain.cli.output import console, print_json, say

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fstrain.api.doctor import Diagnosed
    from fstrain.core.doctor import CheckResult, DoctorFacts

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
    from fstrain.api.doctor import DoctorRequest, doctor
    from fstrain.api.requests import HostRequest
    from fstrain.cli.progress_output import progress_reporter

    if list_checks:
        print_catalogue(json_output)
        return
    request = DoctorRequest(
        HostRequest(hostfile=hostfile, hosts=hosts, include=include, exclude=exclude, gpus_per_node=gpus_per_node,
                    ssh_config=ssh_config, accept_new_hosts=accept_new_hosts, fanout=fanout),
        only=only, skip=skip, plan=plan, checkpoint_dir=checkpoint_dir, master_port=master_port, python=python,
        workdir=workdir, orphans=orphans, kill_orphans=kill_orphans, write_test_mib=write_test_mib, bench=bench)
    try:
        with progress_reporter() as reporter:
            diagnosed = doctor(request, report=say, progress=reporter)
    except KeyboardInterrupt:
        console().print("[red]interrupted[/red]")
        raise typer.Exit(130) from None
    raise typer.Exit(report(diagnosed, json_output))


def report(diagnosed: Diagnosed, json_output: bool) -> int:
    facts, results, totals = diagnosed.facts, list(diagnosed.results), diagnosed.summary
    if json_output:
        document: dict[str, Any] = {"checks": [r.to_dict() for r in results],
                                    "summary": {**totals, "hosts": diagnosed.hosts}}
        if diagnosed.list_orphans:
            document["orphans"] = orphan_rows(facts)
        print_json(document)
    else:
        if diagnosed.source.startswith("localhost"):
            say(f"hosts: {diagnosed.source}")
        print_table(results, diagnosed.hosts)
        if diagnosed.list_orphans:
            print_orphans(facts)
        print_summary(totals)
    return diagnosed.exit_code


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


def print_summary(totals: Mapping[str, Any]) -> None:
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
