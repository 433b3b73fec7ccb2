"""NVLink and topology: every NVLink the hardware has is up; nodes that should be identical are."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fstrain.core.doctor.facts import DoctorFacts, HostFacts
from fstrain.core.doctor.gpus import gpu_hosts, gpus, index_list, no_gpu_reason
from fstrain.core.doctor.result import CheckResult, Finding, group, skipped
from fstrain.core.parsers.probe_report import node_from_report
from fstrain.core.topo.topology import Node, group_nodes
from fstrain.errors import FstrainError

NVLINK_FIX = ("check `nvidia-smi nvlink --status` and the error counters (`nvidia-smi nvlink -e`); a GPU reset "
              "(`nvidia-smi -r`) or a reboot may bring the link back, else drain the node for service")


def _links(gpu: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    links = gpu.get("nvlinks")
    return [link for link in links if isinstance(link, Mapping)] if isinstance(links, list) else None


def _active(gpu: Mapping[str, Any]) -> int:
    return sum(1 for link in _links(gpu) or [] if link.get("active"))


def check_nvlink(facts: DoctorFacts) -> list[CheckResult]:
    """A GPU with fewer active NVLinks than the most any GPU of its model has in the cluster has
    links down: NVML lists a GPU's NVLink slots whether or not they are cabled, so the peers are
    the reference (a PCIe card with no bridge has none active on every host, and is fine)."""
    hosts = [h for h in gpu_hosts(facts) if any(_links(g) is not None for g in gpus(h))]
    if not hosts:
        reason = no_gpu_reason(facts) if not gpu_hosts(facts) else "NVML gave no NVLink state (no pynvml)"
        return skipped("topo.nvlink", reason)
    expected: dict[str, int] = {}
    for host in hosts:
        for gpu in gpus(host):
            name = str(gpu.get("name"))
            expected[name] = max(expected.get(name, 0), _active(gpu))
    return group("topo.nvlink", [_nvlink_finding(h, expected) for h in hosts])


def _nvlink_finding(host: HostFacts, expected: Mapping[str, int]) -> Finding:
    problems: dict[str, list[int]] = {}
    total = 0
    for gpu in gpus(host):
        want = expected.get(str(gpu.get("name")), 0)
        have = _active(gpu)
        total += have
        if have < want:
            down = [int(link.get("link", -1)) for link in _links(gpu) or [] if not link.get("active")]
            listed = f" (links {', '.join(map(str, down))} down)" if down and len(down) <= 8 else ""
            problems.setdefault(f"{have} of {want} NVLinks up{listed}", []).append(int(gpu.get("index", -1)))
    if problems:
        message = "; ".join(f"{index_list(ix)}: {text}" for text, ix in problems.items())
        return Finding(host.name, "fail", message, NVLINK_FIX)
    if total == 0:
        return Finding(host.name, "ok", "no NVLink (PCIe GPUs)")
    return Finding(host.name, "ok", "every NVLink up")


def check_identical(facts: DoctorFacts) -> list[CheckResult]:
    """Hosts with the same GPUs should have the same topology (shape hash): one NCCL topology
    file and one plan serve them all, and a slower odd node sets the pace."""
    hosts = gpu_hosts(facts)
    if not hosts:
        return skipped("topo.identical", no_gpu_reason(facts))
    nodes: dict[str, Node] = {}
    findings: list[Finding] = []
    for host in hosts:
        try:
            nodes[host.name] = node_from_report(dict(host.report or {}), where=host.name)
        except FstrainError as exc:
            findings.append(Finding(host.name, "skipped", f"topology unreadable: {exc.message}"))
    by_kind: dict[tuple[str, ...], list[str]] = {}
    for name, node in nodes.items():
        by_kind.setdefault(tuple(str(g.name) for g in node.gpus), []).append(name)
    for names in by_kind.values():
        groups = group_nodes([_renamed(nodes[n], n) for n in names])
        largest = groups[0]
        for index, node_group in enumerate(groups):
            for name in node_group.hostnames:
                if len(names) == 1:
                    findings.append(Finding(name, "ok", "no other host has the same GPUs to compare with"))
                elif index == 0 and len(groups) == 1:
                    findings.append(Finding(name, "ok", "the same topology as every host with the same GPUs"))
                elif index == 0:
                    findings.append(Finding(name, "ok", f"the most common topology (shape {node_group.shape_hash}) "
                                            "among the hosts with the same GPUs"))
                else:
                    findings.append(Finding(
                        name, "warn", f"shape {node_group.shape_hash} differs from {', '.join(largest.hostnames)} "
                        f"({largest.shape_hash}): {'; '.join(node_group.differences)}",
                        "compare it with `fstrain topo show` (BIOS, firmware, GPU or NIC placement); a node "
                        "that cannot match should be planned apart or left out"))
    return group("topo.identical", findings)


def _renamed(node: Node, name: str) -> Node:
    # group by inventory name (the probe's hostname may repeat across hosts)
    from dataclasses import replace

    return replace(node, hostname=name)
