"""The watchdog's side of --metrics-textfile, in this process: the rank log relay hands every
line and restart attempt to the textfile, which is written whole (tmp + rename), is never
replaced by a late periodic write after the final one, carries the time of each write and, at the
end, the job's state and exit code, and says once when it cannot write."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fstrain.core.job.spec import SCRIPT_FLAGS
from fstrain.core.monitor import metricline, promfile
from fstrain.core.monitor.metricline import StepMetrics, format_metric_line
from fstrain.io.remote import source, stacks
from fstrain.io.remote.watchdog import BOOTSTRAP, MetricsTextfile, RankLogTailer


def textfile(folder: Path, clock: Callable[[], float] = time.time) -> MetricsTextfile:
    header = {"run_id": "r1", "node_rank": 1, "nproc": 2, "rank_offset": 2}
    return MetricsTextfile(header, str(folder), promfile, metricline, stacks, clock)


def values(path: Path, name: str) -> dict[str, float]:
    return {s.labels["local_rank"]: s.value for f in text_string_to_metric_families(path.read_text())
            for s in f.samples if s.name == name and "local_rank" in s.labels}


def test_relayed_lines_and_restarts_reach_the_file(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    logs = tmp_path / "ranklogs"
    for attempt in (0, 1):
        for local in (0, 1):
            folder = logs / "r1_x" / f"attempt_{attempt}" / str(local)
            folder.mkdir(parents=True)
            step = StepMetrics(step=10 * attempt + local + 1, loss=1.5, rank=2 + local)
            (folder / "stdout.log").write_text(f"hello\n{format_metric_line(step)}\n")
            (folder / "stderr.log").write_text("")
    out = textfile(tmp_path / "prom")
    tailer = RankLogTailer(str(logs), 2, 2, out.line)
    tailer.poll(final=False)
    out.write({0: 2}, tailer, final=False)
    path = tmp_path / "prom" / "fstrain_r1_node1.prom"
    assert values(path, "fstrain_step") == {"0": 11.0, "1": 12.0}  # the latest attempt's lines came last
    assert values(path, "fstrain_rank_alive") == {"0": 1.0, "1": 0.0}
    [restarts] = [s.value for f in text_string_to_metric_families(path.read_text()) for s in f.samples
                  if s.name == "fstrain_restarts_total"]
    assert restarts == 1
    assert "[local1]:FSTRAIN_METRICS" in capfd.readouterr().out  # relayed as before
    assert sorted(os.listdir(tmp_path / "prom")) == ["fstrain_r1_node1.prom"]  # no .tmp left


def test_a_bars_draws_reach_the_file_before_its_line_ends(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A tqdm bar (transformers' Trainer) redrawn with "\\r" and no newline yet: each poll hands
    its newest draws to the textfile, which shows the step drawn; nothing is relayed until the
    newline comes, then the line once, whole."""
    folder = tmp_path / "ranklogs" / "r1_x" / "attempt_0" / "0"
    folder.mkdir(parents=True)
    (folder / "stdout.log").write_text("")
    bar = folder / "stderr.log"
    bar.write_bytes("\r  8%|▊         | 1/12 [00:01<00:13,  1.26s/it]\r 17%|█▋        | 2/12 [00:02<00".encode())
    out = textfile(tmp_path / "prom")
    tailer = RankLogTailer(str(tmp_path / "ranklogs"), 2, 2, out.line, lambda local, fd, text: out.line(local, text))
    tailer.DRAW_INTERVAL_S = 0.0
    path = tmp_path / "prom" / "fstrain_r1_node1.prom"
    steps = []
    for more in (":11,  1.12s/it]", "\r 25%|██▌       | 3/12 [00:03<00:09,  1.04s/it]", "\n"):
        tailer.poll(final=False)
        out.write({0: 2}, tailer, final=False)
        steps.append(values(path, "fstrain_step").get("0"))
        with bar.open("ab") as handle:
            handle.write(more.encode())
    tailer.poll(final=False)
    assert steps == [1.0, 2.0, 3.0]  # the half-written draw of step 2 is not read until whole
    assert capfd.readouterr().err == "[local0]:" + bar.read_bytes().decode()


