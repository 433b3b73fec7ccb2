"""The bench edge's small decisions: ranks per host, and reading a result document."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fstrain.api.bench import bench_nprocs
from fstrain.core.hosts.hostfile import Host
from fstrain.errors import InputError
from fstrain.io.bench import BenchError, fetch_document, read_document
from fstrain.io.transport.base import CommandResult
from fstrain.io.transport.fake import FakeTransport


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


def _reply(outputs: list[CommandResult]) -> Any:
    def connect(host: Host) -> FakeTransport:
        return FakeTransport(host.name, lambda argv, stdin: outputs.pop(0))
    return connect


def test_a_short_read_of_the_result_is_read_again(tmp_path: Path) -> None:
    whole = json.dumps({"schema": "fstrain.bench/1", "nodes": ["a", "b"]})
    outputs = [CommandResult(0, whole[:20], "", 0.1), CommandResult(0, whole, "", 0.1)]
    document = fetch_document([Host("a"), Host("b")], ["/r/a", "/r/b"], _reply(outputs), tmp_path)
    assert document["nodes"] == ["a", "b"]
    assert json.loads((tmp_path / "bench.json").read_text()) == document


def test_a_lost_result_is_exit_3_and_says_how_to_print_it(tmp_path: Path) -> None:
    lost = CommandResult(1, "", "cat: no such file", 0.1)
    with pytest.raises(BenchError) as caught:
        fetch_document([Host("a"), Host("b")], ["/r/a", "/r/b"], _reply([lost] * 6), tmp_path)
    assert caught.value.exit_code == 3
    assert caught.value.where == "a:/r/a/bench.json"
    assert "fstrain bench --from bench.json" in caught.value.hint
