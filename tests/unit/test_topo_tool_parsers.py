"""The probe's fallback text: --query-gpu csv, ibstat/ibstatus/ibv_devinfo, nvidia-smi -q (real captures)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from fstrain.core.parsers.ibstat import normalize_guid, normalize_port_state, parse_ib_text, parse_rate_gbps
from fstrain.core.parsers.nvidia_smi_q import gpu_health, parse_nvidia_smi_q
from fstrain.core.parsers.query_gpu import gpus_from_query, parse_query_gpu
from fstrain.errors import ParseError

MISC = Path(__file__).resolve().parent.parent / "fixtures" / "misc"
IB_EXPECTED = {k: v for k, v in json.loads((MISC / "expected-ib.json").read_text()).items() if not k.startswith("_")}


def test_query_gpu_csv_with_units() -> None:
    rows = parse_query_gpu((MISC / "nvidia-smi-query-gpu-csv_a100-sxm4-80gb-4x.csv").read_text())
    assert [r["index"] for r in rows] == ["0", "1", "2", "3"]
    assert rows[0]["memory.total"] == "81920"
    gpus = gpus_from_query(rows)
    assert {g.name for g in gpus} == {"NVIDIA A100-SXM4-80GB"}
    assert gpus[3].memory_total_bytes == 81920 * 2**20
    assert gpus[0].compute_capability == "8.0"


def test_query_gpu_noheader_nounits_and_na() -> None:
    text = ("0, NVIDIA H100 80GB HBM3, 00000000:19:00.0, 81559, [N/A]\n"
            "1, NVIDIA H100 80GB HBM3, 00000000:3B:00.0, 81559, 9.0\n")
    rows = parse_query_gpu(text, fields=["index", "name", "pci.bus_id", "memory.total", "compute_cap"])
    assert rows[0]["compute_cap"] is None
    gpus = gpus_from_query(rows)
    assert [g.pci_bus_id for g in gpus] == ["0000:19:00.0", "0000:3b:00.0"]
    assert gpus[1].memory_total_bytes == 81559 * 2**20


def test_query_gpu_cut_output_names_the_line() -> None:
    text = (MISC / "nvidia-smi-query-gpu-csv_a100-sxm4-80gb-4x.csv").read_text() + "4, NVIDIA A100-SXM4\n"
    with pytest.raises(ParseError) as info:
        parse_query_gpu(text, source="q.csv")
    assert info.value.where == "q.csv:6"


@pytest.mark.parametrize("name", sorted(IB_EXPECTED))
def test_ib_tools(name: str) -> None:
    expected = IB_EXPECTED[name]
    devices = parse_ib_text((MISC / name).read_text(), name)
    ports = [p for d in devices for p in d.ports]
    assert len(devices) == expected["devices"]
    assert sum(1 for p in ports if p.state == "ACTIVE") == expected["active_ports"]
    assert dict(Counter(str(p.rate_gbps) for p in ports)) == expected["rates"]
    assert dict(Counter(p.link_layer for p in ports)) == expected["link_layers"]
    if "down" in expected:
        assert sorted(d.name for d in devices if not d.active_ports) == expected["down"]
    if "names" in expected:
        assert [d.name for d in devices] == expected["names"]
    if "first" in expected:
        first = devices[0]
        got = {k: getattr(first, k) for k in expected["first"]}
        assert got == expected["first"]


def test_ib_helpers_accept_every_spelling() -> None:
    for text in ("Active", "4: ACTIVE", "PORT_ACTIVE (4)"):
        assert normalize_port_state(text) == "ACTIVE"
    assert parse_rate_gbps("400 Gb/sec (4X NDR)") == 400.0
    assert normalize_guid("9803:9b03:00dc:cab0") == normalize_guid("0x98039B0300DCCAB0") == "0x98039b0300dccab0"
    with pytest.raises(ParseError, match="not ibstat"):
        parse_ib_text("hello", "x")


def test_nvidia_smi_q_new_and_old_drivers() -> None:
    a10 = parse_nvidia_smi_q((MISC / "nvidia-smi-q_a10-1x_driver535.129.03_gpud.txt").read_text())
    assert (a10.driver_version, a10.cuda_version, a10.attached_gpus, a10.warnings) == ("535.129.03", "12.2", 1, ())
    facts = gpu_health(a10.gpus[0])
    assert facts["name"] == "NVIDIA A10"
    assert facts["pci_bus_id"] == "0000:07:00.0"
    assert facts["memory_total_bytes"] == 23028 * 2**20
    assert facts["remapped_rows"] == {"correctable": 0, "uncorrectable": 4, "pending": True, "failure": False}
    assert facts["throttle_reasons"] == ["Idle"]
    assert facts["temperature_c"] == 33
    v100 = parse_nvidia_smi_q((MISC / "nvidia-smi-q_v100-pcie-32gb_driver410.48_microway-excerpt-1-of-4-gpus.txt")
                              .read_text())
    # The article printed one GPU of four: the parser says so instead of pretending.
    assert v100.attached_gpus == 4 and len(v100.gpus) == 1 and v100.warnings
    old = gpu_health(v100.gpus[0])
    assert old["retired_pages"] == {"single_bit": 0, "double_bit": 0, "pending": False}
    assert old["ecc"] == {"mode": "Enabled", "volatile_corrected": 0, "volatile_uncorrected": 0,
                          "aggregate_corrected": 0, "aggregate_uncorrected": 0}
    assert old["throttle_reasons"] == []
    assert [p["pid"] for p in old["processes"]] == [315406]  # type: ignore[union-attr]


def test_nvidia_smi_q_eight_gpus() -> None:
    q = parse_nvidia_smi_q((MISC / "nvidia-smi-q_h100-8x_driver535.161.08_gpud.txt").read_text())
    assert q.attached_gpus == len(q.gpus) == 8
    buses = [gpu_health(g)["pci_bus_id"] for g in q.gpus]
    assert buses[:2] == ["0000:19:00.0", "0000:3b:00.0"]
    assert all(gpu_health(g)["name"] == "NVIDIA H100 80GB HBM3" for g in q.gpus)


def test_nvidia_smi_q_rejects_other_text() -> None:
    with pytest.raises(ParseError):
        parse_nvidia_smi_q((MISC / "nvidia-smi-query-gpu-csv_a100-sxm4-80gb-4x.csv").read_text(), "csv")
