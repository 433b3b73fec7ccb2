"""RDMA: devices present and ports ACTIVE at the expected rate, ``NCCL_IB_HCA`` naming devices that
exist, ``nvidia_peermem`` for GPUDirect RDMA, and ``ulimit -l`` for registering memory."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fstrain.core.doctor.facts import DoctorFacts, HostFacts, merged_env
from fstrain.core.doctor.gpus import gpus
from fstrain.core.doctor.result import CheckResult, Finding, group, skipped
from fstrain.core.parsers.ibstat import normalize_port_state, parse_rate_gbps

NO_RDMA = "no RDMA device on any host: NCCL uses TCP sockets"


def devices(host: HostFacts) -> list[Mapping[str, Any]]:
    rdma = (host.report or {}).get("rdma") or {}
    return [d for d in rdma.get("devices") or [] if isinstance(d, Mapping) and d.get("name")]


def ports(device: Mapping[str, Any]) -> list[tuple[int, str, float | None, str | None]]:
    """(port, state, rate Gb/s, link layer) from the sysfs spellings (``4: ACTIVE``, ``400 Gb/sec``)."""
    out = []
    for port in device.get("ports") or []:
        if isinstance(port, Mapping):
            state = normalize_port_state(str(port.get("state") or "?"))
            rate = parse_rate_gbps(str(port["rate"])) if port.get("rate") else None
            out.append((int(port.get("port") or 0), state, rate, port.get("link_layer")))
    return out


def rdma_hosts(facts: DoctorFacts) -> list[HostFacts]:
    return [h for h in facts.probed if devices(h)]


def ib_hca_selection(spec: str, names: list[str]) -> tuple[list[str], list[str], bool]:
    """``NCCL_IB_HCA``: (selected devices, entries matching nothing, exclude list?). Entries are
    ``<hca>[:<port>[:<rail>[:<plane>]]]``; ``^`` excludes, ``=`` makes names exact (else prefixes)."""
    exclude = spec.startswith("^")
    rest = spec[1:] if exclude else spec
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    entries = [e.split(":")[0] for e in rest.split(",") if e.split(":")[0]]

    def hits(entry: str) -> list[str]:
        return [n for n in names if (n == entry if exact else n.startswith(entry))]

    unmatched = [e for e in entries if not hits(e)]
    chosen = {n for e in entries for n in hits(e)}
    selected = [n for n in names if (n in chosen) != exclude]
    return selected, unmatched, exclude


def check_ports(facts: DoctorFacts) -> list[CheckResult]:
    with_rdma = rdma_hosts(facts)
    if not with_rdma:
        return skipped("rdma.ports", NO_RDMA, [h.name for h in facts.probed])
    best: dict[tuple[str, str | None], float] = {}  # (HCA type, link layer) -> best rate seen in the cluster
    for host in with_rdma:
        for device in devices(host):
            for _, state, rate, layer in ports(device):
                key = (str(device.get("hca_type")), layer)
                if state == "ACTIVE" and rate:
                    best[key] = max(best.get(key, 0.0), rate)
    return group("rdma.ports", [_ports_finding(h, best) for h in facts.probed])


def _ports_finding(host: HostFacts, best: Mapping[tuple[str, str | None], float]) -> Finding:
    found = devices(host)
    if not found:
        return Finding(host.name, "fail", "no RDMA device, while other hosts have them: NCCL cannot use one "
                       "network for all", "install/enable its HCAs (`ibv_devinfo`), or leave it out: "
                       f"--exclude {host.name}")
    spec = merged_env(host).get("NCCL_IB_HCA")
    wanted = set(ib_hca_selection(spec[0], [str(d["name"]) for d in found])[0]) if spec else set()
    down, slow, fail = [], [], False
    for device in found:
        for port, state, rate, layer in ports(device):
            label = f"{device['name']}:{port}"
            if state != "ACTIVE":
                down.append(f"{label} {state}")
                fail = fail or device["name"] in wanted
            elif rate and rate < best.get((str(device.get("hca_type")), layer), rate):
                slow.append(f"{label} at {rate:g} Gb/s (others {best[(str(device.get('hca_type')), layer)]:g})")
    if not down and not slow:
        return Finding(host.name, "ok", f"{len(found)} RDMA devices, every port ACTIVE at the expected rate")
    message = "; ".join(filter(None, [", ".join(down) and f"not active: {', '.join(down)}",
                                      ", ".join(slow) and f"slow: {', '.join(slow)}"]))
    fix = "check cables and the switch port (`ibstat`, `ibv_devinfo`); keep NCCL off unused ports with NCCL_IB_HCA"
    return Finding(host.name, "fail" if fail else "warn", message, fix)


def _prefix_trap(spec: str, names: list[str]) -> str | None:
    """The documented trap: ``mlx5_1`` without ``=`` also selects ``mlx5_10`` to ``mlx5_19``."""
    rest = spec.lstrip("^")
    if rest.startswith("="):
        return None
    for entry in (e.split(":")[0] for e in rest.split(",")):
        if entry in names and any(n != entry and n.startswith(entry) for n in names):
            return entry
    return None


def check_ib_hca(facts: DoctorFacts) -> list[CheckResult]:
    hosts = [h for h in facts.probed if "NCCL_IB_HCA" in merged_env(h)]
    if not hosts:
        return skipped("rdma.ib_hca", "NCCL_IB_HCA is not set on any host")
    findings = []
    for host in hosts:
        value = merged_env(host)["NCCL_IB_HCA"][0]
        names = [str(d["name"]) for d in devices(host)]
        selected, unmatched, exclude = ib_hca_selection(value, names)
        have = ", ".join(names) or "none"
        if unmatched:
            findings.append(Finding(host.name, "fail" if not exclude else "warn",
                                    f"NCCL_IB_HCA={value}: {', '.join(unmatched)} matches no device (it has {have})",
                                    f"name existing devices, exactly: NCCL_IB_HCA=={','.join(names) or 'mlx5_0'}"))
        elif not selected:
            findings.append(Finding(host.name, "fail", f"NCCL_IB_HCA={value} leaves no device (it has {have})",
                                    "select at least one device"))
        elif (trap := _prefix_trap(value, names)) is not None:
            findings.append(Finding(host.name, "warn", f"NCCL_IB_HCA={value}: {trap} is a prefix, so it also "
                                    f"selects {', '.join(n for n in names if n.startswith(trap) and n != trap)}",
                                    f"write exact names: NCCL_IB_HCA={'^' if exclude else ''}="
                                    f"{value.lstrip('^')}"))
        else:
            findings.append(Finding(host.name, "ok", f"NCCL_IB_HCA selects {', '.join(selected)}"))
    return group("rdma.ib_hca", findings)


def check_peermem(facts: DoctorFacts) -> list[CheckResult]:
    hosts = [h for h in rdma_hosts(facts) if gpus(h)]
    if not hosts:
        return skipped("rdma.peermem", "no host has both GPUs and RDMA devices")
    findings = []
    for host in hosts:
        loaded = ((host.report or {}).get("rdma") or {}).get("nvidia_peermem_loaded")
        if loaded:
            findings.append(Finding(host.name, "ok", "nvidia_peermem is loaded (GPUDirect RDMA)"))
        else:
            findings.append(Finding(host.name, "warn", "nvidia_peermem is not loaded: GPUDirect RDMA then needs "
                                    "DMA-BUF (kernel >= 5.12, open GPU kernel modules), else NCCL stages "
                                    "every transfer through host memory",
                                    "`sudo modprobe nvidia_peermem` (and add it to /etc/modules-load.d/)"))
    return group("rdma.peermem", findings)


def check_memlock(facts: DoctorFacts) -> list[CheckResult]:
    hosts = rdma_hosts(facts)
    if not hosts:
        return skipped("rdma.memlock", NO_RDMA + " (ulimit -l matters only for RDMA)")
    findings = []
    for host in hosts:
        limit = (((host.report or {}).get("ulimits") or {}).get("memlock_bytes") or {})
        soft = limit.get("soft")
        if soft is None and "soft" in limit:
            findings.append(Finding(host.name, "ok", "ulimit -l unlimited"))
        elif host.cap_ipc_lock:
            findings.append(Finding(host.name, "ok", "ulimit -l is limited, but the session may lock memory "
                                    "anyway (CAP_IPC_LOCK)"))
        else:
            shown = f"{soft // 1024} KiB" if isinstance(soft, int) else "unknown"
            findings.append(Finding(host.name, "fail", f"ulimit -l is {shown}: NCCL cannot register its buffers "
                                    "with the HCA (ibv_reg_mr fails)",
                                    "`* soft memlock unlimited` and `* hard memlock unlimited` in "
                                    "/etc/security/limits.conf (LimitMEMLOCK=infinity for sshd/slurmd units)"))
    return group("rdma.memlock", findings)
