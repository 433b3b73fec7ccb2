"""`fstrain launch --mlflow URI` and `--wandb PROJECT --wandb-offline`, end to end on this machine:
a real MLflow tracking server (its sqlite store and artifacts in a temporary folder, a free port),
a launch of a small program whose rank 0 prints fstrain's metric line and rank 1 torchtitan's step
line, read back with MLflow's own client; the same launch's W&B offline run read back from its
run file with wandb's own record type. A tracker that does not answer stops the launch in its
preflight, in one line, before anything starts."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_fstrain

PROGRAM = """\
import json, os, sys, time
rank = int(os.environ["RANK"])
for step in (1, 2, 3):
    time.sleep(0.05)
    if rank == 0:
        print("FSTRAIN_METRICS " + json.dumps({"step": step, "steps": 3, "loss": 4.0 / step, "lr": 0.001 * step,
              "tokens_per_s": 1000.0 * step, "step_s": 0.25, "memory_bytes": 2**20, "rank": 0}), flush=True)
    else:  # torchtitan's step line, as MetricsProcessor.log prints it
        print(f"step: {step:2}  loss: {8.0 / step:8.5f}  grad_norm:  1.2000  memory: 1.00GiB(5.00%)  "
              f"tps: {500 * step:,}  tflops: 0.52  mfu: 0.17%", flush=True)
sys.exit(int(os.environ.get("EXIT_CODE", "0")) if rank == 1 else 0)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `mlflow server` on localhost: sqlite store and artifacts in a temporary folder."""
    folder = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with (folder / "server.log").open("wb") as log:
        server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                                   "--workers", "1", "--backend-store-uri", f"sqlite:///{folder}/mlflow.db",
                                   "--artifacts-destination", str(folder / "artifacts")],
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300  # a loaded 2-core machine took 27-98 s
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start:\n{(folder / 'server.log').read_text()[-3000:]}")
            time.sleep(0.3)
        yield url
    finally:  # a throwaway server: SIGKILL (SIGTERM took 20 s to end it on a loaded machine)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def wandb_records(path: Path) -> list[Any]:
    """Every record of a W&B run file (``run-<id>.wandb``), parsed by wandb's own protobuf type
    ``Record``. The file is a LevelDB log (wandb 0.31 ships no Python reader of it): a 7-byte
    header (``:W&B``, magic 0xBEE1, version 0), then 32 KiB blocks of chunks, each with a 7-byte
    header (checksum, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    records, pending, at, block = [], b"", 7, 32768
    while at + 7 <= len(data):
        left = block - at % block
        if left < 7:  # too little for a chunk's header: the block's padding
            at += left
            continue
        _, length, kind = struct.unpack("<IHB", data[at:at + 7])
        chunk = data[at + 7:at + 7 + length]
        at += 7 + length
        if kind == 0 and length == 0:  # the zeros that pad a block
            at += block - at % block if at % block else 0
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def history_rows(records: list[Any]) -> list[dict[str, Any]]:
    rows = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = record.history.item
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items})
    return rows


