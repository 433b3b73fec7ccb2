"""The probe report (the JSON ``fstrain/io/probe_remote.py`` prints): validate it, read it as a Node.

The probe keeps tool output raw; :func:`validate_report` turns the ``nvidia-smi`` fallback text into
the same per-GPU dicts NVML gives, with the tested parsers beside this module.
:func:`node_from_report` builds the :class:`~fstrain.core.topo.topology.Node`: the link matrix comes from
``nvidia-smi topo -m`` when the node printed one, else from NVML NVLinks and sysfs PCI paths.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from fstrain.core.parsers.ibstat import normalize_port_state, parse_rate_gbps
from fstrain.core.parsers.nvidia_smi_q import gpu_health, parse_nvidia_smi_q
from fstrain.core.parsers.query_gpu import gpus_from_query, parse_query_gpu
from fstrain.core.parsers.topo_matrix import node_from_topo_matrix, parse_topo_matrix
from fstrain.core.topo.topology import Gpu, Nic, Node, normalize_pci_bus_id, parse_cpu_list
from fstrain.errors import ParseError

SCHEMA = "fstrain-probe"
SCHEMA_VERSION = 1
GPU_SOURCES = ("nvml", "nvidia-smi", "none")
_BDF = re.compile(r"[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")

Report = dict[str, Any]


def validate_report(data: object, where: str = "<probe report>") -> Report:
    """Check a report's schema and required fields; return a normalised copy (raises ParseError)."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ParseError("not an fstrain probe report (no \"schema\": \"fstrain-probe\")",
                         hint="pass the JSON printed by `fstrain topo show --json` or the probe", where=where)
    version = data.get("schema_version")
    if not isinstance(version, int) or version < 1:
        raise ParseError(f"schema_version {version!r} is not a positive integer", where=where)
    if version > SCHEMA_VERSION:
        raise ParseError(f"report schema version {version} is newer than this fstrain reads ({SCHEMA_VERSION})",
                         hint="upgrade fstrain on this machine", where=where)
    for key, kind in (("hostname", str), ("gpus", list), ("gpu_source", str), ("missing", list), ("pci", dict)):
        if not isinstance(data.get(key), kind):
            raise ParseError(f"field {key!r} is missing or not a {kind.__name__}", where=where)
    if data["gpu_source"] not in GPU_SOURCES:
        raise ParseError(f"gpu_source {data['gpu_source']!r} is not one of {', '.join(GPU_SOURCES)}", where=where)
    report: Report = copy.deepcopy(data)
    if report["gpu_source"] == "nvidia-smi" and not report["gpus"]:
        report["gpus"] = _gpus_from_nvidia_smi(report, where)
    for pos, gpu in enumerate(report["gpus"]):
        if not isinstance(gpu, dict) or not isinstance(gpu.get("index"), int):
            raise ParseError(f"gpus[{pos}] has no integer index", where=where)
        if gpu.get("pci_bus_id"):
            try:
                gpu["pci_bus_id"] = normalize_pci_bus_id(gpu["pci_bus_id"])
            except ValueError as exc:
                raise ParseError(f"gpus[{pos}]: {exc}", where=where) from None
    return report


def _tool_stdout(report: Report, key: str) -> str | None:
    result = (report.get("nvidia_smi") or {}).get(key)
    if not isinstance(result, dict) or result.get("exit_code") != 0 or result.get("error"):
        return None
    stdout = result.get("stdout")
    return stdout if isinstance(stdout, str) and stdout.strip() else None


def _gpus_from_nvidia_smi(report: Report, where: str) -> list[dict[str, Any]]:
    text = _tool_stdout(report, "query_gpu")
    if text is None:
        raise ParseError("gpu_source is nvidia-smi but the report has no --query-gpu output", where=where)
    rows = parse_query_gpu(text, source=f"{where}: nvidia-smi --query-gpu")
    health: dict[str, dict[str, object]] = {}
    q_text = _tool_stdout(report, "q")
    if q_text is not None:
        for section in parse_nvidia_smi_q(q_text, source=f"{where}: nvidia-smi -q").gpus:
            facts = gpu_health(section)
            if isinstance(facts.get("pci_bus_id"), str):
                health[str(facts["pci_bus_id"])] = facts
    gpus = []
    for row, gpu in zip(rows, gpus_from_query(rows), strict=True):
        entry: dict[str, Any] = {
            "index": gpu.index, "name": gpu.name, "uuid": gpu.uuid, "pci_bus_id": gpu.pci_bus_id,
            "memory_total_bytes": gpu.memory_total_bytes, "compute_capability": gpu.compute_capability,
            "pcie": {"max_gen": gpu.pcie_generation, "max_width": gpu.pcie_width},
            "temperature_c": _int(row.get("temperature.gpu")),
            "clocks_mhz": {"sm": _int(row.get("clocks.sm")), "max_sm": _int(row.get("clocks.max.sm"))},
            "source": "nvidia-smi",
        }
        free = _int(row.get("memory.free"))
        entry["memory_free_bytes"] = free * 2**20 if free is not None else None
        for key in ("ecc", "retired_pages", "remapped_rows", "throttle_reasons", "processes"):
            if gpu.pci_bus_id in health:
                entry[key] = health[gpu.pci_bus_id][key]
        gpus.append(entry)
    return gpus


