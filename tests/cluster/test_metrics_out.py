"""Metrics out of a real run on two namespace hosts (gloo on CPU, the tiny model): a metric line
per rank and step in the launcher's output, each rank's metrics.jsonl on its node, and each
node's Prometheus textfile, read by Prometheus's own parser, for an attached and a detached run:
its write time advancing while the run goes on, and at the end the node's state and exit code."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fstrain.core.monitor.metricline import parse_metric_line, parse_metrics_jsonl
from fstrain.core.monitor.promfile import NODE_METRICS, RANK_METRICS
from tests.cluster.launch_helpers import assert_no_job_processes
from tests.cluster.test_runs import fstrain, wait_state
from tests.conftest import NamespaceCluster
from tests.helpers import run_fstrain

pytestmark = pytest.mark.cluster

STEPS = 4
HOSTS = ("node1", "node2")


def read_textfile(path: Path) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """family name -> samples; the parser refuses malformed names, labels and values."""
    families = {}
    for family in text_string_to_metric_families(path.read_text()):
        kinds = {name.removesuffix("_total"): kind for name, kind, *_ in RANK_METRICS + NODE_METRICS}
        assert family.type == kinds[family.name] and family.documentation, family
        families[family.name] = [(s.name, s.labels, s.value) for s in family.samples]
    assert sorted(families) == sorted(kinds)
    return families


def per_rank(families: dict[str, list[tuple[str, dict[str, str], float]]], name: str) -> dict[str, float]:
    return {labels["rank"]: value for _, labels, value in families[name]}


def node_end(families: dict[str, list[tuple[str, dict[str, str], float]]]) -> tuple[list[str], list[float]]:
    """The node's run state (the states at 1) and its exit code (none while the job runs)."""
    return ([labels["state"] for _, labels, value in families["fstrain_run_state"] if value == 1],
            [value for *_, value in families["fstrain_exit_code"]])


def written(families: dict[str, list[tuple[str, dict[str, str], float]]]) -> float:
    [(_, _, value)] = families["fstrain_textfile_written_timestamp_seconds"]
    return value


def test_attached_run_reports_every_rank_every_step(cluster: NamespaceCluster, tmp_path: Path) -> None:
    run_dir, prom = tmp_path / "run", tmp_path / "prom"
    launched = time.time()
    result = run_fstrain(
        "launch", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-2]", "--nproc-per-node", "1",
        "--backend", "direct", "--model", "tiny", "--steps", str(STEPS), "--grace", "5", "--run-dir", str(run_dir),
        "--metrics-textfile", str(prom), "--tensorboard", "{run_dir}/tb", timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    # Metric lines go to the log files, not to the terminal.
    assert not [line for line in result.stdout.splitlines() if parse_metric_line(line) is not None]
    logged = "".join((run_dir / "logs" / f"{host}.log").read_text() for host in HOSTS)
    lines = [(line.split("]", 1)[0].lstrip("["), m) for line in logged.splitlines()
             if (m := parse_metric_line(line)) is not None]
    assert sorted((m.rank, m.step) for _, m in lines) == [(r, s) for r in (0, 1) for s in range(1, STEPS + 1)]
    assert {(where.split()[0], m.rank) for where, m in lines} == {("node1", 0), ("node2", 1)}

    run_id = json.loads((run_dir / "manifest.json").read_text())["run_id"]
    for index, rank in ((1, 0), (2, 1)):
        jsonl = cluster.home(index) / ".fstrain" / "runs" / run_id / "metrics" / f"rank{rank}.jsonl"
        assert [m for m in parse_metrics_jsonl(jsonl.read_text())] == [m for _, m in lines if m.rank == rank]

    assert sorted(p.name for p in prom.iterdir()) == [f"fstrain_{run_id}_node{i}.prom" for i in (0, 1)]
    for node_rank, host in enumerate(HOSTS):
        families = read_textfile(prom / f"fstrain_{run_id}_node{node_rank}.prom")
        rank = str(node_rank)
        assert per_rank(families, "fstrain_step") == {rank: STEPS}
        assert per_rank(families, "fstrain_rank_alive") == {rank: 0}  # the final write: the job is over
        assert per_rank(families, "fstrain_loss")[rank] > 0
        assert node_end(families) == (["succeeded"], [0])
        assert launched < written(families) <= time.time()
        [(_, labels, restarts)] = families["fstrain_restarts"]
        assert labels == {"run_id": run_id, "host": host, "node_rank": str(node_rank)} and restarts == 0
    # Rank 0's TensorBoard events, in node 0's run directory, read with TensorBoard's own reader.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(cluster.home(1) / ".fstrain" / "runs" / run_id / "tb"))
    board.Reload()
    assert [event.step for event in board.Scalars("train/loss")] == list(range(1, STEPS + 1))
    assert_no_job_processes(cluster, 10)


def test_detached_run_textfiles_show_live_ranks_then_the_end(cluster: NamespaceCluster, tmp_path: Path) -> None:
    home, prom = tmp_path / "home", tmp_path / "prom"
    home.mkdir()
    steps = 40  # long enough to be seen running: the files are rewritten every 5 s
    started = fstrain(home, "launch", "--detach", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-2]",
                      "--nproc-per-node", "1", "--backend", "direct", "--grace", "3", "--run-dir",
                      str(tmp_path / "run"), "--model", "tiny", "--steps", str(steps), "--metrics-textfile", str(prom))
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    paths = [prom / f"fstrain_{run_id}_node{i}.prom" for i in (0, 1)]
    seen_live: set[int] = set()
    writes: dict[int, set[float]] = {0: set(), 1: set()}  # each node's write times seen while it ran
    finals: list[dict[str, list[tuple[str, dict[str, str], float]]]] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        found = {i: read_textfile(path) for i, path in enumerate(paths) if path.is_file()}
        for node_rank, families in found.items():
            alive, now = per_rank(families, "fstrain_rank_alive"), per_rank(families, "fstrain_step")
            if alive == {str(node_rank): 1} and 0 < now.get(str(node_rank), 0) < steps:
                seen_live.add(node_rank)
            if node_end(families) == (["running"], []):
                writes[node_rank].add(written(families))
        # A node's last write says how its job ended; a write between its ranks' exit and that
        # end may already show them dead while the node still says running.
        finals = [f for f in found.values() if node_end(f)[0] not in (["running"], [])]
        if len(finals) == 2:
            break
        time.sleep(0.3)
    assert seen_live == {0, 1}, "no textfile showed a live rank mid-run"
    assert len(finals) == 2, "the nodes did not write their final files"
    assert all(len(times) >= 2 for times in writes.values()), f"the write time did not advance: {writes}"
    assert [node_end(f) for f in finals] == [(["succeeded"], [0])] * 2
    assert all(set(per_rank(f, "fstrain_rank_alive").values()) == {0} for f in finals)
    assert all(set(per_rank(f, "fstrain_step").values()) == {steps} for f in finals)
    assert wait_state(home, run_id, {"succeeded", "failed", "stopped", "lost"}, 60)["state"] == "succeeded"
    assert_no_job_processes(cluster, 10)
