"""The real Slurm of scripts/testslurm.sh: munged and slurmctld here, one slurmd per namespace.

It runs on namespaces of its own (the SSH test cluster's id + 100, so one per worker in a parallel
run, or FSTRAIN_TESTSLURM_ID), so the SSH test cluster of the same session is never touched.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import cluster_id_for_worker, cluster_unavailable_reason, require_cluster_tools
from tests.helpers import REPO, require_tool

TESTSLURM = REPO / "scripts" / "testslurm.sh"
SLURM_NODES = 3  # allocations of 2 for most tests; 3 where a node dies (test_slurm_recovery.py)


@dataclass(frozen=True)
class SlurmCluster:
    state: Path
    cluster_id: str
    num_nodes: int

    @property
    def conf(self) -> str:
        return str(self.state / "slurm.conf")

    def namespace(self, index: int) -> str:
        return f"fst{self.cluster_id}-node{index}"

    def env(self, home: Path) -> dict[str, str]:
        """What a user's shell on the login node holds: SLURM_CONF, a home of its own, and this
        repository on PYTHONPATH (the nodes share the file system and get the environment)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env.update(SLURM_CONF=self.conf, HOME=str(home), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        env.pop("FSTRAIN_DEBUG", None)
        return env

    def script(self, *args: str) -> None:
        subprocess.run([str(TESTSLURM), *args], check=True, timeout=120, capture_output=True,
                       env={**os.environ, "FSTRAIN_TESTCLUSTER_ID": self.cluster_id,
                            "FSTRAIN_TESTSLURM_DIR": str(self.state)})


def require_slurm_tools() -> None:
    """What the test Slurm is built with: missing, the tests fail (they are test dependencies)."""
    require_cluster_tools()
    for tool, package in (("munged", "munge"), ("slurmctld", "slurm-wlm"), ("slurmd", "slurm-wlm"),
                          ("srun", "slurm-wlm"), ("nsenter", "util-linux")):
        require_tool(tool, f"apt-get install {package}")


def slurm_cluster_id() -> str:
    explicit = os.environ.get("FSTRAIN_TESTSLURM_ID")
    if explicit:
        return explicit
    return str(int(cluster_id_for_worker() or 0) + 100)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """Bring the test Slurm up once per session and down at the end."""
    reason = cluster_unavailable_reason()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Slurm tests: {reason}")
        pytest.skip(reason)
    require_slurm_tools()
    cluster = SlurmCluster(tmp_path_factory.mktemp("testslurm"), slurm_cluster_id(), SLURM_NODES)
    try:
        cluster.script("up", str(SLURM_NODES))
        yield cluster
    finally:
        cluster.script("down")


# How long a test waits at its start for the nodes a test before it used to be idle again in
# Slurm's view (a job's epilog and COMPLETING state outlast its processes).
IDLE_WAIT_S = 60


def node_states(slurm: SlurmCluster) -> dict[str, str]:
    """Each node's state as sinfo reports it (idle, alloc, comp, down*, ...)."""
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=60,
                         env=slurm.env(slurm.state), check=False).stdout
    return dict(line.split(None, 1) for line in out.splitlines() if len(line.split()) == 2)


@pytest.fixture(autouse=True)
def _nodes_idle_at_start(request: pytest.FixtureRequest) -> None:
    """Every Slurm test starts with all nodes idle: an allocation of 2 of the 3 is then node1 and
    node2, as the tests expect, not whichever a job before it had not yet given back."""
    if "slurm" not in request.fixturenames:
        return
    slurm = request.getfixturevalue("slurm")
    deadline = time.monotonic() + IDLE_WAIT_S
    states = node_states(slurm)
    while any(state != "idle" for state in states.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
        states = node_states(slurm)
    busy = {node: state for node, state in states.items() if state != "idle"}
    if busy:
        pytest.fail(f"Slurm nodes not idle {IDLE_WAIT_S} s into this test's start (a test before it left them): "
                    f"{busy}")
