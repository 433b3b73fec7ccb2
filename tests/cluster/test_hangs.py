"""Hang and straggler detection on the namespace cluster: a rank that blocks forever is found,
its stack lands in the run directory, it is named, and the job ends `stalled` (exit 124)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.cluster.launch_helpers import assert_no_job_processes, start_launch
from tests.conftest import NamespaceCluster
from tests.helpers import REPO, require_tool

pytestmark = pytest.mark.cluster

HANG = str(REPO / "tests" / "cluster" / "programs" / "hang.py")
GRACE_S = 3
TIMEOUT_S = 20
# After the timeout: the stacks request (3 s for SIGUSR1 answers), SIGTERM, the grace period,
# the per-node launchers' exits, on a shared 2-core machine.
SLACK_S = 25


@pytest.mark.parametrize(("others", "flag"), [("collective", "--stall-timeout"), ("exit", "--finish-timeout")])
def test_blocked_rank_is_found_named_and_the_job_ends_stalled(
    cluster: NamespaceCluster, tmp_path: Path, others: str, flag: str
) -> None:
    require_tool("py-spy", "pip install py-spy")  # a test extra: fstrain takes stacks with it; the hosts share PATH
    run_dir = tmp_path / "run"
    launch = start_launch(cluster, "--hosts", "node[1-2]", "--nproc-per-node", "2", "--grace", str(GRACE_S),
                          "--run-dir", str(run_dir), flag, f"{TIMEOUT_S}s",
                          "--env", "FSTRAIN_TEST_HANG_RANK=3", "--env", f"FSTRAIN_TEST_OTHERS={others}",
                          # torch's flight recorder, as fstrain render's environment turns it on
                          "--env", "TORCH_NCCL_TRACE_BUFFER_SIZE=2000",
                          "--", "python3", HANG)
    launch.wait_for("] rank 3 blocks forever", timeout=300)
    if others == "exit":
        launch.wait_for("] done rank=", count=3, timeout=120)
    blocked_at = time.monotonic()
    code = launch.finish(timeout=TIMEOUT_S + GRACE_S + SLACK_S + 30)
    elapsed = time.monotonic() - blocked_at
    assert code == 124, launch.err
    assert elapsed < TIMEOUT_S + GRACE_S + SLACK_S, elapsed
    assert "stalled: " in launch.err and "odd rank: 3" in launch.err, launch.err
    assert "rank 3 is in <module> (hang.py:" in launch.err
    stack = (run_dir / "stacks" / "rank3.faulthandler.txt").read_text()
    assert f'File "{HANG}", line' in stack
    assert "<module> (hang.py:" in (run_dir / "stacks" / "rank3.py-spy.txt").read_text()
    report = json.loads((run_dir / "stacks" / "report.json").read_text())
    assert report["odd_ranks"] == [3] and report["node_of_rank"]["3"] == 1
    if others == "collective":  # the three others wait in the same all_reduce
        assert report["common"].startswith("all_reduce ")
        assert sorted(report["where"]) == ["0", "1", "2", "3"]
        # every rank's flight recorder answered: rank 3 enqueued one collective, the others two
        assert report["flight_recorder_behind"] == [3]
        assert "flight recorder, process group 0: rank 3 (1) behind the others' collective 2 (gloo:all_reduce)" \
            in launch.err
        for rank in range(4):
            dump = json.loads((run_dir / "stacks" / f"rank{rank}.flight-recorder.json").read_text())
            assert dump["pg_status"]["0"]["last_enqueued_collective"] == ("1" if rank == 3 else "2")
    else:
        assert sorted(report["where"]) == ["3"]  # the only live rank
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["reason"] == "stalled" and manifest["exit_code"] == 124
    assert_no_job_processes(cluster, GRACE_S + 8)
