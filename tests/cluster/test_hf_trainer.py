"""Hugging Face transformers' Trainer, unchanged, end to end on the namespace cluster
(examples/train_hf.py, docs/your-trainer.md): a detached run on two hosts shows rank 0's step,
loss and tokens/s in `status` while it trains, read from the Trainer's bar and log dicts; a host
lost after a checkpoint is excluded, and the run resumes on the host left from the Trainer's own
checkpoint, its loss curve going on from the step saved; the report has every step."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from fstrain.core.runs.runstate import FINAL
from tests.cluster.launch_helpers import assert_no_job_processes
from tests.cluster.test_runs import GRACE_S, detach, fstrain, wait_state
from tests.conftest import NamespaceCluster
from tests.helpers import REPO

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
EXAMPLE = str(REPO / "examples" / "train_hf.py")
# Enough steps that the run cannot end between the status that shows its numbers (a few
# seconds after its first step: the node record is rewritten every 2 s) and the host's loss,
# at well under 0.1 s a step on idle cores.
MAX_STEPS = 200
SAVE_STEPS = 10


def running_status(home: Path, run_id: str, checkpoints: Path, timeout_s: float) -> dict[str, Any]:
    """The run's status once rank 0 shows a step past the first checkpoint, with its loss and
    tokens/s, while the run goes on."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = json.loads(fstrain(home, "status", run_id, "--json").stdout)
        progress = status["nodes"][0]["ranks"][0]["progress"] if status["nodes"][0]["ranks"] else None
        saved = (checkpoints / f"checkpoint-{SAVE_STEPS}" / "trainer_state.json").is_file()
        if saved and progress and progress["step"] > SAVE_STEPS and progress["loss"] is not None \
                and progress["tokens_per_s"] is not None:
            return status
        assert status["state"] not in FINAL and time.monotonic() < deadline, (status, saved)
        time.sleep(1)


def logged_losses(trainer_state: Path) -> dict[int, float]:
    return {entry["step"]: entry["loss"] for entry in json.loads(trainer_state.read_text())["log_history"]
            if "loss" in entry}


def test_hf_trainer_shows_its_steps_and_resumes_from_its_checkpoint_on_the_host_left(
        cluster: NamespaceCluster, tmp_path: Path) -> None:
    home, run_dir = tmp_path / "home", tmp_path / "run"
    # One intra-op thread per rank, as torchrun sets it where a node runs several ranks: the two
    # hosts' ranks share the test machine's 2 cores.
    run_id = detach(cluster, home, run_dir, "--backend", "torchrun", "--nproc-per-node", "1",
                    "--heartbeat-timeout", "4",
                    "--env", "OMP_NUM_THREADS=1", "--on-failure", "exclude", "--max-restarts", "1",
                    "--", "python3", EXAMPLE, "--max-steps", str(MAX_STEPS), "--save-steps", str(SAVE_STEPS))
    node0_dir = Path(json.loads((run_dir / "detached.json").read_text())["nodes"][0]["run_dir"])
    checkpoints = node0_dir / "checkpoints"  # FSTRAIN_CHECKPOINT_DIR: node 0's RUN_DIR/checkpoints
    try:
        status = running_status(home, run_id, checkpoints, 120)
        ranks = {rank["rank"]: rank for node in status["nodes"] for rank in node["ranks"]}
        assert status["state"] == "running" and [node["host"] for node in status["nodes"]] == ["node1", "node2"]
        progress = ranks[0]["progress"]
        assert SAVE_STEPS < progress["step"] < MAX_STEPS and progress["steps"] == MAX_STEPS
        assert progress["loss"] > 0 and progress["tokens_per_s"] > 0
        assert (ranks.get(1) or {}).get("progress") is None  # the Trainer prints its steps on rank 0 only
        cluster.script("stop-sshd", "2")  # node2 is lost, after checkpoint-10
        try:
            status = wait_state(home, run_id, set(FINAL), 300)
        finally:
            cluster.script("start-sshd", "2")
        assert status["state"] == "succeeded", status
        first, second = status["attempts"]
        assert first["excluded"] == ["node2"] and first["next"] == "restart" and second["hosts"] == ["node1"]
        saved = first["last_checkpoint_step"]  # the newest checkpoint-N when node2 was lost
        assert saved is not None and saved >= SAVE_STEPS and saved % SAVE_STEPS == 0
        assert second["resumed_from_step"] == saved and second["exit_code"] == 0
        # The loss curve goes on from the step saved: the last checkpoint's log history holds
        # every step once, the first attempt's up to the step saved (as its checkpoint had them),
        # then the second attempt's, which start near where the first stopped, not from scratch.
        final = logged_losses(checkpoints / f"checkpoint-{MAX_STEPS}" / "trainer_state.json")
        before = logged_losses(checkpoints / f"checkpoint-{saved}" / "trainer_state.json")
        assert sorted(final) == list(range(1, MAX_STEPS + 1))
        assert {step: final[step] for step in before} == before
        assert abs(final[saved + 1] - final[saved]) < 0.5 * (final[1] - final[saved]), final
        logs = fstrain(home, "logs", run_id).stdout
        second_part = logs[logs.index("==== attempt 2 (hosts node1) ===="):]
        assert f"restart 1: resuming from {checkpoints}/checkpoint-{saved}" in second_part
        assert second_part.count("'loss': ") == MAX_STEPS - saved  # its own steps, logged once each
        report = json.loads(fstrain(home, "report", run_id, "--json").stdout)
        (rank,) = [r for r in report["ranks"] if r["rank"] == 0]
        steps = [point["step"] for point in rank["points"]]
        assert steps[-1] == MAX_STEPS and set(range(saved + 1, MAX_STEPS + 1)) <= set(steps)
        # Each log dict at the step its bar was cleared at for it; a step logged again after the
        # resume keeps its later loss, as the final log history does.
        assert {p["step"]: p["loss"] for p in rank["points"] if p["loss"] is not None} == {
            step: float(f"{loss:.4g}") for step, loss in final.items()}
        assert_no_job_processes(cluster, GRACE_S + 8)
    finally:
        fstrain(home, "stop", run_id, "--force")
