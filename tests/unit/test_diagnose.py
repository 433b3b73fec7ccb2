"""Testing suspects before blame (fstrain/api/diagnose.py): the rule on values, and a quick
doctor of this machine beside a host that cannot be reached."""

from __future__ import annotations

import time

from fstrain.api import diagnose
from fstrain.core.doctor.result import CheckResult
from fstrain.core.hosts.hostfile import Host
from fstrain.errors import TransportError
from fstrain.io.connect import make_connector

TESTED = ("node1", "node2", "node3")


def test_a_failed_check_on_a_suspect_makes_it_guilty() -> None:
    rows = [CheckResult("ssh.connect", "ok", ("node1", "node2"), "connected"),
            CheckResult("ssh.connect", "fail", ("node3",), "cannot connect: Connection refused")]
    report = diagnose.weigh(rows, TESTED, ["node3"])
    assert report.guilty == ("node3",)
    assert report.why == {"node1": "nothing found", "node2": "nothing found",
                          "node3": "ssh.connect: cannot connect: Connection refused"}


def test_a_suspect_the_tests_clear_is_not_guilty() -> None:
    rows = [CheckResult("ssh.connect", "ok", TESTED, "connected"),
            CheckResult("bench.pairs", "warn", ("node2",), "node1-node2 slower, not confirmed")]
    assert diagnose.weigh(rows, TESTED, ["node2"]).guilty == ()


def test_a_failure_every_host_shares_is_nobodys() -> None:
    rows = [CheckResult("sys.shm", "fail", TESTED, "/dev/shm is 64 MiB")]
    report = diagnose.weigh(rows, TESTED, ["node2"])
    assert report.guilty == () and report.why["node2"].startswith("nothing found (sys.shm fails on every host")


def test_a_survivor_that_fails_is_said_not_blamed() -> None:
    rows = [CheckResult("gpu.ecc", "fail", ("node1",), "uncorrectable ECC errors"),
            CheckResult("bench.pairs", "fail", ("node2",), "node2's links run at a third of the others'")]
    report = diagnose.weigh(rows, TESTED, ["node2"])
    assert report.guilty == ("node2",) and report.also_failing == ("node1",)
    assert diagnose.describe(report)[1] == "node2: guilty: bench.pairs: node2's links run at a third of the others'"


def test_this_machine_passes_and_an_unreachable_host_is_guilty() -> None:
    local = make_connector(None)

    def connect(host: Host) -> object:
        if host.name == "gone":
            raise TransportError("cannot connect to 198.18.0.99:22: Connection refused")
        return local(host)

    start = time.monotonic()
    report = diagnose.test_suspects([Host("localhost"), Host("gone")], ["localhost", "gone"], connect,  # type: ignore[arg-type]
                                    checks=("ssh.connect", "sw.interpreter", "sys.shm"))
    assert report.guilty == ("gone",), report.why
    assert report.why["gone"].startswith("ssh.connect: cannot connect")
    assert report.why["localhost"] == "nothing found"
    assert time.monotonic() - start < 60


def test_the_suspects_are_tested_beside_a_few_others_not_the_whole_cluster() -> None:
    hosts = [Host(f"node{i}") for i in range(1, 1001)]
    assert [h.name for h in diagnose.tested_hosts(hosts, ["node500", "node7"])] == \
        ["node1", "node2", "node3", "node7", "node500"]
    assert [h.name for h in diagnose.tested_hosts(hosts[:2], ["node2"])] == ["node1", "node2"]
    reached: list[str] = []

    def connect(host: Host) -> object:
        reached.append(host.name)
        raise TransportError(f"cannot connect to {host.name}: Connection refused")

    report = diagnose.test_suspects(hosts, ["node500"], connect, checks=("ssh.connect",))  # type: ignore[arg-type]
    assert sorted(reached) == ["node1", "node2", "node3", "node500"]
    assert list(report.why) == ["node1", "node2", "node3", "node500"]
