"""RUN_DIR/events.jsonl: the record (fstrain/core/runs/runevents.py) as values, and its writer
and reader (fstrain/io/runevents.py) on real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fstrain.core.runs.runevents import FIELDS, KINDS, RunEvent, parse_lines
from fstrain.errors import InputError
from fstrain.io.runevents import EventLog, read_events


def test_a_failure_writes_its_kinds_fields_only_and_reads_back_equal() -> None:
    event = RunEvent("failure", 1700000000.5, "r1", attempt=2, text="rank 3 on node2 exited with 7",
                     host="node2", rank=3, exit_code=7, step=9)  # step is no failure's field
    document = event.to_dict("9.9")
    assert document == {"format": 1, "fstrain": "9.9", "kind": "failure", "time": 1700000000.5, "run_id": "r1",
                        "attempt": 2, "host": "node2", "rank": 3, "exit_code": 7, "signal": None,
                        "text": "rank 3 on node2 exited with 7"}
    back = RunEvent.from_dict(json.loads(json.dumps(document)), "events.jsonl:1")
    assert back == RunEvent("failure", 1700000000.5, "r1", 2, "rank 3 on node2 exited with 7", host="node2", rank=3,
                            exit_code=7)


def test_blame_carries_suspects_evidence_and_tests() -> None:
    event = RunEvent("blame", 5.0, "r1", text="host node2", verdict="host", suspects=("node2",),
                     evidence="rank 3 on node2 was lost", tested={"node2": "sshd does not answer"})
    document = event.to_dict()
    assert {k: document[k] for k in FIELDS["blame"]} == {
        "verdict": "host", "suspects": ["node2"], "evidence": "rank 3 on node2 was lost",
        "tested": {"node2": "sshd does not answer"}}
    assert RunEvent.from_dict(document, "x") == event


def test_every_kind_round_trips() -> None:
    assert KINDS == ("started", "first_step", "failure", "blame", "excluded", "attempt", "resumed", "finished")
    for kind in KINDS:
        event = RunEvent(kind, 1.0, "r", 3, kind, hosts=("a", "b"), host="a", rank=0, exit_code=1, signal="SIGKILL",
                         step=4, state="failed", verdict="host", suspects=("a",), evidence="why",
                         tested={"a": "found"})
        back = RunEvent.from_dict(event.to_dict(), "x")
        assert back.to_dict() == event.to_dict()
        assert set(event.to_dict()) == {"format", "kind", "time", "run_id", "attempt", "text", *FIELDS[kind]}


def test_a_newer_format_and_a_bad_field_are_one_line_naming_the_line() -> None:
    newer = {"format": 2, "fstrain": "99.0", "kind": "started", "time": 1.0, "run_id": "r"}
    with pytest.raises(InputError, match=r"written by fstrain 99.0 \(format 2\)") as caught:
        parse_lines([json.dumps(newer)], "RUN/events.jsonl")
    assert caught.value.where == "RUN/events.jsonl:1"
    with pytest.raises(InputError, match="rank must be an integer") as caught:
        parse_lines(["", json.dumps({"kind": "failure", "time": 1.0, "run_id": "r", "rank": "3"})], "E")
    assert caught.value.where == "E:2"
    with pytest.raises(InputError, match="unknown run event kind 'exploded'"):
        RunEvent("exploded", 1.0, "r")


def test_the_writer_appends_flushed_lines_and_a_cut_last_line_is_skipped(tmp_path: Path) -> None:
    log = EventLog.in_folder(tmp_path / "run", "r1")
    log.write("started", text="run r1 started", at=10.0, hosts=("node1", "node2"))
    assert read_events(log.path) is not None
    first = log.path.read_bytes()
    # A writer killed mid-line: half a line, no newline.
    with log.path.open("ab") as handle:
        handle.write(b'{"format": 1, "kind": "first_st')
    read = read_events(log.path)
    assert read is not None and [e.kind for e in read.events] == ["started"] and read.skipped == 1
    log.write("first_step", text="step 1", at=11.0, step=1)
    assert log.path.read_bytes().startswith(first)  # appended, never rewritten
    read = read_events(log.path)
    assert read is not None
    assert [(e.kind, e.time, e.step, e.hosts) for e in read.events] == [
        ("started", 10.0, None, ("node1", "node2")), ("first_step", 11.0, 1, ())]
    assert read.skipped == 1
    assert read_events(tmp_path / "none.jsonl") is None


def test_a_write_that_fails_is_said_once_and_the_run_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) \
        -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    log = EventLog(blocker / "events.jsonl", "r1")  # its folder is a file
    log.write("started")
    log.write("finished", state="succeeded", exit_code=0)
    assert capsys.readouterr().err.count("cannot write") == 1
