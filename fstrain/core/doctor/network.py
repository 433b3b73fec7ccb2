"""Name resolution and interfaces: loopback hostnames, the reachability matrix, virtual interfaces
NCCL or Gloo might pick, ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME``, MTU, the rendezvous port."""

from __future__ import annotations

from collections.abc import Sequence

from fstrain.core.doctor.facts import Connection, DoctorFacts, HostFacts, Interface, merged_env
from fstrain.core.doctor.result import CheckResult, Finding, group, skipped
from fstrain.core.hosts.hostfile import compress_hostlist
from fstrain.core.job.spec import PORT_RANGE

# Interfaces that belong to containers, VMs, overlays or VPNs: NCCL's default selection skips only
# lo and docker*, and prefers ib*; anything else (veth, virbr0, cni0, tailscale0...) can win.
VIRTUAL_PREFIXES = ("veth", "virbr", "br-", "cni", "flannel", "cali", "vxlan", "tun", "tap", "lxc", "lxd", "kube",
                    "weave", "tailscale", "wg", "zt", "podman", "cilium", "docker")
MATRIX_FULL_MAX_HOSTS = 16  # above this, the matrix is sampled (every host -> a few targets)
MATRIX_SAMPLE_TARGETS = 8


def is_loopback(address: str) -> bool:
    return address.startswith("127.") or address == "::1"


def interfaces(host: HostFacts) -> tuple[Interface, ...]:
    return host.interfaces or ()


def sample_targets(hosts: Sequence[str], limit: int = MATRIX_SAMPLE_TARGETS,
                   full_max: int = MATRIX_FULL_MAX_HOSTS) -> list[str]:
    """The hosts that get a listener: all of them for a small cluster; for a large one the first
    (the master) and ``limit - 1`` more spread evenly, so every rack-sized block gets one."""
    if len(hosts) <= full_max:
        return list(hosts)
    step = len(hosts) / limit
    picked = {int(i * step) for i in range(limit)} | {0}
    return [hosts[i] for i in sorted(picked)]


def reachable_interfaces(facts: DoctorFacts, target: str) -> tuple[list[str], dict[str, list[Connection]]]:
    """The target's interfaces every other host reached, and the failed connections per interface."""
    if facts.matrix is None:
        return [], {}
    tried: dict[str, list[Connection]] = {}
    for conn in facts.matrix:
        if conn.target == target and not conn.self_address:
            tried.setdefault(conn.interface, []).append(conn)
    good = [name for name, conns in tried.items() if conns and all(c.ok for c in conns)]
    failed = {name: [c for c in conns if not c.ok] for name, conns in tried.items() if any(not c.ok for c in conns)}
    return good, failed


def data_interface(facts: DoctorFacts, host: HostFacts) -> str | None:
    """The interface this host uses for training traffic: the one that reached the master's
    listener (what ``fstrain launch`` puts in NCCL/GLOO_SOCKET_IFNAME), else one every host reaches."""
    if facts.rendezvous is not None:
        for conn in facts.rendezvous.connections:
            if conn.source == host.name and conn.ok and conn.via:
                return conn.via
    good, _ = reachable_interfaces(facts, host.name)
    if good:
        return good[0]
    usable = [i.name for i in interfaces(host) if i.usable and not i.name.startswith(VIRTUAL_PREFIXES)]
    return usable[0] if usable else None


def _address_on(host: HostFacts, name: str | None) -> str | None:
    for iface in interfaces(host):
        if iface.name == name:
            v4 = [a for a in iface.addresses if not is_loopback(a)]
            if v4:
                return v4[0]
    return None


# --- hostname ----------------------------------------------------------------------------------


def check_hostname(facts: DoctorFacts) -> list[CheckResult]:
    hosts = facts.probed
    if not hosts:
        return skipped("net.hostname", "no host was probed")
    return group("net.hostname", [_hostname_finding(facts, h, len(facts.hosts) > 1) for h in hosts])


