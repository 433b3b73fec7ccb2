"""--compile and --fused-rmsnorm: the elementwise traffic they remove, priced on the GPU's HBM,
and the flags end to end (JSON, plan file, the table, refusals)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.kernels import elementwise_bytes_per_token, elementwise_passes, fusion_seconds_saved_per_token
from fstrain.core.plan.plancluster import uniform_cluster
from fstrain.core.plan.planfile import PlanFile
from fstrain.core.plan.planner import Pins, PlanModel, TrainingSpec, plan
from fstrain.io.recipes import load_shipped_recipe
from tests.helpers import run_fstrain
from tests.plans import TINY_MODEL

LLAMA = replace(TINY_MODEL, norm="rmsnorm", activation="swiglu", position_embedding="rope", hidden_size=100,
                num_heads=4, num_kv_heads=2, ffn_hidden_size=300)  # head_dim 25: q 100 wide, k 50


def test_eager_and_fused_elementwise_bytes_by_hand() -> None:
    eager = elementwise_bytes_per_token(LLAMA, 2, compiled=False, fused_rmsnorm=False)
    # norms: 2 x (6 + 8 + 4 + 8 + 6 + 4) = 72 bytes per element, residual adds 2 x 6
    assert eager.replicated == 100 * (72 + 12)
    # rotary on q and k (150 wide): 6 + 8 + 6 = 20; silu(gate) * up on 300: 4 + 6 = 10
    assert eager.sharded == 150 * 20 + 300 * 10
    fused_norm = elementwise_bytes_per_token(LLAMA, 2, compiled=False, fused_rmsnorm=True)
    assert (fused_norm.replicated, fused_norm.sharded) == (100 * (2 * 4 + 12), eager.sharded)
    compiled = elementwise_bytes_per_token(LLAMA, 2, compiled=True, fused_rmsnorm=False)
    assert (compiled.replicated, compiled.sharded) == (100 * (2 * 4 + 2 * 2), 150 * 4 + 300 * 6)
    gelu = replace(LLAMA, activation="gelu", norm="layernorm", position_embedding="learned")
    assert elementwise_bytes_per_token(gelu, 2, True, False).sharded == elementwise_bytes_per_token(
        gelu, 2, False, False).sharded == 300 * 4  # one GeLU kernel either way


def test_time_saved_counts_passes_tp_and_hbm() -> None:
    assert [elementwise_passes(ac, k) for ac, k in (("none", 0), ("full", 1), ("selective-op", 0),
                                                   ("every-k:4", 4))] == [3.0, 4.0, 4.0, 3.25]
    hbm = 1e12
    saved = fusion_seconds_saved_per_token(LLAMA, 2, 1, 1, "none", 0, True, False, hbm)
    removed = 100 * (84 - 12) + (150 * 20 + 300 * 10 - 150 * 4 - 300 * 6)
    assert saved == pytest.approx(removed * 3 / hbm)
    # tensor parallel: sharded traffic splits by tp, hidden-wide traffic by the sequence-parallel split
    assert fusion_seconds_saved_per_token(LLAMA, 2, 2, 2, "none", 0, True, False, hbm) == pytest.approx(saved / 2)
    assert fusion_seconds_saved_per_token(LLAMA, 2, 1, 1, "none", 0, False, False, hbm) == 0.0


def test_compile_changes_the_plan_by_the_fused_traffic_and_the_saved_tensors() -> None:
    spec = load_shipped_recipe("llama3.1-8b").model
    cluster = uniform_cluster(1, 8, "h100-sxm")
    base = TrainingSpec(8192, 16, "bf16")
    pins = Pins(strategy="fsdp-full", tp=1, pp=1, micro_batch_size=2, activation_checkpointing="selective-op",
                offload="none")
    eager = plan(PlanModel.from_spec(spec), base, cluster, pins).best
    compiled = plan(PlanModel.from_spec(spec), replace(base, compile=True), cluster, pins).best
    assert eager is not None and compiled is not None
    assert compiled.knobs == replace(eager.knobs, compile=True)  # same layout, other kernels
    assert eager.time is not None and compiled.time is not None
    layers, tokens = spec.num_layers, eager.knobs.micro_batch_size * 8192
    hbm = cluster.links().hbm_bytes_per_s * Assumptions().hbm_efficiency
    ac = eager.knobs.activation_checkpointing
    from fstrain.core.plan.acpolicy import every_k
    from fstrain.core.plan.fitted import COMPUTE_TIME_SCALE

    # The kernel model prices the elementwise traffic each way: the difference is what fusion removes.
    per_micro_batch = tokens * layers * fusion_seconds_saved_per_token(spec, 2, 1, 1, ac, every_k(ac), True, False, hbm)
    assert eager.time.elementwise_s - compiled.time.elementwise_s == pytest.approx(
        eager.knobs.grad_accum_steps * per_micro_batch * COMPUTE_TIME_SCALE["hopper"])
    assert eager.time.gemm_s == compiled.time.gemm_s and eager.time.attention_s == compiled.time.attention_s
    assert compiled.memory.activations < eager.memory.activations


def test_flags_reach_json_table_plan_file_launch_and_trace(tmp_path: Path) -> None:
    assert {"--compile", "--fused-rmsnorm"} <= set(run_fstrain("plan", "--help", env={"COLUMNS": "200"}).stdout.split())
    args = ("plan", "--model", "tiny", "--num-nodes", "1", "--gpus-per-node", "2", "--gpu", "h100-sxm",
            "--strategy", "fsdp-full")
    result = run_fstrain(*args, "--compile", "--json", "--out", str(tmp_path / "plan.yaml"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["training"]["compile"] is True
    saved = PlanFile.from_dict(yaml.safe_load((tmp_path / "plan.yaml").read_text()), "plan.yaml")
    assert saved.knobs.compile and not saved.knobs.fused_rmsnorm
    assert "torch.compile" in run_fstrain(*args, "--compile").stderr
    launch = run_fstrain("launch", "--plan", str(tmp_path / "plan.yaml"), "--dry-run", "--hosts", "localhost",
                         "--nproc-per-node", "2")
    assert launch.returncode == 0, launch.stderr  # the bundled trainer compiles each block
    trace = run_fstrain(*args, "--compile", "--trace")
    assert trace.returncode == 2 and trace.stderr.count("\n") == 1
    assert trace.stderr.startswith("error: --trace: the plan is for torch.compile (--compile), but the trace runs")
    fused = run_fstrain(*args[:2], "tiny-moe", *args[3:], "--fused-rmsnorm", "--out", str(tmp_path / "fused.yaml"))
    assert fused.returncode == 0 and "fused RMSNorm" in fused.stderr
    dry = run_fstrain("launch", "--plan", str(tmp_path / "fused.yaml"), "--dry-run", "--hosts", "localhost",
                      "--nproc-per-node", "2")
    assert dry.returncode == 0, dry.stderr  # the bundled trainer runs a fused RMSNorm


def test_bad_kernel_input_is_one_line(tmp_path: Path) -> None:
    result = run_fstrain("plan", "--model", "gpt2-1.5b", "--gpu", "h100-sxm", "--fused-rmsnorm")
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: --fused-rmsnorm: gpt2-1.5b normalises with layernorm, not RMSNorm")
    made = run_fstrain("plan", "--model", "tiny", "--num-nodes", "1", "--gpus-per-node", "1", "--gpu", "h100-sxm",
                       "--out", str(tmp_path / "plan.yaml"))
    assert made.returncode == 0, made.stderr
    document = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    document["plan"]["compile"] = "yes"
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(document))
    launch = run_fstrain("launch", "--plan", str(tmp_path / "plan.yaml"), "--dry-run", "--hosts", "localhost",
                         "--nproc-per-node", "1")
    assert launch.returncode == 2 and launch.stderr.count("\n") == 1
    assert "plan.compile must be true or false, got 'yes'" in launch.stderr


def test_a_compiled_plan_on_cpu_without_a_cxx_compiler_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from fstrain.errors import ConfigError
    from fstrain.train.settings import check_compiler_toolchain

    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ConfigError, match="Inductor needs a C\\+\\+ compiler, but none was found") as error:
        check_compiler_toolchain()
    assert "apt-get install g++" in error.value.one_line()
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/g++" if name == "g++" else None)
    check_compiler_toolchain()  # one is enough
