"""The fstrain command line: one typer app, one module per command.

Start-up is kept fast: command modules import the heavy parts (paramiko, the planner, the
renderers) inside the command functions, and nothing here imports torch or deepspeed.
"""

from __future__ import annotations

import os
import sys

import typer

from fstrain import __version__
from fstrain.errors import FstrainError

app = typer.Typer(
    name="fstrain",
    help="Launch and orchestrate multi-node GPU training: doctor, plan, render, launch.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: importing rich for --help costs ~0.15 s of start-up
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version_callback(value: bool) -> None:
    if value:
        print(f"fstrain {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """fstrain: probe, plan, render and launch multi-node training jobs."""


def _register() -> None:
    # Each command module adds itself to `app`; keep this list sorted by command name.
    from fstrain.cli import bench, doctor, exec_cmd, launch, plan, render, runs, topo

    bench.register(app)
    doctor.register(app)
    exec_cmd.register(app)
    launch.register(app)
    plan.register(app)
    render.register(app)
    runs.register(app)  # runs, status, logs, attach, stop, gc
    topo.register(app)

    from fstrain.cli.metavars import name_placeholders

    name_placeholders(app)


_register()


def _one_line_usage_errors() -> None:
    from fstrain.cli.usage_errors import install

    install()


_one_line_usage_errors()


def main() -> None:
    """Console-script entry point: known errors are one line on stderr, never a traceback."""
    try:
        app()
    except FstrainError as exc:
        if os.environ.get("FSTRAIN_DEBUG"):
            raise
        sys.stderr.write(f"error: {exc.one_line()}\n")
        sys.exit(exc.exit_code)


if __name__ == "__main__":  # pragma: no cover - `python -m fstrain.cli.main`
    main()
