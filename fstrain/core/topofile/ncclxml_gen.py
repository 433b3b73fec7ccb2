"""Generate the NCCL topology XML (``NCCL_TOPO_FILE``) for a node from what fstrain knows of it.

:func:`xml_from_report` rebuilds, from a probe report, the tree NCCL itself would detect: the same
walk up sysfs (a PCI switch is kept as its upstream port, two levels at a time, until the root
complex becomes the ``<cpu>``), the same attributes and value spellings, children sorted by bus id.
Where NCCL lets the file win over detection, a wrong value would silently change NCCL's behaviour,
so values the probe cannot know exactly are left out for NCCL to fill: ``maxconn`` (the HCA's
queue-pair limit), ``gdr`` when ``nvidia_peermem`` is not loaded (``gdr="0"`` would disable
GPUDirect RDMA even where DMA-BUF provides it), ``latency`` and ``host_hash``.

:func:`xml_from_topo_matrix` does what can be done from an ``nvidia-smi topo -m`` paste alone:
NCCL matches every element by PCI bus id, which topo -m does not print, so the file holds the
NUMA layout as comments and ``<cpu>`` elements, and :attr:`GeneratedXml.missing` says the rest.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fstrain.core.parsers.ibstat import normalize_port_state, parse_rate_gbps
from fstrain.core.parsers.probe_report import Report, node_from_report
from fstrain.core.parsers.topo_matrix import TopoMatrix, node_from_topo_matrix
from fstrain.core.topo.ncclxml import CPU_CLASS, NO_TARGET, NVSWITCH_CLASS, XmlElement, render_nccl_xml
from fstrain.core.topo.topology import closest_nics, format_cpu_list, normalize_pci_bus_id, shape_hash
from fstrain.errors import ConfigError

_BDF = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]")  # NCCL's checkBDFFormat
_ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64",
         "ppc64": "ppc64"}


@dataclass(frozen=True)
class GeneratedXml:
    text: str
    missing: tuple[str, ...]  # what the file leaves out and why, in words
    name: str  # the <system name>, logged by NCCL as "Loading topology <name>"


def _pci(report: Report, bus_id: str) -> Mapping[str, Any]:
    entry = report["pci"].get(bus_id)
    return entry if isinstance(entry, dict) else {}


def _components(report: Report, bus_id: str) -> list[str]:
    path = _pci(report, bus_id).get("path")
    if not isinstance(path, str):
        return []
    parts = path.rstrip("/").split("/")
    return parts[3:] if parts[:3] == ["", "sys", "devices"] else parts


def _speed_value(text: object) -> float:
    match = re.match(r"\s*([0-9.]+)\s*GT/s", text) if isinstance(text, str) else None
    return float(match.group(1)) if match else float("inf")


def _width(text: object) -> int:
    try:
        return int(str(text), 0)
    except ValueError:
        return 0  # NCCL's strtol("") is 0: a missing width ends up "0" (read as x16)


def _pci_attrs(report: Report, bus_id: str, port_id: str | None, fallback_class: str) -> dict[str, str]:
    """The attributes NCCL's sysfs walk gives a pci node, in the order NCCL writes them."""
    dev, port = _pci(report, bus_id), _pci(report, port_id) if port_id else {}
    attrs = {"busid": bus_id, "class": dev.get("class") or fallback_class}
    for key in ("vendor", "device", "subsystem_vendor", "subsystem_device"):
        if dev.get(key):
            attrs[key] = str(dev[key])
    # NCCL takes the slower of the device and its upstream port, by the number before "GT/s".
    dev_speed, port_speed = dev.get("max_link_speed"), port.get("max_link_speed")
    chosen = port_speed if _speed_value(port_speed) < _speed_value(dev_speed) else dev_speed
    attrs["link_speed"] = str(chosen) if chosen else ""
    attrs["link_width"] = str(min(_width(dev.get("max_link_width")), _width(port.get("max_link_width"))))
    return attrs


