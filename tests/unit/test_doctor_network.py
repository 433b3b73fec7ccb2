"""Network checks on collected facts: hostname, the reachability matrix, interfaces, MTU, the port."""

from __future__ import annotations

from typing import Any

from fstrain.core.doctor.catalogue import run_checks, select
from fstrain.core.doctor.facts import Connection, Rendezvous
from fstrain.core.doctor.network import matching_interfaces, sample_targets
from tests.unit.doctor_reports import facts, host, minimal_report

ADDRESSES = {"n1": "198.18.0.11", "n2": "198.18.0.12", "n3": "198.18.0.13"}


def iface(name: str, address: str, mtu: int = 1500, state: str = "up") -> dict[str, Any]:
    return {"name": name, "addresses": [f"{address}/24"], "mtu": mtu, "state": state}


def node(name: str, extra: list[dict[str, Any]] | None = None, env: dict[str, str] | None = None,
         resolves: list[str] | None = None, mtu: int = 1500) -> Any:
    interfaces = [{"name": "lo", "addresses": ["127.0.0.1/8"], "mtu": 65536, "state": "unknown"},
                  iface("eth0", ADDRESSES[name], mtu), *(extra or [])]
    report = minimal_report(name, interfaces=interfaces, env=env or {},
                            hostname_resolves_to=resolves if resolves is not None else [ADDRESSES[name]])
    return host(name, report)


def matrix(*hosts: Any, broken: set[tuple[str, str]] = frozenset()) -> tuple[Connection, ...]:  # type: ignore[assignment]
    """Every host connects to every usable address of every other; (source, address) in ``broken`` fail."""
    conns = []
    for src in hosts:
        for dst in hosts:
            if src.name == dst.name:
                continue
            for i in dst.interfaces:
                for a in i.addresses:
                    if i.usable and not a.startswith("127."):
                        ok = (src.name, a) not in broken
                        conns.append(Connection(src.name, dst.name, i.name, a, 29500, ok,
                                                None if ok else "Connection timed out", "eth0" if ok else None))
    return tuple(conns)


def run(check_id: str, *hosts: Any, **extra: Any) -> dict[tuple[str, ...], tuple[str, str, str]]:
    return {r.hosts: (r.verdict, r.message, r.fix) for r in run_checks(facts(*hosts, **extra), select(check_id))}


def test_hostname_resolving_to_loopback() -> None:
    n1, n2 = node("n1"), node("n2", resolves=["127.0.1.1"])
    result = run("net.hostname", n1, n2)
    assert result[("n1",)][0] == "ok"
    verdict, message, fix = result[("n2",)]
    assert verdict == "fail"
    assert message.startswith("its hostname n2 resolves to 127.0.1.1 (loopback)")
    assert fix.startswith("on n2, in /etc/hosts replace `127.0.1.1 n2` with `198.18.0.12 n2`")
    alone = run("net.hostname", node("n2", resolves=["127.0.1.1"]))
    assert alone[("n2",)][0] == "ok"  # one host: the rendezvous stays on this machine


def test_hostname_not_resolving_or_stale() -> None:
    result = run("net.hostname", node("n1", resolves=[]), node("n2", resolves=["10.9.9.9"]))
    assert result[("n1",)][:2] == ("warn", "its hostname n1 does not resolve")
    assert result[("n2",)][:2] == ("warn", "its hostname n2 resolves to 10.9.9.9, which is not one of its addresses")


def test_full_matrix_names_the_interface_to_use() -> None:
    hosts = [node(n) for n in ADDRESSES]
    result = run("net.reachability", *hosts, matrix=matrix(*hosts), matrix_targets=tuple(ADDRESSES))
    assert result == {("n1", "n2", "n3"): ("ok", "reachable from every host on eth0; use NCCL_SOCKET_IFNAME=eth0",
                                           "")}


def test_a_host_nobody_reaches_and_an_unreachable_side_interface() -> None:
    hosts = [node("n1"), node("n2", extra=[iface("virbr0", "192.168.122.1")]), node("n3")]
    broken = {("n1", "198.18.0.13"), ("n2", "198.18.0.13"), ("n1", "192.168.122.1"), ("n3", "192.168.122.1")}
    result = run("net.reachability", *hosts, matrix=matrix(*hosts, broken=broken), matrix_targets=tuple(ADDRESSES))
    assert result[("n3",)][0] == "fail"
    assert result[("n3",)][1] == ("no interface of it is reachable from every host: eth0 from n[1-2] "
                                  "(Connection timed out)")
    assert result[("n2",)] == ("warn", "reached on eth0; virbr0 not from n[1,3]",
                               "keep NCCL and Gloo on eth0: NCCL_SOCKET_IFNAME=eth0 GLOO_SOCKET_IFNAME=eth0 "
                               "(fstrain launch sets both per host)")
    sampled = run("net.reachability", *hosts, matrix=matrix(*hosts), matrix_targets=("n1",))
    assert "(sampled: 1 of 3 hosts listened)" in sampled[("n1",)][1]


def test_sample_targets() -> None:
    assert sample_targets(["a", "b"]) == ["a", "b"]
    many = [f"node{i:04d}" for i in range(1000)]
    picked = sample_targets(many)
    assert len(picked) == 8 and picked[0] == "node0000" and picked[1] == "node0125" and picked[-1] == "node0875"


