"""``exec``: one command on every selected host, in parallel; every host's result, never
fail-fast (fstrain/io/fanout.py: one connection per host, at most ``fanout`` at once)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fstrain.api.hosts import quiet
from fstrain.api.requests import HostRequest
from fstrain.io.fanout import HostResult

__all__ = ["ExecRequest", "Executed", "HostResult", "exec"]


@dataclass(frozen=True)
class ExecRequest:
    """An argv (quoted once, by the transport) and the hosts to run it on."""

    command: tuple[str, ...]
    hosts: HostRequest = field(default_factory=HostRequest)
    timeout_s: float | None = None  # each host's command may run this long


@dataclass(frozen=True)
class Executed:
    source: str  # where the hosts came from
    results: tuple[HostResult, ...]  # one per host, in the order selected

    @property
    def ok(self) -> bool:
        """Every host ran the command and it exited 0."""
        return all(r.ok for r in self.results)


def exec(request: ExecRequest, *, report: Callable[[str], None] = quiet) -> Executed:
    """Run ``request.command`` on every selected host; ``report`` hears how they are reached."""
    from fstrain.api.hosts import reach, resolve_hosts
    from fstrain.errors import InputError
    from fstrain.io.fanout import HostPool

    if not request.command:
        raise InputError("no command to run", "give the command after --", "fstrain exec")
    hosts = request.hosts
    selection = resolve_hosts(hosts.hostfile, hosts.hosts, hosts.include, hosts.exclude, None)
    with HostPool(selection.hosts, reach(selection, hosts, report).connect, fanout=hosts.fanout) as pool:
        results = pool.run_all(list(request.command), timeout_s=request.timeout_s)
    return Executed(selection.source, tuple(results))
