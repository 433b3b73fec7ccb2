"""The fstrain command line: one typer app, one module per command.

Start-up is kept fast: command modules import the heavy parts (paramiko, the planner, the
renderers) inside the command functions, and nothing here imports torch or deepspeed. The
top-level group is lazy (:class:`CommandGroup`): click asks it for a command by name, and only
then is that command's module imported, so ``fstrain plan`` loads ``fstrain.cli.plan`` alone
(``--help``, shell completion and a mistyped command load them all). Nothing is decided from
``sys.argv`` at import: an importing process gets the same app whatever its own arguments.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import typer
from typer.core import TyperGroup
from typer.main import get_command

from fstrain import __version__
from fstrain.errors import FstrainError

# Each top-level command -> the module that defines it (keep sorted by command name).
COMMAND_MODULES = {
    "attach": "runs", "bench": "bench", "doctor": "doctor", "exec": "exec_cmd", "gc": "runs", "launch": "launch",
    "logs": "runs", "plan": "plan", "render": "render", "report": "report", "runs": "runs", "status": "runs",
    "stop": "runs", "topo": "topo",
}


def _no_options() -> None:
    """The group callback of one module's commands (it has no options of its own)."""


@functools.cache
def module_commands(module: str) -> dict[str, Any]:
    """The click commands that ``fstrain.cli.MODULE``'s ``register`` defines, by name, in the order
    it defines them; built once per process."""
    import importlib

    from fstrain.cli.metavars import name_placeholders

    commands = typer.Typer(rich_markup_mode=None, add_completion=False, pretty_exceptions_enable=False)
    commands.callback()(_no_options)  # always a group: typer turns a lone command into the whole app
    importlib.import_module(f"fstrain.cli.{module}").register(commands)
    name_placeholders(commands)
    group = get_command(commands)
    assert isinstance(group, TyperGroup)
    return dict(group.commands)


class CommandGroup(TyperGroup):
    """The top-level ``fstrain`` group: commands are loaded when click asks for them by name, and
    click's usage errors (a bad flag value, an unknown option or command) are one line."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [name for module in sorted(set(COMMAND_MODULES.values())) for name in module_commands(module)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        module = COMMAND_MODULES.get(cmd_name)
        if module is None:  # a mistyped command: every name, for click's "Did you mean ...?"
            for name in self.list_commands(ctx):
                self.commands.setdefault(name, module_commands(COMMAND_MODULES[name])[name])
            return None
        command = self.commands.setdefault(cmd_name, module_commands(module)[cmd_name])
        return command

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:
        self.standalone_mode = standalone_mode  # an in-process `app([...], standalone_mode=False)` gets the error
        return super().main(args, prog_name, complete_var, standalone_mode, windows_expand_args, **extra)

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with self._usage_errors_as_one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        with self._usage_errors_as_one_line():
            return super().invoke(ctx)

    @contextlib.contextmanager
    def _usage_errors_as_one_line(self) -> Iterator[None]:
        """Click prints a usage error as three lines (``Usage: ...``, ``Try ... -h``, ``Error: ...``);
        fstrain's rule is one line, ``error: where: what (hint: ...)``, exit code 2. An error that
        brings its own display (the help shown for a bare ``fstrain``) keeps it."""
        from fstrain.cli.usage_errors import is_plain_usage_error, one_line

        try:
            yield
        except Exception as error:
            if not getattr(self, "standalone_mode", True) or not is_plain_usage_error(error):
                raise
            sys.stderr.write(f"error: {one_line(error)}\n")
            raise typer.Exit(2) from None


app = typer.Typer(
    name="fstrain",
    cls=CommandGroup,
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
