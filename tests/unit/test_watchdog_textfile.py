"""The watchdog's side of --metrics-textfile, in this process: the rank log relay hands every
line and restart attempt to the textfile, which is written whole (tmp + rename), is never
replaced by a late periodic write after the final one, and says once when it cannot write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fstrain.core.monitor import metricline, promfile
from fstrain.core.monitor.metricline import StepMetrics, format_metric_line
from fstrain.io.remote import stacks
from fstrain.io.remote.watchdog import MetricsTextfile, RankLogTailer


def textfile(folder: Path) -> MetricsTextfile:
    header = {"run_id": "r1", "node_rank": 1, "nproc": 2, "rank_offset": 2}
    return MetricsTextfile(header, str(folder), promfile, metricline, stacks)


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


def test_the_final_write_is_the_last(tmp_path: Path) -> None:
    out = textfile(tmp_path)
    out.write({0: 2, 1: 3}, None, final=False)
    out.finish(None)
    out.write({0: 2, 1: 3}, None, final=False)  # a periodic write that lost the race
    assert values(tmp_path / "fstrain_r1_node1.prom", "fstrain_rank_alive") == {"0": 0.0, "1": 0.0}


def test_an_unwritable_folder_is_said_once(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = textfile(blocker / "prom")  # under a file: never a folder
    for _ in range(3):
        out.write({}, None, final=False)
    err = capfd.readouterr().err
    assert err.count("--metrics-textfile: cannot write") == 1 and "the job goes on" in err
