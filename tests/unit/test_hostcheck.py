"""A launch's checks of its hosts (fstrain/io/hostcheck.py): the preflight and the rendezvous in
one session per host, with the stages' own errors; netcheck's package versions as
importlib.metadata reads them."""

from __future__ import annotations

import importlib.metadata
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from fstrain.core.hosts.hostfile import Host
from fstrain.errors import FstrainError
from fstrain.io.fanout import HostPool
from fstrain.io.hostcheck import check_hosts, reached
from fstrain.io.transport.base import CommandResult
from fstrain.io.transport.local import LocalRunning, LocalTransport

SESSIONS: Counter[str] = Counter()  # per host name, the sessions a CountingTransport started


class CountingTransport(LocalTransport):
    """This machine under another host's name, counting the sessions started on it."""

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout_s: float | None = None) -> CommandResult:
        SESSIONS[self.host] += 1
        return super().run(argv, stdin=stdin, timeout_s=timeout_s)

    def start(self, argv: Sequence[str]) -> LocalRunning:
        SESSIONS[self.host] += 1
        return super().start(argv)


def test_every_host_is_checked_and_reaches_the_first_in_one_session() -> None:
    """Two hosts (this machine twice, under two names): the listener on the first and one probe
    each, so three sessions where the stages apart took five; each host's facts as the
    preflight's (no reach entries left in them) and the rendezvous on an address of this
    machine's that both reached."""
    SESSIONS.clear()
    with HostPool([Host("a"), Host("b")], lambda host: CountingTransport(host.name)) as pool:
        facts, rendezvous = check_hosts(pool, sys.executable, "/tmp", "20261206-000000-abcdef", None,
                                        packages=("pytest",))
    assert SESSIONS == {"a": 2, "b": 1}
    assert [f.host.name for f in facts] == ["a", "b"]
    assert all("reach" not in f.info and f.info["importable"]["pytest"] for f in facts)
    addresses = {i["address"]: i["name"] for i in facts[0].info["interfaces"]}
    assert rendezvous.master_addr in addresses and not rendezvous.master_addr.startswith("127.")
    assert rendezvous.interfaces == (addresses[rendezvous.master_addr],) * 2
    assert 1024 < rendezvous.master_port < 65536


def test_a_missing_package_is_the_preflights_error_in_the_one_session() -> None:
    with HostPool([Host("a"), Host("b")], lambda host: CountingTransport(host.name)) as pool, \
            pytest.raises(FstrainError) as caught:
        check_hosts(pool, sys.executable, "/tmp", "20261206-000000-abcdef", None, packages=("no_such_package_xyz",))
    line = str(caught.value)
    assert line.startswith(f"launch: preflight failed on a: {sys.executable} (") and "\n" not in line, line
    assert line.count("cannot import no_such_package_xyz") == 2, line


def test_a_first_host_whose_interpreter_is_missing_gets_the_preflights_error(tmp_path: Path) -> None:
    """No listener can start on the first host: the stages run apart and the preflight names
    every host's problem as it always did."""
    missing = str(tmp_path / "no-python")
    with HostPool([Host("a"), Host("b")], lambda host: CountingTransport(host.name)) as pool, \
            pytest.raises(FstrainError) as caught:
        check_hosts(pool, missing, "/tmp", "20261206-000000-abcdef", None)
    line = str(caught.value)
    assert line.startswith(f"launch: preflight failed on a: interpreter {missing!r} not found; b: interpreter"), line


def test_the_rendezvous_is_the_first_address_every_host_reached() -> None:
    hosts = [Host("n1"), Host("n2"), Host("n3")]
    targets, candidates = ["10.0.0.1:29500", "10.1.0.1:29500"], ["10.0.0.1", "10.1.0.1"]

    def entry(ok: bool, interface: str = "") -> dict[str, object]:
        return {"ok": ok, "interface": interface} if ok else {"ok": False, "error": "No route to host"}

    reach = [{targets[0]: entry(True, "lo"), targets[1]: entry(True, "ib0")},
             {targets[0]: entry(False), targets[1]: entry(True, "ib0")},
             {targets[0]: entry(True, "eth0"), targets[1]: entry(True, "ib1")}]
    chosen = reached(hosts, targets, candidates, 29500, reach)
    assert (chosen.master_addr, chosen.master_port, chosen.interfaces) == ("10.1.0.1", 29500, ("ib0", "ib0", "ib1"))
    reach[2][targets[1]] = entry(False)
    with pytest.raises(FstrainError) as caught:
        reached(hosts, targets, candidates, 29500, reach)
    assert str(caught.value) == ("rendezvous: no address of n1 is reachable from every host: n2 cannot reach "
                                 "10.0.0.1:29500; n3 cannot reach 10.1.0.1:29500 (hint: check routes and "
                                 "firewalls, or run `fstrain doctor`)")


def test_netcheck_reads_every_installed_version_as_importlib_metadata_does() -> None:
    """Every distribution this interpreter has, and one it has not: the host's check reads
    versions from the metadata folders without importing importlib.metadata."""
    from fstrain.io.remote import netcheck

    names = {dist.metadata["Name"] for dist in importlib.metadata.distributions()}
    assert len(names) > 20
    differ = {name: (importlib.metadata.version(name), netcheck.package_version(name)) for name in names
              if importlib.metadata.version(name) != netcheck.package_version(name)}
    assert not differ
    assert netcheck.package_version("no-such-distribution-xyz") is None
