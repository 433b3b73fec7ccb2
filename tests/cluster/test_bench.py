"""`fstrain bench` on the namespace cluster: real gloo traffic between real hosts.

One host's link is shaped with a token bucket (``tc qdisc ... tbf``) on its root-side veth, which
slows the traffic into that host; the pairs suite must name it, and only it, after re-timing it
(how often it does so over many runs, loaded or not, is benchmarks/bench_false_positive.py's
count). A host without torch, a host down and a lost result are failures to measure (exit 3),
never "outliers found" (1) nor bad input (2).
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


def bench(cluster: NamespaceCluster, run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_fstrain("bench", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-3]", "--workdir", str(REPO),
                       "--run-dir", str(run_dir), *args, timeout=600)


def bench_pairs(cluster: NamespaceCluster, run_dir: Path) -> tuple[int, dict, str]:
    result = bench(cluster, run_dir, "--suite", "pairs", "--json")
    assert result.returncode in (0, 1), result.stderr[-4000:]
    return result.returncode, json.loads(result.stdout), result.stderr


def test_pairs_name_the_shaped_host_and_no_other(cluster: NamespaceCluster, tmp_path: Path) -> None:
    with shaped_link(cluster, SHAPED):
        code, document, stderr = bench_pairs(cluster, tmp_path / "shaped")
    pairs = document["analysis"]["pairs"]
    assert pairs["outlier_hosts"] == [f"node{SHAPED}"], (pairs, stderr[-2000:])
    assert [h["direction"] for h in pairs["hosts"]] == ["in"]
    assert code == 1
    assert f"outlier host node{SHAPED}: traffic into it is slow" in stderr
    # Every ordered pair of the three hosts was timed, with every sample kept.
    links = document["pairs"]["links"]
    assert len(links) == 6 and all(len(x["samples_gbps"]) == 5 for x in links)
    # The verdict was confirmed: both links into node2 were timed again before it.
    retimed = {(x["src"], x["dst"]) for x in document["pairs"]["retimes"][-1]["links"]}
    assert {("node1", f"node{SHAPED}"), ("node3", f"node{SHAPED}")} <= retimed
    assert_no_job_processes(cluster, 10)


@pytest.mark.timing
def test_pairs_name_nobody_on_an_even_cluster(cluster: NamespaceCluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "even"
    code, document, stderr = bench_pairs(cluster, run_dir)
    assert document["analysis"]["pairs"]["outlier_hosts"] == [], stderr[-2000:]
    assert code == 0
    assert "pairs: no outliers" in stderr
    saved = json.loads((run_dir / "bench.json").read_text())
    assert saved["analysis"] == document["analysis"]
    # A pair matrix: a header and a row per sender, not a row per link.
    report = (run_dir / "report.txt").read_text().splitlines()
    rows = [line for line in report if line.split("|")[0].strip() in ("node1", "node2", "node3")]
    assert len(rows) == 3 and len(rows[0].split("|")[1].split()) == 2
    # Progress went to stderr, stdout is the one document.
    assert "[fstrain.bench] pairs: sample 5 of 5 of 6 links" in stderr
    # The report comes back from the saved result, with the same verdict.
    again = run_fstrain("bench", "--from", str(run_dir / "bench.json"))
    assert again.returncode == 0 and "pairs: no outliers" in again.stderr


def test_a_host_without_torch_is_a_failure_to_measure(cluster: NamespaceCluster, tmp_path: Path) -> None:
    no_torch = subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True, check=False)
    if no_torch.returncode == 0:
        pytest.skip("/usr/bin/python3 has torch here")
    result = bench(cluster, tmp_path / "run", "--suite", "pairs", "--python", "/usr/bin/python3", "--json")
    assert result.returncode == 3, result.stderr[-3000:]
    assert "cannot import torch" in result.stderr
    assert json.loads(result.stdout)["exit_code"] == 3
    assert not list((tmp_path / "run").glob("logs/*"))  # stopped at the preflight: no rank started


def test_a_host_down_is_a_failure_to_measure(cluster: NamespaceCluster, tmp_path: Path) -> None:
    cluster.script("stop-sshd", "3")
    try:
        result = bench(cluster, tmp_path / "run", "--suite", "pairs")
    finally:
        cluster.script("start-sshd", "3")
    assert result.returncode == 3, result.stderr[-3000:]
    assert "node3" in result.stderr and "Traceback" not in result.stderr


def test_a_result_read_short_is_read_again_or_from_another_node(cluster: NamespaceCluster, tmp_path: Path) -> None:
    """The transport's short read at the end of a run: node 0's copy never reads whole here,
    node 1's reads short once; the report still comes back."""
    from fstrain.api.bench import BenchRequest, run_bench
    from fstrain.api.job import interface_env
    from fstrain.core.hosts.hostfile import Host
    from fstrain.io.connect import make_connector
    from fstrain.io.transport.base import CommandResult

    connect = make_connector(cluster.ssh_config)
    reads: list[str] = []

    class ShortReads:
        def __init__(self, host: Host) -> None:
            self.host, self.inner = host, connect(host)

        def run(self, argv: list[str], **kwargs: object) -> CommandResult:
            result = self.inner.run(argv, **kwargs)  # type: ignore[arg-type]
            if argv[0] == "cat" and argv[-1].endswith("/bench.json"):
                reads.append(self.host.name)
                if self.host.name == "node1" or reads.count(self.host.name) == 1:
                    return CommandResult(0, result.stdout[: len(result.stdout) // 2], "", result.seconds)
            return result

        def __getattr__(self, name: str) -> object:  # start, alive, close: the SSH transport's own
            return getattr(self.inner, name)

    request = BenchRequest(hosts=[Host("node1"), Host("node2")], suites=["pairs"], run_id="shortread",
                           run_dir=tmp_path / "run", workdir=str(REPO), extra=["--pair-samples", "2"])
    run = run_bench(request, ShortReads, fanout=4, node_env=lambda ifname: interface_env(ifname, {}))  # type: ignore[arg-type]
    assert run.outcome.exit_code == 0
    assert run.document is not None and run.document["nodes"] == ["node1", "node2"]
    assert reads == ["node1"] * 3 + ["node2"] * 2
    assert json.loads((tmp_path / "run" / "bench.json").read_text()) == run.document


def test_collectives_are_named_by_host_and_summarised(cluster: NamespaceCluster, tmp_path: Path) -> None:
    result = run_fstrain("bench", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-3]", "--workdir", str(REPO),
                         "--run-dir", str(tmp_path / "run"), "--suite", "collectives", "--nproc-per-node", "2",
                         "--sizes", "256K", "--seconds", "0.05", "--json", env={"COLUMNS": "200"}, timeout=600)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    document = json.loads(result.stdout)
    assert [s["scope"] for s in document["collectives"]["scopes"]] == ["world", "intra_node", "inter_node"]
    report = (tmp_path / "run" / "report.txt").read_text()
    assert "intra_node all_reduce (2 ranks)" in report
    # One row per scope and collective (15), not one per group and size (105 here).
    rows = [line for line in result.stderr.splitlines()
            if line.startswith(("world ", "intra_node ", "inter_node ")) and "│" in line]
    assert len(rows) == 15, result.stderr[-3000:]
    assert {row.split()[-1] for row in rows if row.startswith("intra_node")} <= {"node1", "node2", "node3"}
    assert {row.split()[-1] for row in rows if row.startswith("inter_node")} <= {"0", "1"}  # "local rank k"
    assert result.returncode == (1 if document["analysis"]["outlier_hosts"] else 0)


@pytest.mark.timing
def test_doctor_bench_on_an_even_cluster_names_nobody(cluster: NamespaceCluster) -> None:
    result = run_fstrain("doctor", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-3]", "--only", "net",
                         "--workdir", str(REPO), "--bench", "--json", timeout=600)
    checks = [c for c in json.loads(result.stdout)["checks"] if c["id"].startswith("bench.")]
    assert [(c["id"], c["verdict"]) for c in checks] == [("bench.pairs", "ok"), ("bench.collectives", "ok")], checks


@pytest.mark.timing
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
