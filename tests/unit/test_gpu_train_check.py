"""scripts/gpu_train_check.py's speed check, on values and as a dry run (it needs a GPU to measure)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_train_check.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_train_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_train_check"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


check = load_script()


def record(case: str, strategy: str, backend: str, tokens_per_s: float | None, status: str = "ok",
           model: str = "gpt2-1.5b", micro_batch: int = 4) -> dict[str, Any]:
    measured = {"tokens_per_s": tokens_per_s} if tokens_per_s is not None else None
    return {"case": case, "strategy": strategy, "backend": backend, "model": model, "micro_batch": micro_batch,
            "grad_accum": 2, "seq_len": None, "ac": "none", "status": status, "measured": measured}


def test_each_deepspeed_run_is_held_to_80_percent_of_fsdp2_on_the_same_model_and_batch() -> None:
    records = [
        record("fsdp-full", "fsdp-full", "fsdp", 13_890),
        record("zero2", "zero2", "deepspeed", 11_112),  # 80.0 %: the bound itself passes
        record("zero3", "zero3", "deepspeed", 11_000),  # 79.2 %
        record("zero2-mb8", "zero2", "deepspeed", 20_000, micro_batch=8),  # no FSDP2 run with this batch
        record("zero3-late", "zero3", "deepspeed", None, status="timed out", model="gpt2-1.5b"),
    ]
    verdicts = {v["case"]: v for v in check.speed_verdicts(records)}
    assert set(verdicts) == {"zero2", "zero3", "zero3-late"}
    assert (verdicts["zero2"]["ratio"], verdicts["zero2"]["verdict"]) == (0.8, "ok")
    assert (verdicts["zero3"]["ratio"], verdicts["zero3"]["verdict"]) == (0.792, "too slow")
    assert verdicts["zero3-late"]["verdict"] == "not measured"
    assert verdicts["zero3-late"]["statuses"] == ["timed out", "ok"]
    # The rendered ZeRO-2 file of 2026-11-30: 285 tokens/s against 13,890.
    slow = check.speed_verdicts([records[0], record("zero2", "zero2", "deepspeed", 285)])
    assert (slow[0]["ratio"], slow[0]["verdict"]) == (0.021, "too slow")


def test_summary_md_lists_the_verdicts() -> None:
    records = [record("fsdp-full", "fsdp-full", "fsdp", 10_000), record("zero2", "zero2", "deepspeed", 9_000)]
    summary = {"argv": ["gpu_train_check.py"], "cases": records, "speed": check.speed_verdicts(records)}
    text = check.markdown(summary)
    assert "- zero2: 9,000 tokens/s against fsdp-full 10,000: 90%, ok" in text


def test_the_speed_matrix_is_fsdp2_zero2_and_zero3_of_one_model() -> None:
    args = check.parse_args(["out", "--matrix", "speed"])
    assert [(c.name, c.backend) for c in args.cases] == [("fsdp-full", "fsdp"), ("zero2", "deepspeed"),
                                                         ("zero3", "deepspeed")]
    assert {(c.model, c.micro_batch, c.grad_accum, c.seq_len, c.ac) for c in args.cases} == {(None, None, None,
                                                                                               None, "none")}
    assert args.model == "gpt2-1.5b"
    with pytest.raises(SystemExit):
        check.parse_args(["out", "--matrix", "speed", "--only", "zero1"])


@pytest.mark.slow
def test_a_dry_run_plans_and_renders_the_speed_matrix(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--matrix", "speed", "--dry-run"],
                          capture_output=True, text=True, cwd=REPO, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "DRY RUN" and summary["model"] == "gpt2-1.5b"
    cases = summary["cases"]
    assert [(c["case"], c["status"]) for c in cases] == [("fsdp-full", "rendered"), ("zero2", "rendered"),
                                                         ("zero3", "rendered")]
    assert {(c["micro_batch"], c["grad_accum"], c["ac"]) for c in cases} == {(4, 2, "none")}


def test_plan_notes_only_where_an_assumed_bucket_differs_from_the_rendered_file(tmp_path: Path) -> None:
    (tmp_path / "ds_config.json").write_text(json.dumps({"zero_optimization": {"reduce_bucket_size": 500_000_000}}))
    zero2 = check.Case("zero2", "deepspeed", "ds_config.json")
    predicted = {"details_bytes": {"DeepSpeed reduce buckets (2, overlap_comm)": 2 * 2**30}}
    # 0 is "as rendered": no disagreement to report.
    assert check.render_notes(tmp_path, zero2, {"reduce_bucket_elements": 0}, predicted) == []
    notes = check.render_notes(tmp_path, zero2, {"reduce_bucket_elements": 4096}, predicted)
    assert notes == ["zero2: ds_config.json reduce_bucket_size = 500,000,000 elements, but the plan assumed "
                     "reduce_bucket_elements = 4,096",
                     "zero2: so the prediction's bucket terms (2.000 GiB) are sized for the assumed values, "
                     "not for the rendered file"]


def test_the_timeterms_matrix_is_a_small_and_a_large_model_at_micro_batch_1_and_8() -> None:
    args = check.parse_args(["out", "--matrix", "timeterms"])
    assert {(c.model, c.micro_batch) for c in args.cases} == {("tiny", 1), ("tiny", 8), ("gpt2-1.5b", 1),
                                                              ("gpt2-1.5b", 8)}
    assert {(c.strategy, c.ac, c.grad_accum) for c in args.cases} == {("fsdp-full", "none", 1)}
    sweeps = {(s.model, s.micro_batch, s.seq_len) for s in check.TIME_SWEEPS}
    # Each trained model and micro-batch has its GEMM sweep; the default grid too.
    assert {(c.model, c.micro_batch, c.seq_len) for c in args.cases} <= sweeps
    assert (None, 1, None) in sweeps and (check.SLICED, 1, 8192) in sweeps
    assert [s.name for s in check.TIME_SWEEPS][:2] == ["gemm-gpt2-1.5b-mb1-s1024", "gemm-gpt2-1.5b-mb8-s1024"]
    assert check.Sweep().name == "gemm-default-grid"


def test_a_dry_run_sweep_records_the_bench_command_and_runs_nothing(tmp_path: Path) -> None:
    args = check.parse_args([str(tmp_path / "out"), "--matrix", "timeterms", "--dry-run"])
    state = check.Check(tmp_path / "out", tmp_path, 60)
    sweep = check.run_sweep(state, check.Sweep("gpt2-1.5b", 8, 1024), args, on_gpu=True)
    assert sweep["status"] == "dry run" and "document" not in sweep
    argv = sweep["argv"]
    assert argv[1:6] == ["-m", "fstrain", "bench", "--suite", "compute"]
    assert argv[argv.index("--model") + 1] == "gpt2-1.5b" and argv[argv.index("--micro-batch") + 1] == "8"
    assert argv[argv.index("--seq-len") + 1] == "1024" and "--max-gemm-flops" not in argv
    on_cpu = check.run_sweep(state, check.Sweep(), args, on_gpu=False)["argv"]
    assert "--model" not in on_cpu and on_cpu[on_cpu.index("--max-gemm-flops") + 1] == check.CPU_SWEEP_MAX_FLOPS


def test_summary_md_lists_the_sweeps() -> None:
    sweeps = [{"sweep": "gemm-tiny-mb1", "status": "ok", "device_name": "NVIDIA H200", "dtype": "bfloat16",
               "shapes": 5, "skipped_shapes": 0, "best_tflops": 12.345, "bench": {"seconds": 21.0}},
              {"sweep": "gemm-default-grid", "status": "skipped", "skipped": "out of time (40 s left)"}]
    text = check.markdown({"argv": ["gpu_train_check.py"], "cases": [], "gemm": sweeps})
    assert "| gemm-tiny-mb1 | ok | NVIDIA H200 | bfloat16 | 5 (0) | 12.35 | 21.0 |" in text
    assert "| gemm-default-grid | skipped: out of time (40 s left) | - | - | - (0) | - | - |" in text
