"""Local transport: runs commands with subprocess on this machine (for ``localhost``)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator, Sequence

from fstrain.errors import TransportError
from fstrain.io.transport.base import CommandResult, merged_lines


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

    def start(self, argv: Sequence[str]) -> LocalRunning:
        """Start ``argv`` with stdin kept open; see :class:`fstrain.io.transport.base.RunningCommand`."""
        return _start_local(self.host, argv)

    def close(self) -> None:
        """Nothing to close: each command is its own process."""


class LocalRunning:
    """A local process started by :meth:`LocalTransport.start`."""

    def __init__(self, host: str, proc: subprocess.Popen[bytes]) -> None:
        self.host = host
        self._proc = proc

    def write(self, data: bytes) -> bool:
        stdin = self._proc.stdin
        if stdin is None or stdin.closed:
            return False
        try:
            stdin.write(data)
            stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            return False
        return True

    def close_stdin(self) -> None:
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()

    def lines(self) -> Iterator[tuple[str, str]]:
        assert self._proc.stdout is not None and self._proc.stderr is not None
        return merged_lines({"stdout": self._proc.stdout.readline, "stderr": self._proc.stderr.readline})

    def wait(self) -> tuple[int | None, str | None]:
        code = self._proc.wait()
        return (code if code >= 0 else 128 - code), None

    def close(self) -> None:
        self.close_stdin()
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def _start_local(host: str, argv: Sequence[str]) -> LocalRunning:
    """A TransportError where ``argv[0]`` cannot run (as a remote shell's exit 127 or 126)."""
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        raise TransportError(f"cannot start {argv[0]}: {exc.strerror or exc}",
                             "check the interpreter's path (--python)", host) from exc
    return LocalRunning(host, proc)