def test_virtual_interfaces_nccl_might_pick() -> None:
    hosts = [node("n1", extra=[iface("veth12ab", "10.88.0.1"), iface("docker0", "172.17.0.1")]), node("n2")]
    result = run("net.virtual_interfaces", *hosts, matrix=matrix(*hosts, broken={("n2", "10.88.0.1")}),
                 matrix_targets=("n1", "n2"))
    assert result[("n1",)] == ("warn", "NCCL may pick veth12ab (a container/virtual interface the other hosts may "
                                       "not reach)", "export NCCL_SOCKET_IFNAME=eth0 GLOO_SOCKET_IFNAME=eth0 "
                                                     "(fstrain launch sets both per host)")
    assert result[("n2",)][0] == "ok"
    pinned = run("net.virtual_interfaces", node("n1", extra=[iface("veth12ab", "10.88.0.1")],
                                                env={"NCCL_SOCKET_IFNAME": "=eth0"}))
    assert pinned[("n1",)][0] == "ok"


def test_socket_ifname_semantics() -> None:
    names = ["lo", "eth0", "eth1", "ib0", "docker0"]
    assert matching_interfaces("eth", names) == ["eth0", "eth1"]
    assert matching_interfaces("=eth0", names) == ["eth0"]
    assert matching_interfaces("^docker,lo", names) == ["eth0", "eth1", "ib0"]
    assert matching_interfaces("^=eth1", names) == ["lo", "eth0", "ib0", "docker0"]
    assert matching_interfaces("ib0:1,eth1", names) == ["eth1", "ib0"]


def test_bogus_socket_ifname() -> None:
    hosts = [node("n1"), node("n2", env={"NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "ens5"})]
    rdv = Rendezvous("n1", None, 29500, (), None, (
        Connection("n1", "n1", "eth0", "198.18.0.11", 29500, True, via="eth0"),
        Connection("n2", "n1", "eth0", "198.18.0.11", 29500, True, via="eth0")))
    result = run("net.socket_ifname", *hosts, matrix=matrix(*hosts), matrix_targets=("n1", "n2"), rendezvous=rdv)
    verdict, message, fix = result[("n2",)]
    assert verdict == "fail"
    assert message == ("NCCL_SOCKET_IFNAME=ib0 matches no usable interface (it has lo, eth0): NCCL fails with 'no "
                       "socket interface found'; GLOO_SOCKET_IFNAME=ens5 names ens5, which it does not have up with "
                       "an address (it has lo, eth0): Gloo fails at start-up")
    assert fix == "set it to eth0 (the interface that reaches the master)"
    assert result[("n1",)][0] == "ok"


def test_socket_ifname_on_an_interface_others_cannot_reach() -> None:
    hosts = [node("n1", extra=[iface("eth1", "10.0.0.11")], env={"NCCL_SOCKET_IFNAME": "=eth1"}), node("n2")]
    result = run("net.socket_ifname", *hosts, matrix=matrix(*hosts, broken={("n2", "10.0.0.11")}),
                 matrix_targets=("n1", "n2"))
    assert result[("n1",)][:2] == ("fail", "NCCL_SOCKET_IFNAME==eth1 selects eth1, which the other hosts cannot reach")


def test_mtu_mismatch() -> None:
    hosts = [node("n1", mtu=9000), node("n2", mtu=9000), node("n3")]
    result = run("net.mtu", *hosts, matrix=matrix(*hosts), matrix_targets=tuple(ADDRESSES))
    assert result[("n3",)][:2] == ("warn", "eth0 has MTU 1500; most hosts use 9000")
    assert "ip link set eth0 mtu 9000" in result[("n3",)][2]
    assert run("net.mtu", node("n1"), node("n2"), matrix=(), matrix_targets=())[("n1", "n2")][0] == "ok"


def test_rendezvous_port_in_use_and_unreachable() -> None:
    hosts = [node("n1"), node("n2"), node("n3")]
    conns = (Connection("n1", "n1", "eth0", "198.18.0.11", 31000, True, via="lo"),
             Connection("n2", "n1", "eth0", "198.18.0.11", 31000, True, via="eth0"),
             Connection("n3", "n1", "eth0", "198.18.0.11", 31000, False, "Connection refused"))
    rdv = Rendezvous("n1", 29500, 31000, (29500,), None, conns)
    result = [(r.verdict, r.hosts, r.message, r.fix)
              for r in run_checks(facts(*hosts, rendezvous=rdv), select("net.rendezvous_port"))]
    assert result[0] == ("fail", ("n1",), "port 29500 is already in use on the master (another process listens on "
                         "it)", "pass a free port, e.g. --master-port 31000 (free now), or stop that process "
                         "(`ss -ltnp 'sport = :29500'` on n1)")
    assert result[1] == ("fail", ("n3",), "cannot reach the master n1 on port 31000: 198.18.0.11 (Connection "
                         "refused)", "open TCP port 31000 on n1 to the other hosts (fstrain launch draws ports from "
                         "20000-39999 unless --master-port is given)")
    assert result[2][:3] == ("ok", ("n1", "n2"), "reaches the master n1 at 198.18.0.11:31000")
    none_free = run("net.rendezvous_port", *hosts, rendezvous=Rendezvous("n1", None, None, (20001, 20002)))
    assert none_free[("n1",)][:2] == ("fail", "no free port among 20001, 20002 on the master")
