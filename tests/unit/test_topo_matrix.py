"""nvidia-smi topo -m: one test over the folder of real captured outputs, plus broken-paste cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fstrain.core.parsers.topo_matrix import node_from_topo_matrix, parse_topo_matrix
from fstrain.core.topo.topology import closest_nics, format_cpu_list, nvlink_domains
from fstrain.errors import ParseError

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "topo"
EXPECTED = {k: v for k, v in json.loads((FIXTURES / "expected.json").read_text()).items() if not k.startswith("_")}


def test_every_fixture_has_expectations() -> None:
    assert sorted(EXPECTED) == sorted(p.name for p in FIXTURES.glob("*.txt"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture(name: str) -> None:
    expected = EXPECTED[name]
    text = (FIXTURES / name).read_text()
    if "error_line" in expected:
        with pytest.raises(ParseError) as info:
            parse_topo_matrix(text, name)
        assert info.value.where == f"{name}:{expected['error_line']}"
        assert expected["error_contains"] in info.value.message
        return
    topo = parse_topo_matrix(text, name)
    node = node_from_topo_matrix(topo)
    assert len(node.gpus) == expected["gpus"]
    assert [n.name for n in node.nics] == expected["nics"]
    assert [g.numa_node for g in node.gpus] == expected["numa"]
    assert topo.layout == expected["layout"]
    assert topo.legend == expected["legend"]
    domains = nvlink_domains(node)
    assert [list(d.gpu_indices) for d in domains] == expected["nvlink_domains"]
    assert [d.kind for d in domains] == expected.get("kinds", [])
    if domains:
        lanes = sorted({min(d.min_lanes for d in domains), max(d.max_lanes for d in domains)})
        assert lanes == expected["lanes"]
    for gpu, (nics, cls) in expected.get("closest", {}).items():
        names, found = closest_nics(node, int(gpu))
        assert (list(names), found.value if found else None) == (nics, cls)
    for gpu, affinity in expected.get("cpu_affinity", {}).items():
        cpus = node.gpu(int(gpu)).cpu_affinity
        assert (format_cpu_list(cpus) if cpus else None) == affinity
    if "memory_numa" in expected:
        assert [g.memory_numa_node for g in node.gpus] == expected["memory_numa"]
    for needle in expected.get("warnings_contain", []):
        assert any(needle in w for w in topo.warnings), topo.warnings
    # The matrix is symmetric with X exactly on the diagonal (Node checks it; this keeps it honest).
    size = len(node.devices)
    assert all(node.matrix[i][j] == node.matrix[j][i] for i in range(size) for j in range(size))
    assert all((node.matrix[i][j] == "X") == (i == j) for i in range(size) for j in range(size))


TAB_FIXTURES = sorted(n for n, e in EXPECTED.items() if e.get("layout") == "tabs")


@pytest.mark.parametrize("name", TAB_FIXTURES)
def test_terminal_copy_reads_the_same(name: str) -> None:
    """The same output copied from a terminal (TABs expanded, trailing blanks lost) parses alike."""
    text = (FIXTURES / name).read_text()
    spaces = "\n".join(line.expandtabs(8).rstrip() for line in text.split("\n"))
    a, b = parse_topo_matrix(text), parse_topo_matrix(spaces)
    assert b.layout == "spaces"
    assert (a.matrix, a.info, a.nic_names) == (b.matrix, b.info, b.nic_names)


def test_ansi_residue_and_crlf_are_ignored() -> None:
    text = (FIXTURES / "h20-8x-8nic-sglang-env-driver535.txt").read_text()
    head, rest = text.split("\n", 1)
    expected = parse_topo_matrix(text)
    for variant in (f"\x1b[4m{head}\x1b[0m\n{rest}", f"[4m{head}[0m\n{rest}", text.replace("\n", "\r\n"),
                    f"\x1b[4m{head}\x1b(B\x1b[m\n{rest}", f"^[[4m{head}^[[0m\n{rest}",
                    f"$ nvidia-smi topo -m\n{text}"):
        got = parse_topo_matrix(variant)
        assert (got.matrix, got.info, got.nic_names) == (expected.matrix, expected.info, expected.nic_names)


GOOD = (FIXTURES / "rtx6000ada-4x-asus-esc8000a-e12-4nic.txt").read_text().split("\n")


@pytest.mark.parametrize(("mutate", "line", "needle"), [
    (lambda ls: [*ls[:2], ls[2].replace("NODE     X", "NODE"), *ls[3:]], 3, "not a topology label"),
    (lambda ls: [*ls[:3], ls[3].replace("SYS", "PIX", 1), *ls[4:]], 4, "not symmetric"),
    (lambda ls: ls[:6], 7, "row for NIC1 is missing"),
    (lambda ls: ls[1:], 1, "before any header"),
    (lambda ls: [*ls[:9], "NIC4    SYS     SYS     NODE    NODE    SYS     SYS     PIX      X", *ls[9:]], 10,
     "not in the header"),
    (lambda ls: [*ls[:1], ls[1].replace(" X ", "SYS", 1), *ls[2:]], 2, "diagonal must be X"),
])
def test_broken_pastes_name_the_line(mutate, line: int, needle: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ParseError) as info:
        parse_topo_matrix("\n".join(mutate(list(GOOD))), "paste")
    assert info.value.where == f"paste:{line}"
    assert needle in info.value.message


def test_no_matrix_at_all() -> None:
    with pytest.raises(ParseError, match="no nvidia-smi topo -m matrix"):
        parse_topo_matrix("Thu Jan  1 00:00:00 2026\nNo devices were found\n", "x.txt")


def test_legend_names_nics_and_tab_quirk() -> None:
    topo = parse_topo_matrix((FIXTURES / "nv4-4x-3nic-slurm-cpuaffinity-0-and-empty-gpu-d-2.txt").read_text())
    assert topo.info_columns == ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
    # GPU2's row is "NODE\t\t1\t\tN/A": empty CPU affinity, NUMA 1, the extra TAB before N/A dropped.
    assert topo.info[2] == ("", "1", "N/A")
    assert topo.nic_names == ("mlx5_0", "mlx5_1", "mlx5_2")
