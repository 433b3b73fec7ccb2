"""The watchdog's ``prewarm``: the launcher's Python is started (and imports its module) before
fstrain sends the full header; then it runs the module as ``python -m`` would, with the final
arguments and environment. Real processes on this machine, with a module of our own standing in
for torch.distributed.run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fstrain.core.job.spec import SCRIPT_FLAGS
from fstrain.io.remote import source
from fstrain.io.remote.watchdog import BOOTSTRAP

MODULE = "fstprewarm_mod"
Started = tuple[subprocess.Popen[bytes], list[str], dict[str, Any]]  # (watchdog, prefix, the early header)
Starter = Callable[[Path], Started]
# Notes its import (pid, and whether the final environment was there yet), then, run as
# __main__, prints what it was given and exits with EXIT_WITH.
# The mark is written under another name and renamed, so a reader never sees it half-written.
MODULE_SOURCE = """\
import json, os, sys, time
writing = os.path.join(os.environ["MARKS"], ".writing-%d" % os.getpid())
with open(writing, "w") as handle:
    json.dump({"late": os.environ.get("LATE")}, handle)
os.replace(writing, os.path.join(os.environ["MARKS"], "import-%d-%d" % (os.getpid(), time.monotonic_ns())))
if __name__ == "__main__":
    print(json.dumps({"pid": os.getpid(), "argv": sys.argv, "late": os.environ.get("LATE"),
                      "run_id": os.environ.get("FSTRAIN_RUN_ID"), "grace": os.environ.get("FSTRAIN_GRACE_S"),
                      "cwd": os.getcwd(), "path0": sys.path[0],
                      "stdin": sys.stdin.read()}), flush=True)
    sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Starter]:
    """``start(tmp_path)``: a watchdog with the early header. Whatever a test leaves running (a
    watchdog waiting for its header, a prewarmed Python) is ended when it finishes, pass or fail."""
    watchdogs: list[subprocess.Popen[bytes]] = []

    def started(folder: Path) -> Started:
        watchdog, prefix, early = start_watchdog(folder)
        watchdogs.append(watchdog)
        return watchdog, prefix, early

    try:
        yield started
    finally:
        for watchdog in watchdogs:
            end(watchdog)
        for pid in module_processes(tmp_path / "marks"):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def module_processes(marks: Path) -> list[int]:
    """This test's prewarmed Pythons still running: the processes whose environment has its MARKS."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"MARKS={marks}".encode() in environ and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def end(watchdog: subprocess.Popen[bytes]) -> None:
    """End of file first (the watchdog then ends its prewarmed Python), SIGKILL if that fails."""
    for stream in (watchdog.stdin, watchdog.stdout):
        with contextlib.suppress(OSError):
            if stream is not None:
                stream.close()
    try:
        watchdog.wait(timeout=10)
    except subprocess.TimeoutExpired:
        watchdog.kill()
        watchdog.wait(timeout=10)


def start_watchdog(tmp_path: Path) -> Started:
    """A watchdog with the early header; (process, prefix, the early header)."""
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / f"{MODULE}.py").write_text(MODULE_SOURCE)
    (tmp_path / "marks").mkdir()
    prefix = [sys.executable, "-m", MODULE]
    env = {"PYTHONUNBUFFERED": "1", "MARKS": str(tmp_path / "marks"), "PYTHONPATH": ""}
    early = {"source": source("watchdog"), "prewarm": prefix, "workdir": str(tmp_path / "work"), "env": env,
             "run_id": "run-p", "node_rank": 0, "state_dir": str(tmp_path / "state")}
    watchdog = subprocess.Popen([sys.executable, *SCRIPT_FLAGS, "-c", BOOTSTRAP], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    assert watchdog.stdin is not None
    watchdog.stdin.write((json.dumps(early) + "\n").encode())
    watchdog.stdin.flush()
    return watchdog, prefix, early


def imports(tmp_path: Path, count: int = 1, timeout_s: float = 30) -> list[int]:
    """The pids that imported the module, once ``count`` have."""
    deadline = time.monotonic() + timeout_s
    while True:
        marks = sorted((tmp_path / "marks").glob("import-*"), key=lambda p: int(p.name.split("-")[2]))
        pids = [int(p.name.split("-")[1]) for p in marks]
        if len(pids) >= count or time.monotonic() > deadline:
            return pids
        time.sleep(0.02)


def full_header(tmp_path: Path, early: dict[str, Any], argv: list[str], **env: str) -> bytes:
    header = {k: v for k, v in early.items() if k not in ("source", "prewarm")}
    header.update(argv=argv, env={**early["env"], **env}, run_dir=str(tmp_path / "run"), grace_s=2,
                  heartbeat_timeout_s=30)
    return (json.dumps(header) + "\n").encode()


def send(watchdog: subprocess.Popen[bytes], line: bytes) -> bytes:
    """Send the full header and read everything until the watchdog exits with its job (stdin
    stays open: its end would read as a lost launcher)."""
    assert watchdog.stdin is not None and watchdog.stdout is not None
    watchdog.stdin.write(line)
    watchdog.stdin.flush()
    out = watchdog.stdout.read()
    watchdog.wait(timeout=60)
    watchdog.stdin.close()
    watchdog.stdout.close()
    return out


def finish(watchdog: subprocess.Popen[bytes], line: bytes) -> tuple[int, dict[str, Any]]:
    """Send the full header and read the module's report."""
    out = send(watchdog, line)
    reports = [json.loads(text) for text in out.decode().splitlines() if text.startswith("{")]
    assert len(reports) == 1, out.decode()
    return watchdog.returncode, reports[0]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_the_module_is_imported_before_the_full_header_and_then_run_as_main(tmp_path: Path, start: Starter) -> None:
    watchdog, prefix, early = start(tmp_path)
    [prewarmed] = imports(tmp_path)  # imported while the watchdog still waits for its command
    [mark] = (tmp_path / "marks").glob(f"import-{prewarmed}-*")
    assert json.loads(mark.read_text()) == {"late": None}
    time.sleep(0.3)
    assert watchdog.poll() is None
    code, report = finish(watchdog, full_header(tmp_path, early, [*prefix, "--x", "{run_dir}/y"], LATE="yes",
                                                EXIT_WITH="5"))
    # The same process ran it, as `python -m`: argv[0] the module's file, the final environment.
    assert report["pid"] == prewarmed and code == 5
    assert report["argv"] == [str(tmp_path / "work" / f"{MODULE}.py"), "--x", f"{tmp_path / 'run'}/y"]
    assert (report["late"], report["run_id"], report["cwd"], report["stdin"]) == ("yes", "run-p",
                                                                                  str(tmp_path / "work"), "")
    assert report["path0"] == str(tmp_path / "work")  # as `python -m` sets it
    assert report["grace"] == "2"  # the full header's grace period, for a save on SIGTERM
    assert imports(tmp_path, 2, timeout_s=0.5) == [prewarmed] * 2  # run afresh as __main__, in the same process
    assert not list((tmp_path / "state").glob("*.json"))  # the pid record is removed at the end


