"""The fstrain command line: one typer app, one module per command.

Start-up is kept fast: command modules import the heavy parts (paramiko, the planner, the
renderers) inside the command functions, a command loads only its own module (``--help`` and
completion load them all), and nothing here imports torch or deepspeed.
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


# Each top-level command -> the module that adds it to `app` (keep sorted by command name).
COMMAND_MODULES = {
    "attach": "runs", "bench": "bench", "doctor": "doctor", "exec": "exec_cmd", "gc": "runs", "launch": "launch",
    "logs": "runs", "plan": "plan", "render": "render", "runs": "runs", "status": "runs", "stop": "runs",
    "topo": "topo",
}
_registered: set[str] = set()


def register(*modules: str) -> None:
    """Add the commands of these modules (every one when none is named) to `app`, each once.
    A command that runs another in-process (`render` runs `plan`) registers it first."""
    import importlib

    from fstrain.cli.metavars import name_placeholders

    for module in modules or sorted(set(COMMAND_MODULES.values())):
        if module not in _registered:
            importlib.import_module(f"fstrain.cli.{module}").register(app)
            _registered.add(module)
    name_placeholders(app)


def _modules_for(argv: list[str]) -> tuple[str, ...]:
    """Start-up: only the command's own module when argv names one (the others cost about
    75 ms of imports); every module for --help, shell completion, a mistyped command."""
    completing = any(name.startswith("_") and name.endswith("_COMPLETE") for name in os.environ) \
        or "_TYPER_COMPLETE_ARGS" in os.environ
    command = argv[1] if len(argv) > 1 else ""
    return (COMMAND_MODULES[command],) if command in COMMAND_MODULES and not completing else ()


register(*_modules_for(sys.argv))


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