def _int(value: object) -> int | None:
    if isinstance(value, int):
        return value
    return int(value) if isinstance(value, str) and value.strip().lstrip("-").isdigit() else None


def _numa(value: object) -> int | None:
    number = _int(value)
    return number if number is not None and number >= 0 else None  # sysfs says -1 for "none"


def _pci_entry(report: Report, bus_id: str | None) -> Mapping[str, Any]:
    entry = report["pci"].get(bus_id) if bus_id else None
    return entry if isinstance(entry, dict) else {}


def report_gpus(report: Report) -> tuple[Gpu, ...]:
    gpus = []
    for raw in report["gpus"]:
        bus = raw.get("pci_bus_id")
        pci = _pci_entry(report, bus)
        affinity = raw.get("cpu_affinity")
        pcie = raw.get("pcie") or {}
        gpus.append(Gpu(
            index=raw["index"], name=raw.get("name"), uuid=raw.get("uuid"), pci_bus_id=bus,
            numa_node=_numa(pci.get("numa_node")) if pci else _numa(raw.get("numa_node")),
            cpu_affinity=parse_cpu_list(affinity) if isinstance(affinity, str) and affinity else None,
            memory_total_bytes=_int(raw.get("memory_total_bytes")),
            compute_capability=raw.get("compute_capability"),
            pcie_generation=_int(pcie.get("max_gen")), pcie_width=_int(pcie.get("max_width")),
        ))
    return tuple(sorted(gpus, key=lambda g: g.index))


def _best_port(device: Mapping[str, Any]) -> Mapping[str, Any]:
    ports = [p for p in device.get("ports") or [] if isinstance(p, dict)]
    active = [p for p in ports if normalize_port_state(str(p.get("state") or "")) == "ACTIVE"]
    return (active or ports or [{}])[0]


def report_nics(report: Report) -> tuple[Nic, ...]:
    nics = []
    for device in (report.get("rdma") or {}).get("devices") or []:
        port = _best_port(device)
        nics.append(Nic(
            label=device["name"], name=device["name"], pci_bus_id=device.get("pci_bus_id"),
            numa_node=_numa(device.get("numa_node")), link_layer=port.get("link_layer"),
            rate_gbps=parse_rate_gbps(str(port["rate"])) if port.get("rate") else None,
            state=normalize_port_state(str(port["state"])) if port.get("state") else None,
        ))
    return tuple(nics)


def nvswitch_present(report: Report) -> bool | None:
    """True when a GPU's active NVLink ends at an NVSwitch; None when NVML gave no NVLink facts."""
    links = [link for g in report["gpus"] for link in g.get("nvlinks") or [] if link.get("active")]
    if not links:
        return None
    gpu_buses = {g.get("pci_bus_id") for g in report["gpus"]}
    return any(link.get("remote_type") == "nvswitch"
               or (link.get("remote_bus_id") and _norm(link["remote_bus_id"]) not in gpu_buses) for link in links)


def _norm(bus_id: str) -> str | None:
    try:
        return normalize_pci_bus_id(bus_id)
    except ValueError:
        return None


def _path_components(report: Report, bus_id: str | None) -> list[str]:
    path = _pci_entry(report, bus_id).get("path")
    if not isinstance(path, str) or not path.startswith("/sys/devices/"):
        return []
    return path[len("/sys/devices/"):].split("/")


def _pcie_label(report: Report, a_bus: str | None, b_bus: str | None, a_numa: int | None,
                b_numa: int | None) -> str:
    """The nvidia-smi class of the PCIe path between two devices, from their sysfs paths."""
    pa, pb = _path_components(report, a_bus), _path_components(report, b_bus)
    if not pa or not pb:
        return "?"
    if pa[0] != pb[0]:  # different root complexes
        single_numa = len(report.get("numa_nodes") or []) == 1
        if (a_numa is not None and a_numa == b_numa) or single_numa:
            return "NODE"
        return "SYS" if a_numa is not None and b_numa is not None else "?"
    common = 0
    while common + 1 < min(len(pa), len(pb)) and pa[common + 1] == pb[common + 1]:
        common += 1
    if common == 0:
        return "PHB"
    bridges = (len(pa) - 1 - common) + (len(pb) - 1 - common) + 1
    return "PIX" if bridges <= 3 else "PXB"


