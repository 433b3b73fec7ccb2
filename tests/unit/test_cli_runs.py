"""`fstrain runs/status/logs/gc` on this machine's records, without any host (own HOME)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from fstrain import __version__
from fstrain.api.runs import open_run
from fstrain.core.hosts.hostfile import Host
from fstrain.core.job.spec import NodeLaunch
from fstrain.core.runs.runrecord import DetachedNode, DetachedRecord, IndexEntry
from fstrain.io.launch import RunOutcome, RunSetup, manifest_of, write_manifest
from fstrain.io.runs import RunRecord, register, run_state
from tests.helpers import run_fstrain


def attached_run(home: Path, folder: Path, run_id: str, reason: str, exit_code: int,
                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An attached run as `fstrain launch` leaves it (through the functions it uses): the index
    entry, the manifest, the logs."""
    (folder / "logs").mkdir(parents=True)
    write_manifest(folder / "manifest.json", manifest_of(
        RunSetup(run_id, "torchrun", [NodeLaunch(Host("localhost"), 0, 2, ("python3", "train.py"))]),
        RunOutcome(exit_code, reason, None, [], time.time() - 60, time.time() - 30)))
    (folder / "logs" / "localhost.log").write_text("[localhost r0] hello\n[localhost r1] world\n")
    (folder / "logs" / "localhost.r1.log").write_text("[localhost r1] world\n")
    monkeypatch.setenv("HOME", str(home))  # the index is under this machine's home
    register(run_id, folder, detached=False)


