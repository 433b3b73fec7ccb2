"""scripts/testcluster.sh itself: up makes what it says, down removes all of it, twice is fine."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import TESTCLUSTER, NamespaceCluster

pytestmark = pytest.mark.cluster

CLUSTER_ID = "250"  # its own names and subnet (fst250-*, 198.18.250.0/24): never the session's cluster


def script(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FSTRAIN_TESTCLUSTER_DIR": str(state), "FSTRAIN_TESTCLUSTER_ID": CLUSTER_ID}
    return subprocess.run([str(TESTCLUSTER), *args], env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def leftovers() -> list[str]:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    found = [line.split()[0] for line in namespaces.splitlines() if line.startswith(f"fst{CLUSTER_ID}-")]
    found += [line.split(": ")[1].split("@")[0] for line in links.splitlines()
              if line.split(": ")[1].startswith(f"fst{CLUSTER_ID}")]
    found += [str(p) for p in Path("/etc/netns").glob(f"fst{CLUSTER_ID}-*")] if Path("/etc/netns").exists() else []
    return found


def test_up_then_down_twice_leaves_nothing(cluster: NamespaceCluster, tmp_path: Path) -> None:
    state = tmp_path / "state"
    up = script(state, "up", "2")
    assert up.returncode == 0, up.stderr
    try:
        assert sorted(leftovers()) == sorted([
            f"fst{CLUSTER_ID}-node1", f"fst{CLUSTER_ID}-node2", f"fst{CLUSTER_ID}veth1", f"fst{CLUSTER_ID}veth2",
            f"fst{CLUSTER_ID}br0", f"/etc/netns/fst{CLUSTER_ID}-node1", f"/etc/netns/fst{CLUSTER_ID}-node2",
        ])
        config = (state / "ssh_config").read_text()
        assert f"Host node2\n    HostName 198.18.{CLUSTER_ID}.12\n" in config
        assert (state / "hostfile").read_text() == "node1 slots=2\nnode2 slots=2\n"
        assert len((state / "known_hosts").read_text().splitlines()) == 2
        hosts_file = Path(f"/etc/netns/fst{CLUSTER_ID}-node2/hosts").read_text()
        assert f"198.18.{CLUSTER_ID}.11 node1" in hosts_file
        hostname = subprocess.run(["ssh", "-F", str(state / "ssh_config"), "node2", "hostname"],
                                  capture_output=True, text=True, timeout=30, check=False)
        assert hostname.stdout == "node2\n", hostname.stderr
    finally:
        first = script(state, "down")
        second = script(state, "down")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert leftovers() == []
    assert not state.exists()  # with it, the only authorized key the script ever added
    # The session's own cluster was not touched.
    assert cluster.in_namespace(1, "hostname", check=False).returncode == 0
