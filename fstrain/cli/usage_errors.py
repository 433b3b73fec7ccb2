"""Usage errors (a bad flag value, an unknown option) as one line, like every other bad input.

Click, which typer builds on, prints three lines for them (``Usage: ...``, ``Try ... -h``,
``Error: ...``). fstrain's rule is one line, ``error: where: what (hint: ...)``, exit code 2, so
the display of click's ``UsageError`` is replaced here, once, at start-up; the exception, its
exit code and click's parsing stay as they are. (``NoArgsIsHelpError``, the help shown for a
bare ``fstrain``, keeps its own display.)
"""

from __future__ import annotations

import sys
from typing import IO, Any


def _usage_error_class() -> Any:
    try:
        from typer._click.exceptions import UsageError  # typer vendors click since 0.22
    except ImportError:  # pragma: no cover - older typer on plain click
        from click.exceptions import UsageError  # type: ignore[assignment]
    return UsageError


def one_line(error: Any) -> str:
    """``where: what (hint: see `fstrain CMD --help`)`` for a click usage error."""
    ctx = getattr(error, "ctx", None)
    path = ctx.command_path if ctx is not None else "fstrain"
    command = "fstrain" + path.split("fstrain", 1)[1] if "fstrain" in path else path
    param = getattr(error, "param", None)
    opts = [o for o in getattr(param, "opts", ()) if o.startswith("--")] or list(getattr(param, "opts", ()))
    if param is not None and opts and type(error).__name__ == "BadParameter":
        text = f"{opts[0]}: {error.message}"
    else:
        text = error.format_message()
    return f"{text.rstrip('.')} (hint: see `{command} --help`)"


def install() -> None:
    """Show every click usage error as one ``error:`` line on stderr."""
    usage_error = _usage_error_class()

    def show(self: Any, file: IO[Any] | None = None) -> None:
        (file or sys.stderr).write(f"error: {one_line(self)}\n")

    usage_error.show = show
