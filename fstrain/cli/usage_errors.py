"""Usage errors (a bad flag value, an unknown option) as one line, like every other bad input.

Click, which typer builds on, prints three lines for them (``Usage: ...``, ``Try ... -h``,
``Error: ...``). fstrain's rule is one line, ``error: where: what (hint: ...)``, exit code 2:
the top-level group (``fstrain.cli.main.CommandGroup``) catches click's ``UsageError`` and
prints :func:`one_line` instead; click's parsing and the exit code stay as they are.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def usage_error_class() -> type[Exception]:
    """Click's ``UsageError``. typer 0.22+ vendors click in a private module, so the class is
    reached through typer's public ``BadParameter``, one of its subclasses."""
    import typer

    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def is_plain_usage_error(error: BaseException) -> bool:
    """A click usage error shown the usual way. ``NoArgsIsHelpError`` (a bare ``fstrain`` or
    ``fstrain topo``) brings its own display, the help, and keeps it."""
    usage_error: Any = usage_error_class()
    return isinstance(error, usage_error) and type(error).show is usage_error.show


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
