"""Host lists cost the same per host at any size: the work is counted here, not timed
(benchmarks/hostlist_scale.py times 1,000 to 100,000 hosts)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any, SupportsIndex

import pytest

from fstrain.api.requests import HostRequest, JobRequest, LaunchRequest, RunSettings
from fstrain.core.hosts.hostfile import Host, check_unique, parse_host_list, select_hosts, with_default_slots
from fstrain.core.job.spec import LaunchJob, plan_launches


class CountingList(list[Any]):
    """A list that counts how many of its items are read (iterated, indexed or sliced)."""

    def __init__(self, items: list[Any]) -> None:
        super().__init__(items)
        self.reads = 0

    def __iter__(self) -> Iterator[Any]:
        for item in super().__iter__():
            self.reads += 1
            yield item

    def __getitem__(self, index: SupportsIndex | slice) -> Any:  # type: ignore[override]
        got = super().__getitem__(index)
        self.reads += len(got) if isinstance(index, slice) else 1
        return got


def _hosts(count: int) -> list[Host]:
    return [Host(f"node{i:06d}", slots=8, where=f"hosts:{i}") for i in range(1, count + 1)]


@pytest.mark.parametrize(("backend", "count"), [("torchrun", 3000), ("deepspeed", 300)])
def test_per_node_commands_read_each_host_a_few_times(backend: str, count: int) -> None:
    # (DeepSpeed's --world_info names every host in every node's command: its commands grow as
    # n^2 by DeepSpeed's design, so it is checked on fewer hosts.)
    hosts, nprocs = CountingList(_hosts(count)), CountingList([8] * count)
    job = LaunchJob(backend, ("python3", "train.py"), "python3", "node000001", 29500, "run-1")
    launches = plan_launches(hosts, nprocs, job)
    assert [launch.rank_offset for launch in launches[:3]] == [0, 8, 16]
    assert launches[-1].rank_offset == 8 * (count - 1)
    # A running sum of the ranks before each node; summing them again per node read n^2/2 counts.
    assert hosts.reads <= 3 * count and nprocs.reads <= 3 * count


def test_host_checks_and_filters_read_each_host_a_few_times() -> None:
    count = 3000
    hosts = CountingList(_hosts(count))
    check_unique(hosts)
    select_hosts(hosts, exclude="node000002:0,1@node000003")
    with_default_slots(hosts, 4)
    assert hosts.reads <= 4 * count


def _calls_of_a_dry_run(count: int) -> int:
    """Python and builtin calls made turning ``--hosts node[1-N]`` into every node's JSON entry."""
    from fstrain.api.launch import dry_run, prepare
    from fstrain.cli.output import json_pieces
    from fstrain.io.launch import node_summary

    request = LaunchRequest(hosts=HostRequest(hosts=f"node[000001-{count:06d}]", gpus_per_node=8),
                            job=JobRequest(program=("python3", "train.py")),
                            run=RunSettings(run_id="20260101-000000-abcdef"))
    calls = 0

    def counter(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    sys.setprofile(counter)
    try:
        planned = dry_run(prepare(request))
        for _ in json_pieces({"nodes": [node_summary(launch, None).to_dict() for launch in planned.launches]}):
            pass
    finally:
        sys.setprofile(None)
    assert len(planned.launches) == count
    return calls


def test_a_dry_run_makes_the_same_number_of_calls_per_host_at_any_size() -> None:
    _calls_of_a_dry_run(10)  # imports and caches filled once
    small, medium, large = (_calls_of_a_dry_run(n) for n in (500, 1000, 2000))
    per_host_first, per_host_then = (medium - small) / 500, (large - medium) / 1000
    assert per_host_then <= per_host_first * 1.05, (small, medium, large)


def test_a_long_host_list_is_split_and_expanded_in_order() -> None:
    names = ",".join(f"n{i}" for i in range(20_000))
    hosts = parse_host_list(names + ",rack[1-2]-g[01-02]")
    assert len(hosts) == 20_004 and hosts[19_999].name == "n19999"
    assert [h.name for h in hosts[-4:]] == ["rack1-g01", "rack1-g02", "rack2-g01", "rack2-g02"]
