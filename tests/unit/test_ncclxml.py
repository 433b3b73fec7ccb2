"""NCCL topology XML: NCCL's grammar and lexical rules, the real files, our generator and reader."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fstrain.core.parsers.probe_report import node_from_report, validate_report
from fstrain.core.parsers.topo_matrix import parse_topo_matrix
from fstrain.core.topo.ncclxml import XmlElement, parse_nccl_xml, read_nccl_topology, render_nccl_xml
from fstrain.core.topo.topology import closest_nics, nvlink_domains
from fstrain.core.topofile.ncclxml_gen import xml_from_report, xml_from_topo_matrix
from fstrain.errors import ConfigError, ParseError

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
XML_FILES = sorted((FIXTURES / "nccl-xml").glob("*.xml"))
TOPOLOGY_FILES = [p for p in XML_FILES if "graph" not in p.name]
REPORTS = sorted((FIXTURES / "probe").glob("*.json"))
# Reconstructed reports and the real NCCL dump of the same machine (tests/fixtures/probe/SOURCES.md).
DUMP_OF = {"nccl2397-a100-pcie-2x-cx6dx.json": "nccl2397_a100-pcie-2x-cx6dx-roce_nccl2.30.4_host10.153.235.11.xml",
           "simai-2a100-nvswitch-2bond.json": "SimAI_topo_2A100_1CX6.xml"}

# NCCL 2.30.7's topology grammar, from FORMAT.md sections 2-3 (handler table of src/graph/xml.cc):
# element -> (parents NCCL reads it under, attributes NCCL's loaders read).
GRAMMAR: dict[str, tuple[set[str], set[str]]] = {
    "system": ({""}, {"version", "name"}),
    "cpu": ({"system"}, {"numaid", "affinity", "arch", "vendor", "familyid", "modelid", "host_hash"}),
    "pci": ({"cpu", "pci"}, {"busid", "class", "link_speed", "link_width", "vendor", "device", "subsystem_vendor",
                             "subsystem_device"}),
    "gpu": ({"pci"}, {"dev", "sm", "rank", "gdr", "mlopart"}),
    "nvlink": ({"gpu"}, {"target", "count", "tclass"}),
    "c2c": ({"gpu"}, {"count", "bw"}),
    "pcilink": ({"pci"}, {"target"}),
    "nic": ({"pci", "cpu"}, set()),
    "net": ({"nic"}, {"name", "dev", "speed", "port", "latency", "guid", "maxconn", "gdr", "coll", "rail", "plane",
                      "net", "gin", "rma"}),
}
CANONICAL_SPEEDS = {"2.5 GT/s", "5 GT/s", "8 GT/s", "16 GT/s", "32 GT/s", "2.5 GT/s PCIe", "5.0 GT/s PCIe",
                    "8.0 GT/s PCIe", "16.0 GT/s PCIe", "32.0 GT/s PCIe", "64.0 GT/s PCIe"}
LINE_RULES = re.compile(r'^(  )*(<!-- [^\t]* -->|</\w+>|<\w+( [a-z_]+="[^"\t\n]*")*/?>)$')


def assert_nccl_grammar(text: str) -> None:
    """Every line obeys NCCL's lexical rules; every element/attribute is one NCCL reads, where it reads it."""
    assert text.endswith("\n") and "\t" not in text and not text.startswith(("<?", "\ufeff"))
    for line in text.splitlines():
        assert LINE_RULES.fullmatch(line), line
    root = ET.fromstring(text)  # an independent XML parser: well-formed, and the tree to walk

    def walk(element: ET.Element, parent: str) -> int:
        parents, attrs = GRAMMAR[element.tag]
        assert parent in parents, f"<{element.tag}> under <{parent}>"
        assert set(element.attrib) <= attrs, f"<{element.tag}> {set(element.attrib) - attrs}"
        assert len(element.attrib) <= 16
        assert all(len(v) < 254 for v in element.attrib.values())
        if element.tag == "pci" and "link_speed" in element.attrib:
            assert element.attrib["link_speed"] in CANONICAL_SPEEDS
        if element.tag == "pci":
            assert re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", element.attrib["busid"])
        return 1 + sum(walk(child, element.tag) for child in element)

    assert root.attrib["version"] == "1"
    assert walk(root, "") <= 256