@dataclass
class _Builder:
    report: Report
    missing: list[str]
    cpus: dict[str, XmlElement]
    pcis: dict[str, XmlElement]

    def cpu(self, numaid: str) -> XmlElement:
        if numaid not in self.cpus:
            self.cpus[numaid] = XmlElement("cpu", _cpu_attrs(self.report, numaid, self.missing))
        return self.cpus[numaid]

    def place(self, bus_id: str, fallback_class: str) -> XmlElement:
        """The pci element of a device, linked under its parents (created on the way up)."""
        if bus_id in self.pcis:
            return self.pcis[bus_id]
        parts = _components(self.report, bus_id)
        if not parts:
            self.missing.append(f"sysfs path of {bus_id}: NCCL will place it from its own detection")
            element = XmlElement("pci", {"busid": bus_id, "class": fallback_class})
            self.pcis[bus_id] = element
            _insert_sorted(self.cpu("-1"), element)
            return element
        return self._place_path(parts, fallback_class)

    def _place_path(self, parts: list[str], fallback_class: str) -> XmlElement:
        bus_id = parts[-1].lower()
        if bus_id in self.pcis:
            return self.pcis[bus_id]
        port = parts[-2].lower() if len(parts) >= 2 and _BDF.fullmatch(parts[-2]) else None
        element = XmlElement("pci", _pci_attrs(self.report, bus_id, port, fallback_class))
        self.pcis[bus_id] = element
        # NCCL goes up two levels (skipping the switch's downstream port) while both are PCI devices.
        if len(parts) >= 3 and _BDF.fullmatch(parts[-2]) and _BDF.fullmatch(parts[-3]):
            parent = self._place_path(parts[:-2], "0x060400")
        else:
            numa = _pci(self.report, bus_id).get("numa_node")
            parent = self.cpu(str(numa) if numa not in (None, "") else "-1")
        _insert_sorted(parent, element)
        return element


def _insert_sorted(parent: XmlElement, child: XmlElement) -> None:
    """NCCL keeps pci children ordered by bus id (issue #820); other children keep their order."""
    key = child.attrs.get("busid", "")
    for pos, other in enumerate(parent.children):
        if other.name == "pci" and key < other.attrs.get("busid", ""):
            parent.children.insert(pos, child)
            return
    parent.children.append(child)


def _cpu_attrs(report: Report, numaid: str, missing: list[str]) -> dict[str, str]:
    attrs = {"numaid": numaid}
    for numa in report.get("numa_nodes") or []:
        if isinstance(numa, dict) and str(numa.get("id")) == numaid and numa.get("cpumap"):
            attrs["affinity"] = str(numa["cpumap"])  # sysfs cpumap, verbatim: what NCCL reads
    cpu = report.get("cpu") or {}
    arch = _ARCH.get(str(cpu.get("arch")))
    if arch is None:
        missing.append(f"CPU architecture {cpu.get('arch')!r} is not one NCCL knows: left for NCCL to detect")
        return attrs
    attrs["arch"] = arch
    if arch == "x86_64":
        if cpu.get("vendor"):
            attrs["vendor"] = str(cpu["vendor"])
        family, model = cpu.get("family"), cpu.get("model_id")
        if isinstance(family, int) and isinstance(model, int):
            # NCCL adds the extended family shifted by 4 (AMD Zen 2: 0xF + (8 << 4) = 143), where
            # /proc/cpuinfo adds it plainly (23); the model numbers agree.
            attrs["familyid"] = str(family if family < 15 else 15 + ((family - 15) << 4))
            attrs["modelid"] = str(model)
    return attrs


def _sm(compute_capability: object) -> str | None:
    match = re.fullmatch(r"(\d+)\.(\d)", str(compute_capability))
    return str(int(match.group(1)) * 10 + int(match.group(2))) if match else None


