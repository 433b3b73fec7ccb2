"""fp8 linears (--fp8) in the planner: time after torchao's float8 roofline, the backward's fp8
casts, the GPU check, plan files, the CLI, and what the trainer, trace and renderers do with it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from fstrain.core.job.plan import check_plan_fits_launch, check_trainer_fp8
from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.gpus import GPUS, lookup_gpu
from fstrain.core.plan.memory import (
    FP8_CASTS_ITEM,
    block_matmuls,
    converted_linears,
    fp8_cast_bytes,
    fp8_gathered_block_params,
    memory_breakdown,
)
from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.plan.plancluster import uniform_cluster
from fstrain.core.plan.planfile import PlanFile
from fstrain.core.plan.planner import Pins, PlanModel, TrainingSpec, plan, plan_file
from fstrain.core.plan.schema import PlanKnobs
from fstrain.core.plan.timemodel import Fp8Rates, fp8_linear_saving_s, step_time
from fstrain.core.render.deepspeed import render_deepspeed
from fstrain.core.render.fsdp import render_accelerate, render_fsdp
from fstrain.errors import ConfigError, InputError
from fstrain.io.recipes import load_shipped_recipe
from fstrain.train.trace import check_traceable
from tests.helpers import run_fstrain
from tests.plans import TINY_MODEL, make_plan

from .test_timemodel import LINKS, NO_OVERLAP

RATES = Fp8Rates(peak_flops=1e15, fp8_peak_flops=2e15, hbm_bytes_per_s=2e12, achievable_mfu=0.4)
LLAMA8B = load_shipped_recipe("llama3.1-8b").model
MIXTRAL = load_shipped_recipe("mixtral-8x7b").model


def tiny_knobs(**changes: object) -> PlanKnobs:
    """TINY_MODEL (hidden 64, 4 heads of 16, 2 KV heads, GeLU 256): 4 x 64 = 256 tokens a micro-batch."""
    base = PlanKnobs("fsdp-full", 3, 8, 1, 1, 8, 4, 1, "none", "none", "bf16", "adamw", 64, fp8=True)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_the_converted_linears_are_the_blocks_and_only_attention_of_a_moe() -> None:
    # q (64->64), k and v (64->32), o (64->64), up (64->256), down (256->64); the head is not one.
    assert converted_linears(TINY_MODEL) == [(64, 64), (64, 32), (64, 32), (64, 64), (64, 256), (256, 64)]
    assert converted_linears(MIXTRAL) == block_matmuls(MIXTRAL)[:4]  # experts are grouped matmuls
    assert len(block_matmuls(MIXTRAL)) == 7


def test_the_saving_of_a_tiny_block_is_the_roofline_by_hand() -> None:
    # sum K N = 4096 + 2048 + 2048 + 4096 + 16384 + 16384 = 45,056; M = 256 tokens.
    # matmuls: 3 x 2 x 256 x 45,056 = 69,206,016 FLOPs at 60 % of 1e15 (bf16) or 2e15 (fp8).
    # casts: 4 M sum(K) + 6 sum(K N) + 4 M sum(N) = 1024 x 576 + 270,336 + 1024 x 512 = 1,384,448 bytes
    # at 89 % (hbm_efficiency) of 2e12 B/s; 6 linears x 3 amax kernels x 2 us.
    flops, cast_bytes = 69_206_016, 1_384_448
    expected = flops / 0.6e15 - flops / 1.2e15 - cast_bytes / (2e12 * 0.89) - 18 * 2e-6
    saving = fp8_linear_saving_s(TINY_MODEL, tiny_knobs(), RATES, Assumptions())
    assert saving == pytest.approx(expected, rel=1e-12)
    assert saving < 0  # shapes this small are slower in fp8 (torchao's README says so too)


def test_selective_op_recompute_runs_every_other_linear_and_its_casts_again() -> None:
    # Recomputed: k (64x32), o (64x64), down (256x64): 2 x 256 x 22,528 more FLOPs; their forward
    # casts again: (65,536 + 12,288) + (65,536 + 24,576) + (262,144 + 98,304) = 528,384 bytes; 2 kernels each.
    base = fp8_linear_saving_s(TINY_MODEL, tiny_knobs(), RATES, Assumptions())
    sac = fp8_linear_saving_s(TINY_MODEL, tiny_knobs(activation_checkpointing="selective-op"), RATES, Assumptions())
    extra_flops = 2 * 256 * 22_528
    extra = extra_flops / 0.6e15 - extra_flops / 1.2e15 - 528_384 / (2e12 * 0.89) - 6 * 2e-6
    assert sac - base == pytest.approx(extra, rel=1e-9)


def test_tensor_parallel_ranks_hold_a_tp_th_and_the_gemm_fraction_is_never_below_the_mfu() -> None:
    assumptions = Assumptions(fp8_scale_kernel_s=0.0)
    whole = fp8_linear_saving_s(LLAMA8B, tiny_knobs(seq_len=8192, micro_batch_size=2), RATES, assumptions)
    half = fp8_linear_saving_s(LLAMA8B, tiny_knobs(seq_len=8192, micro_batch_size=2, tp=2), RATES, assumptions)
    assert half == pytest.approx(whole / 2)
    fast = dataclasses.replace(RATES, achievable_mfu=0.8)  # above 0.6: the linears run at 0.8 too
    assert fp8_linear_saving_s(LLAMA8B, tiny_knobs(), fast, assumptions) == pytest.approx(
        fp8_linear_saving_s(LLAMA8B, tiny_knobs(), RATES, dataclasses.replace(assumptions, gemm_peak_fraction=0.8)))


def test_step_time_takes_the_saving_off_every_layer_of_every_micro_batch() -> None:
    k = dataclasses.replace(tiny_knobs(seq_len=4096, micro_batch_size=1, grad_accum_steps=3), dp=1,
                            shard_group_size=1)
    bf16 = step_time(LLAMA8B, 8_000_000_000, dataclasses.replace(k, fp8=False), 400e12, 1e15, LINKS, NO_OVERLAP)
    fp8 = step_time(LLAMA8B, 8_000_000_000, k, 400e12, 1e15, LINKS, NO_OVERLAP, fp8_rates=RATES)
    saving = fp8_linear_saving_s(LLAMA8B, k, RATES, NO_OVERLAP)
    assert bf16.compute_s - fp8.compute_s == pytest.approx(3 * 32 * saving)
    assert fp8.model_flops_per_step == bf16.model_flops_per_step  # MFU still counts the bf16 peak
    with pytest.raises(ValueError, match="fp8 rates"):
        step_time(LLAMA8B, 8_000_000_000, k, 400e12, 1e15, LINKS, NO_OVERLAP)


def test_llama_8b_on_h100_96gb_gains_what_torchtitan_measured_within_the_model() -> None:
    # torchtitan's 2412 benchmark: FSDP + compile 6,667 -> + Float8 8,532 tokens/s per GPU (1.28x).
    model = PlanModel.from_spec(LLAMA8B)
    cluster = uniform_cluster(1, 8, "h100-96gb")
    pins = Pins(strategy="fsdp-full", tp=1, pp=1, micro_batch_size=2, grad_accum_steps=1,
                activation_checkpointing="selective-op")
    bf16 = plan(model, TrainingSpec(8192, 16), cluster, pins, suggest=False).plans[0]
    fp8 = plan(model, TrainingSpec(8192, 16, fp8=True), cluster, pins, suggest=False).plans[0]
    assert fp8.knobs.fp8 and not bf16.knobs.fp8
    assert bf16.time is not None and fp8.time is not None
    assert 1.15 < fp8.time.tokens_per_s / bf16.time.tokens_per_s < 1.35
    assert fp8.memory.peak == bf16.memory.peak  # the loss moment holds the peak; casts are backward's


def test_the_backward_holds_the_largest_linears_fp8_casts() -> None:
    # up (64 -> 256) is the largest: 2 x 256 x 256 + 64 x 256 + 256 x 64 = 163,840 bytes.
    assert fp8_cast_bytes(TINY_MODEL, tiny_knobs()) == 163_840
    assert fp8_cast_bytes(TINY_MODEL, tiny_knobs(tp=2)) == 81_920
    params = count_parameters(TINY_MODEL)
    with_casts = memory_breakdown(TINY_MODEL, params, params.total, tiny_knobs(), 8)
    without = memory_breakdown(TINY_MODEL, params, params.total, tiny_knobs(fp8=False), 8)
    backward = dict(with_casts.moments)["backward"] - dict(without.moments)["backward"]
    assert abs(backward - 163_840 * (1 + Assumptions().fragmentation_fraction)) <= 1  # + the allocator's share
    assert dict(with_casts.moments)["optimizer step"] == dict(without.moments)["optimizer step"]
    # With the logits in chunks the loss moment shrinks and the backward holds the peak, so the
    # peak's itemised details must show the casts.
    chunked = memory_breakdown(TINY_MODEL, params, params.total, tiny_knobs(loss="chunked:8"), 8)
    assert chunked.phase == "backward"
    assert (FP8_CASTS_ITEM, 163_840) in chunked.details


def test_the_gpu_table_has_the_datasheets_dense_fp8_peaks() -> None:
    dense_fp8_tflops = {  # datasheet "FP8 Tensor Core" with sparsity, halved
        "h100-sxm": 1978.9, "h100-pcie": 1513, "h100-nvl": 1671, "h100-96gb": 1978.9, "h200": 1979,
        "h200-nvl": 1671, "b200": 4500, "gb200": 5000, "l40s": 733, "l4": 242.5, "rtx-4090": 330.3,
        "mi300x": 2614.9,
    }
    for spec in GPUS:
        assert spec.fp8_flops == pytest.approx(dense_fp8_tflops.get(spec.name, 0.0) * 1e12), spec.name


@pytest.mark.parametrize(
    ("gpu", "precision", "message"),
    [
        ("a100-80gb", "bf16", "A100-SXM4-80GB has no fp8 tensor cores"),
        ("v100-32gb", "fp16", "V100-SXM2-32GB has no fp8 tensor cores"),
        ("h100-sxm", "fp32", "computes in fp32"),
    ],
)
def test_fp8_needs_fp8_tensor_cores_and_a_16_bit_compute_dtype(gpu: str, precision: str, message: str) -> None:
    model = PlanModel.from_spec(TINY_MODEL)
    training = TrainingSpec(64, 16, precision=precision, flash_attention=precision != "fp32", fp8=True)
    with pytest.raises(ConfigError, match=message) as caught:
        plan(model, training, uniform_cluster(1, 8, gpu))
    assert caught.value.hint and caught.value.where == "--fp8"


def test_a_gpu_scaled_with_gpu_tflops_keeps_the_tables_fp8_ratio() -> None:
    from fstrain.core.plan.plancluster import NodeGpus, build_cluster

    scaled = build_cluster([NodeGpus("h100-sxm", 8, peak_tflops=500.0)], None, "--gpu").nodes[0].gpu
    h100 = lookup_gpu("h100-sxm")
    assert scaled.fp8_flops == pytest.approx(500e12 * h100.fp8_flops / h100.bf16_flops)
    outside = build_cluster([NodeGpus("mygpu", 8, memory_bytes=80 * 2**30, peak_tflops=500.0)], None, "--gpu")
    with pytest.raises(ConfigError, match="fp8 peak of mygpu is unknown"):
        plan(PlanModel.from_spec(TINY_MODEL), TrainingSpec(64, 16, fp8=True), outside)


def test_plan_files_carry_fp8_and_old_ones_still_load() -> None:
    model = PlanModel.from_spec(TINY_MODEL)
    cluster = uniform_cluster(1, 8, "h100-sxm")
    saved = plan_file(plan(model, TrainingSpec(64, 16, fp8=True), cluster), model, cluster)
    document = saved.to_dict()
    assert document["plan"]["fp8"] is True
    assert PlanFile.from_dict(yaml.safe_load(yaml.safe_dump(document)), "plan.yaml").knobs == saved.knobs
    del document["plan"]["fp8"]  # written before fp8
    assert PlanFile.from_dict(document, "plan.yaml").knobs.fp8 is False
    document["plan"]["fp8"] = "yes"
    with pytest.raises(InputError, match=r"plan\.fp8 must be true or false, got 'yes'") as caught:
        PlanFile.from_dict(document, "plan.yaml")
    assert caught.value.hint


def test_the_trainer_launch_and_trace_refuse_fp8_and_renderers_say_what_runs_it() -> None:
    chosen = make_plan("fsdp-full", dp=2, fp8=True)
    for check in (lambda: check_trainer_fp8(chosen, "plan.yaml"), lambda: check_plan_fits_launch(chosen, 2, "x"),
                  lambda: check_traceable(chosen)):
        with pytest.raises(ConfigError, match="the bundled trainer computes them in bf16") as caught:
            check()
        assert "torchtitan --model.converters float8" in caught.value.hint
    check_trainer_fp8(make_plan("fsdp-full", dp=2), "plan.yaml")  # bf16 linears train
    accelerate = render_accelerate(chosen)
    assert accelerate.config["mixed_precision"] == "fp8" and accelerate.config["fp8_config"] == {"backend": "AO"}
    assert render_accelerate(make_plan("fsdp-full", dp=2)).config["mixed_precision"] == "bf16"
    assert "te.Linear" in " ".join(render_deepspeed(make_plan("zero3", dp=2, fp8=True)).notes)
    assert "--model.converters float8" in " ".join(render_fsdp(chosen).notes)
    gathering = make_plan("fsdp-full", dp=2, fp8=True, fp8_all_gather=True)
    assert "--float8.enable_fsdp_float8_all_gather" in " ".join(render_fsdp(gathering).notes)
    assert "enable_fsdp_float8_all_gather=True" in " ".join(render_accelerate(gathering).notes)


def test_the_command_line_plans_fp8_and_says_so(tmp_path: Path) -> None:
    help_text = run_fstrain("plan", "--help").stdout
    assert "--fp8 " in help_text and "--fp8-all-gather" in help_text
    argv = ["plan", "--model", "tiny", "--num-nodes", "1", "--gpus-per-node", "8", "--gpu", "h100-sxm",
            "--global-batch", "16", "--precision", "bf16"]
    out = tmp_path / "plan.yaml"
    result = run_fstrain(*argv, "--fp8", "--json", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert all(p["fp8"] is True for p in json.loads(result.stdout)["plans"])
    assert yaml.safe_load(out.read_text())["plan"]["fp8"] is True
    human = run_fstrain(*argv, "--fp8")
    assert "with fp8 linears" in human.stderr and "fp8 linears" in human.stderr.split("chosen:")[1].splitlines()[0]
    traced = run_fstrain(*argv, "--fp8", "--strategy", "fsdp-full", "--tp", "1", "--pp", "1", "--trace")
    assert traced.returncode == 2 and "Traceback" not in traced.stderr
    assert traced.stderr.strip().splitlines()[-1].startswith("error: --trace: the plan has fp8 linears")
    refused = run_fstrain(*[a if a != "h100-sxm" else "a100-80gb" for a in argv], "--fp8")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith("error: --fp8: A100-SXM4-80GB has no fp8 tensor cores")
    document = yaml.safe_load(out.read_text())
    document["plan"]["fp8"] = 1
    out.write_text(yaml.safe_dump(document))
    bad = run_fstrain("render", "--plan", str(out), "-o", str(tmp_path / "out"))
    assert bad.returncode == 2 and "plan.fp8 must be true or false, got 1" in bad.stderr
    assert not (tmp_path / "out").exists()


def test_fsdp_float8_all_gather_moves_the_converted_weights_in_one_byte() -> None:
    # Llama 3.1 8B: a block's linears are 2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336 = 218,103,808
    # weights, 32 blocks of the 8,030,261,248 parameters: that share gathers at 1 byte instead of 2.
    params = count_parameters(LLAMA8B).total
    share = 32 * 218_103_808 / params
    k = tiny_knobs(seq_len=8192, micro_batch_size=2)  # AC none: each forward cast once
    bf16 = step_time(LLAMA8B, params, k, 400e12, 8e15, LINKS, NO_OVERLAP, fp8_rates=RATES)
    gathered = step_time(LLAMA8B, params, dataclasses.replace(k, fp8_all_gather=True), 400e12, 8e15, LINKS,
                         NO_OVERLAP, fp8_rates=RATES)
    # FSDP full shard moves 2 all-gathers (2 bytes each) and a reduce-scatter (4 bytes) per parameter.
    assert gathered.dp_comm_s / bf16.dp_comm_s == pytest.approx((2 * (2 - share) + 4) / 8)
    # Each rank casts its 1/8 weight shard before the gather instead of the whole weight after it.
    weights = 218_103_808
    assert gathered.compute_s - bf16.compute_s == pytest.approx(
        -32 * 6 * weights * (1 - 1 / 8) / (2e12 * 0.89), rel=1e-6)


def test_fsdp_float8_all_gather_halves_the_gathered_blocks_linears() -> None:
    # TINY_MODEL: 45,056 linear weights a block gathered at 1 byte instead of 2, current + prefetched.
    params = count_parameters(TINY_MODEL)
    k = tiny_knobs()
    assert fp8_gathered_block_params(TINY_MODEL, k) == 0
    assert fp8_gathered_block_params(TINY_MODEL, dataclasses.replace(k, fp8_all_gather=True, tp=2)) == 22_528
    moments = dict(memory_breakdown(TINY_MODEL, params, params.total, k, 8).moments)
    gathered = dict(memory_breakdown(TINY_MODEL, params, params.total, dataclasses.replace(k, fp8_all_gather=True),
                                     8).moments)
    saved = moments["backward"] - gathered["backward"]
    assert abs(saved - 2 * 45_056 * (1 + Assumptions().fragmentation_fraction)) <= 1
    assert moments["optimizer step"] == gathered["optimizer step"]


def test_fp8_all_gather_needs_fp8_and_fsdp_and_plans_fsdp_only() -> None:
    model = PlanModel.from_spec(TINY_MODEL)
    cluster = uniform_cluster(1, 8, "h100-sxm")
    with pytest.raises(ConfigError, match="but --fp8 is not given"):
        plan(model, TrainingSpec(64, 16, fp8_all_gather=True), cluster)
    with pytest.raises(ConfigError, match="ZeRO-3 gathers no fp8 weights") as caught:
        plan(model, TrainingSpec(64, 16, fp8=True, fp8_all_gather=True), cluster, Pins(strategy="zero3"))
    assert caught.value.where == "--fp8-all-gather"
    result = plan(model, TrainingSpec(64, 16, fp8=True, fp8_all_gather=True), cluster)
    assert result.plans and all(p.knobs.strategy.startswith("fsdp") and p.knobs.fp8_all_gather for p in result.plans)
    document = plan_file(result, model, cluster).to_dict()
    assert PlanFile.from_dict(document, "plan.yaml").knobs.fp8_all_gather is True
    document["plan"]["fp8"] = False
    with pytest.raises(InputError, match="fp8_all_gather is true with fp8 false"):
        PlanFile.from_dict(document, "plan.yaml")


def test_a_context_parallel_rank_saves_what_a_rank_of_its_share_of_the_sequence_saves() -> None:
    # cp 2 at 2 x 4096 tokens: each CP rank runs the linears on 4096 tokens, as cp 1 at 4096 does.
    def saved(k: PlanKnobs) -> float:
        with_fp8 = step_time(LLAMA8B, 8_000_000_000, k, 400e12, 8e15, LINKS, NO_OVERLAP, fp8_rates=RATES)
        without = step_time(LLAMA8B, 8_000_000_000, dataclasses.replace(k, fp8=False), 400e12, 8e15, LINKS,
                            NO_OVERLAP)
        return without.compute_s - with_fp8.compute_s

    one = tiny_knobs(seq_len=4096, micro_batch_size=1, dp=4, shard_group_size=4)
    two = tiny_knobs(seq_len=8192, micro_batch_size=1, dp=4, shard_group_size=4, cp=2)
    assert saved(two) == pytest.approx(saved(one))
    assert saved(one) == pytest.approx(32 * fp8_linear_saving_s(LLAMA8B, one, RATES, NO_OVERLAP))
