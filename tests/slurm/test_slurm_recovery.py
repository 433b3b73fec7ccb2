"""A node that dies inside a Slurm allocation (docs/recovery.md, "Kinds of run"): its slurmd and
every process on it killed mid-run, fstrain takes it as lost once its watchdog stops answering
the heartbeats (long before Slurm would declare it down), abandons its step's srun, and with
``--on-failure exclude`` runs the next attempt as new steps on the nodes left in the allocation."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fstrain.core.slurm.job import NODE_FAILED
from tests.cluster.launch_helpers import start_process
from tests.cluster.test_recovery import PROGRAM
from tests.slurm.conftest import SlurmCluster
from tests.slurm.test_slurm_launch import assert_nodes_idle

pytestmark = pytest.mark.slurm
GRACE_S = 3
HEARTBEAT_TIMEOUT_S = 5


def srun_clients(slurm: SlurmCluster) -> list[str]:
    """srun processes on this machine of this test Slurm (its SLURM_CONF in their environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "srun":
                continue
            if f"SLURM_CONF={slurm.conf}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return found


def recovering_launch(run_dir: Path, steps: int, *salloc: str) -> list[str]:
    """Inside ``salloc -N3 [salloc...]``: the tiny model, a checkpoint every 2 steps, node3 to be lost."""
    return ["salloc", "-N3", *salloc, sys.executable, "-m", "fstrain", "launch", "--model", "tiny", "--precision",
            "fp32", "--nproc-per-node", "1", "--steps", str(steps), "--checkpoint-interval", "2", "--on-failure",
            "exclude", "--max-restarts", "1", "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S), "--grace", str(GRACE_S),
            "--run-dir", str(run_dir)]


def program_launch(run_dir: Path, steps: int, *salloc: str) -> list[str]:
    """As :func:`recovering_launch`, with the recovery tests' program instead of the trainer
    (tests/cluster/programs/recovering.py: a step line every 0.5 s, a checkpoint every 2 steps):
    for what is the launcher's and Slurm's, not the training's."""
    return ["salloc", "-N3", *salloc, sys.executable, "-m", "fstrain", "launch", "--nproc-per-node", "1",
            "--on-failure", "exclude", "--max-restarts", "1", "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S),
            "--grace", str(GRACE_S), "--run-dir", str(run_dir), "--", "python3", PROGRAM, "--steps", str(steps),
            "--checkpoint-every", "2"]


def test_a_node_that_dies_is_excluded_and_the_run_resumes_on_the_rest(slurm: SlurmCluster, tmp_path: Path) -> None:
    assert slurm.num_nodes >= 3
    run_dir = tmp_path / "run"
    launch = start_process(recovering_launch(run_dir, 8, "--no-kill"), slurm.env(tmp_path), tmp_path)
    killed = False
    try:
        launch.wait_for("[fstrain.train] step 3/8 loss", timeout=300)
        slurm.script("kill-node", "3")
        killed = True
        lost_at = time.monotonic()
        launch.wait_for("==== attempt 2 ", timeout=120)
        recovered_s = time.monotonic() - lost_at
        code = launch.finish(timeout=300)
    finally:
        if launch.proc.poll() is None:
            launch.proc.kill()
        if killed:
            slurm.script("start-node", "3")
    assert code == 0, launch.err[-4000:] + launch.out[-2000:]
    # Long before Slurm's SlurmdTimeout (300 s) could have declared node3 down.
    assert recovered_s < 120
    first, second = json.loads((run_dir / "manifest.json").read_text())["attempts"]
    assert first["hosts"] == ["node1", "node2", "node3"] and first["exit_code"] != 0
    assert first["verdict"]["kind"] == "hardware" and first["verdict"]["suspects"] == ["node3"], first
    assert first["excluded"] == ["node3"] and first["next"] == "restart"
    assert first["last_checkpoint_step"] is not None and first["last_checkpoint_step"] >= 2
    assert second["hosts"] == ["node1", "node2"] and second["exit_code"] == 0
    assert second["resumed_from_step"] == first["last_checkpoint_step"] and second["progress"] is True
    assert "excluded node3" in launch.err and "attempt 2 on 2 nodes (node1, node2)" in launch.err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["start_step"] == first["last_checkpoint_step"]
    # Nothing left: no job process on the survivors, no srun client waiting here for node3.
    assert not srun_clients(slurm), srun_clients(slurm)
    assert_nodes_idle(slurm, GRACE_S + 8)
    print(f"node3 killed -> attempt 2 started: {recovered_s:.1f} s; attempts: {json.dumps([first, second])}")


def test_a_spare_node_of_the_allocation_takes_the_dead_nodes_place(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Nodes left in the allocation: a hostfile given with --launcher srun holds node3 back as a
    spare; node2 dies, and the next attempt runs on node1 and node3, the world's size kept."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=1\nnode2 slots=1\nnode3 slots=1 spare=true\n")
    run_dir = tmp_path / "run"
    argv = program_launch(run_dir, 8, "--no-kill")
    at = argv.index("--")
    argv[at:at] = ["--launcher", "srun", "--hostfile", str(hostfile)]
    launch = start_process(argv, slurm.env(tmp_path), tmp_path)
    killed = False
    try:
        launch.wait_for("] line rank=0 attempt=0 step=3", timeout=300)
        slurm.script("kill-node", "2")
        killed = True
        code = launch.finish(timeout=300)
    finally:
        if launch.proc.poll() is None:
            launch.proc.kill()
        if killed:
            slurm.script("start-node", "2")
    assert code == 0, launch.err[-4000:] + launch.out[-2000:]
    first, second = json.loads((run_dir / "manifest.json").read_text())["attempts"]
    assert first["hosts"] == ["node1", "node2"] and first["excluded"] == ["node2"], first
    assert first["spares_used"] == ["node3"] and second["hosts"] == ["node1", "node3"]
    assert second["exit_code"] == 0 and second["replanned"] == ""  # the same world size: nothing to re-plan
    assert second["resumed_from_step"] == first["last_checkpoint_step"] >= 2
    started = [line for line in launch.stdout if "] start rank=" in line and "attempt=1" in line]
    assert sorted(line.split("host=")[1].split()[0] for line in started) == ["node1", "node3"], started
    assert all("world=2" in line for line in started), started
    assert not srun_clients(slurm), srun_clients(slurm)
    assert_nodes_idle(slurm, GRACE_S + 8)


def test_without_no_kill_slurm_ends_the_job_and_the_run_says_why(slurm: SlurmCluster, tmp_path: Path) -> None:
    """The allocation made without --no-kill: fstrain loses node3 and starts attempt 2 on the
    others, then Slurm declares node3 down (SlurmdTimeout, made 10 s here for the test's sake)
    and ends the whole job; the run ends cancelled, saying why and how to allocate."""
    conf = Path(slurm.conf)
    original = conf.read_text()
    env = slurm.env(tmp_path)
    conf.write_text(original + "SlurmdTimeout=10\n")
    subprocess.run(["scontrol", "reconfigure"], check=True, env=env, timeout=60)
    run_dir = tmp_path / "run"
    launch = start_process(program_launch(run_dir, 600), env, tmp_path)
    killed = False
    try:
        launch.wait_for("] line rank=0 attempt=0 step=3", timeout=300)
        slurm.script("kill-node", "3")
        killed = True
        code = launch.finish(timeout=300)
    finally:
        if launch.proc.poll() is None:
            launch.proc.kill()
        conf.write_text(original)
        subprocess.run(["scontrol", "reconfigure"], check=True, env=env, timeout=60)
        if killed:
            slurm.script("start-node", "3")
    assert code == 143, launch.err[-4000:]
    assert NODE_FAILED in launch.err
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert (manifest["reason"], manifest["exit_code"], manifest["detail"]) == ("cancelled", 143, NODE_FAILED)
    first, second = manifest["attempts"]
    assert first["excluded"] == ["node3"] and second["hosts"] == ["node1", "node2"]
    assert (second["reason"], second["detail"]) == ("cancelled", NODE_FAILED)
    assert not srun_clients(slurm), srun_clients(slurm)
    assert_nodes_idle(slurm, GRACE_S + 8)