def _nvlink_lanes(report: Report) -> dict[tuple[int, int], int]:
    by_bus = {g.get("pci_bus_id"): g["index"] for g in report["gpus"]}
    switch_links = {g["index"]: 0 for g in report["gpus"]}
    directed: dict[tuple[int, int], int] = {}
    for gpu in report["gpus"]:
        for link in gpu.get("nvlinks") or []:
            if not link.get("active") or not link.get("remote_bus_id"):
                continue
            peer = by_bus.get(_norm(link["remote_bus_id"]))
            if peer is not None and link.get("remote_type") in (None, "gpu"):
                directed[(gpu["index"], peer)] = directed.get((gpu["index"], peer), 0) + 1
            else:
                switch_links[gpu["index"]] += 1
    # Each GPU counts its own ends of a direct bond; the two counts agree on a healthy node.
    lanes: dict[tuple[int, int], int] = {}
    for (x, y), count in directed.items():
        key = (min(x, y), max(x, y))
        lanes[key] = max(lanes.get(key, 0), count)
    switched = [i for i, n in switch_links.items() if n]
    for x in switched:
        for y in switched:
            if x < y:
                lanes[(x, y)] = lanes.get((x, y), 0) + min(switch_links[x], switch_links[y])
    return lanes


def _matrix_from_sysfs(report: Report, gpus: Sequence[Gpu], nics: Sequence[Nic]) -> tuple[tuple[str, ...], ...]:
    lanes = _nvlink_lanes(report)
    ends: list[tuple[str | None, int | None, int | None]] = [(g.pci_bus_id, g.numa_node, g.index) for g in gpus]
    ends += [(n.pci_bus_id, n.numa_node, None) for n in nics]
    rows = []
    for i, (a_bus, a_numa, a_gpu) in enumerate(ends):
        row = []
        for j, (b_bus, b_numa, b_gpu) in enumerate(ends):
            if i == j:
                row.append("X")
            elif a_gpu is not None and b_gpu is not None and lanes.get((min(a_gpu, b_gpu), max(a_gpu, b_gpu))):
                row.append(f"NV{lanes[(min(a_gpu, b_gpu), max(a_gpu, b_gpu))]}")
            else:
                row.append(_pcie_label(report, a_bus, b_bus, a_numa, b_numa))
        rows.append(tuple(row))
    return tuple(rows)


def node_from_report(report: Report, where: str = "") -> Node:
    """The topology of one probed node. ``report`` must have passed :func:`validate_report`."""
    gpus = report_gpus(report)
    rdma_nics = report_nics(report)
    missing = [f"{m.get('what')}: {m.get('why')}" for m in report["missing"] if isinstance(m, dict)]
    numa_cpus = {}
    for numa in report.get("numa_nodes") or []:
        if isinstance(numa, dict) and isinstance(numa.get("cpulist"), str) and numa["cpulist"]:
            numa_cpus[int(numa["id"])] = parse_cpu_list(numa["cpulist"])
    topo_text = _tool_stdout(report, "topo_m")
    nics: tuple[Nic, ...] = rdma_nics
    matrix: tuple[tuple[str, ...], ...] = ()
    source = "probe (NVML + sysfs)"
    if topo_text is not None and gpus:
        try:
            topo_node = node_from_topo_matrix(parse_topo_matrix(topo_text, f"{where or report['hostname']}: topo -m"))
        except ParseError as exc:
            missing.append(f"nvidia-smi topo -m output unreadable: {exc.message}")
        else:
            if [g.index for g in topo_node.gpus] == [g.index for g in gpus]:
                by_name = {n.name: n for n in rdma_nics if n.name}
                # Keep the topo -m column labels, enriched with what sysfs says about the same device.
                nics = tuple(replace(by_name[t.name], label=t.label) if t.name in by_name else t
                             for t in topo_node.nics)
                matrix, source = topo_node.matrix, "probe (NVML + nvidia-smi topo -m)"
                missing.extend(topo_node.missing)
                unlisted = sorted(set(by_name) - {n.name for n in nics if n.name})
                if unlisted:
                    missing.append(f"RDMA devices not in topo -m: {', '.join(unlisted)}")
            else:
                missing.append("nvidia-smi topo -m lists other GPUs than NVML; using sysfs paths instead")
    if not matrix and gpus:
        matrix = _matrix_from_sysfs(report, gpus, nics)
    if not gpus:
        nics, matrix = (), ()  # a node without GPUs has no GPU topology to show
    return Node(hostname=report["hostname"], gpus=gpus, nics=nics, matrix=matrix, source=source,
                missing=tuple(missing), nvswitch=nvswitch_present(report), numa_cpus=numa_cpus)
