"""Format versions of what fstrain writes (fstrain/core/formats.py): every kind round-trips, a
document without a version is format 1, a newer or unreadable one is one line wherever it is
read (the CLI exits 2; the watchdog and the coordinator refuse), and the node-side scripts'
copies of the versions match."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fstrain.core.formats import KINDS, check_format, problem, stamped, version
from fstrain.core.hosts.hostfile import Host
from fstrain.core.job.spec import SCRIPT_FLAGS
from fstrain.core.monitor import stacks
from fstrain.core.plan.planfile import PlanFile
from fstrain.core.runs.runrecord import DetachedNode, DetachedRecord, IndexEntry
from fstrain.errors import InputError
from fstrain.io.launch import RunOutcome, RunSetup, manifest_of, write_manifest
from fstrain.io.remote import coordinator, runctl, source, watchdog
from fstrain.io.render_files import to_yaml
from fstrain.io.runs import register, stop_on_node
from fstrain.io.transport.base import CommandResult
from fstrain.io.transport.fake import FakeTransport
from tests.coordinators import SECRET, ask, make_coordinator
from tests.helpers import run_fstrain
from tests.plans import make_plan

RUN_ID = "20261130-120000-aaaaaa"


def newer(kind: str) -> int:
    return KINDS[kind].current + 1


def known(kind: str) -> str:
    current = KINDS[kind].current
    return "format 1" if current == 1 else f"formats 1-{current}"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_round_trips_and_reads_old_documents_as_format_1(kind: str) -> None:
    spec = KINDS[kind]
    document = json.loads(json.dumps(stamped({"run_id": "r", spec.key: 99}, kind, "0.1.0")))
    assert document == {spec.key: spec.current, "fstrain": "0.1.0", "run_id": "r"}
    assert check_format(document, kind, "f") == spec.current
    assert check_format({"run_id": "r"}, kind, "f") == 1 == version({}, kind)
    assert problem(stamped({}, kind), kind) is None


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_newer_format_is_one_line_that_says_upgrade(kind: str) -> None:
    spec = KINDS[kind]
    with pytest.raises(InputError) as written_by:
        check_format({spec.key: newer(kind), "fstrain": "9.9.0"}, kind, "runs/a/x.json")
    assert written_by.value.one_line() == (f"runs/a/x.json: {spec.title} written by fstrain 9.9.0 (format "
                                           f"{newer(kind)}); this fstrain reads {known(kind)} (hint: upgrade fstrain)")
    assert problem({spec.key: newer(kind)}, kind) == (
        f"{spec.title} written by a newer fstrain (format {newer(kind)}); this fstrain reads {known(kind)}",
        "upgrade fstrain")


@pytest.mark.parametrize("value", ["2", 0, -1, True, None, 1.5])
def test_a_format_no_release_writes_is_one_line_with_what_to_do(value: object) -> None:
    with pytest.raises(InputError) as info:
        check_format({"format": value}, "manifest", "m.json")
    assert info.value.one_line() == (f"m.json: run manifest of format {value!r}, which no fstrain release writes "
                                     f"(hint: {KINDS['manifest'].redo})")
    assert problem([1, 2], "node") == ("node state of format 'list', which no fstrain release writes",
                                       KINDS["node"].redo)


def test_the_node_side_scripts_hold_the_same_versions() -> None:
    copies = {("header", watchdog.HEADER_FORMAT), ("node", watchdog.NODE_FORMAT),
              ("message", coordinator.MESSAGE_FORMAT), ("node", coordinator.NODE_FORMAT),
              ("run", coordinator.RUN_FORMAT), ("coordinator", coordinator.COORDINATOR_FORMAT),
              ("events", coordinator.EVENTS_FORMAT), ("ended_views", coordinator.ENDED_VIEWS_FORMAT),
              ("message", runctl.MESSAGE_FORMAT), ("coordinator", runctl.COORDINATOR_FORMAT),
              ("ended_views", runctl.ENDED_VIEWS_FORMAT),
              ("hang_report", stacks.HANG_REPORT_FORMAT)}
    assert {(kind, KINDS[kind].current) for kind, _ in copies} == copies


def test_typed_records_round_trip_and_check_their_format() -> None:
    entry = IndexEntry(RUN_ID, "/runs/a", True, 12.5, 321)
    assert IndexEntry.from_dict(json.loads(json.dumps(entry.to_dict("0.1.0"))), "e") == entry
    old = {"run_id": RUN_ID, "run_dir": "/runs/a", "detached": False, "registered": 1.0, "client_pid": 0}
    assert IndexEntry.from_dict(old, "e") == IndexEntry(RUN_ID, "/runs/a", False, 1.0, 0)
    record = DetachedRecord(RUN_ID, "torchrun", 10.0, "python3", 15.0, None, "198.18.0.11", 4242,
                            (DetachedNode(Host("node1", "me", 22), 0, 2, 0, "/r/a", 11, 12),
                             DetachedNode(Host("node2"), 1, 2, None, "/r/a", None, None)))
    document = json.loads(json.dumps(record.to_dict("0.1.0")))
    assert (document["format"], document["fstrain"]) == (KINDS["detached"].current, "0.1.0")
    assert DetachedRecord.from_dict(document, "d") == record
    assert DetachedRecord.from_dict({k: v for k, v in document.items() if k not in ("format", "fstrain")},
                                    "d") == record
    with pytest.raises(InputError, match=r"^d: detached run record written by fstrain 9\.0 \(format"):
        DetachedRecord.from_dict({**document, "format": newer("detached"), "fstrain": "9.0"}, "d")
    with pytest.raises(InputError, match=r"^d: nodes\[1\]: node_rank is missing"):
        DetachedRecord.from_dict({**document, "nodes": [document["nodes"][0], {"host": {"name": "x"}}]}, "d")


def test_plan_files_carry_their_version_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    plan = make_plan()
    data = plan.to_dict()
    assert data["fstrain_plan"] == KINDS["plan"].current
    assert PlanFile.from_dict(data, "plan.yaml") == plan
    path = tmp_path / "plan.yaml"
    path.write_text(to_yaml({**data, "fstrain_plan": newer("plan")}))
    result = run_fstrain("render", "--plan", str(path), "-o", str(tmp_path / "out"))
    assert result.returncode == 2 and result.stderr == (
        f"error: {path}: plan file written by a newer fstrain (format {newer('plan')}); this fstrain reads "
        f"{known('plan')} (hint: upgrade fstrain)\n")
    assert not (tmp_path / "out").exists()


def test_status_and_logs_of_a_run_folder_of_a_newer_format_exit_2(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    home, folder = tmp_path / "home", tmp_path / "run"
    manifest = folder / "manifest.json"
    write_manifest(manifest, manifest_of(RunSetup(RUN_ID, "torchrun", []),
                                         RunOutcome(0, "ok", None, [], time.time() - 5, time.time())))
    monkeypatch.setenv("HOME", str(home))
    register(RUN_ID, folder, detached=False)
    env = {"HOME": str(home)}
    assert run_fstrain("status", RUN_ID, env=env).returncode == 0
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format": newer("manifest"),
                                    "fstrain": "9.9.0"}))
    line = (f"error: {manifest}: run manifest written by fstrain 9.9.0 (format {newer('manifest')}); this fstrain "
            f"reads {known('manifest')} (hint: upgrade fstrain)\n")
    for command in ("status", "logs"):
        result = run_fstrain(command, RUN_ID, env=env)
        assert (result.returncode, result.stderr) == (2, line), command
    entry = home / ".fstrain" / "launched" / f"{RUN_ID}.json"
    entry.write_text(json.dumps({**json.loads(entry.read_text()), "format": newer("index")}))
    other = "20261201-090000-bbbbbb"
    register(other, tmp_path / "other", detached=False)  # a run this fstrain can read: still listed
    result = run_fstrain("runs", "--all", "--json", env=env)
    assert result.returncode == 0
    assert [row["run_id"] for row in json.loads(result.stdout)["runs"]] == [other]
    assert result.stderr.startswith(f"warning: run left out: {entry}: run index entry written by fstrain ")


def test_a_watchdog_refuses_a_header_of_a_newer_format(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    header = {"format": newer("header"), "source": source("watchdog"), "argv": ["touch", str(marker)], "env": {},
              "run_dir": str(tmp_path), "run_id": "r", "node_rank": 0}
    done = subprocess.run([sys.executable, *SCRIPT_FLAGS, "-c", watchdog.BOOTSTRAP],
                          input=(json.dumps(header) + "\n").encode(), capture_output=True, timeout=60, check=False)
    assert done.returncode == watchdog.EXIT_FORMAT == 125
    assert done.stderr.decode() == (f"fstrain watchdog: the header is format {newer('header')}, this watchdog reads "
                                    f"format {watchdog.HEADER_FORMAT}: send both from one fstrain\n")
    assert not marker.exists()


def test_a_coordinator_refuses_a_request_of_a_newer_format_and_answers_its_own(tmp_path: Path) -> None:
    secret = SECRET
    running = make_coordinator(tmp_path)
    node = running.node
    port = running.listen("127.0.0.1")
    refused = ask(port, {"format": newer("message"), "secret": secret, "control": "stop", "how": "term"})
    assert refused == {"format": KINDS["message"].current, "hint": "stop it with the fstrain that started it",
                       "refused": f"the run's coordinator reads coordinator messages of format "
                                  f"{KINDS['message'].current}, this request is format {newer('message')}: the run "
                                  "was started by an older fstrain"}
    assert running.run.stopping_since_s is None
    answer = ask(port, {"secret": secret, "control": "stop", "how": "term"})  # an older fstrain's: no format
    assert answer["ok"] is True and answer["format"] == KINDS["message"].current
    assert running.run.stopping_since_s is not None
    assert check_format(answer["state"], "run", "run.json") == KINDS["run"].current
    assert check_format(node.state(), "node", "node0.json") == KINDS["node"].current
    assert running.listener is not None
    running.listener.close()


def test_stop_says_in_one_line_when_node_0_speaks_another_format(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "coordinator.json").write_text(json.dumps({"format": newer("coordinator"), "address": "127.0.0.1",
                                                         "port": 1, "secret": "x"}))
    answer = runctl.stop(str(folder), "term", None)
    assert answer == {"refused": f"coordinator.json is format {newer('coordinator')}, this fstrain reads format "
                                 f"{runctl.COORDINATOR_FORMAT}: the run was started by a newer fstrain",
                      "hint": "upgrade fstrain"}

    def node0(reply: dict[str, object]) -> FakeTransport:
        return FakeTransport("node1", lambda argv, stdin: CommandResult(0, json.dumps(reply) + "\n", "", 0.1))

    with pytest.raises(InputError) as info:
        stop_on_node(lambda host: node0(answer), Host("node1"), "python3", "/r/a", "term")
    assert info.value.one_line() == f"node1:/r/a: {answer['refused']} (hint: upgrade fstrain)"
    with pytest.raises(InputError, match=r"^node1:/r/a: coordinator message written by a newer fstrain"):
        stop_on_node(lambda host: node0({"ok": True, "format": newer("message")}), Host("node1"), "python3", "/r/a",
                     "term")
    assert stop_on_node(lambda host: node0({"ok": True}), Host("node1"), "python3", "/r/a", "term") == {"ok": True}


def test_the_trainers_summary_and_a_hang_report_carry_their_format(tmp_path: Path) -> None:
    from fstrain.io.runs import read_summary

    path = tmp_path / "summary.json"
    path.write_text(json.dumps(stamped({"losses": [2.0]}, "summary", "0.1.0")))
    assert read_summary(path) == {"format": 1, "fstrain": "0.1.0", "losses": [2.0]}
    path.write_text(json.dumps({"losses": [2.0]}))  # an older trainer's: no stamp, format 1
    assert read_summary(path) == {"losses": [2.0]}
    path.write_text(json.dumps({"format": 2, "fstrain": "9.9.0", "losses": [2.0]}))
    with pytest.raises(InputError, match=r"training summary written by fstrain 9\.9\.0 \(format 2\)"):
        read_summary(path)
    document, _ = stacks.hang_report({}, "no rank printed anything for 60 s", [], ["node1"])
    assert document["format"] == KINDS["hang_report"].current
