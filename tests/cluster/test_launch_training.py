"""The bundled trainer launched by `fstrain launch` across two namespace hosts, for real (gloo on CPU)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cluster.launch_helpers import assert_no_job_processes
from tests.conftest import NamespaceCluster
from tests.helpers import run_fstrain

pytestmark = pytest.mark.cluster

# torchrun's --tee tags lines with the local rank ([node1 r0]); DeepSpeed's launcher does not ([node1]).
RANK_LINE = re.compile(r"^\[(node\d)(?: r\d)?\] \[fstrain\.train\] rank (\d)/(\d+) local (\d) on (node\d) ")


@pytest.mark.parametrize(
    ("backend", "strategy", "trainer_backend", "nproc"),
    # DeepSpeed's ranks are the costliest to start: one per node keeps ZeRO-3 across two hosts
    # (its local ranks: tests/cluster/test_launch_local_rank.py)
    [("torchrun", "fsdp-full", "fsdp", 2), ("deepspeed", "zero3", "deepspeed", 1), ("direct", "fsdp-full", "fsdp", 2)],
)
def test_two_nodes_train_and_loss_goes_down(
    cluster: NamespaceCluster, tmp_path: Path, backend: str, strategy: str, trainer_backend: str, nproc: int
) -> None:
    run_dir = tmp_path / "run"
    world = 2 * nproc
    result = run_fstrain(
        "launch", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-2]", "--nproc-per-node", str(nproc),
        "--backend", backend, "--model", "tiny", "--strategy", strategy, "--steps", "8", "--grace", "5",
        "--run-dir", str(run_dir), "--json", timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    document = json.loads(result.stdout)
    summary = document["training_summary"]
    assert summary["world_size"] == world and summary["backend"] == trainer_backend
    assert summary["steps"] == 8
    assert summary["last_loss"] < summary["first_loss"]
    assert document["plan"]["plan"]["strategy"] == strategy and document["plan"]["plan"]["dp"] == world
    # Every rank joined the same world; the logs of both hosts arrived.
    seen = set()
    for host in ("node1", "node2"):
        log = (run_dir / "logs" / f"{host}.log").read_text()
        for line in log.splitlines():
            match = RANK_LINE.match(line)
            if match:
                assert match.group(1) == match.group(5) == host
                assert match.group(3) == str(world)
                seen.add(int(match.group(2)))
    assert seen == set(range(world))
    assert (run_dir / "summary.json").is_file()
    assert_no_job_processes(cluster, 10)
