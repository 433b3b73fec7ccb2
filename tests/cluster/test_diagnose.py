"""Testing suspects on the namespace cluster (fstrain/api/diagnose.py): a host whose sshd is
stopped is guilty; a healthy suspect is cleared, by the quick doctor and by a short pairs bench."""

from __future__ import annotations

from pathlib import Path

import pytest

from fstrain.api import diagnose
from fstrain.core.hosts.hostfile import Host, parse_hostfile
from fstrain.io.connect import make_connector
from tests.conftest import NamespaceCluster

pytestmark = pytest.mark.cluster


def hosts_of(cluster: NamespaceCluster) -> list[Host]:
    return parse_hostfile(Path(cluster.hostfile).read_text(), cluster.hostfile)


def test_a_host_that_stopped_answering_is_guilty(cluster: NamespaceCluster) -> None:
    cluster.script("stop-sshd", "3")
    try:
        report = diagnose.test_suspects(hosts_of(cluster), ["node3"], make_connector(cluster.ssh_config))
    finally:
        cluster.script("start-sshd", "3")
    assert report.guilty == ("node3",)
    assert report.why["node3"].startswith("ssh.connect: cannot connect") and "Connection refused" in report.why["node3"]
    assert report.why["node1"] == "nothing found" and report.also_failing == ()


@pytest.mark.timing
def test_a_healthy_suspect_is_cleared_by_the_doctor_and_the_bench(cluster: NamespaceCluster, tmp_path: Path) -> None:
    report = diagnose.test_suspects(hosts_of(cluster), ["node2"], make_connector(cluster.ssh_config),
                                    bench_suites=("pairs",), run_dir=tmp_path / "bench")
    assert report.guilty == (), report.why
    assert report.why["node2"] == "nothing found"
    rows = {row.id: row.verdict for row in report.checks}
    assert rows["ssh.connect"] == "ok" and rows["bench.pairs"] in ("ok", "warn"), report.checks
