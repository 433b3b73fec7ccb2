"""The one exception root of fstrain.

::

    FstrainError(message, hint)          anything fstrain expects and explains
    ├── InputError                       bad user input: files, flags, recipes (has where)
    │   ├── InventoryError               hostfiles, host lists, include/exclude filters
    │   └── ParseError                   captured tool output that cannot be read
    ├── TransportError                   a host cannot be reached, authenticated or talked to
    │   └── HostKeyError                 unknown or changed host key
    └── ConfigError                      inconsistent settings (plans, renders)

The CLI prints a known error as one line, ``error: <where>: <message> (hint: <hint>)``, and
exits non-zero; ``FSTRAIN_DEBUG=1`` shows the traceback as well.
"""

from __future__ import annotations


class FstrainError(Exception):
    """An error fstrain expects: it says what went wrong, where, and how to fix it."""

    exit_code = 2

    def __init__(self, message: str, hint: str = "", where: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.where = where

    def one_line(self) -> str:
        """The single line a user sees: ``where: message (hint: ...)``."""
        text = f"{self.where}: {self.message}" if self.where else self.message
        if self.hint:
            text += f" (hint: {self.hint})"
        return text

    def __str__(self) -> str:
        return self.one_line()


class InputError(FstrainError):
    """Bad user input: a file, a flag, a recipe."""


class InventoryError(InputError):
    """A hostfile, host list or include/exclude filter that cannot be used."""


class ParseError(InputError):
    """Captured tool output (nvidia-smi, ibstat, XML) that cannot be read."""


class ConfigError(FstrainError):
    """Settings that contradict each other."""


class TransportError(FstrainError):
    """A host that cannot be reached, authenticated or talked to."""


class HostKeyError(TransportError):
    """A host key that is unknown or does not match known_hosts."""