def _gpu_element(report: Report, gpu: Mapping[str, Any], gpu_buses: Mapping[str, Any],
                 peermem: bool, missing: list[str]) -> XmlElement:
    attrs = {"dev": str(gpu["index"])}
    sm = _sm(gpu.get("compute_capability"))
    if sm:
        attrs["sm"] = sm
    else:
        missing.append(f"GPU{gpu['index']} compute capability: NCCL fills sm itself")
    attrs["rank"] = str(gpu["index"])  # NCCL overwrites rank with the process's own
    if peermem:
        attrs["gdr"] = "1"
    element = XmlElement("gpu", attrs)
    links = gpu.get("nvlinks")
    if links is None:
        missing.append(f"GPU{gpu['index']} NVLinks (not probed: pynvml missing); NCCL detects them")
        return element
    targets: dict[str, list[Any]] = {}
    for link in links:
        if not link.get("active"):
            continue
        remote = link.get("remote_bus_id")
        try:
            target = normalize_pci_bus_id(remote) if remote else NO_TARGET
        except ValueError:
            target = NO_TARGET
        targets.setdefault(target, []).append(link)
    for target, group in targets.items():
        kind = group[0].get("remote_type")
        if target in gpu_buses or kind == "gpu":
            tclass = str(_pci(report, target).get("class") or "0x030200")
        elif kind == "ibmnpu":
            tclass = CPU_CLASS  # POWER9: the NVLink ends at the CPU
        else:
            tclass = NVSWITCH_CLASS  # what NCCL assumes for a target it cannot classify
        element.children.append(XmlElement("nvlink", {"target": target, "count": str(len(group)),
                                                      "tclass": tclass}))
    return element


def _ib_guid(sys_image_guid: object) -> str | None:
    """NCCL prints the verbs ``sys_image_guid`` (big-endian) as a host integer: reverse the bytes."""
    digits = str(sys_image_guid or "").replace(":", "").lower().removeprefix("0x")
    if not re.fullmatch(r"[0-9a-f]{16}", digits):
        return None
    return f"0x{int.from_bytes(bytes.fromhex(digits), 'little'):x}"


def _add_nics(builder: _Builder, report: Report, node_specific: bool, peermem: bool) -> None:
    devices = [d for d in (report.get("rdma") or {}).get("devices") or [] if isinstance(d, dict)]
    devices.sort(key=lambda d: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(d.get("name")))])
    by_function0: dict[str, int] = {}
    dev_index = 0
    for device in devices:
        ports = [p for p in device.get("ports") or [] if normalize_port_state(str(p.get("state") or "")) == "ACTIVE"]
        bus_id = device.get("pci_bus_id")
        if not ports:
            builder.missing.append(f"{device.get('name')}: no ACTIVE port, so NCCL will not use it (left out)")
            continue
        if not bus_id:
            builder.missing.append(f"{device.get('name')}: not a PCI device; NCCL attaches it to the first CPU")
            continue
        # NCCL merges the ports (PCI functions) of one NIC into function 0.
        function0 = str(bus_id)[:-1] + "0"
        real_port = by_function0.get(function0, 0)
        by_function0[function0] = real_port + 1
        pci = builder.place(function0, "0x020000")
        nic = next((c for c in pci.children if c.name == "nic"), None)
        if nic is None:
            nic = XmlElement("nic")
            pci.children.append(nic)
        port = ports[0]
        attrs = {"name": str(device["name"]), "dev": str(dev_index)}
        rate = parse_rate_gbps(str(port.get("rate") or ""))
        if rate:
            attrs["speed"] = str(int(rate * 1000))
        attrs["port"] = str(int(port.get("port") or 1) + real_port)
        guid = _ib_guid(device.get("sys_image_guid"))
        if node_specific and guid:
            attrs["guid"] = guid
        if peermem:
            attrs["gdr"] = "1"
        nic.children.append(XmlElement("net", attrs))
        dev_index += 1
        if len(ports) > 1:
            builder.missing.append(f"{device['name']}: only port {port.get('port')} is written; NCCL adds the others")


