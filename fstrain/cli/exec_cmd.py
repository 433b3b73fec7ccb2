"""``fstrain exec``: run one command on every selected host, in parallel."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

from fstrain.cli import hostopts
from fstrain.cli.output import console, print_json, say

if TYPE_CHECKING:
    from fstrain.api.exec import HostResult


def register(app: typer.Typer) -> None:
    app.command(
        "exec",
        context_settings={"allow_interspersed_args": False},
        help="Run a command on every selected host: fstrain exec --hostfile F -- CMD ARGS...",
    )(exec_command)


def exec_command(
    command: list[str] = typer.Argument(..., help="The command and its arguments (after --).", show_default=False),
    hostfile: str | None = hostopts.HOSTFILE,
    hosts: str | None = hostopts.HOSTS,
    include: str | None = hostopts.INCLUDE,
    exclude: str | None = hostopts.EXCLUDE,
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    fanout: int = hostopts.FANOUT,
    timeout: float | None = typer.Option(None, "--timeout", min=0.1, help="Seconds each host's command may run."),
    json_output: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
) -> None:
    """Run a command on every selected host; exit 0 only if every host succeeded."""
    from fstrain.api.exec import ExecRequest, exec
    from fstrain.api.requests import HostRequest

    executed = exec(ExecRequest(tuple(command), HostRequest(hostfile=hostfile, hosts=hosts, include=include,
                                                            exclude=exclude, ssh_config=ssh_config,
                                                            accept_new_hosts=accept_new_hosts, fanout=fanout),
                                timeout_s=timeout), report=say)
    results = list(executed.results)
    if json_output:
        print_json({"hosts": [r.to_dict() for r in results]})
    else:
        if executed.source.startswith("localhost"):
            say(f"hosts: {executed.source}")
        print_grouped_output(results)
        print_summary(results)
    raise typer.Exit(0 if executed.ok else 1)


def print_grouped_output(results: list[HostResult]) -> None:
    """Each distinct output once, headed by the hosts that printed it (like ``dshbak -c``)."""
    from fstrain.core.hosts.hostfile import compress_hostlist

    groups: dict[tuple[str, str], list[str]] = {}
    for result in results:
        if result.stdout or result.stderr:
            groups.setdefault((result.stdout, result.stderr), []).append(result.host)
    for (stdout, stderr), names in groups.items():
        header = compress_hostlist(names)
        rule = "-" * max(16, len(header))
        sys.stdout.write(f"{rule}\n{header}\n{rule}\n")
        sys.stdout.write(stdout if stdout.endswith("\n") or not stdout else stdout + "\n")
        if stderr:
            sys.stdout.write("".join(f"[stderr] {line}\n" for line in stderr.splitlines()))
    sys.stdout.flush()


def print_summary(results: list[HostResult]) -> None:
    """A row per host on stderr: exit code, seconds, and why it failed."""
    from rich.table import Table

    table = Table(title=None, show_edge=False, pad_edge=False)
    table.add_column("host")
    table.add_column("exit", justify="right")
    table.add_column("seconds", justify="right")
    table.add_column("error")
    for result in results:
        code = "-" if result.exit_code is None else str(result.exit_code)
        style = "green" if result.ok else "red"
        table.add_row(result.host, f"[{style}]{code}[/{style}]", f"{result.seconds:.2f}", result.error or "")
    failed = sum(not r.ok for r in results)
    out = console()
    out.print(table)
    verdict = "[green]all ok[/green]" if not failed else f"[red]{failed} of {len(results)} failed[/red]"
    out.print(f"{len(results)} hosts: {verdict}")