def report(path: Path) -> dict:  # type: ignore[type-arg]
    return validate_report(json.loads(path.read_text()), path.name)


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: p.name)
def test_generated_xml_follows_nccl_grammar(path: Path) -> None:
    assert_nccl_grammar(xml_from_report(report(path)).text)
    assert_nccl_grammar(xml_from_report(report(path), node_specific=False).text)


TOPO = sorted(p for p in (FIXTURES / "topo").glob("*.txt") if "corrupted" not in p.name and "daskcuda" not in p.name)


@pytest.mark.parametrize("path", TOPO, ids=lambda p: p.name)
def test_paste_xml_follows_nccl_grammar_and_says_what_is_missing(path: Path) -> None:
    topo = parse_topo_matrix(path.read_text(), path.name)
    generated = xml_from_topo_matrix(topo)
    assert_nccl_grammar(generated.text)
    assert any("PCI bus ids" in m for m in generated.missing)
    root = ET.fromstring(generated.text)
    numas = sorted({int(v) for row in topo.info for v in [row[topo.info_columns.index("NUMA Affinity")]]
                    if v.isdigit()}) if "NUMA Affinity" in topo.info_columns else []
    assert [int(c.attrib["numaid"]) for c in root] == numas
    assert not root.findall(".//pci")  # nothing NCCL would match wrongly


@pytest.mark.parametrize("name", sorted(DUMP_OF))
def test_generator_reproduces_nccls_own_dump(name: str) -> None:
    """Same tree, same values as the NCCL dump of that machine; we only leave attributes out."""
    ours, _ = parse_nccl_xml(xml_from_report(report(FIXTURES / "probe" / name)).text, "ours")
    dump, _ = parse_nccl_xml((FIXTURES / "nccl-xml" / DUMP_OF[name]).read_text(), "dump")
    left_out = {"host_hash", "latency", "maxconn", "gdr", "net", "gin"}

    def same(a: XmlElement, b: XmlElement) -> None:
        assert a.name == b.name
        for key, value in a.attrs.items():
            if key != "name" or a.name != "system":
                assert b.attrs.get(key) == value, (a.name, key, value, b.attrs.get(key))
        assert set(b.attrs) - set(a.attrs) <= left_out | ({"gdr"} if "gdr" not in a.attrs else set())
        assert len(a.children) == len(b.children), a.attrs
        for x, y in zip(a.children, b.children, strict=True):
            same(x, y)

    assert ours.attrs["version"] == dump.attrs["version"]
    assert len(ours.children) == len(dump.children)
    for x, y in zip(ours.children, dump.children, strict=True):
        same(x, y)


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: p.name)
def test_round_trip_through_our_reader(path: Path) -> None:
    data = report(path)
    probed = node_from_report(data)
    read, warnings = read_nccl_topology(xml_from_report(data).text, "generated")
    assert warnings == ()
    assert [g.pci_bus_id for g in read.gpus] == [g.pci_bus_id for g in probed.gpus]
    assert [g.numa_node for g in read.gpus] == [g.numa_node for g in probed.gpus]
    assert [g.compute_capability for g in read.gpus] == [g.compute_capability for g in probed.gpus]
    assert [n.name for n in read.nics] == [n.name for n in probed.nics]
    assert [d.gpu_indices for d in nvlink_domains(read)] == [d.gpu_indices for d in nvlink_domains(probed)]
    for gpu in probed.gpus:
        assert closest_nics(read, gpu.index)[0] == closest_nics(probed, gpu.index)[0]


@pytest.mark.parametrize("path", TOPOLOGY_FILES, ids=lambda p: p.name)
def test_real_files_read_into_the_model(path: Path) -> None:
    text = path.read_text()
    node, warnings = read_nccl_topology(text, path.name)
    tree = ET.fromstring(re.sub(r"^\s*<!--.*?-->", "", text, flags=re.S).strip())
    gpu_pcis = [p for p in tree.iter("pci")
                if p.find("gpu") is not None or p.attrib.get("class", "").startswith("0x03")]
    assert sorted(g.pci_bus_id or "" for g in node.gpus) == sorted(p.attrib["busid"] for p in gpu_pcis)
    assert sorted(n.name for n in node.nics if n.name) == sorted(n.attrib["name"] for n in tree.iter("net"))
    assert warnings == ()
    # Writing what we read gives a file that reads back the same.
    root, _ = parse_nccl_xml(text, path.name)
    again = render_nccl_xml(root)
    assert render_nccl_xml(parse_nccl_xml(again)[0]) == again


