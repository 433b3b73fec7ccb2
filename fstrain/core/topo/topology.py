"""The topology of GPU nodes: GPUs, NICs, the links between them, NUMA and NVLink domains.

Pure values. A :class:`Node` is built by a parser (``nvidia-smi topo -m``, an NCCL topology XML)
or from a probe report (:mod:`fstrain.core.parsers.probe_report`); nothing here reads the machine.

The link classes follow ``nvidia-smi topo -m`` (closest first)::

    X     the device itself
    NV#   a bonded set of # NVLinks (direct, or through NVSwitch)
    PIX   at most one PCIe bridge (the same PCIe switch)
    PXB   several PCIe bridges, without the host bridge
    PHB   through a PCIe host bridge (the CPU)
    NODE  between host bridges inside one NUMA node
    SYS   across the SMP interconnect between NUMA nodes (QPI/UPI/xGMI); old drivers say SOC
    ?     not known (a source that cannot tell, e.g. a template XML)
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum


class LinkClass(str, Enum):
    """How two devices of one node are connected; the order of the members is closest first."""

    SELF = "X"
    NVLINK = "NV"
    PIX = "PIX"
    PXB = "PXB"
    PHB = "PHB"
    NODE = "NODE"
    SYS = "SYS"
    UNKNOWN = "?"

    @property
    def rank(self) -> int:
        """0 for the device itself, growing with distance; UNKNOWN sorts last."""
        return _RANK[self]

    @property
    def description(self) -> str:
        return _DESCRIPTION[self]


_RANK = {cls: i for i, cls in enumerate(LinkClass)}
_DESCRIPTION = {
    LinkClass.SELF: "the device itself",
    LinkClass.NVLINK: "NVLink (direct or through NVSwitch); NV# = # bonded links",
    LinkClass.PIX: "PCIe, at most one bridge (same PCIe switch)",
    LinkClass.PXB: "PCIe, several bridges, not through the host bridge",
    LinkClass.PHB: "PCIe through a host bridge (the CPU)",
    LinkClass.NODE: "PCIe between host bridges of one NUMA node",
    LinkClass.SYS: "across the SMP interconnect between NUMA nodes (QPI/UPI/xGMI)",
    LinkClass.UNKNOWN: "not known",
}

_NV_RE = re.compile(r"NV(\d+)")
# nvidia-smi before the NODE level existed called the cross-socket path SOC.
_PLAIN_LABELS = {
    "X": LinkClass.SELF,
    "PIX": LinkClass.PIX,
    "PXB": LinkClass.PXB,
    "PHB": LinkClass.PHB,
    "NODE": LinkClass.NODE,
    "SYS": LinkClass.SYS,
    "SOC": LinkClass.SYS,
    "?": LinkClass.UNKNOWN,
}


def parse_link_label(label: str) -> tuple[LinkClass, int]:
    """``"NV12"`` -> (NVLINK, 12); ``"SOC"`` -> (SYS, 0). Raises ValueError for anything else."""
    if label in _PLAIN_LABELS:
        return _PLAIN_LABELS[label], 0
    match = _NV_RE.fullmatch(label)
    if match and int(match.group(1)) > 0:
        return LinkClass.NVLINK, int(match.group(1))
    raise ValueError(f"not a topology link label: {label!r}")


def canonical_label(label: str) -> str:
    """The label in today's vocabulary (SOC becomes SYS)."""
    cls, lanes = parse_link_label(label)
    return f"NV{lanes}" if cls is LinkClass.NVLINK else cls.value


# Nominal NVLink bandwidth per link and direction, in Gbit/s, by compute capability. NVLink 2-4
# carry 25 GB/s per link; the GA102 bridge (RTX 3090, A6000) 14.0625 GB/s; NVLink 5 50 GB/s.
_NVLINK_LANE_GBPS = {"6.0": 160.0, "7.0": 200.0, "8.0": 200.0, "8.6": 112.5, "9.0": 200.0,
                     "10.0": 400.0, "10.3": 400.0}
