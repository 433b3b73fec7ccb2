"""Parse ``nvidia-smi -q``: the health facts the probe needs when NVML (pynvml) is not importable.

The output is an indented tree (4 spaces a level) of ``Key : value`` lines and section titles;
a key can carry a value and children at once (``Process ID : 1234`` with its ``Name`` below).
:func:`parse_nvidia_smi_q` keeps that tree; :func:`gpu_health` reads the facts that matter from one
GPU section, across driver generations (``Clocks Throttle Reasons`` became ``Clocks Event
Reasons``; ECC ``Single/Double Bit`` became ``SRAM/DRAM Correctable/Uncorrectable``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from fstrain.core.topo.topology import normalize_pci_bus_id
from fstrain.errors import ParseError

_NA = {"N/A", "[N/A]", "Not Supported", "[Not Supported]", ""}


@dataclass
class Entry:
    """One line of the tree: ``key``, its ``value`` (None for a bare title) and nested entries."""

    key: str
    value: str | None
    children: list[Entry] = field(default_factory=list)

    def find(self, *path: str) -> Entry | None:
        """The first entry down ``path`` (keys compared case-insensitively)."""
        node: Entry | None = self
        for key in path:
            assert node is not None
            node = next((c for c in node.children if c.key.lower() == key.lower()), None)
            if node is None:
                return None
        return node

    def value_at(self, *path: str) -> str | None:
        node = self.find(*path)
        return None if node is None or node.value in _NA else node.value

    def walk(self) -> Iterator[Entry]:
        for child in self.children:
            yield child
            yield from child.walk()


@dataclass(frozen=True)
class NvidiaSmiQ:
    driver_version: str | None
    cuda_version: str | None
    attached_gpus: int | None
    gpus: tuple[Entry, ...]  # one section per GPU, key "GPU", value = its bus id as printed
    warnings: tuple[str, ...]


def parse_nvidia_smi_q(text: str, source: str = "<nvidia-smi -q>") -> NvidiaSmiQ:
    root = Entry("", None)
    stack: list[tuple[int, Entry]] = [(-1, root)]
    for number, raw in enumerate(text.replace("\r", "").split("\n"), 1):
        line = raw.rstrip()
        if not line.strip() or line.startswith("="):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent % 4:
            raise ParseError(f"indent of {indent} spaces is not a multiple of 4",
                             hint="pass the unmodified output of `nvidia-smi -q`", where=f"{source}:{number}")
        if indent == 0 and re.fullmatch(r"GPU [0-9A-Fa-f]+:[0-9A-Fa-f:.]+", line.strip()):
            entry = Entry("GPU", line.strip()[4:])  # a GPU section: "GPU 00000000:07:00.0"
        else:
            key, sep, value = line.strip().partition(" : ") if " : " in line else line.strip().partition(":")
            entry = Entry(key.strip(), value.strip() if sep else None)
        while stack[-1][0] >= indent:
            stack.pop()
        stack[-1][1].children.append(entry)
        stack.append((indent, entry))
    gpus = tuple(c for c in root.children if c.key == "GPU")
    if not gpus and root.value_at("Attached GPUs") is None:
        raise ParseError("no GPU section and no 'Attached GPUs' line", hint="pass the output of `nvidia-smi -q`",
                         where=source)
    attached_text = root.value_at("Attached GPUs")
    attached = int(attached_text) if attached_text and attached_text.isdigit() else None
    warnings = []
    if attached is not None and attached != len(gpus):
        warnings.append(f"'Attached GPUs : {attached}' but {len(gpus)} GPU section(s): the output is an excerpt "
                        "or was cut")
    return NvidiaSmiQ(root.value_at("Driver Version"), root.value_at("CUDA Version"), attached, gpus,
                      tuple(warnings))


def _number(text: str | None) -> int | None:
    if text is None:
        return None
    head = text.split()[0].rstrip("x")
    return int(head) if head.isdigit() else None


def _mib_bytes(text: str | None) -> int | None:
    n = _number(text)
    return None if n is None else n * 2**20


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _ecc_counts(gpu: Entry, scope: str) -> tuple[int | None, int | None]:
    """(corrected, uncorrected) errors for ``Volatile`` or ``Aggregate``, old and new spelling."""
    node = gpu.find("ECC Errors", scope)
    if node is None:
        return None, None
    if node.find("Single Bit") is not None:
        return _number(node.value_at("Single Bit", "Total")), _number(node.value_at("Double Bit", "Total"))
    corrected = [_number(c.value) for c in node.children if c.key.endswith(" Correctable")]
    uncorrected = [_number(c.value) for c in node.children if c.key.endswith(" Uncorrectable")]
    return _sum(corrected), _sum(uncorrected)


def gpu_health(gpu: Entry) -> dict[str, object]:
    """The probe's per-GPU facts from one ``-q`` GPU section (None where nvidia-smi says N/A)."""
    reasons_node = gpu.find("Clocks Event Reasons") or gpu.find("Clocks Throttle Reasons")
    active = sorted(e.key for e in (reasons_node.walk() if reasons_node else ()) if e.value == "Active")
    vol_c, vol_u = _ecc_counts(gpu, "Volatile")
    agg_c, agg_u = _ecc_counts(gpu, "Aggregate")
    processes = []
    process_list = gpu.find("Processes")
    for entry in process_list.children if process_list is not None else []:
        if entry.key == "Process ID" and entry.value and entry.value.isdigit():
            processes.append({"pid": int(entry.value), "name": entry.value_at("Name"),
                              "used_memory_bytes": _mib_bytes(entry.value_at("Used GPU Memory"))})
    bus = gpu.value_at("PCI", "Bus Id") or gpu.value
    return {
        "name": gpu.value_at("Product Name"),
        "uuid": gpu.value_at("GPU UUID"),
        "pci_bus_id": normalize_pci_bus_id(bus) if bus else None,
        "memory_total_bytes": _mib_bytes(gpu.value_at("FB Memory Usage", "Total")),
        "memory_free_bytes": _mib_bytes(gpu.value_at("FB Memory Usage", "Free")),
        "pcie": {"max_gen": _number(gpu.value_at("PCI", "GPU Link Info", "PCIe Generation", "Max")),
                 "cur_gen": _number(gpu.value_at("PCI", "GPU Link Info", "PCIe Generation", "Current")),
                 "max_width": _number(gpu.value_at("PCI", "GPU Link Info", "Link Width", "Max")),
                 "cur_width": _number(gpu.value_at("PCI", "GPU Link Info", "Link Width", "Current"))},
        "ecc": {"mode": gpu.value_at("ECC Mode", "Current") or gpu.value_at("Ecc Mode", "Current"),
                "volatile_corrected": vol_c, "volatile_uncorrected": vol_u,
                "aggregate_corrected": agg_c, "aggregate_uncorrected": agg_u},
        "retired_pages": {"single_bit": _number(gpu.value_at("Retired Pages", "Single Bit ECC")),
                          "double_bit": _number(gpu.value_at("Retired Pages", "Double Bit ECC")),
                          "pending": _yes(gpu.value_at("Retired Pages", "Pending Page Blacklist")
                                          or gpu.value_at("Retired Pages", "Pending"))},
        "remapped_rows": {"correctable": _number(gpu.value_at("Remapped Rows", "Correctable Error")),
                          "uncorrectable": _number(gpu.value_at("Remapped Rows", "Uncorrectable Error")),
                          "pending": _yes(gpu.value_at("Remapped Rows", "Pending")),
                          "failure": _yes(gpu.value_at("Remapped Rows", "Remapping Failure Occurred"))},
        "throttle_reasons": active,
        "temperature_c": _number(gpu.value_at("Temperature", "GPU Current Temp")),
        "processes": processes,
    }


def _yes(text: str | None) -> bool | None:
    return None if text is None else text.strip().lower() == "yes"
