"""How the run commands name a run's first failure and a stall's missing nodes: by host."""

from __future__ import annotations

import pytest

from fstrain.cli.launch_output import describe_failure, print_stall


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
