"""Naming the ranks that differ in a hang, from stacks captured with faulthandler (three ranks
of a gloo job, rank 1 sleeping while ranks 0 and 2 wait in all_reduce)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fstrain.core.launch.duration import parse_duration_s
from fstrain.core.monitor.stacks import Frame, analyse, hang_report, in_collective, parse_stacks, where
from fstrain.errors import InputError

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "stacks"


def dump(rank: int) -> str:
    return (FIXTURES / f"faulthandler_gloo-allreduce-hang_rank{rank}.txt").read_text()


def test_faulthandler_dump_parses_threads_and_finds_the_main_one() -> None:
    threads = parse_stacks(dump(0))
    assert len(threads) == 2
    assert threads[0].frames[-1].function == "_bootstrap"  # a helper thread, not the main one
    frame = where(dump(0))
    assert frame is not None and frame.function == "all_reduce" and in_collective(frame)
    assert where(dump(1)) == Frame("/tmp/i14scratch/hang.py", 12, "<module>")


def test_the_rank_outside_the_collective_is_named() -> None:
    report = analyse({0: dump(0), 1: dump(1), 2: dump(2)})
    assert report.odd_ranks == (1,)
    assert report.common is not None and report.common.function == "all_reduce"
    assert report.lines() == ["ranks 0,2 are in all_reduce (distributed_c10d.py:3252)",
                              "rank 1 is in <module> (hang.py:12)"]


def test_after_others_finished_every_live_rank_is_a_straggler() -> None:
    report = analyse({1: dump(1)}, after_finish=True)
    assert report.odd_ranks == (1,) and report.common is None


def test_a_rank_without_a_readable_dump_is_named() -> None:
    report = analyse({0: dump(0), 2: dump(2), 3: ""})
    assert report.odd_ranks == (3,)
    assert report.lines()[-1] == "rank 3: no stack could be read"


def test_py_spy_format() -> None:
    text = ('Process 12: python train.py\nPython v3.11.7\n\nThread 12 (idle): "MainThread"\n'
            "    all_reduce (torch/distributed/distributed_c10d.py:3252)\n    <module> (train.py:13)\n"
            'Thread 15 (idle): "Thread-1"\n    _bootstrap (threading.py:1002)\n')
    assert where(text) == Frame("torch/distributed/distributed_c10d.py", 3252, "all_reduce")


@pytest.mark.parametrize(("text", "seconds"), [("20s", 20), ("20", 20), ("1.5m", 90), ("2h", 7200), ("7d", 604800)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration_s(text, "--x") == seconds


@pytest.mark.parametrize("text", ["", "abc", "5w", "-3s", "0s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(InputError, match="--x"):
        parse_duration_s(text, "--x")


def test_hang_report_from_node_reports() -> None:
    reports = {0: {"ranks": {"0": {"faulthandler": dump(0)}, "1": {"faulthandler": dump(1)}},
                   "nccl_traces": ["/r/nccl_trace_rank_0"]},
               1: {"ranks": {"2": {"faulthandler": dump(2), "py_spy": "Thread 1 (idle)"}}}}
    document, files = hang_report(reports, "no rank printed anything for 20 s", [])
    assert document["odd_ranks"] == [1] and document["node_of_rank"] == {"0": 0, "1": 0, "2": 1}
    assert document["nccl_traces"] == ["node rank 0: /r/nccl_trace_rank_0"]
    named, _ = hang_report(reports, "no rank printed anything for 20 s", [], ["gpu-a", "gpu-b"])
    assert named["nccl_traces"] == ["gpu-a: /r/nccl_trace_rank_0"]  # by host, where the hosts are known
    assert sorted(files) == ["rank0.faulthandler.txt", "rank1.faulthandler.txt", "rank2.faulthandler.txt",
                             "rank2.py-spy.txt"]


def test_the_coordinator_reads_the_watchdogs_event_lines() -> None:
    from fstrain.io.remote import coordinator, watchdog

    assert coordinator.EVENT_PREFIX == watchdog.EVENT_PREFIX


def _recorder(enqueued: int, name: str = "gloo:all_reduce") -> dict[str, Any]:
    # the shape of torch's _dump_fr_trace_json (version 2.10), as collect() cuts it
    entries = [{"collective_seq_id": seq, "pg_id": 0, "profiling_name": name, "state": "scheduled"}
               for seq in range(1, enqueued + 1)]
    return {"pg_status": {"0": {"last_completed_collective": str(enqueued - 1), "last_enqueued_collective":
                                str(enqueued), "last_started_collective": "-1"}}, "entries": entries}


def test_flight_recorders_name_the_rank_that_never_reached_the_collective() -> None:
    from fstrain.core.monitor.stacks import flight_recorder_lag

    behind, lines = flight_recorder_lag({0: _recorder(2), 1: _recorder(2), 2: _recorder(2), 3: _recorder(1)})
    assert behind == [3]
    assert lines == ["flight recorder, process group 0: rank 3 (1) behind the others' collective 2 (gloo:all_reduce)"]
    assert flight_recorder_lag({0: _recorder(2), 1: _recorder(2)}) == ([], [])
    assert flight_recorder_lag({0: {"pg_status": {"0": {"last_enqueued_collective": "x"}}}}) == ([], [])


def test_hang_report_carries_the_flight_recorders() -> None:
    reports = {0: {"ranks": {}, "nccl_traces": [], "flight_recorder": {"0": _recorder(2), "1": _recorder(1)}}}
    document, files = hang_report(reports, "no rank printed anything for 20 s", [])
    assert document["flight_recorder_behind"] == [1]
    assert document["summary"][-1].startswith("flight recorder, process group 0: rank 1 (1) behind")
    assert json.loads(files["rank0.flight-recorder.json"])["pg_status"]["0"]["last_enqueued_collective"] == "2"