# PCIe payload rate per lane after line coding, in Gbit/s, by generation.
_PCIE_LANE_GBPS = {1: 2.0, 2: 4.0, 3: 7.877, 4: 15.754, 5: 31.508, 6: 60.5}


def nvlink_lane_gbps(compute_capability: str | None) -> float | None:
    """Nominal Gbit/s of one NVLink (one direction) for a GPU generation; None when not known."""
    if compute_capability is None:
        return None
    return _NVLINK_LANE_GBPS.get(compute_capability)


def pcie_gbps(generation: int | None, width: int | None) -> float | None:
    """Nominal Gbit/s of a PCIe link (one direction); None when generation or width is unknown."""
    if not generation or not width or generation not in _PCIE_LANE_GBPS:
        return None
    return round(_PCIE_LANE_GBPS[generation] * width, 1)


_BUS_ID = re.compile(r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])")


def normalize_pci_bus_id(text: str) -> str:
    """``00000000:07:00.0`` (NVML) or ``07:00.0`` -> ``0000:07:00.0``, the sysfs/NCCL spelling.

    Raises ValueError when the text is not a PCI address.
    """
    match = _BUS_ID.fullmatch(text.strip())
    if not match:
        raise ValueError(f"not a PCI bus id: {text!r}")
    domain, bus, dev, func = match.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{func}"


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """``"0-3,8,10-11"`` -> (0, 1, 2, 3, 8, 10, 11). Raises ValueError on anything else."""
    cpus: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty item in CPU list {text!r}")
        low, sep, high = part.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"not a CPU list: {text!r}")
        first, last = int(low), int(high) if sep else int(low)
        if last < first:
            raise ValueError(f"descending range {part!r} in CPU list {text!r}")
        cpus.extend(range(first, last + 1))
    return tuple(sorted(set(cpus)))


def format_cpu_list(cpus: Iterable[int]) -> str:
    """(0, 1, 2, 3, 8) -> ``"0-3,8"``: the kernel's cpulist spelling."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


@dataclass(frozen=True)
class Gpu:
    """One GPU of a node. Fields a source cannot tell are None."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None  # dddd:bb:dd.f, lowercase
    numa_node: int | None = None
    cpu_affinity: tuple[int, ...] | None = None  # None: not known; () : known to be empty
    memory_total_bytes: int | None = None
    compute_capability: str | None = None  # "9.0"
    pcie_generation: int | None = None
    pcie_width: int | None = None
    memory_numa_node: int | None = None  # "GPU NUMA ID": the GPU memory's own NUMA node (Grace)

    @property
    def label(self) -> str:
        return f"GPU{self.index}"


@dataclass(frozen=True)
class Nic:
    """One network device (an RDMA HCA port or its PCI function) of a node."""

    label: str  # the column label in topo -m (NIC0, mlx5_0), or the name
    name: str | None = None  # the verbs device name (mlx5_0); None when the source does not say
    pci_bus_id: str | None = None
    numa_node: int | None = None
    link_layer: str | None = None  # InfiniBand / Ethernet
    rate_gbps: float | None = None
    state: str | None = None  # ACTIVE / DOWN ...

    @property
    def display_name(self) -> str:
        return self.name or self.label


@dataclass(frozen=True)
class Link:
    """The connection between two devices of a node (by label), with its nominal bandwidth."""

    a: str
    b: str
    label: str  # as nvidia-smi prints it, e.g. NV18, PXB
    link_class: LinkClass
    nvlink_lanes: int = 0
    bandwidth_gbps: float | None = None  # nominal, one direction, Gbit/s; None when unknown


@dataclass(frozen=True)
class NumaDomain:
    """A NUMA node with the CPUs, GPUs and NICs attached to it (as far as the source knows)."""

    node_id: int
    cpus: tuple[int, ...] | None
    gpu_indices: tuple[int, ...]
    nic_labels: tuple[str, ...]


