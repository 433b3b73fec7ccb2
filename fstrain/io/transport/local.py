"""Local transport: runs commands with subprocess on this machine (for ``localhost``)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence

from fstrain.io.transport.base import CommandResult


class LocalTransport:
    """Runs argv lists directly (no shell), so arguments need no quoting at all."""

    def __init__(self, host: str = "localhost") -> None:
        self.host = host

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
    ) -> CommandResult:
        start = time.monotonic()
        try:
            proc = subprocess.run(
                list(argv),
                input=stdin if stdin is not None else b"",
                capture_output=True,
                timeout=timeout_s,
                check=False,
            )
        except FileNotFoundError:
            return CommandResult(127, "", f"{argv[0]}: command not found\n", time.monotonic() - start)
        except subprocess.TimeoutExpired:
            return CommandResult(None, "", "", time.monotonic() - start, f"timed out after {timeout_s:g} s")
        except OSError as exc:
            return CommandResult(126, "", f"{argv[0]}: {exc.strerror}\n", time.monotonic() - start)
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        return CommandResult(
            code,
            proc.stdout.decode("utf-8", "replace"),
            proc.stderr.decode("utf-8", "replace"),
            time.monotonic() - start,
        )

    def close(self) -> None:
        """Nothing to close: each command is its own process."""
