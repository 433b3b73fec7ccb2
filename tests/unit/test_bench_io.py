"""The bench edge's small decisions: ranks per host, and reading a result document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fstrain.api.bench import bench_nprocs
from fstrain.core.hosts.hostfile import Host
from fstrain.errors import InputError
from fstrain.io.bench import read_document


def test_ranks_per_host_flag_then_slots_then_gpus_then_one() -> None:
    hosts = [Host("a"), Host("b", slots=4), Host("c")]
    assert bench_nprocs(hosts, None, [0, 0, 8]) == [1, 4, 8]
    assert bench_nprocs(hosts, 2, [0, 0, 8]) == [2, 2, 2]


def test_read_document(tmp_path: Path) -> None:
    good = tmp_path / "bench.json"
    good.write_text(json.dumps({"schema": "fstrain.bench/1", "nodes": ["a"]}))
    assert read_document(str(good))["nodes"] == ["a"]
    other = tmp_path / "summary.json"
    other.write_text(json.dumps({"losses": [1.0]}))
    with pytest.raises(InputError, match="not an fstrain bench document"):
        read_document(str(other))
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(InputError, match="cannot read JSON") as caught:
        read_document(str(broken))
    assert caught.value.where == str(broken)