@dataclass(frozen=True)
class NvlinkDomain:
    """A connected component of GPUs over NVLink.

    ``kind`` is ``all-to-all`` (every pair has a direct NVLink: NVSwitch, or a fully connected
    board such as HGX A100 4-GPU), ``pair`` (two GPUs, e.g. an NVLink bridge) or
    ``partial-mesh`` (some pairs reach each other only through a third GPU: DGX-1 hybrid cube mesh).
    """

    gpu_indices: tuple[int, ...]
    kind: str
    min_lanes: int
    max_lanes: int
    via_nvswitch: bool | None = None  # None: the source cannot tell (topo -m)


@dataclass(frozen=True)
class Node:
    """One machine. ``matrix`` holds link labels over ``devices`` (GPUs then NICs, source order)."""

    hostname: str
    gpus: tuple[Gpu, ...]
    nics: tuple[Nic, ...] = ()
    matrix: tuple[tuple[str, ...], ...] = ()
    source: str = ""
    missing: tuple[str, ...] = ()  # facts the source could not provide, in words
    nvswitch: bool | None = None
    numa_cpus: Mapping[int, tuple[int, ...]] = field(default_factory=dict)  # from sysfs, when probed

    def __post_init__(self) -> None:
        size = len(self.gpus) + len(self.nics)
        if self.matrix and (len(self.matrix) != size or any(len(row) != size for row in self.matrix)):
            raise ValueError(f"matrix must be {size}x{size} (GPUs then NICs)")
        for i, row in enumerate(self.matrix):
            for j, label in enumerate(row):
                cls, _ = parse_link_label(label)
                if (i == j) != (cls is LinkClass.SELF):
                    raise ValueError(f"matrix[{i}][{j}] = {label!r}: X belongs on the diagonal only")
                if self.matrix[j][i] != label:
                    raise ValueError(f"matrix is not symmetric at [{i}][{j}]")

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(g.label for g in self.gpus) + tuple(n.label for n in self.nics)

    def gpu(self, index: int) -> Gpu:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise KeyError(f"{self.hostname}: no GPU{index}")

    def label_between(self, a: str, b: str) -> str:
        """The matrix label between two device labels; ``?`` when the node has no matrix."""
        if not self.matrix:
            return "X" if a == b else "?"
        devices = self.devices
        return self.matrix[devices.index(a)][devices.index(b)]

    def link(self, a: str, b: str) -> Link:
        label = self.label_between(a, b)
        cls, lanes = parse_link_label(label)
        return Link(a, b, label, cls, lanes, self._bandwidth_gbps(a, b, cls, lanes))

    @property
    def links(self) -> tuple[Link, ...]:
        """Every unordered pair of distinct devices, in matrix order."""
        devices = self.devices
        return tuple(self.link(devices[i], devices[j])
                     for i in range(len(devices)) for j in range(i + 1, len(devices)))

    def _bandwidth_gbps(self, a: str, b: str, cls: LinkClass, lanes: int) -> float | None:
        ends = [self._gpu_by_label(x) for x in (a, b)]
        if cls is LinkClass.NVLINK:
            rates = {nvlink_lane_gbps(g.compute_capability) for g in ends if g is not None}
            rate = rates.pop() if len(rates) == 1 else None
            return None if rate is None else lanes * rate
        if cls in (LinkClass.SELF, LinkClass.UNKNOWN):
            return None
        # A PCIe path is as fast as its slowest end; NIC link widths are not modelled.
        speeds = [pcie_gbps(g.pcie_generation, g.pcie_width) if g else None for g in ends]
        return None if None in speeds else min(s for s in speeds if s is not None)

    def _gpu_by_label(self, label: str) -> Gpu | None:
        return next((g for g in self.gpus if g.label == label), None)

    # --- derived views ---------------------------------------------------------------------

    @property
    def nvlink_domains(self) -> tuple[NvlinkDomain, ...]:
        return nvlink_domains(self)

    @property
    def numa_domains(self) -> tuple[NumaDomain, ...]:
        return numa_domains(self)


