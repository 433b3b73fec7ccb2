"""Doctor facts built from real captured machine output (tests/fixtures/probe, tests/fixtures/misc).

Faults that no capture shows are made by editing one value of a real capture, in the test that
needs it, with :func:`edit_section` (text) or plain dict edits (probe reports).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from fstrain.core.doctor.facts import DoctorFacts, HostFacts, interfaces_from_report
from fstrain.core.parsers.ibstat import parse_ib_text
from fstrain.core.parsers.nvidia_smi_q import gpu_health, parse_nvidia_smi_q
from fstrain.core.parsers.probe_report import validate_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PROBE = FIXTURES / "probe"
MISC = FIXTURES / "misc"
H100_Q = MISC / "nvidia-smi-q_h100-8x_driver535.161.08_gpud.txt"
A10_Q = MISC / "nvidia-smi-q_a10-1x_driver535.129.03_gpud.txt"
TITANV_Q = MISC / "nvidia-smi-q_titanv-1x_driver560.35.03_gpud.txt"
V100_Q = MISC / "nvidia-smi-q_v100-pcie-32gb_driver410.48_microway-excerpt-1-of-4-gpus.txt"
SIMAI = PROBE / "simai-2a100-nvswitch-2bond.json"
NCCL2397 = PROBE / "nccl2397-a100-pcie-2x-cx6dx.json"


def probe_report(path: Path, hostname: str | None = None) -> dict[str, Any]:
    """A recorded probe report, validated like a live one; ``hostname`` renames the node."""
    data = json.loads(path.read_text())
    if hostname:
        data["hostname"] = hostname
    return dict(validate_report(data, where=str(path)))


def report_from_nvidia_smi_q(text: str, hostname: str) -> dict[str, Any]:
    """The report the probe makes on a node without pynvml: GPUs from ``nvidia-smi -q`` (real text)."""
    parsed = parse_nvidia_smi_q(text)
    gpus = []
    for index, section in enumerate(parsed.gpus):
        gpu = dict(gpu_health(section))
        gpu["index"] = index
        gpus.append(gpu)
    return dict(validate_report({
        "schema": "fstrain-probe", "schema_version": 1, "hostname": hostname, "gpus": gpus,
        "gpu_source": "nvidia-smi", "gpu_source_reason": "pynvml is not importable", "missing": [], "pci": {},
        "driver_version": parsed.driver_version, "nvidia_smi": {"q": {"exit_code": 0, "stdout": text, "error": None}},
        "nvidia_pci_devices": [g["pci_bus_id"] for g in gpus], "env": {}, "interfaces": [],
        "software": {"python": "3.11.7", "torch": "2.4.0+cu121", "torch_cuda": "12.1", "nccl": "2.20.5"},
    }))


def edit_section(text: str, bus_id: str, old: str, new: str) -> str:
    """Replace ``old`` by ``new`` once, inside the ``nvidia-smi -q`` section of GPU ``bus_id``."""
    head = f"GPU {bus_id}"
    start = text.index(head)
    following = text.find("\nGPU ", start + len(head))
    end = following if following != -1 else len(text)
    section = text[start:end]
    assert old in section, f"{old!r} not in the section of {bus_id}"
    return text[:start] + section.replace(old, new, 1) + text[end:]


def rdma_from_ib_text(path: Path) -> list[dict[str, Any]]:
    """``ibstat``/``ibv_devinfo`` output (real) as the probe's ``rdma.devices`` (sysfs spellings)."""
    devices = []
    for device in parse_ib_text(path.read_text(), str(path)):
        ports = [{"port": p.port, "state": f"{4 if p.state == 'ACTIVE' else 1}: {p.state}",
                  "phys_state": p.physical_state, "rate": f"{p.rate_gbps:g} Gb/sec" if p.rate_gbps else None,
                  "link_layer": p.link_layer} for p in device.ports]
        devices.append({"name": device.name, "hca_type": device.ca_type, "ports": ports})
    return devices


def host(name: str, report: dict[str, Any] | None, **extra: Any) -> HostFacts:
    interfaces = interfaces_from_report(report) if report is not None else None
    extra.setdefault("probe_python", "python3")
    return HostFacts(name, report=copy.deepcopy(report), interfaces=interfaces, **extra)


def facts(*hosts: HostFacts, **extra: Any) -> DoctorFacts:
    return DoctorFacts(hosts=tuple(hosts), **extra)


def minimal_report(hostname: str, **fields: Any) -> dict[str, Any]:
    """A GPU-less node as this machine's probe reports it (shape of docs/topology.md's example)."""
    report: dict[str, Any] = {
        "schema": "fstrain-probe", "schema_version": 1, "hostname": hostname, "gpus": [], "gpu_source": "none",
        "gpu_source_reason": "no NVIDIA GPU on the PCI bus", "missing": [], "pci": {}, "env": {},
        "hostname_resolves_to": ["198.18.0.11"],
        "interfaces": [{"name": "lo", "addresses": ["127.0.0.1/8", "::1/128"], "mtu": 65536, "state": "unknown"},
                       {"name": "eth0", "addresses": ["198.18.0.11/24"], "mtu": 1500, "state": "up"}],
        "software": {"python": "3.11.7", "python_executable": "/usr/bin/python3", "torch": "2.13.0+cpu",
                     "torch_cuda": None, "deepspeed": "0.19.8"},
        "ulimits": {"memlock_bytes": {"hard": 8388608, "soft": 8388608}, "nofile": {"hard": 20000, "soft": 20000}},
        "dev_shm": {"total_bytes": 25 << 30, "free_bytes": 25 << 30},
        "rdma": {"devices": [], "nvidia_peermem_loaded": False},
    }
    report.update(fields)
    return dict(validate_report(report))
