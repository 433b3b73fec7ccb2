"""The topology model: labels, CPU lists, NVLink domains, affinity, bandwidth, cluster grouping."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fstrain.core.parsers.topo_matrix import node_from_topo_matrix, parse_topo_matrix
from fstrain.core.topo.topology import (
    Gpu,
    LinkClass,
    Nic,
    Node,
    closest_nics,
    format_cpu_list,
    group_nodes,
    node_to_dict,
    normalize_pci_bus_id,
    numa_domains,
    nvlink_domains,
    nvlink_summary,
    parse_cpu_list,
    parse_link_label,
    shape_hash,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "topo"


def fixture_node(name: str, hostname: str = "") -> Node:
    return node_from_topo_matrix(parse_topo_matrix((FIXTURES / name).read_text(), name), hostname)


def matrix_node(rows: list[str], nics: tuple[str, ...] = (), cc: str | None = None) -> Node:
    cells = tuple(tuple(r.split()) for r in rows)
    gpus = tuple(Gpu(i, compute_capability=cc) for i in range(len(rows) - len(nics)))
    return Node("n", gpus, tuple(Nic(label=n, name=n) for n in nics), cells)


@pytest.mark.parametrize(("label", "cls", "lanes"), [
    ("X", LinkClass.SELF, 0), ("NV12", LinkClass.NVLINK, 12), ("NV1", LinkClass.NVLINK, 1), ("PIX", LinkClass.PIX, 0),
    ("PXB", LinkClass.PXB, 0), ("PHB", LinkClass.PHB, 0), ("NODE", LinkClass.NODE, 0), ("SYS", LinkClass.SYS, 0),
    ("SOC", LinkClass.SYS, 0),
])
def test_link_labels(label: str, cls: LinkClass, lanes: int) -> None:
    assert parse_link_label(label) == (cls, lanes)


@pytest.mark.parametrize("label", ["NV0", "NV", "PIXNODE", "X NODE", "nv12", ""])
def test_bad_link_labels(label: str) -> None:
    with pytest.raises(ValueError):
        parse_link_label(label)


def test_link_classes_are_ordered_closest_first() -> None:
    order = [LinkClass.SELF, LinkClass.NVLINK, LinkClass.PIX, LinkClass.PXB, LinkClass.PHB, LinkClass.NODE,
             LinkClass.SYS]
    assert sorted(order, key=lambda c: c.rank) == order


@pytest.mark.parametrize(("text", "cpus"), [("0-3,8,10-11", (0, 1, 2, 3, 8, 10, 11)), ("6,14,22,30", (6, 14, 22, 30)),
                                            ("0", (0,))])
def test_cpu_lists(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpu_list(text) == cpus
    assert format_cpu_list(cpus) == text


@pytest.mark.parametrize("text", ["", "a-b", "3-1", "1,,2", "0-"])
def test_bad_cpu_lists(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpu_list(text)


def test_bus_ids() -> None:
    assert normalize_pci_bus_id("00000000:1B:00.0") == "0000:1b:00.0"
    assert normalize_pci_bus_id("07:00.1") == "0000:07:00.1"
    assert normalize_pci_bus_id("10000:01:00.0") == "10000:01:00.0"
    with pytest.raises(ValueError):
        normalize_pci_bus_id("GPU-1234")


def test_node_rejects_asymmetric_or_misplaced_x() -> None:
    with pytest.raises(ValueError, match="symmetric"):
        matrix_node(["X NV2", "NV1 X"])
    with pytest.raises(ValueError, match="diagonal"):
        matrix_node(["X X", "X X"])


def test_domains_pairs_mesh_and_a_dead_gpu() -> None:
    pairs = fixture_node("rtx3090-2x-nvlink-bridge-nv4-ryzen5900x.txt")
    assert [(d.gpu_indices, d.kind) for d in nvlink_domains(pairs)] == [((0, 1), "pair")]
    mesh = fixture_node("v100-8x-sxm2-hybridcube-vastai-1nic.txt")
    (domain,) = nvlink_domains(mesh)
    assert (domain.kind, domain.min_lanes, domain.max_lanes) == ("partial-mesh", 1, 2)
    # A B200 node whose GPU2 lost its NVLinks: 7 GPUs stay all-to-all, GPU2 is in no domain.
    rows = []
    for i in range(4):
        rows.append(" ".join("X" if j == i else "NODE" if 2 in (i, j) else "NV18" for j in range(4)))
    node = matrix_node(rows)
    assert [(d.gpu_indices, d.kind) for d in nvlink_domains(node)] == [((0, 1, 3), "all-to-all")]
    degraded = matrix_node(["X NV18 NV17", "NV18 X NV18", "NV17 NV18 X"])
    (d,) = nvlink_domains(degraded)
    assert (d.kind, d.min_lanes, d.max_lanes) == ("all-to-all", 17, 18)
    assert nvlink_summary(degraded) == "all to all NV17-NV18 (3 GPUs)"


def test_bandwidth_follows_the_gpu_generation() -> None:
    hopper = matrix_node(["X NV18", "NV18 X"], cc="9.0")
    assert hopper.link("GPU0", "GPU1").bandwidth_gbps == 18 * 200.0
    unknown = matrix_node(["X NV18", "NV18 X"])
    assert unknown.link("GPU0", "GPU1").bandwidth_gbps is None
    pcie = Node("n", (Gpu(0, pcie_generation=4, pcie_width=16), Gpu(1, pcie_generation=5, pcie_width=16)),
                matrix=(("X", "PHB"), ("PHB", "X")))
    assert pcie.link("GPU0", "GPU1").bandwidth_gbps == pytest.approx(252.1)


def test_affinity_and_numa_domains() -> None:
    node = fixture_node("dgx-a100-8x-12mlx5-nps4.txt")
    assert closest_nics(node, 0) == (("mlx5_0", "mlx5_1"), LinkClass.PXB)
    domains = {d.node_id: d for d in numa_domains(node)}
    assert sorted(domains) == [1, 3, 5, 7]
    assert domains[3].gpu_indices == (0, 1)
    assert domains[3].nic_labels == ("mlx5_0", "mlx5_1")
    assert domains[3].cpus == parse_cpu_list("48-63,176-191")
    # mlx5_4/mlx5_5 are SYS from every GPU: their NUMA node cannot be told from this matrix.
    assert "mlx5_4" not in {n for d in domains.values() for n in d.nic_labels}


def test_grouping_identical_and_different_nodes() -> None:
    a = fixture_node("h20-8x-8nic-sglang-env-driver535.txt", "a")
    b = replace(a, hostname="b", gpus=tuple(replace(g, uuid=f"GPU-{g.index}") for g in a.gpus))
    c = fixture_node("h100-8x-sxm-della-6nic-empty-cpuaffinity.txt", "c")
    assert shape_hash(a) == shape_hash(b) != shape_hash(c)
    groups = group_nodes([a, c, b])
    assert [g.hostnames for g in groups] == [("a", "b"), ("c",)]
    assert groups[0].differences == ()
    assert any(d.startswith("NICs: 6 NICs") for d in groups[1].differences)


def test_node_dict_is_json() -> None:
    node = fixture_node("a100-8x-sxm-nps4-10nic-niclegend-2trailingtabs.txt")
    data = json.loads(json.dumps(node_to_dict(node)))
    assert data["nvlink_domains"] == [list(range(8))]
    assert data["gpus"][2]["closest_nics"] == ["mlx5_2", "mlx5_3"]
    assert data["links"][0][8] == "PXB"