def test_real_nvswitch_and_mesh_files() -> None:
    h100, _ = read_nccl_topology((FIXTURES / "nccl-xml" / "oci-hpc_H100-topology.xml").read_text())
    (domain,) = nvlink_domains(h100)
    assert (domain.gpu_indices, domain.kind, domain.min_lanes) == (tuple(range(8)), "all-to-all", 18)
    assert h100.nvswitch is True
    pair, _ = read_nccl_topology((FIXTURES / "nccl-xml" / "azurehpc_nc48v4-topo.xml").read_text())
    assert [(d.gpu_indices, d.kind, d.min_lanes) for d in nvlink_domains(pair)] == [((0, 1), "pair", 12)]
    self_links, _ = read_nccl_topology((FIXTURES / "nccl-xml" / "azhpc-images_ncv4-topo.xml").read_text())
    assert nvlink_domains(self_links) == ()
    assert any("own bus id" in m for m in self_links.missing)


def test_graph_file_is_refused_with_a_reason() -> None:
    with pytest.raises(ParseError, match="graph file"):
        parse_nccl_xml((FIXTURES / "nccl-xml" / "azhpc-images_ncv4-graph.xml").read_text(), "g.xml")


GOOD = ('<system version="1">\n  <cpu numaid="0" arch="x86_64">\n    <pci busid="0000:01:00.0" class="0x030200"/>\n'
        "  </cpu>\n</system>\n")


@pytest.mark.parametrize(("text", "line", "needle"), [
    (GOOD.replace("  <cpu", "\t<cpu"), 2, "TAB"),
    ('<?xml version="1.0"?>\n' + GOOD, 1, "prolog"),
    (GOOD.replace('numaid="0" arch', 'numaid="0"\n    arch'), 2, "one line"),
    (GOOD.replace('version="1"', 'version="2"'), 1, "version"),
    (GOOD.replace('numaid="0"', "numaid=0"), 2, "quotes"),
    (GOOD.replace("</cpu>", "</pci>"), 4, "does not match"),
    (GOOD.replace("</cpu>", "</cpu >"), 4, "closing tag"),
    (GOOD.replace("  </cpu>\n</system>\n", ""), 2, "unterminated <cpu>"),
    (GOOD.replace('class="0x030200"', 'class="' + "f" * 260 + '"'), 3, "characters"),
    ("<!--a=b -->\n" + GOOD, 1, "put a space after <!--"),
    (GOOD.replace("  </cpu>", "  hello\n  </cpu>"), 4, "expecting '<'"),
])
def test_what_nccl_refuses_is_refused_at_the_same_line(text: str, line: int, needle: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_nccl_xml(text, "t.xml")
    assert info.value.where == f"t.xml:{line}"
    assert needle in info.value.message + info.value.hint


def test_what_nccl_drops_is_a_warning() -> None:
    many = " ".join(f'a{i}="{i}"' for i in range(18))
    text = GOOD.replace('arch="x86_64"', f'arch="x86_64" {many}').replace(
        "  </cpu>", '    <gpu dev="0"/>\n  </cpu>')
    _, warnings = parse_nccl_xml(text, "t.xml")
    assert any("more than 16 attributes" in w for w in warnings)
    assert any("ignores <gpu> inside <cpu>" in w for w in warnings)
    # Comments anywhere between elements, and a blank first line, are fine (real files have both).
    parse_nccl_xml("\n<!-- note -->\n" + GOOD.replace("  </cpu>", "  <!-- x -->\n  </cpu>"), "t.xml")


def test_node_without_gpu_has_no_xml() -> None:
    data = report(REPORTS[0])
    data["gpus"], data["gpu_source"], data["gpu_source_reason"] = [], "none", "no NVIDIA GPU on the PCI bus"
    with pytest.raises(ConfigError, match="no NVIDIA GPU on the PCI bus"):
        xml_from_report(data)


def test_shared_file_leaves_out_per_node_guids() -> None:
    data = report(FIXTURES / "probe" / "nccl2397-a100-pcie-2x-cx6dx.json")
    assert 'guid="0x78ad550003d3ebe8"' in xml_from_report(data).text
    shared = xml_from_report(data, node_specific=False)
    assert "guid=" not in shared.text and shared.name.startswith("fstrain shape ")
