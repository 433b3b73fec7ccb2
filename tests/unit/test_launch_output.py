"""How the run commands name a run's first failure and a stall's missing nodes: by host."""

from __future__ import annotations

import pytest

from fstrain.cli.launch_output import describe_failure, print_stall, print_summary


def test_a_first_failure_is_named_by_rank_code_and_host() -> None:
    failure = {"rank": 3, "local_rank": 1, "exit_code": 139, "signal": "SIGSEGV", "node_rank": 1, "host": "gpu-b",
               "reason": "rank 3 (local rank 1) on gpu-b was killed by SIGSEGV"}
    assert describe_failure(failure) == failure["reason"]  # one wording: the run's own reason's
    assert describe_failure({**failure, "signal": None}) == failure["reason"]  # named from the code
    assert describe_failure({"rank": 2, "local_rank": 0, "exit_code": 7, "host": "gpu-a"}) == \
        "rank 2 (local rank 0) on gpu-a exited with 7"
    assert describe_failure({"rank": None, "local_rank": None, "exit_code": 7, "host": "gpu-a"}) == \
        "the job on gpu-a exited with 7"
    # A node lost without a rank's code: its host and why, the host said once.
    lost = {"node_rank": 1, "host": "gpu-b", "reason": "gpu-b was lost: no heartbeat for 30 s"}
    assert describe_failure(lost) == "gpu-b was lost: no heartbeat for 30 s"
    assert describe_failure({"node_rank": 1, "host": "gpu-b", "reason": "no exit status came back"}) == \
        "gpu-b: no exit status came back"


def test_a_stall_names_the_hosts_that_sent_no_stacks(capsys: pytest.CaptureFixture[str]) -> None:
    report = {"reason": "no rank printed anything for 20 s", "odd_ranks": [3], "summary": [], "folder": "/runs/x",
              "unanswered_nodes": [1]}
    print_stall(report, ["gpu-a", "gpu-b"])
    err = capsys.readouterr().err
    assert "no stacks from gpu-b" in err and "node" not in err.split("no stacks from", 1)[1]


def test_the_node_table_gives_the_failed_ranks_code_as_the_run_does(capsys: pytest.CaptureFixture[str]) -> None:
    """torchrun exits 1 whatever its rank's code: the node's row says the rank's, as the verdict."""
    from fstrain.core.hosts.hostfile import Host
    from fstrain.core.job.spec import NodeLaunch
    from fstrain.core.monitor.rankexit import RankFailure
    from fstrain.io.launch import NodeState, RunOutcome

    def node(host: str, rank: int, code: int, failure: RankFailure | None) -> NodeState:
        launch = NodeLaunch(host=Host(host), node_rank=rank, nproc=2, argv=("python3", "x.py"), env={})
        return NodeState(launch, started=100.0, ended=103.0, exit_code=code, failure=failure)

    nodes = [node("gpu-a", 0, 1, RankFailure(0, 0, 2)), node("gpu-b", 1, 143, None)]
    print_summary(RunOutcome(2, "failed", 0, nodes, 100.0, 103.0,
                             detail="rank 0 (local rank 0) on gpu-a exited with 2"))
    err = capsys.readouterr().err
    rows = {cells[0]: cells for cells in ([c.strip() for c in line.split("│")] for line in err.splitlines())
            if cells[0].startswith("gpu-")}
    assert rows["gpu-a"][1:3] == ["0", "2 (rank 0)"], err  # not torchrun's 1
    assert rows["gpu-b"][1:3] == ["1", "143 (SIGTERM)"], err  # no rank known: the node's own code
    assert "first failure: rank 0 (local rank 0) on gpu-a (node 0) exited with 2" in err
    assert "failed; exit code 2" in err