def live_attached_run(home: Path, folder: Path, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An attached run still going, as `fstrain launch` leaves it while its ranks run: the index
    entry (this test's process as its launcher), a rank's first line, no manifest yet."""
    (folder / "logs").mkdir(parents=True)
    (folder / "logs" / "localhost.log").write_text("[localhost r0] [fstrain.train] step 1/4 loss 6.0 lr 1e-4 "
                                                   "tokens/s 9\n")
    monkeypatch.setenv("HOME", str(home))  # the index is under this machine's home
    register(run_id, folder, detached=False)


def test_runs_lists_finished_runs_only_with_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    env = {"HOME": str(home)}
    assert json.loads(run_fstrain("runs", "--json", env=env).stdout) == {"runs": []}
    attached_run(home, tmp_path / "a", "20261130-120000-aaaaaa", "failed", 7, monkeypatch)
    attached_run(home, tmp_path / "b", "20261130-130000-bbbbbb", "interrupted", 130, monkeypatch)
    assert json.loads(run_fstrain("runs", "--json", env=env).stdout) == {"runs": []}
    rows = json.loads(run_fstrain("runs", "--all", "--json", env=env).stdout)["runs"]
    assert [(r["run_id"], r["state"], r["exit_code"]) for r in rows] == [
        ("20261130-120000-aaaaaa", "failed", 7), ("20261130-130000-bbbbbb", "stopped", 130)]
    assert rows[0]["nodes"] == ["localhost"] and rows[0]["detached"] is False


def test_logs_of_an_attached_run_and_unknown_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    env = {"HOME": str(home)}
    attached_run(home, tmp_path / "a", "20261130-120000-aaaaaa", "ok", 0, monkeypatch)
    logs = run_fstrain("logs", "20261130-12", env=env)
    assert logs.returncode == 0 and logs.stdout == "[localhost r0] hello\n[localhost r1] world\n"
    assert run_fstrain("logs", "20261130-12", "--rank", "1", env=env).stdout == "[localhost r1] world\n"
    missing = run_fstrain("status", "nope", env=env)
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: RUN: no run 'nope' was started from this machine (hint:")
    attached_run(home, tmp_path / "b", "20261130-120000-bbbbbb", "ok", 0, monkeypatch)
    ambiguous = run_fstrain("logs", "20261130-12", env=env)
    assert ambiguous.returncode == 2 and "matches 2 runs" in ambiguous.stderr
    stop = run_fstrain("stop", "20261130-120000-aaaaaa", env=env)
    assert stop.returncode == 0 and "has already ended: succeeded, exit 0" in stop.stderr


def test_logs_no_metrics_leaves_out_the_metric_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    env = {"HOME": str(home)}
    attached_run(home, tmp_path / "a", "20261130-120000-aaaaaa", "ok", 0, monkeypatch)
    lines = ["[localhost r0] step 1\n", '[localhost r0] FSTRAIN_METRICS {"v":1,"step":1,"loss":2.5}\n',
             '[localhost r1] FSTRAIN_METRICS {"v":1,"step":1}\n', "[localhost r0] step 2\n",
             '[localhost r0] FSTRAIN_METRICS {"v":1,"step":2}\n']
    (tmp_path / "a" / "logs" / "localhost.log").write_text("".join(lines))
    shown = run_fstrain("logs", "20261130-12", env=env)
    assert (shown.returncode, shown.stdout) == (0, "".join(lines))  # as written unless asked
    hidden = run_fstrain("logs", "20261130-12", "--no-metrics", env=env)
    assert (hidden.returncode, hidden.stdout, hidden.stderr) == (0, "[localhost r0] step 1\n[localhost r0] step 2\n",
                                                                 "")
    last = run_fstrain("logs", "20261130-12", "--no-metrics", "--tail", "2", env=env)  # counts the lines shown
    assert (last.returncode, last.stdout) == (0, "[localhost r0] step 1\n[localhost r0] step 2\n")


def test_bad_durations_are_one_line(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    gc = run_fstrain("gc", "--older-than", "soon", env=env)
    assert gc.returncode == 2 and gc.stderr.startswith("error: --older-than: not a duration: 'soon'")
    launch = run_fstrain("launch", "--stall-timeout", "0s", "--", "python3", "x.py", env=env)
    assert launch.returncode == 2 and "--stall-timeout: the duration must be above 0" in launch.stderr


def test_status_of_an_attached_run_is_its_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    attached_run(home, tmp_path / "a", "20261130-120000-aaaaaa", "failed", 7, monkeypatch)
    document = json.loads(run_fstrain("status", "20261130-120000-aaaaaa", "--json", env={"HOME": str(home)}).stdout)
    assert (document["state"], document["exit_code"], document["detached"]) == ("failed", 7, False)
    assert document["nodes"][0]["host"] == "localhost"


def test_status_of_a_live_attached_run_by_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A still-going attached run has its index entry and run directory but no final manifest:
    its folder names it as its id does (`fstrain report` and `plan --calibrate` find it the same way)."""
    home, run_id = tmp_path / "home", "20261130-150000-eeeeee"
    folder = tmp_path / "runs" / run_id
    live_attached_run(home, folder, run_id, monkeypatch)
    for reference in (run_id, str(folder)):
        shown = run_fstrain("status", reference, "--json", env={"HOME": str(home)})
        assert shown.returncode == 0, shown.stderr
        document = json.loads(shown.stdout)
        assert (document["run_id"], document["state"], document["detached"]) == (run_id, "running", False)
    monkeypatch.chdir(tmp_path)
    assert open_run(f"./runs/{run_id}").state().state == "running"
    # Between two attempts (--on-failure) the manifest lists them but has no end: its launcher says.
    write_manifest(folder / "manifest.json", replace(manifest_of(
        RunSetup(run_id, "torchrun", [NodeLaunch(Host("localhost"), 0, 2, ("python3", "train.py"))]),
        RunOutcome(1, "failed", None, [], time.time() - 60, time.time() - 30)), ended=None, reason="restarting"))
    assert open_run(f"./runs/{run_id}").state().state == "running"


def test_status_of_a_live_attached_run_lists_every_rank_with_its_numbers(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """While an attached run goes on, its ranks are those of its logs here, on the hosts its
    events file says it started; once it ended, the manifest's nodes, and no rank is alive."""
    from fstrain.io.runevents import EventLog

    home, run_id = tmp_path / "home", "20261130-160000-ffffff"
    folder = tmp_path / "runs" / run_id
    live_attached_run(home, folder, run_id, monkeypatch)
    EventLog.in_folder(folder, run_id).write("started", hosts=["node2", "node1"])
    logs = folder / "logs"
    (logs / "node2.r0.log").write_text("[node2 r0] hello\n[node2 r0] [fstrain.train] step 3/8 loss 5.25 lr 1e-4 "
                                       "tokens/s 1,200\n")
    (logs / "node1.r1.log").write_text('[node1 r1] FSTRAIN_METRICS {"v":1,"step":2,"loss":6.5,"rank":1}\n')
    env = {"HOME": str(home), "COLUMNS": "200"}
    document = json.loads(run_fstrain("status", run_id, "--json", env=env).stdout)
    assert [(n["host"], n["node_rank"], n["exit_code"]) for n in document["nodes"]] == [("node2", 0, None),
                                                                                      ("node1", 1, None)]
    ranks = [(r["rank"], r["alive"], r["progress"]) for n in document["nodes"] for r in n["ranks"]]
    assert ranks == [(0, None, {"step": 3, "steps": 8, "loss": 5.25, "tokens_per_s": 1200.0, "step_s": None,
                                "memory_bytes": None}),
                     (1, None, {"step": 2, "steps": None, "loss": 6.5, "tokens_per_s": None, "step_s": None,
                                "memory_bytes": None})]
    table = run_fstrain("status", run_id, env=env)
    assert table.returncode == 0, table.stderr
    rows = [[cell for cell in line.split() if cell != "│"] for line in table.stderr.splitlines()
            if line.startswith(("node1", "node2"))]
    assert [row[:2] + row[-3:] for row in rows] == [["node2", "0", "3", "5.25", "1,200"],
                                                    ["node1", "1", "ago", "2", "6.5"]]  # "N s ago", no tokens/s
    write_manifest(folder / "manifest.json", manifest_of(
        RunSetup(run_id, "torchrun", [NodeLaunch(Host("node2"), 0, 1, ("python3", "train.py")),
                                      NodeLaunch(Host("node1"), 1, 1, ("python3", "train.py"))]),
        RunOutcome(0, "ok", None, [], time.time() - 60, time.time() - 1)))
    ended = json.loads(run_fstrain("status", run_id, "--json", env=env).stdout)
    assert [(n["host"], [(r["rank"], r["alive"]) for r in n["ranks"]]) for n in ended["nodes"]] == [
        ("node2", [(0, False)]), ("node1", [(1, False)])]


def detached_run(home: Path, folder: Path, run_id: str, hosts: list[dict], node_dirs: list[Path],
                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A detached run as `launch --detach` records it here (the nodes' files are the caller's)."""
    folder.mkdir(parents=True)
    nodes = tuple(DetachedNode(Host(h["name"], user=h.get("user"), port=h.get("port")), i, 2, 2 * i,
                               str(node_dirs[i]), None, None) for i, h in enumerate(hosts))
    record = DetachedRecord(run_id, "torchrun", time.time() - 60, sys.executable, 15.0, None, "", None, nodes)
    (folder / "detached.json").write_text(json.dumps(record.to_dict(__version__)))
    monkeypatch.setenv("HOME", str(home))  # the index is under this machine's home
    register(run_id, folder, detached=True)


def test_logs_of_a_detached_run_name_the_host_that_could_not_be_read(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    node0 = tmp_path / "node0"
    node0.mkdir()
    now = time.time()
    (node0 / "node0.out").write_bytes(b"%.3f [default1]:bad \xff byte\n%.3f [default1]:tag kept\n" % (now - 5, now - 4))
    # node1 is a host whose SSH port refuses connections (loopback, port 1).
    config = tmp_path / "ssh_config"
    config.write_text("Host deadnode\n  HostName 127.0.0.1\n  Port 1\n  ConnectTimeout 5\n")
    hosts = [{"name": "localhost", "user": None, "port": None}, {"name": "deadnode", "user": None, "port": None}]
    detached_run(home, tmp_path / "run", "20261130-140000-cccccc", hosts, [node0, tmp_path / "node1"], monkeypatch)
    env = {"HOME": str(home)}
    logs = run_fstrain("logs", "20261130-14", "--ssh-config", str(config), env=env)
    assert logs.stdout == "[localhost r1] bad \ufffd byte\n[localhost r1] tag kept\n"
    assert logs.returncode == 1
    assert logs.stderr.startswith("error: deadnode: its output could not be read: ") and logs.stderr.count("\n") == 1
    only = run_fstrain("logs", "20261130-14", "--host", "localhost", "--tail", "1", "--since", "1m", env=env)
    assert (only.returncode, only.stdout, only.stderr) == (0, "[localhost r1] tag kept\n", "")


def test_since_is_refused_where_lines_have_no_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    attached_run(home, tmp_path / "a", "20261130-120000-aaaaaa", "ok", 0, monkeypatch)
    logs = run_fstrain("logs", "20261130-12", "--since", "5m", env={"HOME": str(home)})
    assert logs.returncode == 2
    assert logs.stderr.startswith("error: --since: --since needs the time of each line, and an attached run's")


def test_a_detached_run_recorded_before_node_0_answered(tmp_path: Path) -> None:
    """The record is written before any node starts: while nothing of the run shows on the
    nodes, it is starting as long as its launch lives, and lost once that is gone."""
    nodes = tuple(DetachedNode(Host(name), rank, 2, 2 * rank, f"/runs/x{rank}", None, None)
                  for rank, name in enumerate(("gpu-a", "gpu-b")))
    detached = DetachedRecord("20261201-120000-cccccc", "torchrun", time.time(), "python3", 15.0, None, "10.0.0.1",
                              None, nodes)
    nothing: list[dict[str, object] | None] = [{"node": None, "run": None, "watchdog_alive": False}] * 2

    def state(pid: int) -> tuple[str, str]:
        entry = IndexEntry(detached.run_id, str(tmp_path), True, time.time(), pid)
        found = run_state(RunRecord(detached.run_id, tmp_path, detached, None, entry), nothing)
        return found.state, found.reason

    assert state(os.getpid()) == ("starting", f"fstrain (pid {os.getpid()}) is starting gpu-a's watchdog")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    assert state(int(gone.stdout)) == ("lost", "the launch ended before gpu-a's watchdog answered")
    # Node 0 answered but shows nothing any more: the coordinator is gone, whoever launched it.
    answered = DetachedRecord(detached.run_id, "torchrun", detached.started, "python3", 15.0, None, "10.0.0.1", 4242,
                              (DetachedNode(Host("gpu-a"), 0, 2, 0, "/runs/x0", 99, 100), nodes[1]))
    entry = IndexEntry(detached.run_id, str(tmp_path), True, time.time(), os.getpid())
    assert run_state(RunRecord(detached.run_id, tmp_path, answered, None, entry), nothing).state == "lost"


def test_watch_reads_the_last_lines_of_local_log_files(tmp_path: Path) -> None:
    """An attached or Slurm run's output is read from files here, a chunk of lines at a time:
    the live view finds each line's numbers all the same."""
    from typing import Any, cast

    from fstrain.api.runs import Run
    from fstrain.cli.watch_output import plain_line, read_view
    from fstrain.core.monitor.watch import Watch
    from fstrain.io.logs import FileOutputs

    log = tmp_path / "h.log"
    log.write_text("".join(f"[h r0] [fstrain.train] step {i}/10 loss 1.0 tokens/s 5\n" for i in range(1, 5)))

    class Handle:
        def status(self) -> dict[str, Any]:
            return {"run_id": "r", "state": "running", "nodes": [{"host": "h", "node_rank": 0, "ranks": []}]}

    view = read_view(cast(Run, Handle()), FileOutputs(lambda: [log]), Watch())
    assert view.step == 4 and [(r.host, r.rank) for r in view.rows] == [("h", 0)]
    assert plain_line(view) == "run r: running; step 4/10 (40%)"


def test_watch_json_of_an_ended_run_is_one_line_with_its_events_and_its_exit_code(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`status --watch --json` on a run that has ended: one line (the view and every event its
    file holds), exit code the run's."""
    from fstrain.io.runevents import EventLog

    home, run_id = tmp_path / "home", "20261130-120000-aaaaaa"
    attached_run(home, tmp_path / "a", run_id, "failed", 7, monkeypatch)
    log = EventLog.in_folder(tmp_path / "a", run_id)
    log.write("started", text="run started", at=100.0, hosts=("localhost",))
    log.write("failure", text="rank 1 on localhost exited with 7", at=130.0, host="localhost", rank=1, exit_code=7)
    log.write("finished", text="run failed, exit code 7", at=131.0, state="failed", exit_code=7)
    result = run_fstrain("status", run_id, "--watch", "--json", "--interval", "0.5", env={"HOME": str(home)})
    assert result.returncode == 7, result.stderr
    (line,) = result.stdout.splitlines()
    document = json.loads(line)
    assert (document["format"], document["run_id"], document["state"], document["exit_code"], document["ended"]) == \
        (1, run_id, "failed", 7, True)
    assert [(e["kind"], e["time"]) for e in document["events"]] == [("started", 100.0), ("failure", 130.0),
                                                                    ("finished", 131.0)]
    assert document["events"][1]["rank"] == 1
    assert [(r["host"], r["rank"], r["alive"]) for r in document["ranks"]] == [("localhost", 1, False)]  # its log's


def test_runs_show_step_and_eta_and_filter_by_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fstrain.cli.runs import step_cell

    home = tmp_path / "home"
    env = {"HOME": str(home)}
    attached_run(home, tmp_path / "a", "20261130-120000-aaaaaa", "failed", 7, monkeypatch)
    live_attached_run(home, tmp_path / "b", "20261130-150000-eeeeee", monkeypatch)  # at step 1 of 4
    rows = json.loads(run_fstrain("runs", "--state", "running", "--json", env=env).stdout)["runs"]
    assert [(r["run_id"], r["step"], r["steps"]) for r in rows] == [("20261130-150000-eeeeee", 1, 4)]
    assert rows[0]["eta_s"] is not None and rows[0]["eta_s"] > 0
    assert (step_cell(rows[0]), step_cell({**rows[0], "steps": None}), step_cell({"step": None})) == ("1/4", "1", "")
    table = run_fstrain("runs", "--state", "failed", "--state", "stopped", env={**env, "COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    assert "20261130-120000-aaaaaa │ failed" in table.stderr and "eeeeee" not in table.stderr  # ended, yet shown
    assert "┃ step ┃ ETA ┃" in table.stderr
    bad = run_fstrain("runs", "--state", "done", env=env)
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith("error: --state: unknown run state 'done' (hint: use one of pending, starting, "
                                 "running, stalled, succeeded, failed, stopped, lost)")
