"""`fstrain topo parse|show|xml` as a user runs them (subprocess): JSON on stdout, one-line errors."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.helpers import run_fstrain

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
DGX = FIXTURES / "topo" / "dgx-a100-8x-12mlx5-nps4.txt"


def test_parse_json_has_the_promised_fields() -> None:
    result = run_fstrain("topo", "parse", str(DGX), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [g["index"] for g in doc["gpus"]] == list(range(8))
    assert [g["numa_node"] for g in doc["gpus"]] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert [n["name"] for n in doc["nics"]] == [f"mlx5_{i}" for i in range(12)]
    assert doc["devices"][:9] == [*(f"GPU{i}" for i in range(8)), "mlx5_0"]
    assert len(doc["links"]) == 20 and doc["links"][0][:3] == ["X", "NV12", "NV12"] and doc["links"][0][8] == "PXB"
    assert doc["nvlink_domains"] == [list(range(8))]
    assert doc["format"] == "nvidia-smi topo -m"


def test_parse_renders_for_humans_on_stderr() -> None:
    result = run_fstrain("topo", "parse", str(FIXTURES / "topo" / "v100-8x-sxm2-hybridcube-vastai-1nic.txt"),
                         env={"COLUMNS": "200"})
    assert result.returncode == 0 and result.stdout == ""
    assert "partial-mesh" in result.stderr and "mlx5_2" in result.stderr


def test_parse_reads_nccl_xml_too() -> None:
    result = run_fstrain("topo", "parse", str(FIXTURES / "nccl-xml" / "oci-hpc_H100-topology.xml"), "--json")
    doc = json.loads(result.stdout)
    assert doc["format"] == "nccl-xml" and doc["nvlink_domains"] == [list(range(8))]


def test_bad_input_is_one_line_and_nonzero(tmp_path: Path) -> None:
    corrupted = FIXTURES / "topo" / "nv18-8x-12nic-numaoff-tpgds-aihub0008-corrupted-paste.txt"
    for args in (["topo", "parse", str(corrupted)],
                 ["topo", "parse", str(tmp_path / "missing.txt")],
                 ["topo", "xml", "--from", str(FIXTURES / "nccl-xml" / "azhpc-images_ncv4-graph.xml")]):
        result = run_fstrain(*args)
        assert result.returncode == 2, args
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
        assert "Traceback" not in result.stderr
    bad = tmp_path / "r.json"
    bad.write_text('{"schema": "fstrain-probe", "schema_version": 1}')
    result = run_fstrain("topo", "xml", "--from", str(bad))
    assert result.returncode == 2 and "field 'hostname'" in result.stderr


def test_xml_from_a_saved_report(tmp_path: Path) -> None:
    report = FIXTURES / "probe" / "simai-2a100-nvswitch-2bond.json"
    result = run_fstrain("topo", "xml", "--from", str(report))
    assert result.returncode == 0, result.stderr
    root = ET.fromstring(result.stdout)
    assert [p.attrib["busid"] for p in root.iter("pci") if p.find("gpu") is not None] == ["0000:13:00.0",
                                                                                           "0000:19:00.0"]
    out = tmp_path / "topo.xml"
    assert run_fstrain("topo", "xml", "--from", str(report), "-o", str(out)).returncode == 0
    assert out.read_text() == result.stdout


def test_xml_one_file_per_shape(tmp_path: Path) -> None:
    a = json.loads((FIXTURES / "probe" / "simai-2a100-nvswitch-2bond.json").read_text())
    b = {**a, "hostname": "simai-2"}
    c = json.loads((FIXTURES / "probe" / "nccl2397-a100-pcie-2x-cx6dx.json").read_text())
    saved = tmp_path / "reports.json"
    saved.write_text(json.dumps({"reports": [a, b, c]}))
    assert run_fstrain("topo", "xml", "--from", str(saved)).returncode == 2  # two shapes need -o
    result = run_fstrain("topo", "xml", "--from", str(saved), "-o", str(tmp_path / "topo.xml"))
    assert result.returncode == 0, result.stderr
    files = sorted(p.name for p in tmp_path.glob("topo.*.xml"))
    assert len(files) == 2
    shared = next(p for p in tmp_path.glob("topo.*.xml") if "0x068000" in p.read_text())
    assert "guid=" not in shared.read_text()  # two nodes share it: no per-node GUIDs
    assert "simai-2a100,simai-2" in result.stderr or "simai-2,simai-2a100" in result.stderr


def test_xml_from_a_paste_says_what_is_missing() -> None:
    result = run_fstrain("topo", "xml", "--from", str(DGX))
    assert result.returncode == 0
    assert [c.attrib["numaid"] for c in ET.fromstring(result.stdout)] == ["1", "3", "5", "7"]
    assert "PCI bus ids" in result.stderr


def test_show_on_this_machine(tmp_path: Path) -> None:
    result = run_fstrain("topo", "show", "--json", timeout=180)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    (report,) = doc["reports"]
    (node,) = doc["nodes"]
    assert node["hostname"] == report["hostname"] and doc["groups"][0]["hostnames"] == [report["hostname"]]
    # The saved document is accepted back by `topo xml --from`.
    saved = tmp_path / "show.json"
    saved.write_text(result.stdout)
    again = run_fstrain("topo", "xml", "--from", str(saved))
    if not report["nvidia_pci_devices"]:
        assert node["gpus"] == [] and node["gpu_source"] == "none"
        assert again.returncode == 2 and "no GPU" in again.stderr and "Traceback" not in again.stderr
        human = run_fstrain("topo", "show", timeout=180)
        assert human.returncode == 0 and "no NVIDIA GPU" in human.stderr and "Traceback" not in human.stderr
    else:
        assert again.returncode == 0 and again.stdout.startswith('<system version="1"')
