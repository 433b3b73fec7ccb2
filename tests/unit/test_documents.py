"""Files written whole or not at all, and JSON read from a node: io/documents.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fstrain.core.hosts.hostfile import Host
from fstrain.io.documents import fetch_json, write_json_atomic, write_json_or_warn, write_text_atomic
from fstrain.io.transport.base import CommandResult
from fstrain.io.transport.fake import FakeTransport


def test_a_write_that_fails_leaves_the_old_file_and_no_partial(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "manifest.json"
    write_json_atomic(path, {"reason": "ok"})
    assert json.loads(path.read_text()) == {"reason": "ok"}
    with pytest.raises(TypeError):  # not JSON: nothing written, the old file intact
        write_json_atomic(path, {"reason": object()})
    (tmp_path / "runs" / "manifest.json.partial").mkdir()  # the temporary name cannot be written
    with pytest.raises(OSError):
        write_text_atomic(path, "new")
    assert json.loads(path.read_text()) == {"reason": "ok"}
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["manifest.json", "manifest.json.partial"]


def test_a_copy_that_cannot_be_written_is_said_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert write_json_or_warn(tmp_path / "summary.json", {"a": 1})
    (tmp_path / "summary.json.partial").mkdir()
    assert not write_json_or_warn(tmp_path / "summary.json", {"a": 2})
    assert capsys.readouterr().err == f"warning: cannot write {tmp_path / 'summary.json'} (Is a directory)\n"
    assert json.loads((tmp_path / "summary.json").read_text()) == {"a": 1}


def test_a_node_document_or_why_not() -> None:
    answers = {("cat", "/r/ok.json"): CommandResult(0, '{"a": 1}', "", 0.1),
               ("cat", "/r/cut.json"): CommandResult(0, '{"a": ', "", 0.1),
               ("cat", "/r/none.json"): CommandResult(1, "", "cat: /r/none.json: No such file or directory\n", 0.1)}

    def connect(host: Host) -> FakeTransport:
        return FakeTransport(host.name, lambda argv, stdin: answers[tuple(argv)])

    node = Host("node1")
    assert fetch_json(connect, node, "/r/ok.json") == ({"a": 1}, None)
    document, why = fetch_json(connect, node, "/r/cut.json")
    assert document is None and why is not None and why.startswith("unreadable (")
    assert fetch_json(connect, node, "/r/none.json") == (None, "cat: /r/none.json: No such file or directory")
