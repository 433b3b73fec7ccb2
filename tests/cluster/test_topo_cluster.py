"""`fstrain topo show` / `topo xml` probing the namespace hosts over SSH (no GPUs there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import NamespaceCluster
from tests.helpers import run_fstrain

pytestmark = pytest.mark.cluster


def test_topo_show_probes_every_host_and_groups_identical_nodes(cluster: NamespaceCluster) -> None:
    result = run_fstrain("topo", "show", "--json", "--ssh-config", cluster.ssh_config, "--hostfile", cluster.hostfile)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert [n["hostname"] for n in document["nodes"]] == cluster.names
    assert all(n["gpus"] == [] and n["gpu_source"] == "none" for n in document["nodes"])
    assert all(n["gpu_source_reason"] for n in document["nodes"])
    assert [g["hostnames"] for g in document["groups"]] == [cluster.names]
    assert document["unreachable"] == []
    # The probe ran on each host (its own hostname and address), not here.
    for index, report in enumerate(document["reports"], start=1):
        addresses = [a.split("/")[0] for i in report["interfaces"] for a in i["addresses"]]
        assert cluster.address(index) in addresses
        assert report["hostname"] == f"node{index}"


def test_topo_show_table_says_no_gpu_and_reports_unreachable_hosts(cluster: NamespaceCluster, tmp_path: Path) -> None:
    config = tmp_path / "cfg"
    config.write_text((cluster.state / "ssh_config").read_text()
                      + f"Host ghost\n    HostName {cluster.subnet}.99\n    ConnectTimeout 1\n")
    result = run_fstrain("topo", "show", "--ssh-config", str(config), "--hosts", "node[1-2],ghost")
    assert result.returncode == 1
    assert "node1: no NVIDIA GPU" in result.stderr and "node2: no NVIDIA GPU" in result.stderr
    assert "error: ghost: connection to" in result.stderr and "timed out" in result.stderr
    assert "Traceback" not in result.stderr


def test_topo_xml_refuses_gpu_less_hosts_with_one_line(cluster: NamespaceCluster, tmp_path: Path) -> None:
    out = tmp_path / "topo.xml"
    result = run_fstrain("topo", "xml", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-3]", "-o", str(out))
    assert result.returncode == 2
    assert result.stderr.startswith("error: node1: no GPU") and result.stderr.count("\n") == 1
    assert not out.exists()


def test_plan_probes_the_hosts_and_says_they_have_no_gpu(cluster: NamespaceCluster) -> None:
    result = run_fstrain("plan", "--model", "tiny", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-2]")
    assert result.returncode == 2
    assert result.stderr.startswith("error: node1: no GPU to plan for (no NVIDIA GPU on the PCI bus)")
    assert result.stderr.count("\n") == 1
