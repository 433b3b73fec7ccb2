"""Activation checkpointing policies: names, aliases, errors, and what the planner counts for each."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from fstrain.core.plan.acpolicy import block_is_checkpointed, checkpointed_blocks, every_k, parse_ac
from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.blocktime import KernelModel
from fstrain.core.plan.gpus import lookup_gpu
from fstrain.core.plan.kernelcost import GpuRates
from fstrain.core.plan.memory import (
    RECOMPUTE_ITEM,
    StageShape,
    block_backward_extra_bytes,
    block_matmuls,
    layer_activation_bytes,
    stage_activation_bytes,
    stage_shapes,
)
from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.plan.planfile import PlanFile
from fstrain.core.plan.recipe import parse_recipe
from fstrain.core.plan.schema import MoESpec, PlanKnobs
from fstrain.core.plan.timemodel import flops_per_token, layer_hardware_flops
from fstrain.errors import InputError
from tests.helpers import run_fstrain
from tests.plans import TINY_MODEL, make_plan

LLAMA8B = replace(TINY_MODEL, name="llama3.1-8b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
                  ffn_hidden_size=14336, activation="swiglu", vocab_size=128256, seq_len=8192, norm="rmsnorm",
                  linear_bias=False, position_embedding="rope", dropout=0.0, tied_embeddings=False)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [("none", "none"), ("selective-op", "selective-op"), ("op", "selective-op"), ("every-k:3", "every-k:3"),
     ("every-k:1", "full"), ("EVERY-K:2", "every-k:2"), ("full", "full"), ("selective", "megatron-selective"),
     ("megatron-selective", "megatron-selective")],
)
def test_names_and_aliases(text: str, canonical: str) -> None:
    assert parse_ac(text, "--ac") == canonical


@pytest.mark.parametrize("text", ["every-k:0", "every-k:", "every-k:x", "partial", "", 3])
def test_bad_policies_are_one_error_naming_the_place(text: object) -> None:
    with pytest.raises(InputError) as info:
        parse_ac(text, "--ac")
    assert info.value.where == "--ac" and info.value.hint


def test_every_k_picks_torchtitans_blocks() -> None:
    # torchtitan counts wrapped blocks from 1 and checkpoints those with count % N == 0.
    assert [block_is_checkpointed("every-k:3", i) for i in range(7)] == [False, False, True, False, False, True, False]
    assert all(block_is_checkpointed("full", i) for i in range(4))
    assert not any(block_is_checkpointed(ac, 0) for ac in ("none", "selective-op", "megatron-selective"))
    counts = (checkpointed_blocks("every-k:3", 32), checkpointed_blocks("full", 32), every_k("selective-op"))
    assert counts == (10, 32, 0)


def test_selective_op_keeps_q_v_gate_down_and_the_attention_output() -> None:
    s, b = 8192, 2
    widths = [out for _, out in block_matmuls(LLAMA8B)]
    assert widths == [4096, 1024, 1024, 4096, 14336, 14336, 4096]  # q k v o gate up down
    kept = 4096 + 4096 + 1024 + 4096 + 14336 + 4096  # input, q, v, attention output, gate, down
    expected = s * b * kept * 2 + 4 * 32 * s * b  # bf16, plus the fp32 log-sum-exp per head
    assert layer_activation_bytes(LLAMA8B, b, s, ac="selective-op") == expected
    assert layer_activation_bytes(LLAMA8B, b, s, ac="full") == s * b * 4096 * 2


def test_selective_op_keeps_no_moe_tensor() -> None:
    # torchtitan's policy: the router matmul is always recomputed and grouped matmuls are not saved.
    mixtral = replace(LLAMA8B, vocab_size=32000, moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=14336))
    s, b = 4096, 1
    kept = 4096 + 4096 + 1024 + 4096  # input, q, v, attention output
    assert layer_activation_bytes(mixtral, b, s, ac="selective-op") == s * b * kept * 2 + 4 * 32 * s * b
    # Without checkpointing each token keeps top-2 copies of the experts' tensors and routing state.
    dense = layer_activation_bytes(replace(mixtral, moe=None), b, s, ac="none")
    extra = 4 * 2 * 14336 * 2 - 4 * 14336 * 2 + (2 * 2 * 4096 * 2 + 4 * 8 + 24 * 2 + 4 * 2 + 4 + 2 * 2)
    assert layer_activation_bytes(mixtral, b, s, ac="none") == dense + s * b * extra


def test_every_k_mixes_full_and_none_layers() -> None:
    knobs = make_plan("fsdp-full", dp=8, model=LLAMA8B, activation_checkpointing="every-k:4", seq_len=8192,
                      micro_batch_size=1).knobs
    stage = StageShape(params=1, layers=32, largest_layer=1, fsdp_unit=1, has_head=False, in_flight=1)
    items = dict(stage_activation_bytes(LLAMA8B, stage, knobs))
    none = layer_activation_bytes(LLAMA8B, 1, 8192, ac="none")
    full = layer_activation_bytes(LLAMA8B, 1, 8192, ac="full")
    assert items["activations (32 layers x 1 micro-batch, AC every-k:4)"] == 8 * full + 24 * none
    assert items["recompute working set (one layer)"] == none


def test_recompute_flops_per_policy() -> None:
    f = flops_per_token(LLAMA8B, 8192)
    base = layer_hardware_flops(f, "none", True)
    # Op-level AC runs k, o and up again: 2 x (h x kv + q x h + h x ffn) per token.
    assert layer_hardware_flops(f, "selective-op", True) - base == 2 * (4096 * 1024 + 4096 * 4096 + 4096 * 14336)
    assert layer_hardware_flops(f, "every-k:4", True) - base == pytest.approx(f.layer / 4)
    assert layer_hardware_flops(f, "full", True) - base == f.layer
    # Megatron checkpoints the attention kernel, FlashAttention's too (attention.py L1555-1556): its
    # forward, QK^T and AV over the causal half, runs again: 4 x 4096 keys/2 x 4096 wide per token.
    assert layer_hardware_flops(f, "megatron-selective", True) - base == f.attention_core
    assert f.attention_core == 4 * 8192 * 4096  # 4 s d per query, the full square's convention
    assert layer_hardware_flops(f, "megatron-selective", False) - layer_hardware_flops(f, "none", False) == (
        f.attention_core)


def test_megatron_selective_recompute_with_flash_attention_costs_time_and_saves_the_lse() -> None:
    none = layer_activation_bytes(LLAMA8B, 2, 8192, tp=2, ac="none")
    selective = layer_activation_bytes(LLAMA8B, 2, 8192, tp=2, ac="megatron-selective")
    assert none - selective == 4 * 32 * 8192 * 2 // 2  # the fp32 log-sum-exp of 32 heads, over TP 2
    knobs = PlanKnobs("fsdp-full", 3, 8, 1, 1, 8, 1, 1, "megatron-selective", seq_len=8192)
    items = dict(stage_activation_bytes(LLAMA8B, stage_shapes(count_parameters(LLAMA8B), 1, 1, 1, False)[0], knobs))
    assert items[RECOMPUTE_ITEM] == 4 * 32 * 8192  # one layer's log-sum-exp, rebuilt in its backward
    h100 = lookup_gpu("h100-sxm")
    kernels = KernelModel(GpuRates(h100.name, (("bf16", h100.peak_flops("bf16")),), h100.hbm_bandwidth_bytes_per_s),
                          Assumptions())
    plain = kernels.micro_batch(LLAMA8B, replace(knobs, activation_checkpointing="none"), 32)
    again = kernels.micro_batch(LLAMA8B, knobs, 32)
    # FlashAttention's backward is 2.5 forwards (fstrain.core.plan.kernelcost): one more forward is 1/3.5.
    assert again.attention_s / plain.attention_s == pytest.approx(4.5 / 3.5, rel=0.02)
    assert again.gemm_s == plain.gemm_s


def test_plan_files_written_with_selective_read_as_megatron_selective() -> None:
    data = make_plan("fsdp-full", activation_checkpointing="full").to_dict()
    data["plan"]["activation_checkpointing"] = "selective"
    assert PlanFile.from_dict(data, "plan.yaml").knobs.activation_checkpointing == "megatron-selective"
    data["plan"]["activation_checkpointing"] = "every-k:0"
    with pytest.raises(InputError, match="every-k:0"):
        PlanFile.from_dict(data, "plan.yaml")


def test_recipe_accepts_every_policy() -> None:
    text = yaml.safe_dump({"name": "m", "model": {"num_layers": 2, "hidden_size": 64, "num_heads": 4,
                                     "ffn_hidden_size": 128, "activation": "swiglu", "vocab_size": 256,
                                     "seq_len": 64},
                           "training": {"activation_checkpointing": "every-k:2"}})
    assert parse_recipe(yaml.safe_load(text), "r.yaml").training.activation_checkpointing == "every-k:2"
    with pytest.raises(InputError, match=r"training\.activation_checkpointing"):
        parse_recipe(yaml.safe_load(text.replace("every-k:2", "most")), "r.yaml")


def test_cli_ac_pins_and_errors() -> None:
    common = ("plan", "--model", "llama3.1-8b", "--gpu", "h100-sxm", "--num-nodes", "1", "--strategy", "fsdp-full",
              "--tp", "1", "--pp", "1", "--micro-batch", "2", "--seq-len", "8192", "--offload", "none", "--json")
    pins = (("selective-op", "selective-op"), ("every-k:2", "every-k:2"), ("selective", "megatron-selective"))
    for ac, expected in pins:
        result = run_fstrain(*common, "--ac", ac)
        assert result.returncode in (0, 1), result.stderr
        doc = json.loads(result.stdout)
        plans = doc["plans"] or doc["rejected"]
        assert plans[0]["activation_checkpointing"] == expected
    bad = run_fstrain(*common, "--ac", "every-k:zero")
    assert bad.returncode == 2 and "--ac" in bad.stderr and "Traceback" not in bad.stderr


def test_selective_op_is_refused_under_deepspeed_zero3() -> None:
    from fstrain.core.render.deepspeed import render_deepspeed
    from fstrain.errors import ConfigError
    from fstrain.train.settings import check_deepspeed_ac

    zero3 = render_deepspeed(make_plan("zero3", activation_checkpointing="selective-op")).config
    with pytest.raises(ConfigError, match="ZeRO-3"):
        check_deepspeed_ac("selective-op", zero3, "plan.yaml")
    check_deepspeed_ac("full", zero3, "plan.yaml")
    check_deepspeed_ac("selective-op", render_deepspeed(make_plan("zero2")).config, "plan.yaml")


def test_gpu_memory_and_tflops_describe_any_gpu() -> None:
    base = ("plan", "--model", "llama3.1-8b", "--num-nodes", "1", "--gpus-per-node", "8", "--json")
    custom = run_fstrain(*base, "--gpu", "acme-x1", "--gpu-memory", "96", "--gpu-tflops", "500")
    assert custom.returncode in (0, 1), custom.stderr
    doc = json.loads(custom.stdout)
    assert doc["cluster"]["gpu"] == "acme-x1" and doc["cluster"]["gpu_memory_bytes"] == 96 * 2**30
    faster = run_fstrain(*base, "--gpu", "h100-sxm", "--gpu-tflops", "1978.8", "--pp", "1", "--tp", "1")
    slower = run_fstrain(*base, "--gpu", "h100-sxm", "--pp", "1", "--tp", "1")
    fast_plan, slow_plan = json.loads(faster.stdout)["plans"][0], json.loads(slower.stdout)["plans"][0]
    assert fast_plan["tokens_per_s"] > slow_plan["tokens_per_s"]
    unknown = run_fstrain(*base, "--gpu", "acme-x1")
    assert unknown.returncode == 2 and "--gpu-tflops" in unknown.stderr


def test_moe_backward_holds_every_experts_gradients() -> None:
    """Mixtral's block backward (PyTorch's eager kernels, traced): after the experts' backward all
    three stacked expert matrices' gradients are live, the routed copies' FFN tensors are freed,
    and the second RMSNorm's backward adds three fp32 hidden-wide temporaries."""
    mixtral = replace(LLAMA8B, vocab_size=32000, moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=14336))
    tokens, hidden = 4096, 4096 * 4096 * 2
    weights = 3 * 8 * 4096 * 14336 * 2  # 2.625 GiB in bf16
    routed_ffn = 4 * tokens * 2 * 14336 * 2
    expected = hidden + weights - routed_ffn + 2 * hidden + 3 * tokens * 4096 * 4
    assert block_backward_extra_bytes(mixtral, 1, 4096, weight_grads="block") == expected
    # DeepSpeed's hooks take each gradient away as it is made: the FFN point is then the peak.
    each = block_backward_extra_bytes(mixtral, 1, 4096, weight_grads="each")
    assert each == hidden + max(weights // 3 + routed_ffn // 4, 2 * routed_ffn // 4)
    knobs = make_plan("fsdp-full", dp=16, model=mixtral, activation_checkpointing="full", seq_len=4096,
                      micro_batch_size=1, grad_accum_steps=1, precision="bf16").knobs
    stage = StageShape(params=1, layers=32, largest_layer=1, fsdp_unit=1, has_head=True, in_flight=1)
    items = dict(stage_activation_bytes(mixtral, stage, knobs))
    assert items["backward temporaries (one block)"] == expected
