"""An idle node costs next to nothing: its watchdog sleeps until the job ends, a stop request
comes or the heartbeat clock needs a look (once a second at most), and its rank-log relay looks
at the files twice a second once they stop growing, opening only those that grew. At 200 nodes
on one machine ten wake-ups a second per node were half a core. Real processes and files."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import pytest

import fstrain.io.remote.watchdog as watchdog_module
from fstrain.core.job.spec import SCRIPT_FLAGS
from fstrain.io.remote import source
from fstrain.io.remote.watchdog import BOOTSTRAP, RankLogTailer, Wakeup, wake_on_exit


def voluntary_switches(pid: int) -> int:
    """How often ``pid``'s threads have gone to sleep (and so woken) so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
    return total


def test_an_idle_watchdog_wakes_a_few_times_a_second(tmp_path: Path) -> None:
    """A watchdog whose job sleeps and whose rank log files stay still: under 8 wake-ups a
    second in all its threads (its supervisor and relay polled ten times a second each before)."""
    logs = tmp_path / "ranklogs"
    (logs / "run_x" / "attempt_0" / "0").mkdir(parents=True)
    (logs / "run_x" / "attempt_0" / "0" / "stdout.log").write_text("one line\n")
    header = {"source": source("watchdog"), "argv": [sys.executable, "-c", "import time; time.sleep(60)"],
              "env": {}, "run_dir": str(tmp_path / "run"), "run_id": "r", "node_rank": 0, "nproc": 1,
              "grace_s": 1, "heartbeat_timeout_s": 600, "rank_log_dir": str(logs)}
    watchdog = subprocess.Popen([sys.executable, *SCRIPT_FLAGS, "-c", BOOTSTRAP], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert watchdog.stdin is not None and watchdog.stdout is not None
    try:
        watchdog.stdin.write((json.dumps(header) + "\n").encode())
        watchdog.stdin.flush()
        assert b"[local0]:one line" in watchdog.stdout.readline(), "the relay runs"
        time.sleep(1.5)  # the relay's wait has grown to its longest
        before, started = voluntary_switches(watchdog.pid), time.monotonic()
        time.sleep(3.0)
        rate = (voluntary_switches(watchdog.pid) - before) / (time.monotonic() - started)
        assert rate < 8, f"{rate:.1f} wake-ups a second"
    finally:
        watchdog.stdin.write(b"kill\n")
        watchdog.stdin.close()
        watchdog.wait(timeout=30)
        watchdog.stdout.close()


def test_a_wakeup_ends_the_wait_from_a_thread_and_from_a_signal_handler() -> None:
    wakeup = Wakeup()
    threading.Timer(0.1, wakeup.set).start()
    started = time.monotonic()
    wakeup.wait(30)
    assert time.monotonic() - started < 10
    previous = signal.signal(signal.SIGUSR1, lambda *_: wakeup.set())
    try:
        threading.Timer(0.1, os.kill, args=(os.getpid(), signal.SIGUSR1)).start()
        started = time.monotonic()
        wakeup.wait(30)
        assert time.monotonic() - started < 10
    finally:
        signal.signal(signal.SIGUSR1, previous)
    started = time.monotonic()
    wakeup.wait(0.2)  # the wake-ups were used: this one sleeps its time
    assert time.monotonic() - started >= 0.15


def test_the_jobs_exit_wakes_the_supervisor_and_leaves_its_status_to_popen() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(0.3); sys.exit(7)"])
    wakeup = Wakeup()
    threading.Thread(target=wake_on_exit, args=(child.pid, wakeup), daemon=True).start()
    started = time.monotonic()
    wakeup.wait(30)
    assert time.monotonic() - started < 10, "woken by the exit, not the timeout"
    assert child.wait(timeout=5) == 7, "the exit status is still the job's to collect"


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files the relay opens, in order."""
    paths: list[str] = []

    def counting_open(path: str, mode: str = "r") -> IO[Any]:
        paths.append(str(path))
        return open(path, mode)  # the relay closes it

    monkeypatch.setattr(watchdog_module, "open", counting_open, raising=False)
    return paths


def test_the_relay_opens_only_files_that_grew(tmp_path: Path, opened: list[str],
                                             capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    folder = tmp_path / "ranklogs"
    folder.mkdir()
    log = folder / "job_rank0.log"
    log.write_bytes(b"first\n")
    tailer = RankLogTailer(str(folder), 1)
    assert tailer.poll(final=False) is True
    for _ in range(5):
        assert tailer.poll(final=False) is False
    assert opened == [str(log)], "a file that did not grow is not opened again"
    with log.open("ab") as handle:
        handle.write(b"second\npart")
    assert tailer.poll(final=False) is True
    tailer.finish()
    assert capfdbinary.readouterr().out == b"[local0]:first\n[local0]:second\n[local0]:part\n"


def test_a_file_added_in_the_same_tick_as_the_last_look_is_found(tmp_path: Path,
                                                                  capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    """A folder's mtime does not change when a file is added within the same tick of the
    filesystem's clock: the relay does not trust a listing younger than FOLDER_SETTLED_S."""
    folder = tmp_path / "ranklogs"
    folder.mkdir()
    (folder / "job_rank0.log").write_bytes(b"zero\n")
    tailer = RankLogTailer(str(folder), 2)
    tailer.poll(final=False)
    stamp = os.stat(folder).st_mtime_ns
    (folder / "job_rank1.log").write_bytes(b"one\n")
    os.utime(folder, ns=(stamp, stamp))  # as if added within the same tick
    tailer.poll(final=False)
    assert capfdbinary.readouterr().out == b"[local0]:zero\n[local1]:one\n"


def test_a_settled_listing_is_walked_again_once_a_folder_changes(tmp_path: Path,
                                                                 capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    """torchrun's layout: a new attempt's folder shows in its parent's mtime."""
    folder = tmp_path / "ranklogs"
    (folder / "run_x" / "attempt_0" / "0").mkdir(parents=True)
    (folder / "run_x" / "attempt_0" / "0" / "stdout.log").write_bytes(b"a0\n")
    old = time.time_ns() - 60 * 10**9
    for path in (folder, folder / "run_x", folder / "run_x" / "attempt_0", folder / "run_x" / "attempt_0" / "0"):
        os.utime(path, ns=(old, old))
    tailer = RankLogTailer(str(folder), 1)
    tailer.poll(final=False)
    assert tailer.folder_stamps, "a listing this old is trusted"
    (folder / "run_x" / "attempt_1" / "0").mkdir(parents=True)
    (folder / "run_x" / "attempt_1" / "0" / "stdout.log").write_bytes(b"a1\n")
    tailer.poll(final=False)
    assert tailer.latest_attempt == 1
    assert capfdbinary.readouterr().out == b"[local0]:a0\n[local0]:a1\n"


def test_the_relays_wait_grows_while_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    looks: list[float] = []
    tailer = RankLogTailer(str(tmp_path), 1)

    def poll(final: bool) -> bool:
        looks.append(time.monotonic())
        return False

    monkeypatch.setattr(tailer, "poll", poll)
    thread = threading.Thread(target=tailer.follow, daemon=True)
    thread.start()
    time.sleep(3.0)
    tailer.done.set()
    thread.join(5)
    gaps = [b - a for a, b in itertools.pairwise(looks)]
    assert len(looks) <= 10, f"{len(looks)} looks in 3 s (every 0.1 s would be 30)"
    assert max(gaps) <= RankLogTailer.IDLE_POLL_MAX_S + 0.3
