"""``fstrain report RUN``: one self-contained HTML file with the run's plots (``--json``: the
same numbers on stdout)."""

from __future__ import annotations

from pathlib import Path

import typer

from fstrain.cli import hostopts
from fstrain.cli.output import console, print_json


def register(app: typer.Typer) -> None:
    app.command("report", help="A run's report: one HTML file with plots, planned vs measured.")(report_command)


def report_command(
    run: str = typer.Argument(..., help="Run id (or a unique prefix), or its local run directory."),
    out: Path | None = typer.Option(None, "--out", help="The HTML file (default RUN_DIR/report.html)."),
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    python: str = typer.Option("python3", "--python", help="Interpreter on the hosts."),
    json_output: bool = typer.Option(False, "--json", help="The report's numbers as one JSON document on stdout "
                                     "(no HTML file unless --out is given)."),
) -> None:
    """Loss and tokens/s over steps, step time per rank with stragglers, memory per rank against
    the plan and the card, the run's events, the plan's prediction against what was measured,
    and a failed run's failing rank with its last lines (also printed here, on stderr)."""
    from fstrain.api.report import report_of, write_html
    from fstrain.api.runs import Access, open_run
    from fstrain.core.report.numbers import as_document

    handle = open_run(run, Access(ssh_config, accept_new_hosts, python))
    result = report_of(handle)
    target = out if out is not None else (None if json_output else handle.run_dir / "report.html")
    if target is not None:
        write_html(result, target)
        console().print(f"report of run {result.run_id} ({result.state.state}) written to {target}", markup=False,
                        highlight=False, soft_wrap=True)
    if result.failure is not None:  # what a failed run's reader looks for first, on the terminal too
        console().print("\n".join([result.failure.heading + (":" if result.failure.lines else ""),
                                   *(f"  {line}" for line in result.failure.lines)]),
                        markup=False, highlight=False, soft_wrap=True)
    for note in result.notes:
        console().print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    if json_output:
        print_json(as_document(result))