def _hostname_finding(facts: DoctorFacts, host: HostFacts, multi: bool) -> Finding:
    report = host.report or {}
    name = str(report.get("hostname") or host.name)
    resolved = [str(a) for a in report.get("hostname_resolves_to") or []]
    own = {a for i in interfaces(host) for a in i.addresses}
    address = _address_on(host, data_interface(facts, host)) or next(
        (a for i in interfaces(host) if i.usable for a in i.addresses if not is_loopback(a)), None)
    line = f"`{address} {name}`" if address else f"`<its address> {name}`"
    if not resolved:
        return Finding(host.name, "warn", f"its hostname {name} does not resolve",
                       f"add {line} to /etc/hosts on it (Gloo and torch.distributed resolve the hostname)")
    loop = [a for a in resolved if is_loopback(a)]
    if loop and multi:
        return Finding(host.name, "fail",
                       f"its hostname {name} resolves to {', '.join(loop)} (loopback): Gloo binds and advertises "
                       "that address, which no other host can reach",
                       f"on {host.name}, in /etc/hosts replace `{loop[0]} {name}` with {line}; "
                       f"or export GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME")
    stray = [a for a in resolved if not is_loopback(a) and ":" not in a and own and a not in own]
    if stray:
        return Finding(host.name, "warn", f"its hostname {name} resolves to {', '.join(stray)}, "
                       "which is not one of its addresses", f"fix its DNS or /etc/hosts entry: {line}")
    return Finding(host.name, "ok", "its hostname resolves to one of its own addresses")


# --- reachability matrix ---------------------------------------------------------------------


def check_reachability(facts: DoctorFacts) -> list[CheckResult]:
    if facts.matrix is None:
        return skipped("net.reachability", "the interface matrix was not run")
    if len(facts.reached) < 2:
        return skipped("net.reachability", "one host: nothing to connect to", [h.name for h in facts.reached])
    note = "" if len(facts.matrix_targets) >= len(facts.reached) else \
        f" (sampled: {len(facts.matrix_targets)} of {len(facts.reached)} hosts listened)"
    findings = []
    for name in facts.matrix_targets:
        host = facts.host(name)
        good, failed = reachable_interfaces(facts, name)
        if not good and not failed:
            findings.append(Finding(name, "skipped", "it had no listener (it could not run the network check)"))
            continue
        if not good:
            detail = "; ".join(f"{iface} from {_sources(conns)} ({conns[0].error or 'no connection'})"
                               for iface, conns in failed.items())
            findings.append(Finding(name, "fail", f"no interface of it is reachable from every host: {detail}",
                                    "check routes and firewalls between the hosts (`ip route`, `iptables -S`); "
                                    "NCCL and Gloo need TCP between every pair of hosts"))
            continue
        pickable = [iface for iface in failed if _nccl_may_pick(host, iface)]
        if pickable:
            detail = "; ".join(f"{iface} not from {_sources(failed[iface])}" for iface in pickable)
            findings.append(Finding(name, "warn", f"reached on {', '.join(good)}; {detail}",
                                    f"keep NCCL and Gloo on {good[0]}: NCCL_SOCKET_IFNAME={good[0]} "
                                    f"GLOO_SOCKET_IFNAME={good[0]} (fstrain launch sets both per host)"))
            continue
        findings.append(Finding(name, "ok", f"reachable from every host on {', '.join(good)}{note}; "
                                f"use NCCL_SOCKET_IFNAME={good[0]}"))
    return group("net.reachability", findings)


def _sources(conns: Sequence[Connection]) -> str:
    return compress_hostlist(dict.fromkeys(c.source for c in conns))


def _nccl_may_pick(host: HostFacts, iface: str) -> bool:
    """Would NCCL's default selection consider ``iface``? (not lo/docker*, unless pinned elsewhere)."""
    if iface == "lo" or iface.startswith("docker"):
        return False
    pinned = merged_env(host).get("NCCL_SOCKET_IFNAME")
    return pinned is None or iface in matching_interfaces(pinned[0], [iface])


# --- virtual interfaces ----------------------------------------------------------------------


def check_virtual_interfaces(facts: DoctorFacts) -> list[CheckResult]:
    hosts = [h for h in facts.probed if h.interfaces is not None]
    if not hosts:
        return skipped("net.virtual_interfaces", "no host was probed")
    return group("net.virtual_interfaces", [_virtual_finding(facts, h) for h in hosts])


