"""What the launching machine's commands cost a large detached run, on the simulated cluster
(fstrain/io/transport/simulated.py): sessions per node, concurrency, bytes of the headers."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from fstrain.core.hosts.hostfile import Host
from fstrain.core.job.spec import NodeLaunch
from fstrain.io.launch import Rendezvous, RunOptions
from fstrain.io.transport.simulated import SimulatedCluster


def test_a_detached_start_is_bounded_by_fanout_and_only_node0_gets_the_host_list(tmp_path: Path) -> None:
    from fstrain.io.runs import start_detached

    headers: dict[str, dict[str, object]] = {}

    def node(host: str, argv: Sequence[str], stdin: bytes) -> tuple[int, str, str]:
        headers[host] = json.loads(stdin.splitlines()[0])["detach"]
        return 0, json.dumps({"pid": 10, "job_pid": 11, "port": 4000}) + "\n", ""

    cluster = SimulatedCluster(node, latency_s=0.01)
    launches = [NodeLaunch(Host(f"n{i}"), i, 1, ("true",)) for i in range(24)]
    answers = start_detached(launches, cluster.transport, "python3", RunOptions("r", tmp_path),
                             Rendezvous("10.0.0.1", 29500, ()), fanout=4)
    assert len(answers) == 24 and all(a["port"] == 4000 for a in answers)
    assert cluster.counts.commands == 24 and cluster.counts.in_flight_max <= 4
    assert headers["n0"]["names"] == [f"n{i}" for i in range(24)]  # the coordinator names the hosts
    assert all("names" not in headers[f"n{i}"] for i in range(1, 24))  # N members x N names: no more
