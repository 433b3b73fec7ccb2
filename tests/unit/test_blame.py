"""Who is at fault for a failed attempt: the rules of fstrain/core/launch/blame.py on values,
and on the ends of ranks captured from real torchrun runs (tests/fixtures/blame/*.json: the
evidence and the verdict expected; a new failure shape is a new file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fstrain.core.launch.blame import Evidence, RankEnd, Verdict, blame, last_exception, read_end, stalled_host
from fstrain.core.monitor.rankexit import RankFailure

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "blame"
HOSTS = ("node1", "node2", "node3", "node4")


def end(host: str, rank: int, code: int, *lines: str) -> RankEnd:
    return RankEnd(rank, None, code, host, tuple(lines))


def traceback(exception: str, rank: int = 0) -> tuple[str, ...]:
    return (f"[local{rank}]:step 3", f"[local{rank}]:[rank{rank}]: Traceback (most recent call last):",
            f'[local{rank}]:[rank{rank}]:   File "train.py", line 7, in <module>',
            f"[local{rank}]:[rank{rank}]: {exception}")


GLOO_RESET = ("[default0]:[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
              "[198.18.0.12]:12697: Connection reset by peer.")


def evidence_of(document: dict[str, Any]) -> Evidence:
    failed = tuple(RankEnd(f["rank"], None, f["exit_code"], f["host"], tuple(f["last_lines"]))
                   for f in document.get("failed", []))
    return Evidence(tuple(document["hosts"]), failed, tuple(document.get("lost_hosts", [])),
                    document.get("stalled_host"), document.get("first_failure_host"))


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.stem)
def test_captured_failures(path: Path) -> None:
    document = json.loads(path.read_text())
    verdict = blame(evidence_of(document["evidence"]))
    assert (verdict.kind, list(verdict.suspects)) == (document["expected"]["kind"],
                                                     document["expected"]["suspects"]), verdict.why


def test_the_fixtures_cover_each_kind() -> None:
    kinds = {json.loads(p.read_text())["expected"]["kind"] for p in FIXTURES.glob("*.json")}
    assert {"hardware", "application"} <= kinds


def test_a_host_that_stopped_answering_is_a_hardware_suspect() -> None:
    verdict = blame(Evidence(HOSTS, lost_hosts=("node3",)))
    assert verdict == Verdict("hardware", ("node3",), "node3 stopped answering")


def test_every_host_lost_blames_none_of_them() -> None:
    verdict = blame(Evidence(HOSTS[:2], lost_hosts=HOSTS[:2]))
    assert verdict.kind == "unknown" and verdict.suspects == ()
    assert "network" in verdict.why


def test_the_same_exception_on_every_host_is_the_programs() -> None:
    failed = tuple(end(h, i, 1, *traceback(f"ValueError: bad batch on rank {i}", i)) for i, h in enumerate(HOSTS))
    verdict = blame(Evidence(HOSTS, failed, first_failure_host="node2"))
    assert verdict.kind == "application" and verdict.suspects == ()
    assert "ValueError: bad batch on rank 0" in verdict.why and "4 ranks" in verdict.why


def test_an_exception_on_the_only_host_is_the_programs() -> None:
    verdict = blame(Evidence(("node1",), (end("node1", 0, 1, *traceback("KeyError: 'w'")),)))
    assert verdict.kind == "application"


def test_an_exception_on_one_host_of_several_is_not_enough_to_blame() -> None:
    verdict = blame(Evidence(HOSTS, (end("node2", 1, 1, *traceback("OSError: [Errno 5] Input/output error")),)))
    assert verdict.kind == "unknown" and verdict.suspects == ("node2",)


def test_different_exceptions_are_unknown() -> None:
    failed = (end("node1", 0, 1, *traceback("ValueError: x")), end("node2", 1, 1, *traceback("KeyError: 'y'")))
    assert blame(Evidence(HOSTS, failed)).kind == "unknown"


@pytest.mark.parametrize("code", [137, 139, 135, 132])  # SIGKILL, SIGSEGV, SIGBUS, SIGILL
def test_a_rank_killed_by_a_fault_signal_points_at_its_host(code: int) -> None:
    failed = (end("node3", 5, code, "[local1]:step 3"), end("node1", 0, 1, GLOO_RESET))
    verdict = blame(Evidence(HOSTS, failed, first_failure_host="node3"))
    assert verdict.kind == "hardware" and verdict.suspects == ("node3",)
    assert "rank 5 on node3 was killed by SIG" in verdict.why


def test_sigterm_is_a_consequence_not_a_cause() -> None:
    verdict = blame(Evidence(HOSTS, (end("node2", 1, 143),), first_failure_host="node2"))
    assert verdict.kind == "unknown" and verdict.suspects == ("node2",)


def test_a_gpu_fault_outranks_the_exception_it_raises() -> None:
    lines = traceback("RuntimeError: CUDA error: uncorrectable ECC error encountered", 2)
    verdict = blame(Evidence(HOSTS, (end("node4", 7, 1, *lines),)))
    assert verdict.kind == "hardware" and verdict.suspects == ("node4",)
    assert "ECC" in verdict.why


def test_a_connection_error_on_one_host_points_at_it() -> None:
    verdict = blame(Evidence(HOSTS, (end("node2", 1, 1, GLOO_RESET),)))
    assert verdict.kind == "hardware" and verdict.suspects == ("node2",)
    assert "connection error on node2 only" in verdict.why


def test_connection_errors_everywhere_name_nobody() -> None:
    failed = tuple(end(h, i, 1, GLOO_RESET) for i, h in enumerate(HOSTS))
    verdict = blame(Evidence(HOSTS, failed))
    assert verdict.kind == "unknown" and verdict.suspects == ()


def test_a_stall_points_at_the_host_behind() -> None:
    verdict = blame(Evidence(HOSTS, stalled_host="node4"))
    assert verdict == Verdict("hardware", ("node4",), "the stack dumps show node4's rank behind the others")


def test_a_signal_and_an_exception_elsewhere_conflict() -> None:
    failed = (end("node1", 0, 139), end("node2", 1, 1, *traceback("ValueError: x")))
    verdict = blame(Evidence(HOSTS, failed, first_failure_host="node1"))
    assert verdict.kind == "unknown" and verdict.suspects == ("node1",)
    assert verdict.why.startswith("conflicting evidence")


def test_more_than_half_of_the_hosts_implicated_is_unknown() -> None:
    failed = tuple(end(h, i, 137) for i, h in enumerate(HOSTS[:3]))
    verdict = blame(Evidence(HOSTS, failed, first_failure_host="node2"))
    assert verdict.kind == "unknown" and verdict.suspects == ("node2", "node1", "node3")


def test_two_of_four_hosts_is_still_hardware() -> None:
    verdict = blame(Evidence(HOSTS, (end("node4", 3, 137),), lost_hosts=("node2",)))
    assert verdict.kind == "hardware" and verdict.suspects == ("node2", "node4")


def test_no_evidence_is_unknown() -> None:
    assert blame(Evidence(HOSTS)) == Verdict("unknown", (), "no evidence: no rank failed, no host was lost "
                                                            "and no stall was seen")


def test_a_stall_whose_stacks_name_no_host_says_so() -> None:
    """A hang the stall timeout ended, where the stacks show no rank behind (the others had ended):
    unknown, and not "no stall was seen"."""
    verdict = blame(Evidence(HOSTS, stalled=True))
    assert verdict.kind == "unknown" and verdict.suspects == ()
    assert verdict.why.startswith("the run stalled, but its stacks show no host's rank behind the others")
    assert blame(Evidence(HOSTS, stalled=True, stalled_host="node2")).suspects == ("node2",)


def test_an_exit_without_words_is_unknown_and_names_the_first_failure() -> None:
    verdict = blame(Evidence(HOSTS, (end("node3", 2, 1, "[local0]:step 3"),), first_failure_host="node3"))
    assert verdict.kind == "unknown" and verdict.suspects == ("node3",)
    assert "rank 2 on node3 exited with 1" in verdict.why


def test_last_exception_reads_the_last_traceback_and_skips_the_agents() -> None:
    lines = [*traceback("KeyError: 'a'"), *traceback("ValueError: b"), "Traceback (most recent call last):",
             '  File "run.py", line 1, in <module>',
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "]
    assert last_exception(lines[:8]) == "ValueError: b"
    assert last_exception(lines) == ""
    assert last_exception(["step 1"]) == ""


def test_the_launchers_rank_tails_are_read_through_their_tags() -> None:
    tail = ["[node2 r3] step 3", "[node2 r3] [rank3]: Traceback (most recent call last):",
            '[node2 r3] [rank3]:   File "train.py", line 7, in <module>', "[node2 r3] [rank3]: KeyError: 'w'"]
    assert last_exception(tail) == "KeyError: 'w'"
    assert last_exception(["[node-a.example r12] Traceback (most recent call last):",
                           "[node-a.example r12] ValueError: x"]) == "ValueError: x"


def test_rank_end_is_a_rank_failure_with_its_lines() -> None:
    failure = RankFailure(3, 1, 139)
    ranked = RankEnd.of(failure, host="node2", last_lines=["x"])
    assert (ranked.rank, ranked.local_rank, ranked.exit_code, ranked.host, ranked.signal) == (3, 1, 139, "node2",
                                                                                            "SIGSEGV")
    assert ranked.last_lines == ("x",) and ranked.describe() == "rank 3 (local rank 1), exit 139 (SIGSEGV)"
    assert read_end(ranked).cause == "signal"
    record = RankEnd.from_record("node2", {"rank": 3, "local_rank": 1, "exit_code": 137, "signal": "SIGKILL"}, ["x"])
    assert record == RankEnd(3, 1, 137, "node2", ("x",)) and record.signal == "SIGKILL"
    assert RankEnd.from_record("node2", {"rank": 3}) is None


def test_stalled_host_from_a_hang_report() -> None:
    report = {"reason": "no rank printed anything for 30 s", "odd_ranks": [3], "common": "all_reduce (x.py:1)",
              "where": {"0": "a", "1": "a", "2": "a", "3": "b"}, "node_of_rank": {"0": 0, "1": 0, "2": 1, "3": 1}}
    assert stalled_host(report, ("node1", "node2")) == "node2"
    assert stalled_host({**report, "odd_ranks": [0, 3]}, ("node1", "node2")) is None  # two hosts: no one
    assert stalled_host({**report, "common": None}, ("node1", "node2")) is None  # nobody agrees
    recorder = {**report, "odd_ranks": [0, 1, 2, 3], "common": None, "flight_recorder_behind": [1]}
    assert stalled_host(recorder, ("node1", "node2")) == "node1"
    finished = {**report, "reason": "some ranks finished 10 s ago and others are still running",
                "odd_ranks": [2, 3], "common": None}
    assert stalled_host(finished, ("node1", "node2")) == "node2"


def test_the_interpreters_start_up_errors_read_as_exceptions() -> None:
    """`python -m` of a module it cannot find, or a missing script: one line, no traceback."""
    assert last_exception(["[node2 r1] /usr/bin/python3: Error while finding module specification for "
                           "'fstrain.train' (ModuleNotFoundError: No module named 'fstrain')"]) == \
        "ModuleNotFoundError: No module named 'fstrain'"
    assert last_exception(["/opt/venv/bin/python3.11: No module named train"]) == \
        "ModuleNotFoundError: No module named train"
    assert last_exception(["[local0]:python: can't open file '/w/train.py': [Errno 2] No such file or directory"]) == \
        "FileNotFoundError: can't open file '/w/train.py': [Errno 2] No such file or directory"
    assert last_exception(["step 3: the python: no module named thing in the docs"]) == ""