def _virtual_finding(facts: DoctorFacts, host: HostFacts) -> Finding:
    env = merged_env(host)
    nccl, gloo = env.get("NCCL_SOCKET_IFNAME"), env.get("GLOO_SOCKET_IFNAME")
    good, _ = reachable_interfaces(facts, host.name)
    usable = [i for i in interfaces(host) if i.usable]
    virtual = [i.name for i in usable if i.name.startswith(VIRTUAL_PREFIXES) and i.name not in good]
    others = [i.name for i in usable if not i.name.startswith(VIRTUAL_PREFIXES)]
    # NCCL uses docker* only when nothing else exists; the other virtual names compete normally.
    risky = [n for n in virtual if not n.startswith("docker") or not others]
    if nccl is not None and gloo is not None:
        return Finding(host.name, "ok", "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME pin the interfaces")
    if nccl is not None:
        risky = [n for n in risky if n in matching_interfaces(nccl[0], [n])]
    if not risky:
        return Finding(host.name, "ok", "no container or virtual interface NCCL could pick by mistake")
    use = (good or others or ["<the interface that reaches the other hosts>"])[0]
    return Finding(host.name, "warn", f"NCCL may pick {', '.join(risky)} (a container/virtual interface "
                   "the other hosts may not reach)",
                   f"export NCCL_SOCKET_IFNAME={use} GLOO_SOCKET_IFNAME={use} (fstrain launch sets both per host)")


# --- NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME -------------------------------------------------


def matching_interfaces(spec: str, names: Sequence[str]) -> list[str]:
    """The interfaces ``NCCL_SOCKET_IFNAME=spec`` selects: comma-separated prefixes, ``=`` for exact
    names, a leading ``^`` to exclude (NCCL's ``parseStringList``/``matchIfList``; ``:port`` ignored)."""
    exclude = spec.startswith("^")
    rest = spec[1:] if exclude else spec
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    prefixes = [p.split(":")[0] for p in rest.split(",") if p.split(":")[0]]

    def hit(name: str) -> bool:
        return any(name == p if exact else name.startswith(p) for p in prefixes)

    return [n for n in names if hit(n) != exclude]


def check_socket_ifname(facts: DoctorFacts) -> list[CheckResult]:
    hosts = [h for h in facts.probed if h.interfaces is not None]
    if not hosts:
        return skipped("net.socket_ifname", "no host was probed")
    return group("net.socket_ifname", [_ifname_finding(facts, h) for h in hosts])


def _ifname_finding(facts: DoctorFacts, host: HostFacts) -> Finding:
    env = merged_env(host)
    use = data_interface(facts, host)
    fix_to = f"set it to {use} (the interface that reaches the master)" if use else "unset it"
    # One host alone may talk over loopback; several need an interface the others reach.
    have = [i.name for i in interfaces(host) if i.usable or (len(facts.hosts) == 1 and i.addresses)]
    listing = ", ".join(i.name for i in interfaces(host)) or "none"
    good, _ = reachable_interfaces(facts, host.name)
    problems: list[str] = []
    if "NCCL_SOCKET_IFNAME" in env:
        value, where = env["NCCL_SOCKET_IFNAME"]
        selected = matching_interfaces(value, have)
        if not selected:
            problems.append(f"NCCL_SOCKET_IFNAME={value}{_where(where)} matches no usable interface "
                            f"(it has {listing}): NCCL fails with 'no socket interface found'")
        elif facts.matrix is not None and len(facts.reached) > 1 and not set(selected) & set(good):
            problems.append(f"NCCL_SOCKET_IFNAME={value}{_where(where)} selects {', '.join(selected)}, "
                            "which the other hosts cannot reach")
    if "GLOO_SOCKET_IFNAME" in env:
        value, where = env["GLOO_SOCKET_IFNAME"]
        names = [n.strip() for n in value.split(",") if n.strip()]
        unknown = [n for n in names if n not in have]
        if unknown:
            problems.append(f"GLOO_SOCKET_IFNAME={value}{_where(where)} names {', '.join(unknown)}, which it does "
                            f"not have up with an address (it has {listing}): Gloo fails at start-up")
        elif facts.matrix is not None and len(facts.reached) > 1 and not set(names) & set(good):
            problems.append(f"GLOO_SOCKET_IFNAME={value}{_where(where)} names {', '.join(names)}, "
                            "which the other hosts cannot reach")
    if problems:
        return Finding(host.name, "fail", "; ".join(problems), fix_to)
    if "NCCL_SOCKET_IFNAME" in env or "GLOO_SOCKET_IFNAME" in env:
        return Finding(host.name, "ok", "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME select reachable interfaces")
    return Finding(host.name, "ok", "not set: fstrain launch sets both per host to the interface that reaches the "
                   "master")


