"""The suite's own rule: a test that uses the namespace cluster, the test Slurm or a GPU carries
that marker, and only such a test does (tests/conftest.py refuses the collection otherwise)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.conftest import marker_mismatches


@dataclass
class Callspec:
    params: dict[str, Any]


@dataclass
class Item:
    nodeid: str
    fixturenames: list[str]
    markers: set[str] = field(default_factory=set)
    callspec: Callspec | None = None

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


def test_a_test_using_the_cluster_without_its_marker_is_named() -> None:
    items = [Item("t.py::a", ["tmp_path", "cluster"]), Item("t.py::b", ["cluster"], {"cluster"})]
    assert marker_mismatches(items) == [  # type: ignore[arg-type]
        "t.py::a uses the namespace test cluster (fixture `cluster`) without @pytest.mark.cluster"]


def test_a_marker_without_its_component_is_named() -> None:
    items = [Item("t.py::a", ["tmp_path"], {"slurm", "slow"}), Item("t.py::b", ["gpu"], {"gpu"})]
    assert marker_mismatches(items) == [  # type: ignore[arg-type]
        "t.py::a is marked slurm but does not use the `slurm` fixture"]


def test_a_parameter_that_shares_a_fixtures_name_is_not_the_fixture() -> None:
    items = [Item("t.py::a[x]", ["cluster"], callspec=Callspec({"cluster": "8xH100"}))]
    assert marker_mismatches(items) == []  # type: ignore[arg-type]
