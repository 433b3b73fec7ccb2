"""`fstrain bench` on the namespace cluster: real gloo traffic between real hosts.

One host's link is shaped with a token bucket (``tc qdisc ... tbf``) on its root-side veth, which
slows the traffic into that host; the pairs suite must name it, and only it, every time.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.cluster.launch_helpers import assert_no_job_processes
from tests.conftest import NamespaceCluster
from tests.helpers import REPO, require_tool, run_fstrain

pytestmark = pytest.mark.cluster

SHAPED = 2  # node2
RUNS = 3


@contextmanager
def shaped_link(cluster: NamespaceCluster, index: int) -> Iterator[None]:
    require_tool("tc", "apt-get install iproute2")
    device = cluster.veth(index)
    subprocess.run(["tc", "qdisc", "add", "dev", device, "root", "tbf", "rate", "200mbit", "burst", "32kbit",
                    "latency", "50ms"], check=True, capture_output=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", device, "root"], check=False, capture_output=True, timeout=30)


def bench_pairs(cluster: NamespaceCluster, run_dir: Path) -> tuple[int, dict, str]:
    result = run_fstrain(
        "bench", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-3]", "--suite", "pairs",
        "--workdir", str(REPO), "--run-dir", str(run_dir), "--json", timeout=600,
    )
    assert result.returncode in (0, 1), result.stderr[-4000:]
    return result.returncode, json.loads(result.stdout), result.stderr


def test_pairs_name_the_shaped_host_and_no_other_every_time(cluster: NamespaceCluster, tmp_path: Path) -> None:
    with shaped_link(cluster, SHAPED):
        for run in range(RUNS):
            code, document, stderr = bench_pairs(cluster, tmp_path / f"shaped{run}")
            pairs = document["analysis"]["pairs"]
            assert pairs["outlier_hosts"] == [f"node{SHAPED}"], (run, pairs, stderr[-2000:])
            assert [h["direction"] for h in pairs["hosts"]] == ["in"]
            assert code == 1
            assert f"outlier host node{SHAPED}: traffic into it is slow" in stderr
            # Every ordered pair of the three hosts was timed, with every sample kept.
            links = document["pairs"]["links"]
            assert len(links) == 6 and all(len(x["samples_gbps"]) == 5 for x in links)
    assert_no_job_processes(cluster, 10)


def test_pairs_name_nobody_on_an_even_cluster(cluster: NamespaceCluster, tmp_path: Path) -> None:
    for run in range(2):
        run_dir = tmp_path / f"even{run}"
        code, document, stderr = bench_pairs(cluster, run_dir)
        assert document["analysis"]["pairs"]["outlier_hosts"] == [], (run, stderr[-2000:])
        assert code == 0
        assert "pairs: no outliers" in stderr
        saved = json.loads((run_dir / "bench.json").read_text())
        assert saved["analysis"] == document["analysis"]
        assert "node1 -> node2 |" in (run_dir / "report.txt").read_text()


def test_bus_bandwidth_agrees_with_a_direct_torch_distributed_timing(cluster: NamespaceCluster, tmp_path: Path) -> None:
    result = run_fstrain(
        "launch", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-3]", "--nproc-per-node", "1",
        "--workdir", str(REPO), "--run-dir", str(tmp_path / "run"), "--", "python3",
        "tests/cluster/programs/bench_agreement.py", timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    line = next(x for x in result.stdout.splitlines() if "AGREEMENT " in x)
    document = json.loads(line.split("AGREEMENT ", 1)[1])
    assert document["world_size"] == 3
    for collective, numbers in document["results"].items():
        assert abs(numbers["ratio"] - 1) <= 0.10, (collective, numbers)


def test_doctor_bench_turns_the_slow_host_into_a_failing_check(cluster: NamespaceCluster) -> None:
    with shaped_link(cluster, SHAPED):
        result = run_fstrain("doctor", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-3]", "--only", "net",
                             "--workdir", str(REPO), "--bench", "--json", timeout=600)
    assert result.returncode == 2, result.stderr[-3000:]
    checks = [c for c in json.loads(result.stdout)["checks"] if c["id"].startswith("bench.")]
    pairs = [c for c in checks if c["id"] == "bench.pairs"]
    assert [(c["verdict"], c["hosts"]) for c in pairs] == [("fail", [f"node{SHAPED}"])]
    assert f"--exclude node{SHAPED}" in pairs[0]["fix"]
    assert any(c["id"] == "bench.collectives" for c in checks)
