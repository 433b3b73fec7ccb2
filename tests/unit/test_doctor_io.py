"""The doctor's edge: the host helper run for real on this machine, and collection over fake transports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from fstrain.core.doctor import run_checks, select, stages
from fstrain.core.hosts.hostfile import Host
from fstrain.errors import TransportError
from fstrain.io.doctor import DoctorOptions, collect, load_plan
from fstrain.io.probe import probe_source
from fstrain.io.remote import source
from fstrain.io.transport.base import CommandResult, Transport
from fstrain.io.transport.fake import FakeTransport
from tests.unit.doctor_reports import minimal_report

HELPER = Path(__file__).resolve().parents[2] / "fstrain" / "io" / "remote" / "doctor_host.py"


def helper(*args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    done = subprocess.run([sys.executable, str(HELPER), *args], capture_output=True, text=True, check=True,
                          env={**os.environ, **(env or {})}, timeout=60)
    return json.loads(done.stdout)


def test_facts_reads_nccl_conf_files_and_named_files(tmp_path: Path) -> None:
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_DEBUG=INFO\n")
    topo = tmp_path / "topo.xml"
    topo.write_text("<system version=\"1\"/>\n")
    out = helper("facts", json.dumps({"workdir": str(tmp_path), "files": [str(topo), str(tmp_path / "nope")]}),
                 env={"NCCL_CONF_FILE": str(conf)})
    assert out["workdir_exists"] is True
    assert out["nccl_conf"][0] == [str(conf), "NCCL_DEBUG=INFO\n"]  # type: ignore[index]
    files = out["files"]
    assert isinstance(files, dict)
    assert files[str(topo)] == {"readable": True, "text": "<system version=\"1\"/>\n"}
    assert files[str(tmp_path / "nope")]["readable"] is False
    assert out["cap_ipc_lock"] in (True, False)


def test_disk_and_marker(tmp_path: Path) -> None:
    out = helper("disk", str(tmp_path / "later" / "ckpt"), str(1 << 20))
    assert out["exists"] is False and out["measured_at"] == str(tmp_path) and out["writable"] is True
    assert out["write_bytes"] == 1 << 20 and isinstance(out["write_s"], float)
    assert list(tmp_path.iterdir()) == []  # the timed file is gone
    assert helper("marker", "write", str(tmp_path), "m1") == {"ok": True}
    assert helper("marker", "check", str(tmp_path), "m1") == {"ok": True, "seen": True}
    assert helper("marker", "remove", str(tmp_path), "m1") == {"ok": True}
    assert helper("marker", "check", str(tmp_path), "m1") == {"ok": True, "seen": False}


@pytest.fixture
def orphan(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    """A run whose watchdog is gone: the job (and its child) carry FSTRAIN_RUN_ID; a decoy does not."""
    run_id = f"test-{os.getpid()}-{time.time_ns()}"
    job = subprocess.Popen([sys.executable, "-c", "import subprocess,time; subprocess.Popen(['sleep','300']); "
                            "time.sleep(300)"], env={**os.environ, "FSTRAIN_RUN_ID": run_id}, start_new_session=True)
    decoy = subprocess.Popen(["sleep", "300"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    state = tmp_path / "active"
    state.mkdir()
    started = time.time()
    record = {"run_id": run_id, "node_rank": 0, "watchdog_pid": gone.pid, "job_pid": job.pid, "started": started,
              "argv": ["python", "train.py"]}
    (state / f"{run_id}.node0.json").write_text(json.dumps(record))
    (state / "other.node0.json").write_text(json.dumps({**record, "run_id": "other", "job_pid": decoy.pid}))
    (state / "stale.node1.json").write_text(json.dumps({**record, "run_id": "stale", "job_pid": gone.pid}))
    time.sleep(0.3)  # let the job start its child
    try:
        yield state, job, decoy
    finally:
        for proc in (job, decoy):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL) if proc is job else proc.kill()
            proc.wait()


def test_orphans_are_found_by_run_id_and_ended_by_pid(
        orphan: tuple[Path, subprocess.Popen[bytes], subprocess.Popen[bytes]]) -> None:
    state, job, decoy = orphan
    listed = {r["run_id"]: r for r in helper("orphans", str(state), "0", "2")["runs"]}  # type: ignore[union-attr]
    mine = next(r for k, r in listed.items() if k.startswith("test-"))
    assert mine["state"] == "orphan" and mine["pids"][0] == job.pid and len(mine["pids"]) == 2
    assert listed["other"]["state"] == "unverified" and "not that run's process" in listed["other"]["note"]
    assert listed["stale"]["state"] == "stale"
    ended = {r["run_id"]: r for r in helper("orphans", str(state), "1", "2")["runs"]}  # type: ignore[union-attr]
    mine = next(r for k, r in ended.items() if k.startswith("test-"))
    assert sorted(mine["killed"]) == sorted(mine["pids"]) and mine["survivors"] == [] and mine["removed"] is True
    assert job.wait(timeout=10) is not None
    assert decoy.poll() is None  # never touched: its pid is in a record but it is not that run's process
    assert sorted(p.name for p in state.iterdir()) == ["other.node0.json"]  # the stale record went too


# --- collection over fake transports ---------------------------------------------------------


def responder(python_ok: Sequence[str]) -> FakeTransport:
    report = json.dumps(minimal_report("h1", software={"python": "3.11.7", "python_executable": "/usr/bin/python3",
                                                       "torch": "2.13.0+cpu"}))

    def answer(argv: Sequence[str], stdin: bytes | None) -> CommandResult:
        if argv[0] == "true":
            return CommandResult(0, "", "", 0.01)
        if argv[0] == "date":
            return CommandResult(0, f"{time.time():.6f}\n", "", 0.01)
        if argv[0] not in python_ok:
            return CommandResult(127, "", f"sh: {argv[0]}: not found", 0.01)
        if stdin == probe_source().encode():
            return CommandResult(0, report + "\n", "", 0.5)
        if stdin == source("doctor_host").encode() and argv[2] == "facts":
            return CommandResult(0, json.dumps({"nccl_conf": [["/etc/nccl.conf", "NCCL_DEBUG=verbose\n"]],
                                                "files": {}, "cap_ipc_lock": False}), "", 0.1)
        if stdin == source("doctor_host").encode() and argv[2] == "orphans":
            return CommandResult(0, json.dumps({"runs": []}), "", 0.1)
        return CommandResult(2, "", f"unexpected {argv}", 0.0)

    return FakeTransport("h1", answer)


def test_collect_falls_back_to_python3_and_keeps_going_past_unreachable_hosts() -> None:
    def connect(host: Host) -> Transport:
        if host.name == "down":
            raise TransportError("cannot connect to 10.0.0.9:22: Connection refused", "is the host up?", "down")
        return responder(python_ok=["python3"])

    checks = select("ssh,sw.interpreter,sw.python,env.values,proc")
    seen: list[tuple[str, str]] = []
    options = DoctorOptions(stages=stages(checks), python="/opt/missing/python")
    doctor = collect([Host("h1"), Host("down")], connect, options, progress=lambda h, w: seen.append((h, w)))
    h1, down = doctor.hosts
    assert down.reach_error == "cannot connect to 10.0.0.9:22: Connection refused (hint: is the host up?)"
    assert h1.python_error == "not found or not executable" and h1.probe_python == "python3"
    assert h1.report is not None and h1.nccl_conf == (("/etc/nccl.conf", "NCCL_DEBUG=verbose\n"),)
    assert h1.clock_offset_s is not None and abs(h1.clock_offset_s) < 1
    assert ("down", "unreachable") in seen and ("h1", "probing") in seen
    verdicts = {(r.id, r.hosts): r.verdict for r in run_checks(doctor, checks)}
    assert verdicts[("ssh.connect", ("down",))] == "fail"
    assert verdicts[("sw.interpreter", ("h1",))] == "fail"
    assert verdicts[("env.values", ("h1",))] == "fail"  # NCCL_DEBUG=verbose, read from /etc/nccl.conf
    assert verdicts[("proc.orphans", ("h1",))] == "ok"


def test_plan_file_errors_name_the_file(tmp_path: Path) -> None:
    from fstrain.errors import InputError

    with pytest.raises(InputError, match="plan file not found"):
        load_plan(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {}\n")
    with pytest.raises(InputError, match="not an fstrain plan"):
        load_plan(str(bad))