def xml_from_report(report: Report, *, node_specific: bool = True, name: str | None = None) -> GeneratedXml:
    """The NCCL topology file for a probed node (``report`` as :func:`validate_report` returns it).

    ``node_specific=False`` leaves out per-node identities (NIC GUIDs) so that one file can serve
    every node of the same shape.
    """
    hostname = str(report.get("hostname"))
    gpus = sorted(report["gpus"], key=lambda g: g["index"])
    if not gpus:
        raise ConfigError(f"no GPU ({report.get('gpu_source_reason') or 'the probe found none'}): "
                          "there is nothing for NCCL to read", hint="run on a GPU node", where=hostname)
    missing: list[str] = []
    builder = _Builder(report, missing, {}, {})
    rdma = report.get("rdma") or {}
    peermem = bool(rdma.get("nvidia_peermem_loaded"))
    if not peermem:
        missing.append("gdr: nvidia_peermem is not loaded, so GPUDirect RDMA is left for NCCL to decide "
                       "(DMA-BUF may still provide it)")
    gpu_buses = {g["pci_bus_id"]: g for g in gpus if g.get("pci_bus_id")}
    for gpu in gpus:
        bus = gpu.get("pci_bus_id")
        if not bus:
            missing.append(f"GPU{gpu['index']} PCI bus id: GPU left out")
            continue
        pci = builder.place(bus, "0x03")
        pci.children.append(_gpu_element(report, gpu, gpu_buses, peermem, missing))
    _add_nics(builder, report, node_specific, peermem)
    label = name or (f"fstrain {hostname}" if node_specific else
                     f"fstrain shape {shape_hash(node_from_report(report))}")
    system = XmlElement("system", {"version": "1", "name": label})
    system.children = [builder.cpus[k] for k in sorted(builder.cpus, key=lambda k: (int(k) < 0, int(k)))]
    return GeneratedXml(render_nccl_xml(system), tuple(missing), label)


PASTE_MISSING = (
    "PCI bus ids of the GPUs and NICs: topo -m does not print them, and NCCL matches every <pci> and "
    "<gpu> by bus id, so none can be written",
    "the PCIe switch tree, link speeds and widths",
    "CPU arch, vendor, family and model",
    "GPU compute capability (sm) and NVLink targets",
    "NIC speeds, ports and GUIDs",
)


def xml_from_topo_matrix(topo: TopoMatrix) -> GeneratedXml:
    """What an ``nvidia-smi topo -m`` paste can give NCCL: ``<cpu numaid>`` per NUMA node, notes."""
    node = node_from_topo_matrix(topo)
    system = XmlElement("system", {"version": "1", "name": f"fstrain paste {shape_hash(node)}"})
    by_numa: dict[int, list[int]] = {}
    unplaced = []
    for gpu in node.gpus:
        if gpu.numa_node is None:
            unplaced.append(gpu.label)
        else:
            by_numa.setdefault(gpu.numa_node, []).append(gpu.index)
    for numa in sorted(by_numa):
        notes = []
        for index in by_numa[numa]:
            gpu = node.gpu(index)
            names, cls = closest_nics(node, index)
            affinity = format_cpu_list(gpu.cpu_affinity) if gpu.cpu_affinity else "unknown"
            nic_note = f", nearest NIC {'/'.join(names)} ({cls.value})" if names and cls else ""
            notes.append(f"GPU{index} CPUs {affinity}{nic_note}")
        # The CPU affinity column is the view of the process that ran nvidia-smi (a cgroup may
        # narrow it), so it goes in a comment, not in the affinity attribute NCCL would pin with.
        system.children.append(XmlElement("cpu", {"numaid": str(numa)},
                                          comment=f"from nvidia-smi topo -m: {'; '.join(notes)}"))
    missing = list(PASTE_MISSING) + list(topo.warnings)
    if unplaced:
        missing.append(f"NUMA node of {', '.join(unplaced)}")
    return GeneratedXml(render_nccl_xml(system), tuple(missing), system.attrs["name"])


def distinct_shapes(reports: Sequence[Report]) -> list[tuple[str, list[Report]]]:
    """Reports grouped by node shape (the hash of :func:`fstrain.core.topo.topology.node_shape`)."""
    groups: dict[str, list[Report]] = {}
    for report in reports:
        groups.setdefault(shape_hash(node_from_report(report)), []).append(report)
    return sorted(groups.items(), key=lambda kv: -len(kv[1]))
