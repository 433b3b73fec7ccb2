"""fstrain.train.metrics, the helper user programs call (stdlib only), and the trainer's metric
flags: the line it prints reads back as written, metrics.jsonl keeps every finished step."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from fstrain.core.monitor.metricline import PREFIX, StepMetrics, parse_metric_line, parse_metrics_jsonl
from fstrain.train.metrics import MetricsLog, metrics_file, report_step
from fstrain.train.settings import load_settings

REPO = Path(__file__).resolve().parents[2]


def test_report_step_prints_one_line_that_reads_back() -> None:
    out = io.StringIO()
    sent = report_step(7, loss=2.5, tokens_per_s=1000.0, scope="rank", step_s=0.5, steps=10, rank=3,
                       stream=out, grad_norm=1.25)
    text = out.getvalue()
    assert text.startswith(PREFIX) and text.count("\n") == 1 and text.endswith("\n")
    back = parse_metric_line(text)
    assert back == sent
    assert (back.step, back.rank, back.scope, back.extra) == (7, 3, "rank", {"grad_norm": 1.25})
    assert back.time is not None


def test_the_helper_needs_neither_torch_nor_the_launchers_rank() -> None:
    code = ("import sys; from fstrain.train.metrics import report_step; report_step(1, loss=1.0); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": "5"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                            timeout=60)
    line = parse_metric_line(result.stdout)
    assert line is not None and (line.step, line.rank, line.loss) == (1, 5, 1.0)


def test_metrics_jsonl_appends_flushed_lines(tmp_path: Path) -> None:
    path = metrics_file(tmp_path / "metrics", 1)
    first = MetricsLog(path)
    first.write(StepMetrics(step=1, loss=3.0, rank=1))
    # Flushed at once: a reader (or a run killed now) sees the step before the file is closed.
    assert parse_metrics_jsonl(path.read_text()) == [StepMetrics(step=1, loss=3.0, rank=1)]
    first.close()
    second = MetricsLog(path)  # a resumed run appends
    second.write(StepMetrics(step=2, loss=float("nan"), rank=1))
    second.close()
    with path.open("a") as handle:
        handle.write('{"v":1,"step":3,"lo')  # cut while writing
    lines = path.read_text().splitlines()
    assert json.loads(lines[1])["loss"] is None
    assert [m.step for m in parse_metrics_jsonl(path.read_text())] == [1, 2]


def test_metrics_dir_defaults_to_the_run_directory_fstrain_names(tmp_path: Path) -> None:
    assert load_settings(["--metrics-dir", str(tmp_path)], 1).metrics_dir == tmp_path
    code = ("from fstrain.train.settings import load_settings; "
            "print(load_settings([], 1).metrics_dir, load_settings(['--tensorboard', 'tb'], 1).tensorboard_dir)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "FSTRAIN_RUN_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                            timeout=60)
    assert result.stdout.split() == [str(tmp_path / "metrics"), "tb"]


def test_tensorboard_without_the_package_is_one_line_before_torch(tmp_path: Path) -> None:
    # sys.modules[name] = None: this interpreter cannot import tensorboard.
    code = ("import sys; sys.modules['tensorboard'] = None; from fstrain.train.cli import main; "
            "main(['--tensorboard', 'tb', '--steps', '1'])")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("FSTRAIN_DEBUG", None)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                            check=False, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--tensorboard" in result.stderr, result.stderr
    assert "pip install 'fstrain[tensorboard]'" in result.stderr and not (tmp_path / "tb").exists()
