"""`fstrain report` of a run whose hosts do not answer: a report all the same, the hosts named;
of a failed attached run: the failing rank's last lines, on the page, in --json and on stderr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fstrain import api
from fstrain.io.launch import write_manifest
from fstrain.io.runs import register
from tests.helpers import manifest, run_fstrain
from tests.unit.test_cli_runs import detached_run, live_attached_run
from tests.unit.test_report_failure import RANK_3_LINES, failed_manifest


def test_a_detached_run_whose_node_0_refuses_ssh_is_reported_all_the_same(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    config = tmp_path / "ssh_config"  # a host whose SSH port refuses connections (loopback, port 1)
    config.write_text("Host deadnode\n  HostName 127.0.0.1\n  Port 1\n  ConnectTimeout 5\n")
    detached_run(home, tmp_path / "run", "20261201-150000-dddddd", [{"name": "deadnode"}], [tmp_path / "node0"],
                 monkeypatch)
    shown = run_fstrain("report", "20261201-15", "--ssh-config", str(config), "--json", env={"HOME": str(home)})
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    # Its launch (this test's process, as the index says) lives: still starting, no end yet.
    assert document["state"]["state"] == "starting" and document["summary"] is None
    assert [(e["kind"], e["where"]) for e in document["events"]] == [("start", ""), ("failure", "deadnode")]
    assert any(note.startswith("the output of deadnode (") for note in document["notes"])
    assert "note: the output of deadnode" in shown.stderr and not (tmp_path / "run" / "report.html").exists()
    same = api.report("20261201-15", api.Access(ssh_config=str(config)))  # the Python API: the same numbers
    assert (same.state.state, same.summary, [e.kind for e in same.events]) == ("starting", None, ["start", "failure"])
    written = run_fstrain("report", "20261201-15", "--ssh-config", str(config), env={"HOME": str(home)})
    assert written.returncode == 0 and (tmp_path / "run" / "report.html").is_file()
    assert f"written to {tmp_path / 'run' / 'report.html'}" in written.stderr


def test_a_report_that_cannot_be_written_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    config = tmp_path / "ssh_config"
    config.write_text("Host deadnode\n  HostName 127.0.0.1\n  Port 1\n  ConnectTimeout 5\n")
    detached_run(home, tmp_path / "run", "20261201-160000-eeeeee", [{"name": "deadnode"}], [tmp_path / "node0"],
                 monkeypatch)
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "report.html"  # under a file, not a folder
    shown = run_fstrain("report", "20261201-16", "--ssh-config", str(config), "--out", str(out),
                        env={"HOME": str(home)})
    assert shown.returncode == 2
    assert shown.stderr == f"error: {out}: cannot write the report: File exists (hint: give " \
        "another --out FILE)\n"


def test_a_failed_attached_runs_report_shows_its_failing_ranks_last_lines(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    home, folder, run_id = tmp_path / "home", tmp_path / "run", "20261201-170000-ffffff"
    (folder / "logs").mkdir(parents=True)
    failure = {"rank": 3, "local_rank": 1, "exit_code": 7, "signal": None}
    write_manifest(folder / "manifest.json", manifest(**{**failed_manifest(RANK_3_LINES, failure), "run_id": run_id}))
    (folder / "logs" / "node2.log").write_text("".join(f"{line}\n" for line in RANK_3_LINES))
    monkeypatch.setenv("HOME", str(home))
    register(run_id, folder, detached=False)
    shown = run_fstrain("report", run_id, "--json", "--out", str(tmp_path / "report.html"), env={"HOME": str(home)})
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert document["state"]["state"] == "failed"
    assert document["failure"]["lines"] == RANK_3_LINES and document["failure"]["rank"] == 3
    assert "rank 3 on node2 (exit 7) failed; its last lines:\n  [node2 r3] step 2 done\n" in shown.stderr
    assert "  [node2 r3] ValueError: bad batch <7>\n" in shown.stderr
    page = (tmp_path / "report.html").read_text()
    assert 'data-section="failure"' in page and "[node2 r3] ValueError: bad batch &lt;7&gt;" in page


def test_a_live_attached_run_is_reported_by_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, run_id = tmp_path / "home", "20261201-160000-eeeeee"
    live_attached_run(home, tmp_path / "runs" / run_id, run_id, monkeypatch)
    shown = run_fstrain("report", str(tmp_path / "runs" / run_id), "--json", env={"HOME": str(home)})
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert (document["run_id"], document["kind"], document["state"]["state"]) == (run_id, "attached", "running")
    assert [(r["rank"], len(r["points"])) for r in document["ranks"]] == [(0, 1)]  # its lines so far