def nvlink_domains(node: Node) -> tuple[NvlinkDomain, ...]:
    """Connected components of GPUs over NVLink (components of one GPU are not domains)."""
    lanes: dict[tuple[int, int], int] = {}
    for ga in node.gpus:
        for gb in node.gpus:
            if ga.index < gb.index:
                cls, n = parse_link_label(node.label_between(ga.label, gb.label))
                if cls is LinkClass.NVLINK:
                    lanes[(ga.index, gb.index)] = n
    seen: set[int] = set()
    domains: list[NvlinkDomain] = []
    for gpu in node.gpus:
        if gpu.index in seen:
            continue
        component, stack = {gpu.index}, [gpu.index]
        while stack:
            here = stack.pop()
            for (x, y) in lanes:
                other = y if x == here else x if y == here else None
                if other is not None and other not in component:
                    component.add(other)
                    stack.append(other)
        seen |= component
        if len(component) < 2:
            continue
        members = tuple(sorted(component))
        widths = [lanes[(x, y)] for x in members for y in members if (x, y) in lanes]
        pairs = len(members) * (len(members) - 1) // 2
        # Complete means every pair is linked directly; unequal widths (a degraded link) keep the
        # domain all-to-all, and min_lanes/max_lanes show the spread.
        complete = len(widths) == pairs
        kind = "pair" if len(members) == 2 else "all-to-all" if complete else "partial-mesh"
        domains.append(NvlinkDomain(members, kind, min(widths), max(widths), node.nvswitch))
    return tuple(domains)


def closest_nics(node: Node, gpu_index: int) -> tuple[tuple[str, ...], LinkClass | None]:
    """The NICs (display names) nearest to a GPU by link class, and that class; ties are all kept."""
    gpu = node.gpu(gpu_index)
    best: LinkClass | None = None
    names: list[str] = []
    for nic in node.nics:
        cls, _ = parse_link_label(node.label_between(gpu.label, nic.label))
        if cls is LinkClass.UNKNOWN:
            continue
        if best is None or cls.rank < best.rank:
            best, names = cls, [nic.display_name]
        elif cls is best:
            names.append(nic.display_name)
    return tuple(names), best


def nic_numa_node(node: Node, nic: Nic) -> int | None:
    """A NIC's NUMA node: its own when known, else that of the GPUs it reaches without SYS."""
    if nic.numa_node is not None:
        return nic.numa_node
    found = {g.numa_node for g in node.gpus
             if g.numa_node is not None
             and parse_link_label(node.label_between(g.label, nic.label))[0]
             in (LinkClass.PIX, LinkClass.PXB, LinkClass.PHB, LinkClass.NODE)}
    # Disagreeing GPUs (a numa=off kernel, a VM) mean we cannot tell.
    return found.pop() if len(found) == 1 else None


def numa_domains(node: Node) -> tuple[NumaDomain, ...]:
    """NUMA nodes with their GPUs and NICs; CPUs from sysfs when probed, else the GPUs' affinity."""
    ids = set(node.numa_cpus) | {g.numa_node for g in node.gpus if g.numa_node is not None}
    nic_numa = {nic.label: nic_numa_node(node, nic) for nic in node.nics}
    ids |= {n for n in nic_numa.values() if n is not None}
    domains = []
    for numa_id in sorted(ids):
        gpus = tuple(g.index for g in node.gpus if g.numa_node == numa_id)
        cpus: tuple[int, ...] | None = node.numa_cpus.get(numa_id)
        if cpus is None:
            affinities = [g.cpu_affinity for g in node.gpus if g.numa_node == numa_id and g.cpu_affinity]
            cpus = tuple(sorted({c for a in affinities if a for c in a})) if affinities else None
        nics = tuple(label for label, n in nic_numa.items() if n == numa_id)
        domains.append(NumaDomain(numa_id, cpus, gpus, nics))
    return tuple(domains)


