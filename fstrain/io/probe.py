"""Run the node probe (:mod:`fstrain.io.probe_remote`) over a transport and read its JSON report.

The probe's source text goes to ``python3 -`` on stdin, so a node needs nothing but a Python 3.6+
interpreter: fstrain itself is not installed there. :func:`probe_local` runs the very same script
on this machine through :class:`~fstrain.io.transport.LocalTransport`.
"""

from __future__ import annotations

import json
import sys
from functools import cache
from pathlib import Path

from fstrain.core.hosts.hostfile import Host
from fstrain.core.parsers.probe_report import Report, validate_report
from fstrain.errors import FstrainError, ParseError, TransportError
from fstrain.io.fanout import Connector, HostPool
from fstrain.io.transport import LocalTransport, Transport

DEFAULT_TIMEOUT_S = 180.0  # the probe's own deadlines add up to about 2 minutes in the worst case
_HINT_PYTHON = "the probe needs Python >= 3.6 on the node: install python3 or pass the interpreter to use"


@cache
def probe_source() -> str:
    """The probe script's text, exactly as it is sent to the nodes."""
    return (Path(__file__).parent / "probe_remote.py").read_text(encoding="utf-8")


def _last_json_line(stdout: str) -> str | None:
    # Login scripts can print before the probe does; the report is the last line that is JSON.
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            return line
    return None


def probe_host(transport: Transport, python: str = "python3", timeout_s: float = DEFAULT_TIMEOUT_S) -> Report:
    """Probe one host; return the validated report (raises TransportError or ParseError)."""
    where = transport.host
    result = transport.run([python, "-"], stdin=probe_source().encode(), timeout_s=timeout_s)
    if result.error is not None:
        raise TransportError(f"probe did not finish: {result.error}",
                             hint="a hung tool or NFS mount on the node? raise the timeout or check the node",
                             where=where)
    stderr_tail = result.stderr.strip().splitlines()[-1:] if result.stderr.strip() else []
    if result.exit_code in (126, 127):
        raise TransportError(f"{python}: not found or not executable on the node", hint=_HINT_PYTHON, where=where)
    if result.exit_code != 0:
        detail = stderr_tail[0] if stderr_tail else "no error output"
        raise TransportError(f"probe exited with status {result.exit_code}: {detail}", hint=_HINT_PYTHON,
                             where=where)
    line = _last_json_line(result.stdout)
    if line is None:
        raise ParseError("the probe printed no JSON report", where=where,
                         hint="run `python3 - < fstrain/io/probe_remote.py` on the node to see what it prints")
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ParseError(f"the probe's report is not valid JSON: {exc.msg} at column {exc.colno}", where=where,
                         hint="the output was cut: check the node's disk and the connection") from None
    return validate_report(data, where=where)


def probe_local(python: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> Report:
    """Probe this machine with the same script the nodes run."""
    return probe_host(LocalTransport("localhost"), python=python or sys.executable, timeout_s=timeout_s)


def probe_hosts(pool: HostPool, python: str = "python3",
                timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Report | FstrainError]:
    """Probe every host of ``pool`` in parallel: a report, or the error that host gave."""

    def one(host: Host) -> Report | FstrainError:
        unreachable = pool.connect_error(host)
        if unreachable is not None:
            return TransportError(unreachable, where=host.label())
        try:
            return probe_host(pool.transport(host), python=python, timeout_s=timeout_s)
        except FstrainError as exc:
            return exc

    return pool.map(one)


def probe_inventory(hosts: list[Host], connect: Connector, *, python: str = "python3",
                    fanout: int = 64) -> tuple[list[Report], list[tuple[Host, FstrainError]]]:
    """Open a pool on ``hosts`` and probe them all: the reports, and each failed host with its error."""
    with HostPool(hosts, connect, fanout=fanout) as pool:
        results = probe_hosts(pool, python=python)
    reports = [r for r in results if not isinstance(r, FstrainError)]
    failures = [(h, r) for h, r in zip(hosts, results, strict=True) if isinstance(r, FstrainError)]
    return reports, failures