def _where(where: str) -> str:
    return "" if where == "environment" else f" (in {where})"


# --- MTU ---------------------------------------------------------------------------------------


def check_mtu(facts: DoctorFacts) -> list[CheckResult]:
    mtus: dict[str, tuple[str, int]] = {}
    for host in facts.probed:
        name = data_interface(facts, host)
        iface = next((i for i in interfaces(host) if i.name == name), None)
        if iface is not None and iface.mtu:
            mtus[host.name] = (iface.name, iface.mtu)
    if len(mtus) < 2:
        return skipped("net.mtu", "fewer than two hosts with a known data interface", list(mtus))
    values = sorted({m for _, m in mtus.values()})
    if len(values) == 1:
        return [CheckResult("net.mtu", "ok", tuple(mtus), f"MTU {values[0]} on every host's data interface")]
    counts = {v: sum(1 for _, m in mtus.values() if m == v) for v in values}
    common = max(values, key=lambda v: counts[v])
    findings = [Finding(h, "warn" if m != common else "ok",
                        f"{name} has MTU {m}" + ("" if m == common else f"; most hosts use {common}"),
                        f"set the same MTU on every host (`ip link set {name} mtu {common}`, and in the "
                        "switch): a mismatch drops large frames (RoCE, jumbo TCP)" if m != common else "")
                for h, (name, m) in mtus.items()]
    return group("net.mtu", findings)


# --- rendezvous port -------------------------------------------------------------------------


def check_rendezvous(facts: DoctorFacts) -> list[CheckResult]:
    rdv = facts.rendezvous
    if rdv is None:
        return skipped("net.rendezvous_port", "the rendezvous check was not run")
    if rdv.error is not None:
        return [CheckResult("net.rendezvous_port", "fail", (rdv.master,),
                            f"could not open a listener on the master: {rdv.error}",
                            "check that the interpreter runs there (sw.interpreter)")]
    results: list[CheckResult] = []
    if rdv.requested_port is not None and rdv.requested_port in rdv.busy:
        alternative = f"pass a free port, e.g. --master-port {rdv.port} (free now)" if rdv.port else \
            "pass a free port with --master-port"
        results.append(CheckResult(
            "net.rendezvous_port", "fail", (rdv.master,),
            f"port {rdv.requested_port} is already in use on the master (another process listens on it)",
            f"{alternative}, or stop that process (`ss -ltnp 'sport = :{rdv.requested_port}'` on {rdv.master})"))
    if rdv.port is None:
        if not results:
            results.append(CheckResult("net.rendezvous_port", "fail", (rdv.master,),
                                       f"no free port among {', '.join(map(str, rdv.busy))} on the master",
                                       "pass a free port with --master-port"))
        return results
    by_source: dict[str, list[Connection]] = {}
    for conn in rdv.connections:
        by_source.setdefault(conn.source, []).append(conn)
    findings = []
    for host in facts.reached:
        conns = by_source.get(host.name)
        if not conns:
            findings.append(Finding(host.name, "skipped", "it could not run the connection test"))
            continue
        ok = [c for c in conns if c.ok]
        if ok:
            findings.append(Finding(host.name, "ok", f"reaches the master {rdv.master} at {ok[0].address}:{rdv.port}"))
            continue
        tried = ", ".join(f"{c.address} ({c.error or 'failed'})" for c in conns)
        findings.append(Finding(host.name, "fail", f"cannot reach the master {rdv.master} on port {rdv.port}: {tried}",
                                f"open TCP port {rdv.port} on {rdv.master} to the other hosts (fstrain launch draws "
                                f"ports from {PORT_RANGE[0]}-{PORT_RANGE[1] - 1} unless --master-port is given)"))
    return results + group("net.rendezvous_port", findings)
