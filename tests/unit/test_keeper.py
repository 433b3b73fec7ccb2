"""A detached run's recovery keeper on values: the run's state with and without its keeper, the
keeper's record, and an ended detached attempt read as the recovery loop reads an attached one
(the evidence that blame weighs)."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path
from unittest import mock

import pytest

from fstrain import __version__
from fstrain.api.driver import (
    AttemptSettings,
    Checked,
    Driven,
    DriveRequest,
    NodeAccess,
    NodeJob,
    Recovery,
    RunOutput,
    attempt_evidence,
    drive_attempts,
)
from fstrain.api.keeper import STOPPED, attempt_outcome
from fstrain.core.formats import KINDS
from fstrain.core.hosts.hostfile import Host
from fstrain.core.job.spec import NodeLaunch
from fstrain.core.launch.blame import blame
from fstrain.core.launch.recovery import Policy
from fstrain.core.runs.runrecord import KeeperRecord
from fstrain.core.runs.runstate import KEEPER_GONE, RunState, attempt_reason, with_keeper
from fstrain.errors import FstrainError, InputError
from fstrain.io.launch import HostFacts, Rendezvous, RunOutcome
from fstrain.io.runs import read_manifest
from fstrain.io.transport.base import Transport
from tests.helpers import manifest

FAILED = RunState("failed", 3, "rank 1 (local rank 0) on n2 exited with 3", 10.0)
RUNNING = RunState("running", None)
ENDED = manifest(ended=20.0, reason="ok", exit_code=0)


def test_a_live_keeper_keeps_an_ended_attempt_from_ending_the_run() -> None:
    assert with_keeper(FAILED, manifest(reason="detached"), keeper_alive=True).state == "running"
    assert with_keeper(FAILED, manifest(reason="restarting"), keeper_alive=True).state == "running"
    assert with_keeper(RUNNING, manifest(reason="restarting"), keeper_alive=True) == RUNNING  # the next attempt runs


def test_the_manifest_ends_the_run_once_the_keeper_has_exited() -> None:
    assert with_keeper(FAILED, ENDED, keeper_alive=False) == RunState("succeeded", 0, "ok", 20.0)
    assert with_keeper(FAILED, ENDED, keeper_alive=True).state == "running"  # still writing its last words


def test_a_keeper_gone_leaves_the_attempt_to_its_nodes_and_says_so() -> None:
    running = with_keeper(RUNNING, manifest(reason="detached"), keeper_alive=False)
    assert running.state == "running" and running.reason == f"{KEEPER_GONE}: no further attempt"
    failed = with_keeper(FAILED, None, keeper_alive=False)
    assert failed.state == "failed" and failed.exit_code == 3
    assert failed.reason == f"{FAILED.reason}; {KEEPER_GONE}: no further attempt"
    assert with_keeper(failed, None, keeper_alive=False) == failed  # a cached state is not said twice


@pytest.mark.parametrize(("state", "reason"), [("succeeded", "ok"), ("failed", "failed"), ("lost", "lost"),
                                               ("stalled", "stalled"), ("stopped", "terminated")])
def test_attempt_reasons_are_the_attached_launchers(state: str, reason: str) -> None:
    assert attempt_reason(state) == reason


def test_keeper_record_round_trip_and_a_newer_format_is_one_line() -> None:
    record = KeeperRecord("r1", 4242, 1.5, "/runs/r1/keeper.log")
    document = record.to_dict("9.9")
    assert document["format"] == KINDS["keeper"].current
    assert KeeperRecord.from_dict(document, "keeper.json") == record
    with pytest.raises(InputError, match=r"recovery keeper record written by fstrain 9\.9"):
        KeeperRecord.from_dict({**document, "format": KINDS["keeper"].current + 1}, "keeper.json")
    with pytest.raises(InputError, match="pid must be an integer"):
        KeeperRecord.from_dict({**document, "pid": "x"}, "keeper.json")


def launches(*hosts: str, nproc: int = 2) -> list[NodeLaunch]:
    return [NodeLaunch(Host(h), i, nproc, ("torchrun",), {}, rank_offset=i * nproc) for i, h in enumerate(hosts)]


def final(**more: object) -> dict:
    return {"state": "failed", "exit_code": 3, "reason": "rank 2 (local rank 0) on n2 exited with 3", "started": 1.0,
            "ended": 9.0, "first_failure_node_rank": 1, "stall": None,
            "nodes": {"0": {"name": "n1", "exit_code": 143, "failure": None, "error": None, "ended": 8.0},
                      "1": {"name": "n2", "exit_code": 3, "ended": 7.0,
                            "failure": {"rank": 2, "local_rank": 0, "exit_code": 3, "signal": None}}},
            **more}


def view(node_rank: int, record: dict | None, last_lines: list[str], ranks: dict | None = None) -> dict:
    return {"watchdog_alive": False, "node": {"node_rank": node_rank, "started": 2.0, "final": record,
                                              "last_lines": last_lines, "ranks": ranks or {}}}


def test_an_ended_detached_attempt_reads_as_an_attached_ones_outcome() -> None:
    record = final()
    views = [view(0, record, ["[local0]: step 4", "[local1]: step 4"],
                  {"0": {"last_line": "[local0]: x", "progress_line": "[local0]: [fstrain.train] step 4/10 loss 2.5"}}),
             view(1, record, ["[local0]: Traceback (most recent call last):", "[local0]: ValueError: bad batch 7"],
                  {"0": {"progress_line": "[local0]: FSTRAIN_METRICS {\"step\": 5, \"loss\": 1.0}"}})]
    outcome, last = attempt_outcome(views, launches("n1", "n2"), FAILED, 0.0)
    assert (outcome.exit_code, outcome.reason, outcome.first_failure) == (3, "failed", 1)
    assert outcome.detail == record["reason"] and (outcome.started, outcome.ended) == (1.0, 9.0)
    n2 = outcome.nodes[1]
    assert n2.exit_code == 3 and n2.failure is not None and (n2.failure.rank, n2.failure.host) == (2, "n2")
    assert n2.rank_tails[0] == ["[n2 r2] Traceback (most recent call last):", "[n2 r2] ValueError: bad batch 7"]
    assert outcome.nodes[0].rank_tails[1] == ["[n1 r1] step 4"]
    assert last == 5
    evidence = attempt_evidence(outcome)
    assert evidence.first_failure_host == "n2" and [end.host for end in evidence.failed] == ["n2"]


def test_a_lost_node_and_an_unreachable_one_are_lost_hosts_for_blame() -> None:
    record = final(state="lost", exit_code=255, reason="n2: its watchdog's connection closed",
                   first_failure_node_rank=1,
                   nodes={"0": {"exit_code": 143, "ended": 8.0},
                          "1": {"exit_code": None, "error": "its watchdog's connection closed", "ended": 6.0}})
    metrics = '[local1]: FSTRAIN_METRICS {"step": 7, "steps": 9, "loss": 0.5}'
    outcome, last = attempt_outcome([view(0, record, [metrics]), None], launches("n1", "n2"),
                                    RunState("lost", 255, record["reason"]), 0.0)
    assert outcome.reason == "lost" and outcome.exit_code == 255 and last == 7
    assert outcome.nodes[1].error == "its watchdog's connection closed"
    verdict = blame(attempt_evidence(outcome))
    assert verdict.kind == "hardware" and verdict.suspects == ("n2",)
    unknown, unknown_last = attempt_outcome([None, None], launches("n1", "n2"),
                                            RunState("lost", None, "n1 cannot be reached"), 0.0)
    assert unknown.exit_code == 255 and unknown.nodes[0].error == "n1 cannot be reached"
    assert unknown_last is None


def followed_loop(tmp_path: Path, stop_after: int) -> tuple[Driven, list[str], list[int]]:
    """drive_attempts as a keeper runs it, on values: the first attempt given (started detached),
    each attempt's end from ``follow`` (node 2's rank exits 3), a stop asked once ``stop_after``
    attempts were followed. Returns the run's result, what it reported, and the attempts that
    ``drive`` was asked to start."""
    hosts = (Host("n1"), Host("n2"))
    request = DriveRequest(NodeAccess(hosts), "r1", tmp_path, detach=True, output=RunOutput(io.StringIO()),
                           attempt=AttemptSettings(checkpoint_dir=""))
    checked = Checked([HostFacts(h, {}) for h in hosts], Rendezvous("n1", 29500, ("eth0", "eth0")), ["/r", "/r"],
                      "/r/checkpoints")
    job = NodeJob("torchrun", launches("n1", "n2", nproc=1))
    followed: list[int] = []
    started: list[int] = []

    def follow(driven: Driven) -> Driven:
        followed.append(len(followed) + 1)
        outcome, last = attempt_outcome([view(0, final(), []), view(1, final(), [])], job.launches, FAILED, 0.0)
        return Driven(checked, job, outcome, manifest(run_id="r1"), 0.0, [], last)

    def connect(host: Host) -> Transport:
        raise FstrainError(f"{host.name}: not reached in a unit test")

    def start(request: DriveRequest, *_: object) -> Driven:
        started.append(request.attempt.restart + 1)
        assert request.attempt.banner == f"==== attempt {request.attempt.restart + 1} (hosts n1,n2) ===="
        return Driven(checked, job, RunOutcome(0, "detached", None, [], 0.0, 0.0), manifest(run_id="r1"), 0.0)

    recovery = Recovery(Policy("restart", max_restarts=3), follow=follow,
                        stop_requested=lambda: STOPPED if len(followed) >= stop_after else "")
    reported: list[str] = []
    first = Driven(checked, job, RunOutcome(0, "detached", None, [], 0.0, 0.0), manifest(run_id="r1"), 0.0)
    with mock.patch("fstrain.api.driver.drive", start):
        driven = drive_attempts(request, connect, lambda c: job, recovery, reported.append, first=first)
    return driven, reported, started


def test_a_keeper_follows_each_attempt_and_a_stop_leaves_no_next_one(tmp_path: Path) -> None:
    driven, reported, started = followed_loop(tmp_path, stop_after=2)
    attempts = driven.manifest.attempts
    assert started == [2]  # the first was given; the third never started
    assert [a["next"] for a in attempts] == ["restart", "stop"] and attempts[-1]["next_why"] == STOPPED
    assert attempts[0]["exit_code"] == 3 and reported[-1] == STOPPED
    assert driven.manifest.exit_code == 3 and driven.manifest.ended
    # What the keeper wrote is what it holds.
    assert read_manifest(tmp_path / "manifest.json") == replace(driven.manifest, writer=__version__)
    assert not (tmp_path / "logs").exists()  # a detached attempt's banner goes to its nodes' output


def test_the_hand_off_carries_its_format_and_a_newer_one_is_refused_before_unpickling() -> None:
    import io
    import pickle

    from fstrain.errors import InputError
    from fstrain.io.keeper import hand_off_bytes, read_hand_off

    current = KINDS["handoff"].current
    sent = hand_off_bytes(("prepared", "first", "job"), "0.1.0")
    assert sent.split(b"\n", 1)[0] == f'{{"format": {current}, "fstrain": "0.1.0", "kind": "handoff"}}'.encode()
    assert read_hand_off(io.BytesIO(sent)) == ("prepared", "first", "job")

    class Bomb:  # unpickling this would run code: a refused hand-off must never get that far
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (exec, ("raise SystemExit('unpickled before the check')",))

    newer = f'{{"format": {current + 1}, "fstrain": "9.9.0"}}\n'.encode() + pickle.dumps(Bomb())
    with pytest.raises(InputError) as refused:
        read_hand_off(io.BytesIO(newer))
    assert refused.value.one_line().startswith("the recovery keeper's stdin: recovery keeper hand-off written by "
                                               f"fstrain 9.9.0 (format {current + 1})")
    with pytest.raises(InputError, match="does not start with its format line"):
        read_hand_off(io.BytesIO(pickle.dumps(("an", "old", "hand-off"))))


def test_the_reported_step_is_the_highest_in_any_nodes_record() -> None:
    from fstrain.api.keeper import reported_step

    node0 = {"node": {"last_lines": ["[default0]:FSTRAIN_METRICS {\"step\": 4, \"loss\": 2.5}",
                                     "torchrun: stopped by signal 15"],
                      "ranks": {"0": {"progress_line": "[default0]:[fstrain.train] step 3/6 loss 2.6"}}}}
    node1 = {"node": {"last_lines": ["[default0]:[fstrain.train] checkpoint saved: step 2 in /c"], "ranks": {}}}
    assert reported_step([node0, node1, None]) == 4
    assert reported_step([{"node": {"last_lines": ["no step here"], "ranks": {}}}, None]) is None