def test_the_final_write_is_the_last(tmp_path: Path) -> None:
    out = textfile(tmp_path)
    out.write({0: 2, 1: 3}, None, final=False)
    out.finish(None)
    out.write({0: 2, 1: 3}, None, final=False)  # a periodic write that lost the race
    assert values(tmp_path / "fstrain_r1_node1.prom", "fstrain_rank_alive") == {"0": 0.0, "1": 0.0}


def node_values(path: Path, name: str) -> dict[str, float]:
    """A node metric's samples: its ``state`` label (or "") -> value."""
    return {s.labels.get("state", ""): s.value for f in text_string_to_metric_families(path.read_text())
            for s in f.samples if s.name == name}


def test_each_write_carries_its_time_and_the_final_one_the_end(tmp_path: Path) -> None:
    """The write time advances from write to write while the watchdog lives (a killed one's file
    stops there); the final write says the job's state and exit code, and that no rank is alive."""
    times = iter([1000.0, 1005.0, 1010.0, 1012.5])  # the start, then one per write
    out = textfile(tmp_path, lambda: next(times))
    path = tmp_path / "fstrain_r1_node1.prom"
    written = "fstrain_textfile_written_timestamp_seconds"
    out.write({0: 2, 1: 3}, None, final=False)
    assert node_values(path, written) == {"": 1005.0}
    assert node_values(path, "fstrain_run_state")["running"] == 1.0
    out.write({0: 2, 1: 3}, None, final=False)
    assert node_values(path, written) == {"": 1010.0}
    assert values(path, "fstrain_rank_alive") == {"0": 1.0, "1": 1.0}
    out.finish(None, 1, stopped=False)
    assert node_values(path, written) == {"": 1012.5}
    assert values(path, "fstrain_rank_alive") == {"0": 0.0, "1": 0.0}
    assert {s for s, value in node_values(path, "fstrain_run_state").items() if value} == {"failed"}
    assert node_values(path, "fstrain_exit_code") == {"": 1.0}


def test_a_watchdog_whose_job_fails_writes_the_end(tmp_path: Path) -> None:
    """A real watchdog (this machine's Python) running a job that reports a step and exits 3."""
    job = "print('FSTRAIN_METRICS {\"step\": 3}', flush=True); raise SystemExit(3)"
    header = {"source": source("watchdog"), "argv": [sys.executable, "-c", job], "env": {}, "run_id": "r1",
              "run_dir": str(tmp_path / "run"), "node_rank": 0, "nproc": 1, "grace_s": 2, "heartbeat_timeout_s": 600,
              "metrics_textfile": str(tmp_path / "prom"),
              "modules": {"stacks": source("stacks"), "promfile": Path(promfile.__file__).read_text(),
                          "metricline": Path(metricline.__file__).read_text()}}
    watchdog = subprocess.Popen([sys.executable, *SCRIPT_FLAGS, "-c", BOOTSTRAP], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert watchdog.stdin is not None
    watchdog.stdin.write((json.dumps(header) + "\n").encode())
    watchdog.stdin.flush()  # and left open: its end would be the launcher's, a stop
    try:
        assert watchdog.wait(60) == 3
    finally:
        watchdog.stdin.close()
    path = tmp_path / "prom" / "fstrain_r1_node0.prom"
    assert values(path, "fstrain_step") == {"0": 3.0}
    assert values(path, "fstrain_rank_alive") == {"0": 0.0}
    assert {s for s, value in node_values(path, "fstrain_run_state").items() if value} == {"failed"}
    assert node_values(path, "fstrain_exit_code") == {"": 3.0}


def test_an_unwritable_folder_is_said_once(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = textfile(blocker / "prom")  # under a file: never a folder
    for _ in range(3):
        out.write({}, None, final=False)
    err = capfd.readouterr().err
    assert err.count("--metrics-textfile: cannot write") == 1 and "the job goes on" in err
