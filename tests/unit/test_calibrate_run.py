"""plan --calibrate RUN_DIR (or a run's report JSON): a finished run's measured numbers."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from fstrain.core.calibrate.calibrate import calibrate
from fstrain.core.formats import stamped
from fstrain.core.monitor.metricline import StepMetrics, format_metric_line
from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.plancluster import uniform_cluster
from fstrain.core.plan.timemodel import flops_per_token
from fstrain.core.report.numbers import as_document, build
from fstrain.core.report.series import rank_series
from fstrain.core.runs.runstate import RunState
from fstrain.errors import InputError
from fstrain.io.recipes import load_shipped_recipe
from tests.helpers import run_fstrain
from tests.unit.test_calibrate import summary
from tests.unit.test_cli_runs import live_attached_run

H100 = uniform_cluster(2, 8, "h100-sxm")
TINY = load_shipped_recipe("tiny").model


def report(state: str, trainer: dict[str, Any] | None) -> dict[str, Any]:
    return as_document(build("r1", "attached", RunState(state, 0 if state == "succeeded" else None), series=[],
                             events=[], plan=None, summary=trainer))


def test_a_finished_runs_report_calibrates_as_its_summary_does() -> None:
    kwargs: dict[str, Any] = {"assumptions": Assumptions(), "cluster": H100, "precision": "bf16", "model": TINY}
    from_report = calibrate(report("succeeded", summary()), "r.json", **kwargs)
    from_summary = calibrate(summary(), "s.json", **kwargs)
    assert from_report.assumptions == from_summary.assumptions and from_report.replaced == from_summary.replaced
    assert from_report.kind == "run r1 (succeeded)"


def test_a_running_run_or_one_without_a_summary_is_one_clear_error() -> None:
    kwargs: dict[str, Any] = {"assumptions": Assumptions(), "cluster": H100, "precision": "bf16", "model": TINY}
    with pytest.raises(InputError, match=r"run r1 has not ended \(running\)"):
        calibrate(report("running", summary()), "r.json", **kwargs)
    with pytest.raises(InputError, match=r"run r1 \(failed\) left no trainer summary") as caught:
        calibrate(report("failed", None), "RUN_DIR", **kwargs)
    assert caught.value.where == "RUN_DIR"


def finished_run(run_dir: Path, log: str, nproc: int = 8) -> Path:
    """A run folder of one node that ran ``nproc`` ranks and ended well, ``log`` its output."""
    (run_dir / "logs").mkdir(parents=True)
    manifest = {"run_id": "20261201-000000-abcdef", "backend": "torchrun", "started": 1.0, "ended": 9.0,
                "exit_code": 0, "reason": "ok", "nodes": [{"host": "node1", "node_rank": 0, "nproc": nproc,
                                                           "started": 1.5, "ended": 8.5, "exit_code": 0}]}
    (run_dir / "manifest.json").write_text(json.dumps(stamped(manifest, "manifest")))
    (run_dir / "logs" / "node1.log").write_text(log)
    return run_dir


def test_plan_calibrate_takes_a_run_directory(tmp_path: Path) -> None:
    run_dir = finished_run(tmp_path / "run", "[node1 r0] [fstrain.train] step 1/2 loss 6.0 lr 1e-4 tokens/s 9\n")
    (run_dir / "summary.json").write_text(json.dumps(summary()))
    env = {"HOME": str(tmp_path / "home")}
    args = ["plan", "--model", "tiny", "--num-nodes", "2", "--gpu", "h100-sxm", "--calibrate", str(run_dir)]
    shown = run_fstrain(*args, "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    calibration = json.loads(shown.stdout)["calibration"]
    assert calibration["kind"] == "run 20261201-000000-abcdef (succeeded)"
    assert [r["name"] for r in calibration["replaced"]] == ["fragmentation_fraction", "mfu"]
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = run_fstrain(*args[:-1], str(empty), env=env)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and f"no run '{empty}'" in bad.stderr


def test_plan_calibrate_finds_a_live_attached_run_by_its_folder(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder is the run (found in this machine's index), which has not ended yet."""
    home, run_id = tmp_path / "home", "20261201-170000-eeeeee"
    live_attached_run(home, tmp_path / "runs" / run_id, run_id, monkeypatch)
    shown = run_fstrain("plan", "--model", "tiny", "--num-nodes", "2", "--gpu", "h100-sxm", "--calibrate",
                        str(tmp_path / "runs" / run_id), env={"HOME": str(home)})
    assert shown.returncode == 2 and shown.stderr.count("\n") == 1
    assert f"run {run_id} has not ended (running)" in shown.stderr, shown.stderr


