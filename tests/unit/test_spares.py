"""Spare hosts: the hostfile marker ``spare=true``, held back from the first world, listed by
`launch`, and picked to replace excluded hosts (fstrain/core/hosts/hostfile.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fstrain.api.hosts import resolve_hosts
from fstrain.core.hosts.hostfile import Host, parse_hostfile, pick_replacements, split_spares, with_default_slots
from fstrain.errors import InventoryError
from tests.helpers import run_fstrain

HOSTFILE = """\
node1 slots=2
node2 slots=2
node3 slots=2 spare=true
node4 spare=true   # slots from --gpus-per-node
node5 slots=4 spare=false
"""


def test_the_marker_is_read_with_or_without_slots() -> None:
    hosts = parse_hostfile(HOSTFILE, "hf")
    assert [(h.name, h.slots, h.spare) for h in hosts] == [("node1", 2, False), ("node2", 2, False),
                                                           ("node3", 2, True), ("node4", None, True),
                                                           ("node5", 4, False)]
    assert with_default_slots(hosts, 2)[3] == Host("node4", slots=2, where="hf:4", spare=True)


@pytest.mark.parametrize("line", ["node9 spare=yes", "node9 slots=2 spare="])
def test_a_bad_marker_names_the_line(line: str) -> None:
    with pytest.raises(InventoryError) as raised:
        parse_hostfile(f"node1\n{line}\n", "hf")
    assert raised.value.where == "hf:2" and "spare must be true or false" in raised.value.message


def test_spares_are_kept_out_of_the_first_world() -> None:
    world, spares = split_spares(parse_hostfile(HOSTFILE, "hf"))
    assert [h.name for h in world] == ["node1", "node2", "node5"]
    assert [h.name for h in spares] == ["node3", "node4"]


def test_a_hostfile_of_spares_only_is_refused() -> None:
    with pytest.raises(InventoryError, match=r"every host \(2\) is marked spare=true"):
        split_spares(parse_hostfile("a spare=true\nb spare=true\n", "hf"), "hf")


def test_resolve_hosts_holds_the_spares_back(tmp_path: Path) -> None:
    path = tmp_path / "hostfile"
    path.write_text(HOSTFILE)
    selection = resolve_hosts(str(path), None, None, "node5", 2, environ={})
    assert [h.name for h in selection.hosts] == ["node1", "node2"]
    assert [(h.name, h.slots) for h in selection.spares] == [("node3", 2), ("node4", 2)]


def test_a_replacement_runs_as_many_processes_when_one_can() -> None:
    spares = [Host("s8", slots=8, spare=True), Host("s2", slots=2, spare=True), Host("s2b", slots=2, spare=True)]
    chosen, missing = pick_replacements([Host("n3", slots=2)], spares)
    assert chosen == {"n3": spares[1]} and missing == []
    chosen, missing = pick_replacements([Host("n3", slots=2), Host("n4", slots=2), Host("n5", slots=2),
                                         Host("n6", slots=2)], spares, taken=["s2b"])
    assert {k: v.name for k, v in chosen.items()} == {"n3": "s2", "n4": "s8"}  # then any free one
    assert [h.name for h in missing] == ["n5", "n6"]


def test_launch_lists_the_spares(tmp_path: Path) -> None:
    path = tmp_path / "hostfile"
    path.write_text("nodeA slots=1\nnodeB slots=1\nnodeC slots=1 spare=true\n")
    result = run_fstrain("launch", "--dry-run", "--hostfile", str(path), "--json", "--", "python3", "train.py")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert [n["host"] for n in document["nodes"]] == ["nodeA", "nodeB"] and document["spares"] == ["nodeC"]
    assert "spare hosts, held back from the first world: nodeC" in result.stderr
