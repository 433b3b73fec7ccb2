"""Reading the failed rank and its own exit code from the launchers' output (fixtures captured
from torch 2.13's torchrun)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fstrain.core.monitor.rankexit import (
    FailureReportReader,
    RankFailure,
    deepspeed_launcher_code,
    describe_code,
    node_failure,
    rank_exit_report,
    shell_code,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "torchrun"


def read(name: str) -> RankFailure | None:
    reader = FailureReportReader()
    for line in (FIXTURES / name).read_text().splitlines():
        reader.feed(line)
    return reader.root_cause


@pytest.mark.parametrize(("name", "expected"), [
    ("failure_exit7_torch2.13.txt", RankFailure(1, 1, 7, "localhost")),
    ("failure_sigsegv_torch2.13.txt", RankFailure(0, 0, 139, "localhost")),
])
def test_root_cause_record_gives_the_rank_and_its_own_code(name: str, expected: RankFailure) -> None:
    assert read(name) == expected


def test_the_other_failures_in_the_report_are_not_the_root_cause() -> None:
    # The report lists the ranks torchrun itself SIGTERMed first; only the root cause counts.
    text = (FIXTURES / "failure_exit7_torch2.13.txt").read_text()
    assert "exitcode  : -15" in text
    assert read("failure_exit7_torch2.13.txt").exit_code == 7  # type: ignore[union-attr]


def test_no_report_no_root_cause() -> None:
    reader = FailureReportReader()
    for line in ["[default0]:rank : 3 (local_rank: 1)", "exitcode  : 9 (pid: 1)", "Root Cause", "[0]:"]:
        reader.feed(line)
    assert reader.root_cause is None


def test_codes_and_signal_names() -> None:
    assert shell_code(-11) == 139 and shell_code(7) == 7
    assert describe_code(139) == "139 (SIGSEGV)" and describe_code(7) == "7" and describe_code(255) == "255"
    assert deepspeed_launcher_code(245) == 139 and deepspeed_launcher_code(247) == 137
    assert deepspeed_launcher_code(7) == 7 and deepspeed_launcher_code(1) == 1
    assert RankFailure(3, 1, 139).describe() == "rank 3 (local rank 1), exit 139 (SIGSEGV)"
    assert RankFailure(None, None, 7).describe() == "a rank, exit 7"


def test_node_failure_per_backend() -> None:
    cause = RankFailure(None, 1, 7)
    assert node_failure("torchrun", 1, cause, rank_offset=2) == RankFailure(3, 1, 7)
    assert node_failure("torchrun", 1, None) is None  # torchrun died without a report
    assert node_failure("torchrun", 0, cause) is None
    assert node_failure("torchrun", None, cause) is None  # a lost host
    assert node_failure("deepspeed", 245, None) == RankFailure(None, None, 139)
    # The watchdog saw which rank exited first: that rank and its own code.
    assert node_failure("deepspeed", 245, RankFailure(2, 0, 139)) == RankFailure(2, 0, 139)
    # The direct backend's script names the rank itself and exits with its code as a shell says it.
    assert node_failure("direct", 9, RankFailure(3, 1, 9)) == RankFailure(3, 1, 9)
    assert node_failure("direct", 250, None) == RankFailure(None, None, 250)  # not folded as DeepSpeed's


def test_the_watchdogs_rank_exit_report() -> None:
    assert rank_exit_report({"rank": 3, "local_rank": 1, "exit_code": 7}) == RankFailure(3, 1, 7)
    assert rank_exit_report({"rank": 3, "local_rank": None, "exit_code": 139}) == RankFailure(3, None, 139)
    for bad in (None, "x", {"rank": "3", "exit_code": 7}, {"rank": 3, "exit_code": 0}, {"rank": 3}):
        assert rank_exit_report(bad) is None


def test_a_report_seen_by_the_watchdog_never_replaces_torchruns_own() -> None:
    reader = FailureReportReader()
    reader.observed(RankFailure(2, 0, 139))
    reader.observed(RankFailure(3, 1, 143))  # a rank the launcher killed afterwards
    reader.observed(None)
    assert reader.root_cause == RankFailure(2, 0, 139)
