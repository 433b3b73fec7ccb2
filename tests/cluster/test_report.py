"""`fstrain report` of real runs on the namespace cluster, opened in a real headless browser:
no console error, every plot and table there, the table's numbers those of the run's files."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

from fstrain.core.runs.runstate import FINAL
from tests.browser import open_page
from tests.cluster.test_runs import detach, fstrain, wait_state
from tests.conftest import NamespaceCluster
from tests.helpers import REPO

pytestmark = pytest.mark.cluster
PROGRAM = str(REPO / "tests" / "cluster" / "programs" / "metrics_then_fail.py")
CHARTS = ("loss", "tokens", "step-times", "memory", "timeline")


def cells(dom: str) -> dict[str, list[float | None]]:
    """The table "planned vs measured" as the browser holds it: row -> planned, measured, error."""
    table = dom[dom.index('<table id="planned-vs-measured"'):dom.index("</table>")]
    rows = {}
    for name, body in re.findall(r'<tr data-row="([^"]+)">(.*?)</tr>', table):
        rows[name] = [float(v) if v else None for v in re.findall(r'data-value="([^"]*)"', body)]
    return rows


def opened_report(home: Path, run_id: str, tmp_path: Path) -> tuple[dict[str, Any], str]:
    page = tmp_path / "report.html"
    written = fstrain(home, "report", run_id, "--out", str(page))
    assert written.returncode == 0, written.stderr
    document = json.loads(fstrain(home, "report", run_id, "--json").stdout)
    opened = open_page(page, tmp_path / "browser")
    print(f"screenshot of the report of run {run_id}: {opened.screenshot}")
    assert opened.console == []
    for chart in CHARTS:
        assert f'data-chart="{chart}"' in opened.dom
    return document, opened.dom


def test_report_of_a_detached_training_run(cluster: NamespaceCluster, tmp_path: Path) -> None:
    home, run_dir, plan = tmp_path / "home", tmp_path / "run", tmp_path / "plan.yaml"
    planned = fstrain(home, "plan", "--model", "tiny", "--num-nodes", "2", "--gpus-per-node", "1", "--gpu",
                      "h100-sxm", "--micro-batch", "4", "--grad-accum", "1", "--global-batch", "8", "--strategy",
                      "fsdp-full", "--out", str(plan))
    assert planned.returncode == 0, planned.stderr
    # One rank per node (the later --nproc-per-node wins over detach's): the run takes well under a minute.
    run_id = detach(cluster, home, run_dir, "--plan", str(plan), "--steps", "6", "--nproc-per-node", "1")
    assert wait_state(home, run_id, set(FINAL), 240)["state"] == "succeeded"
    document, dom = opened_report(home, run_id, tmp_path)
    for chart in CHARTS:
        assert f'data-chart="{chart}" data-empty' not in dom
    summary = json.loads((run_dir / "summary.json").read_text())  # fetched from node 0 by the report
    predicted = _predicted(run_dir)
    measured = {"memory": summary["peak_memory_max_over_ranks"]["max_rss_bytes"],
                "tokens/s": summary["tokens_per_s"], "step time": summary["tokens_per_step"] / summary["tokens_per_s"]}
    expected = {"memory": predicted["memory"]["peak"], "tokens/s": predicted["tokens_per_s"],
                "step time": predicted["step_time_s"]}
    table = cells(dom)
    for name in ("memory", "tokens/s", "step time"):
        plan_value, run_value, error = table[name]
        assert (plan_value, run_value) == (expected[name], measured[name]), name
        assert error == pytest.approx(measured[name] / expected[name] - 1)
    assert [r["measured"] for r in document["planned_vs_measured"]] == [measured[n] for n in measured]
    # Every rank's own metric lines: its steps, its loss (their mean is the job's), its step time.
    ranks = document["ranks"]
    assert [(r["rank"], r["host"], r["source"]) for r in ranks] == [(0, "node1", "metric line"),
                                                                     (1, "node2", "metric line")]
    assert all([p["step"] for p in r["points"]] == [1, 2, 3, 4, 5, 6] for r in ranks)
    assert statistics.mean(r["points"][-1]["loss"] for r in ranks) == pytest.approx(summary["last_loss"])
    assert [s["rank"] for s in document["step_times"]] == [0, 1]
    assert [m["rank"] for m in document["memory"]] == [0, 1, None]
    kinds = [(e["kind"], e["where"]) for e in document["events"]]
    assert kinds[0] == ("start", "") and kinds[-1] == ("end", "")
    assert {("node up", "node1"), ("node up", "node2"), ("node end", "node1"), ("node end", "node2")} <= set(kinds)
    assert document["memory_label"].startswith("CPU peak RSS")


def _predicted(run_dir: Path) -> dict[str, Any]:
    predicted: dict[str, Any] = json.loads((run_dir / "manifest.json").read_text())["plan"]["predicted"]
    return predicted


def test_report_of_an_attached_run_of_a_program_that_failed(
    cluster: NamespaceCluster, tmp_path: Path
) -> None:
    home, run_dir = tmp_path / "home", tmp_path / "run"
    launched = fstrain(home, "launch", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-2]", "--nproc-per-node",
                       "2", "--grace", "3", "--run-dir", str(run_dir), "--env", f"PYTHONPATH={REPO}", "--",
                       "python3", PROGRAM)
    assert launched.returncode == 7, launched.stderr[-3000:]
    run_id = json.loads((run_dir / "manifest.json").read_text())["run_id"]
    document, dom = opened_report(home, run_id, tmp_path)
    assert (document["kind"], document["state"]["state"]) == ("attached", "failed")
    failures = [e for e in document["events"] if e["kind"] == "failure"]
    # The run's events file: the failure as the launcher named it, then the run's end.
    assert failures[0]["where"] == "node2" and failures[0]["text"] == "rank 3 (local rank 1) on node2 exited with 7"
    assert failures[-1]["where"] == "" and failures[-1]["text"].startswith("run failed, exit code 7")
    node1 = [e["text"] for e in document["events"] if (e["kind"], e["where"]) == ("node end", "node1")]
    assert node1 and node1[0].endswith("stopped by the teardown after node rank 1's failure")
    assert {("node up", "node1"), ("node up", "node2")} <= {(e["kind"], e["where"]) for e in document["events"]}
    assert dom.count('data-event="failure"') == len(failures)
    # The program's own metric lines: every rank's steps, rank 3 a straggler; no summary to compare.
    assert [[p["step"] for p in r["points"]] for r in document["ranks"]] == [[1, 2, 3]] * 4
    assert [s["straggler"] for s in document["step_times"]] == [False, False, False, True]
    assert 'data-chart="loss" data-empty' not in dom and "stragglers: rank 3 on node2" in dom
    assert any("no summary.json" in note for note in document["notes"])