TRAINER_OUTPUT = Path(__file__).parent.parent / "fixtures" / "trainer-output"


def output_report(fixture: str, state: str = "succeeded", world_size: int | None = 8) -> dict[str, Any]:
    """The report of a run with no summary whose rank 0 printed the fixture's lines."""
    series = rank_series(f"[node1 r0] {line}" for line in (TRAINER_OUTPUT / fixture).read_text().splitlines())
    return as_document(build("r1", "attached", RunState(state, 0), series=series, events=[], plan=None,
                             summary=None, world_size=world_size))


def test_a_run_without_a_summary_calibrates_mfu_from_the_tokens_per_second_its_ranks_printed() -> None:
    kwargs: dict[str, Any] = {"assumptions": Assumptions(), "cluster": H100, "precision": "bf16", "model": TINY}
    result = calibrate(output_report("torchtitan-step.txt"), "RUN_DIR", seq_len=8192, **kwargs)
    tps = statistics.median([7334, 7313, 7282, 7322])  # steps 15-18 (tps is per rank); step 14 left out
    assert [r.name for r in result.replaced] == ["mfu"]
    assert result.assumptions.mfu == pytest.approx(tps * flops_per_token(TINY, 8192).training / 989.4e12)
    assert result.kind == "run r1 (succeeded)"
    assert result.note.startswith("from its ranks' output (torchtitan): 7,318 tokens/s per rank")
    assert "memory peak 9.46 GiB" in result.note
    assert "lacked: fragmentation_fraction: it needs the allocator's reserved and allocated peaks, the output " \
           "gives one peak" in result.note
    no_length = calibrate(output_report("torchtitan-step.txt"), "RUN_DIR", **kwargs)
    assert no_length.replaced == [] and "; the sequence length, to count a token's FLOPs" in no_length.note


def test_a_run_whose_output_has_no_tokens_per_second_says_what_it_lacked() -> None:
    kwargs: dict[str, Any] = {"assumptions": Assumptions(), "cluster": H100, "precision": "bf16", "model": TINY}
    megatron = calibrate(output_report("megatron-iteration.txt"), "RUN_DIR", seq_len=4096, **kwargs)
    assert megatron.replaced == [] and megatron.assumptions == Assumptions()
    assert megatron.note.startswith("from its ranks' output (Megatron-LM): also read: step time 5.65 s")
    assert "lacked: tokens/s: the output gives a step time (5.65 s) but not the tokens of a step" in megatron.note
    deepspeed = calibrate(output_report("deepspeed-engine.txt"), "RUN_DIR", seq_len=4096, **kwargs)
    assert "(DeepSpeed ThroughputTimer)" in deepspeed.note and "count samples, not tokens" in deepspeed.note
    lines = [format_metric_line(StepMetrics(step=s, tokens_per_s=9e5, rank=r)) for s in (1, 2) for r in (0, 1)]
    job = as_document(build("r1", "attached", RunState("succeeded", 0), series=rank_series(lines), events=[],
                            plan=None, summary=None))
    unknown_world = calibrate(job, "RUN_DIR", seq_len=4096, **kwargs)
    assert unknown_world.replaced == [] and "the run's world size" in unknown_world.note
    cpu = calibrate(output_report("torchtitan-step.txt") | {"device": "cpu"}, "RUN_DIR", seq_len=8192, **kwargs)
    assert cpu.replaced == [] and cpu.ignored == ["the run was on cpu: its speed and memory say nothing about GPUs"]


def test_plan_calibrate_takes_a_run_directory_of_a_trainers_own_output(tmp_path: Path) -> None:
    run_dir = finished_run(tmp_path / "run", "".join(
        f"[node1 r0] {line}\n" for line in (TRAINER_OUTPUT / "torchtitan-step.txt").read_text().splitlines()))
    shown = run_fstrain("plan", "--model", "tiny", "--num-nodes", "2", "--gpu", "h100-sxm", "--calibrate",
                        str(run_dir), "--json", env={"HOME": str(tmp_path / "home")})
    assert shown.returncode == 0, shown.stderr
    calibration = json.loads(shown.stdout)["calibration"]
    assert [r["name"] for r in calibration["replaced"]] == ["mfu"]
    assert calibration["note"].startswith("from its ranks' output (torchtitan): 7,318 tokens/s per rank")
    assert "at the plan's" in calibration["replaced"][0]["source"]