# --- cluster level ---------------------------------------------------------------------------


def node_shape(node: Node) -> dict[str, object]:
    """The facts that make two nodes interchangeable for training (no hostnames, UUIDs or GUIDs)."""
    gpu_labels = [g.label for g in node.gpus]
    return {
        "gpu_count": len(node.gpus),
        "gpu_names": [g.name for g in node.gpus],
        "gpu_memory_bytes": [g.memory_total_bytes for g in node.gpus],
        "gpu_numa": [g.numa_node for g in node.gpus],
        "gpu_pci_bus_ids": [g.pci_bus_id for g in node.gpus],
        "gpu_links": [[canonical_label(node.label_between(a, b)) for b in gpu_labels] for a in gpu_labels],
        "nics": [[n.display_name, n.rate_gbps, n.link_layer] for n in node.nics],
        "gpu_nic_links": [[canonical_label(node.label_between(g, n.label)) for n in node.nics]
                          for g in gpu_labels],
    }


def shape_hash(node: Node) -> str:
    """A short stable hash of :func:`node_shape`: equal hashes mean interchangeable nodes."""
    text = json.dumps(node_shape(node), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def nvlink_summary(node: Node) -> str:
    """``8 GPUs all-to-all NV18``, ``4 pairs NV12``, ``partial mesh NV1-NV2 (8 GPUs)`` or ``none``."""
    domains = nvlink_domains(node)
    if not domains:
        return "none"
    parts = []
    for kind in ("all-to-all", "pair", "partial-mesh"):
        group = [d for d in domains if d.kind == kind]
        if not group:
            continue
        lo, hi = min(d.min_lanes for d in group), max(d.max_lanes for d in group)
        width = f"NV{lo}" if lo == hi else f"NV{lo}-NV{hi}"
        if kind == "pair":
            parts.append(f"{len(group)} pair{'s' if len(group) > 1 else ''} {width}")
        else:
            sizes = "+".join(str(len(d.gpu_indices)) for d in group)
            parts.append(f"{kind.replace('-', ' ')} {width} ({sizes} GPUs)")
    return ", ".join(parts)


def _gpu_summary(shape: Mapping[str, object]) -> str:
    names = shape["gpu_names"]
    assert isinstance(names, list)
    distinct = sorted({str(n) if n else "unknown GPU" for n in names})
    return f"{shape['gpu_count']}x {'/'.join(distinct) if distinct else 'no GPU'}"


def _nic_summary(shape: Mapping[str, object]) -> str:
    nics = shape["nics"]
    assert isinstance(nics, list)
    if not nics:
        return "no NICs"
    rates = sorted({f"{r:g} Gb/s" for _, r, _ in nics if r})
    return f"{len(nics)} NICs ({', '.join(n for n, _, _ in nics)})" + (f" at {'/'.join(rates)}" if rates else "")


def describe_differences(base: Mapping[str, object], other: Mapping[str, object]) -> tuple[str, ...]:
    """How ``other`` differs from ``base`` (two :func:`node_shape` values), in words."""
    out: list[str] = []
    if base["gpu_count"] != other["gpu_count"] or base["gpu_names"] != other["gpu_names"]:
        out.append(f"GPUs: {_gpu_summary(other)} vs {_gpu_summary(base)}")
    if base["gpu_memory_bytes"] != other["gpu_memory_bytes"] and base["gpu_count"] == other["gpu_count"]:
        out.append("GPU memory sizes differ")
    if base["gpu_links"] != other["gpu_links"]:
        out.append("GPU-GPU links (NVLink/PCIe) differ")
    if base["nics"] != other["nics"]:
        out.append(f"NICs: {_nic_summary(other)} vs {_nic_summary(base)}")
    elif base["gpu_nic_links"] != other["gpu_nic_links"]:
        out.append("GPU-NIC placement differs")
    if base["gpu_numa"] != other["gpu_numa"]:
        out.append(f"GPU NUMA nodes: {other['gpu_numa']} vs {base['gpu_numa']}")
    if base["gpu_pci_bus_ids"] != other["gpu_pci_bus_ids"] and base["gpu_count"] == other["gpu_count"]:
        out.append("GPU PCI bus ids differ (one NCCL topology file cannot serve both)")
    return tuple(out)


@dataclass(frozen=True)
class NodeGroup:
    """Nodes with one shape; ``differences`` compares the group with the largest group."""

    shape_hash: str
    hostnames: tuple[str, ...]
    representative: Node
    differences: tuple[str, ...] = ()


def group_nodes(nodes: Sequence[Node]) -> tuple[NodeGroup, ...]:
    """Group identical nodes by shape hash; the largest group first (ties: first seen)."""
    order: list[str] = []
    members: dict[str, list[Node]] = {}
    for node in nodes:
        key = shape_hash(node)
        if key not in members:
            order.append(key)
            members[key] = []
        members[key].append(node)
    order.sort(key=lambda k: -len(members[k]))  # stable: ties keep first-seen order
    groups: list[NodeGroup] = []
    base = node_shape(members[order[0]][0]) if order else {}
    for i, key in enumerate(order):
        rep = members[key][0]
        diffs = () if i == 0 else describe_differences(base, node_shape(rep))
        groups.append(NodeGroup(key, tuple(n.hostname for n in members[key]), rep, diffs))
    return tuple(groups)


def node_to_dict(node: Node) -> dict[str, object]:
    """A JSON-ready view of a node: devices, link matrix, NVLink and NUMA domains, GPU-NIC affinity."""
    gpus = []
    for gpu in node.gpus:
        names, cls = closest_nics(node, gpu.index)
        gpus.append({
            "index": gpu.index, "name": gpu.name, "uuid": gpu.uuid, "pci_bus_id": gpu.pci_bus_id,
            "numa_node": gpu.numa_node, "memory_numa_node": gpu.memory_numa_node,
            "cpu_affinity": format_cpu_list(gpu.cpu_affinity) if gpu.cpu_affinity else None,
            "memory_total_bytes": gpu.memory_total_bytes, "compute_capability": gpu.compute_capability,
            "closest_nics": list(names), "closest_nic_link": cls.value if cls else None,
        })
    return {
        "hostname": node.hostname,
        "source": node.source,
        "gpus": gpus,
        "nics": [{"label": n.label, "name": n.name, "pci_bus_id": n.pci_bus_id, "numa_node": nic_numa_node(node, n),
                  "link_layer": n.link_layer, "rate_gbps": n.rate_gbps, "state": n.state} for n in node.nics],
        "devices": list(node.devices),
        "links": [list(row) for row in node.matrix],
        "nvlink_domains": [list(d.gpu_indices) for d in nvlink_domains(node)],
        "nvlink_domain_kinds": [{"gpus": list(d.gpu_indices), "kind": d.kind, "min_lanes": d.min_lanes,
                                 "max_lanes": d.max_lanes, "via_nvswitch": d.via_nvswitch}
                                for d in nvlink_domains(node)],
        "nvlink_summary": nvlink_summary(node),
        "numa_domains": [{"numa_node": d.node_id, "cpus": format_cpu_list(d.cpus) if d.cpus else None,
                          "gpus": list(d.gpu_indices), "nics": list(d.nic_labels)} for d in numa_domains(node)],
        "links_detail": [{"a": link.a, "b": link.b, "label": link.label, "class": link.link_class.value,
                          "nvlink_lanes": link.nvlink_lanes, "bandwidth_gbps": link.bandwidth_gbps}
                         for link in node.links],
        "missing": list(node.missing),
        "shape_hash": shape_hash(node),
    }