@pytest.mark.slow
def test_a_launch_logs_params_every_ranks_steps_and_its_end_to_mlflow_and_wandb(
        mlflow_server: str, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    run_dir = tmp_path / "run"
    result = run_fstrain("launch", "--nproc-per-node", "2", "--run-dir", str(run_dir), "--mlflow", mlflow_server,
                         "--mlflow-experiment", "fstrain-test", "--wandb", "fstrain-test", "--wandb-offline",
                         "--", sys.executable, str(script),
                         env={"HOME": str(tmp_path), "WANDB_SILENT": "true"}, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr, result.stderr
    assert "View run" not in result.stdout and "MLflow" not in result.stdout  # the ranks' lines only
    run_id = json.loads((run_dir / "manifest.json").read_text())["run_id"]
    said = [line for line in result.stderr.splitlines() if line.startswith(("MLflow: ", "W&B: "))]

    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("fstrain-test")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id], f"tags.`fstrain.run_id` = '{run_id}'")
    assert run.info.run_name == run_id and run.info.status == "FINISHED"
    assert said == [f"MLflow: run at {mlflow_server}/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}",
                    f"W&B: offline run in {next((run_dir / 'wandb').glob('offline-run-*'))} (upload it with "
                    f"`wandb sync`)"], result.stderr
    params = run.data.params
    assert {k: params[k] for k in ("backend", "nodes", "nproc_per_node", "world_size", "hosts")} == \
        {"backend": "torchrun", "nodes": "1", "nproc_per_node": "2", "world_size": "2", "hosts": "localhost"}
    assert params["program"].endswith("train.py")
    assert run.data.tags["fstrain.exit_code"] == "0" and run.data.tags["fstrain.reason"] == "ok"
    assert run.data.tags["fstrain.state"] == "succeeded" and run.data.tags["fstrain.attempts"] == "1"
    events = client.download_artifacts(run.info.run_id, "fstrain/events.jsonl", str(tmp_path))
    kinds = [json.loads(line)["kind"] for line in Path(events).read_text().splitlines()]
    assert kinds == [json.loads(line)["kind"] for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert kinds[0] == "started" and "first_step" in kinds and kinds[-1] == "finished", kinds

    def history(key: str) -> list[tuple[int, float]]:
        return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))

    assert history("loss") == history("rank0/loss") == [(1, 4.0), (2, 2.0), (3, 4.0 / 3)]
    assert history("tokens_per_s") == [(1, 1000.0), (2, 2000.0), (3, 3000.0)]
    assert history("memory_bytes") == [(1, 2.0**20), (2, 2.0**20), (3, 2.0**20)]
    assert history("rank1/loss") == [(1, 8.0), (2, 4.0), (3, 2.66667)]  # torchtitan's line ({loss:8.5f})
    assert history("rank1/tokens_per_s_rank") == [(1, 500.0), (2, 1000.0), (3, 1500.0)]
    assert history("rank1/memory_bytes") == [(s, float(2**30)) for s in (1, 2, 3)]

    (offline,) = (run_dir / "wandb").glob(f"offline-run-*-{run_id}")
    records = wandb_records(offline / f"run-{run_id}.wandb")
    record_types = [r.WhichOneof("record_type") for r in records]
    assert "run" in record_types and "exit" in record_types
    (started,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert started.run_id == run_id and started.project == "fstrain-test"
    (ended,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert ended.exit_code == 0
    summary = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for r in records
               if r.WhichOneof("record_type") == "summary" for item in r.summary.update}
    assert summary["fstrain/status"] == "FINISHED" and summary["fstrain.state"] == "succeeded", summary
    assert [event["kind"] for event in summary["fstrain/events"]] == kinds
    rows = history_rows(records)
    assert sorted((row["step"], row["loss"]) for row in rows if "loss" in row) == [(1, 4.0), (2, 2.0), (3, 4.0 / 3)]
    assert sorted((row["step"], row["rank1/loss"]) for row in rows if "rank1/loss" in row) == \
        [(1, 8.0), (2, 4.0), (3, 2.66667)]


@pytest.mark.slow
def test_a_tracker_that_does_not_answer_stops_the_launch_before_anything_starts(tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{_free_port()}"
    run_dir = tmp_path / "run"
    result = run_fstrain("launch", "--nproc-per-node", "1", "--run-dir", str(run_dir), "--mlflow", closed,
                         "--", sys.executable, "-c", "print('ran')", env={"HOME": str(tmp_path)}, timeout=120)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [result.stderr.splitlines()[-1]], result.stderr
    assert errors[0] == (f"error: --mlflow: the MLflow tracking server at {closed} does not answer: [Errno 111] "
                         f"Connection refused (hint: start it (mlflow server --host ... --port ...), or check the "
                         f"URI; nothing was started)"), errors
    assert result.stdout == "" and not (run_dir / "logs").exists() and not (run_dir / "manifest.json").exists()


@pytest.mark.slow
def test_a_detached_runs_keeper_logs_its_steps_and_end(mlflow_server: str, tmp_path: Path) -> None:
    """`--detach` returns once the nodes started; the keeper, a process of its own here, reads
    the nodes' output and sends it, then the end."""
    from mlflow.tracking import MlflowClient

    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    run_dir = tmp_path / "run"
    result = run_fstrain("launch", "--detach", "--nproc-per-node", "2", "--run-dir", str(run_dir),
                         "--mlflow", mlflow_server, "--mlflow-experiment", "fstrain-detached", "--env", "EXIT_CODE=3",
                         "--", sys.executable, str(script), env={"HOME": str(tmp_path)}, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "keeper (pid " in result.stderr and "sends the run to its trackers" in result.stderr, result.stderr
    run_id = result.stdout.strip()
    keeper = json.loads((run_dir / "keeper.json").read_text())["pid"]
    deadline = time.monotonic() + 120
    try:
        while Path(f"/proc/{keeper}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        if Path(f"/proc/{keeper}").exists():
            os.kill(keeper, signal.SIGKILL)
            pytest.fail(f"the keeper did not end:\n{(run_dir / 'keeper.log').read_text()}")
    log = (run_dir / "keeper.log").read_text()
    assert "warning" not in log, log
    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("fstrain-detached")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id], f"tags.`fstrain.run_id` = '{run_id}'")
    assert run.info.status == "FAILED" and run.data.tags["fstrain.exit_code"] == "3", (run.data.tags, log)
    assert run.data.params["world_size"] == "2"
    assert run.data.tags["fstrain.state"] == "failed" and run.data.tags["fstrain.failures"] == "1", run.data.tags
    loss = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss"))
    assert loss == [(1, 4.0), (2, 2.0), (3, 4.0 / 3)]
    titan = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "rank1/loss"))
    assert titan == [(1, 8.0), (2, 4.0), (3, 2.66667)]


def test_a_trackers_option_without_its_tracker_is_one_line() -> None:
    for flags, expected in ((("--wandb-offline",), "error: --wandb-offline: needs the W&B project to log to (hint: "),
                            (("--mlflow-experiment", "x"), "error: --mlflow-experiment: needs the MLflow tracking")):
        result = run_fstrain("launch", "--dry-run", *flags, "--", "true")
        assert result.returncode == 2 and result.stderr.startswith(expected), result.stderr
        assert result.stderr.count("\n") == 1 and "mlflow" not in result.stdout


def test_a_tracker_whose_package_is_missing_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    hide = tmp_path / "without-mlflow"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['mlflow'] = None  # importing it fails\n")
    result = run_fstrain("launch", "--nproc-per-node", "1", "--run-dir", str(tmp_path / "run"), "--mlflow",
                         "http://127.0.0.1:1", "--", sys.executable, "-c", "print('ran')",
                         env={"HOME": str(tmp_path), "PYTHONPATH": f"{hide}:{os.environ.get('PYTHONPATH', '')}"})
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[-1].startswith("error: --mlflow: MLflow is not installed in this Python ("), \
        result.stderr
    assert result.stderr.splitlines()[-1].endswith("(hint: pip install mlflow (or mlflow-skinny: its client alone))")
    assert result.stdout == "" and not (tmp_path / "run" / "logs").exists()