def test_another_command_is_started_afresh(tmp_path: Path, start: Starter) -> None:
    watchdog, _, early = start(tmp_path)
    [prewarmed] = imports(tmp_path)
    argv = [sys.executable, "-u", "-m", MODULE, "z"]  # another prefix (-u): not what was prewarmed
    code, report = finish(watchdog, full_header(tmp_path, early, argv, LATE="yes"))
    assert code == 0 and report["pid"] != prewarmed and report["argv"][1:] == ["z"] and report["late"] == "yes"
    assert not alive(prewarmed)


def test_a_changed_startup_variable_starts_afresh(tmp_path: Path, start: Starter) -> None:
    watchdog, prefix, early = start(tmp_path)
    [prewarmed] = imports(tmp_path)
    code, report = finish(watchdog, full_header(tmp_path, early, [*prefix], PYTHONHASHSEED="7"))
    assert code == 0 and report["pid"] != prewarmed and not alive(prewarmed)


def test_another_working_directory_starts_afresh_there(tmp_path: Path, start: Starter) -> None:
    watchdog, prefix, early = start(tmp_path)
    [prewarmed] = imports(tmp_path)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / f"{MODULE}.py").write_text(MODULE_SOURCE)
    code, report = finish(watchdog, full_header(tmp_path, {**early, "workdir": str(tmp_path / "other")}, prefix))
    assert code == 0 and report["pid"] != prewarmed and report["cwd"] == str(tmp_path / "other")
    assert not alive(prewarmed)


def test_end_of_file_before_the_full_header_ends_the_waiting_python(tmp_path: Path, start: Starter) -> None:
    watchdog, _, _ = start(tmp_path)
    [prewarmed] = imports(tmp_path)
    assert watchdog.stdin is not None
    watchdog.stdin.close()  # the launcher is gone (failed preflight, Ctrl-C, lost link)
    assert watchdog.wait(timeout=30) == 0
    assert watchdog.stdout is not None
    watchdog.stdout.close()
    deadline = time.monotonic() + 10
    while alive(prewarmed) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(prewarmed)
    assert not list((tmp_path / "state").glob("*.json"))


def test_a_missing_working_directory_is_reported_by_the_full_start(tmp_path: Path, start: Starter) -> None:
    watchdog, prefix, early = start(tmp_path)
    imports(tmp_path)
    early["workdir"] = str(tmp_path / "gone")
    out = send(watchdog, full_header(tmp_path, early, prefix))
    assert watchdog.returncode == 2 and b"working directory" in out and b"gone" in out
    assert not [p for p in imports(tmp_path, timeout_s=0) if alive(p)]
    assert os.path.isdir(tmp_path / "work")
