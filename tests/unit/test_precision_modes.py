"""Precision modes (bf16-pure, amp-bf16, amp-fp16) in the memory and time models, on values."""

from __future__ import annotations

import dataclasses

import pytest

from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.gpus import lookup_gpu
from fstrain.core.plan.memory import (
    AUTOCAST_CACHE_ITEM,
    AUTOCAST_SAVED_ITEM,
    block_matmul_params,
    comm_bytes,
    layer_activation_bytes,
    memory_breakdown,
    model_states,
    stage_activation_bytes,
    stage_shapes,
)
from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.plan.precision import PRECISIONS, check_strategy, compute_dtype, optimizer_state_bytes
from fstrain.core.plan.schema import ModelSpec, PlanKnobs
from fstrain.errors import FstrainError

LLAMA_8B = ModelSpec("llama3.1-8b", 32, 4096, 32, 8, 14336, "swiglu", 128256, 8192)
N = 1000


def test_the_new_modes_are_plan_vocabulary() -> None:
    assert {"bf16-pure", "amp-bf16", "amp-fp16"} <= set(PRECISIONS)
    assert [compute_dtype(p) for p in ("bf16-pure", "amp-bf16", "amp-fp16", "fp32")] == [
        "bf16", "bf16", "fp16", "fp32"]


@pytest.mark.parametrize(
    ("precision", "optimizer", "params", "grads", "states"),
    [
        # torchtune: bf16 params, bf16 grads, torch AdamW m and v in the param dtype (zeros_like)
        ("bf16-pure", "adamw", 2, 2, 4),
        ("bf16-pure", "sgd", 2, 2, 2),
        ("bf16-pure", "adam8bit", 2, 2, 2),
        # autocast over fp32 weights: 4 + 4 + 8, no separate master copy
        ("amp-bf16", "adamw", 4, 4, 8),
        ("amp-fp16", "adamw", 4, 4, 8),
        ("amp-fp16", "sgd", 4, 4, 4),
        # unchanged: 2 + 2 + (4 master + 8)
        ("bf16", "adamw", 2, 2, 12),
    ],
)
def test_ddp_model_states_per_mode(precision: str, optimizer: str, params: int, grads: int, states: int) -> None:
    got = model_states(N, "ddp", 1, precision, optimizer)
    assert (got.parameters, got.gradients, got.optimizer_states) == (params * N, grads * N, states * N)


@pytest.mark.parametrize(
    ("precision", "per_rank"),
    [
        ("bf16-pure", (2 * N // 8, 2 * N // 8, 4 * N // 8)),  # FSDP2 over a bf16 model: all bf16
        ("amp-bf16", (4 * N // 8, 4 * N // 8, 8 * N // 8)),  # no MixedPrecisionPolicy: fp32 shards
        ("bf16", (4 * N // 8, 4 * N // 8, 8 * N // 8)),  # the fp32 sharded parameter is the master
    ],
)
def test_fsdp_full_model_states_per_mode(precision: str, per_rank: tuple[int, int, int]) -> None:
    got = model_states(N, "fsdp-full", 8, precision)
    assert (got.parameters, got.gradients, got.optimizer_states) == per_rank


def test_fsdp_grad_op_keeps_gathered_params_in_the_param_dtype() -> None:
    amp = model_states(N, "fsdp-grad-op", 8, "amp-bf16")
    pure = model_states(N, "fsdp-grad-op", 8, "bf16-pure")
    assert amp.parameters == 4 * N // 8 + 4 * N
    assert pure.parameters == 2 * N // 8 + 2 * N


def test_zero_under_autocast_has_no_fp32_gradient_partition_or_master() -> None:
    # fp32 parameters: DeepSpeed's "fp32 gradient partition" is the gradient itself
    z2 = model_states(N, "zero2", 8, "amp-bf16")
    assert (z2.parameters, z2.gradients, z2.optimizer_states) == (4 * N, 4 * N // 8, 8 * N // 8)
    z3 = model_states(N, "zero3", 8, "amp-fp16")
    assert (z3.parameters, z3.gradients, z3.optimizer_states) == (4 * N // 8, 4 * N // 8, 8 * N // 8)


def test_optimizer_state_bytes_follow_the_state_dtype() -> None:
    assert optimizer_state_bytes("bf16-pure", "adamw", 8) == 4
    assert optimizer_state_bytes("amp-bf16", "adamw", 8) == 8
    assert optimizer_state_bytes("bf16-pure", "adam8bit", 2) == 2


def test_pure_bf16_is_refused_for_deepspeed_zero_with_a_hint() -> None:
    for strategy in ("zero1", "zero2", "zero3"):
        with pytest.raises(FstrainError) as caught:
            check_strategy("bf16-pure", strategy)
        assert "master copy" in str(caught.value) and "fsdp" in caught.value.hint
    for strategy in ("ddp", "fsdp-full", "fsdp-grad-op", "fsdp-hybrid"):
        check_strategy("bf16-pure", strategy)
    for strategy in ("ddp", "zero1", "zero2", "zero3", "fsdp-full"):
        check_strategy("amp-bf16", strategy)
    for strategy in ("ddp", "fsdp-full", "fsdp-hybrid"):
        check_strategy("amp-fp16", strategy)
    with pytest.raises(FstrainError, match="no loss scaler") as scaler:
        check_strategy("amp-fp16", "zero2")
    assert "--precision fp16" in scaler.value.hint


def test_communication_dtypes() -> None:
    a = Assumptions()
    assert comm_bytes("amp-bf16", "fsdp-full", a) == (4, 4)  # fp32 units and gradients
    assert comm_bytes("bf16-pure", "fsdp-full", a) == (2, 2)
    assert comm_bytes("bf16", "fsdp-full", a) == (2, a.fsdp_reduce_bytes_per_element)
    assert comm_bytes("amp-bf16", "ddp", a) == (4, 4)  # DDP all-reduces fp32 gradients
    assert comm_bytes("amp-fp16", "zero3", a) == (2, 2)  # DeepSpeed torch_autocast comm_dtype
    assert comm_bytes("bf16", "zero2", a) == (2, 2)


def test_autocast_keeps_the_residual_stream_and_norms_in_fp32() -> None:
    s, h = 8192, 4096
    full_bf16 = layer_activation_bytes(LLAMA_8B, 1, s, 1, "full", precision="bf16")
    full_amp = layer_activation_bytes(LLAMA_8B, 1, s, 1, "full", precision="amp-bf16")
    assert (full_bf16, full_amp) == (2 * s * h, 4 * s * h)
    none_bf16 = layer_activation_bytes(LLAMA_8B, 1, s, 1, "none", precision="bf16")
    none_amp = layer_activation_bytes(LLAMA_8B, 1, s, 1, "none", precision="amp-bf16")
    # two RMSNorms whose outputs are fp32 instead of bf16 (2 x 2sh), and q, k, v, gate and up each
    # save their own cast of the shared input (5 casts instead of 2 tensors: 3 x 2sh)
    assert none_amp - none_bf16 == 2 * 2 * s * h + 3 * 2 * s * h
    # pure bf16 saves what bf16 mixed precision saves
    assert layer_activation_bytes(LLAMA_8B, 1, s, 1, "none", precision="bf16-pure") == none_bf16


def test_autocast_eager_softmax_is_fp32() -> None:
    gpt = ModelSpec("g", 2, 1024, 16, 16, 4096, "gelu", 50257, 1024, norm="layernorm", dropout=0.0)
    s = 1024
    bf16 = layer_activation_bytes(gpt, 1, s, 1, "none", flash_attention=False, precision="fp16")
    amp = layer_activation_bytes(gpt, 1, s, 1, "none", flash_attention=False, precision="amp-fp16")
    # norm inputs 2 x (4 - 2) sh; q, k, v and up cast the shared inputs each (4 casts instead of 2
    # tensors); softmax: an fp32 output beside the fp16 cast (4 + 2 instead of 2)
    assert amp - bf16 == 2 * 2 * s * 1024 + 2 * 2 * s * 1024 + 16 * s * s * 4
    # With attention dropout: fp16 keeps the softmax output, the mask and the dropped-out output
    # (2 + 1 + 2); autocast the fp32 softmax output, the mask and the AV matmul's cast (4 + 1 + 2).
    dropped = dataclasses.replace(gpt, dropout=0.1)
    bf16_d = layer_activation_bytes(dropped, 1, s, 1, "none", flash_attention=False, precision="fp16")
    amp_d = layer_activation_bytes(dropped, 1, s, 1, "none", flash_attention=False, precision="amp-fp16")
    assert (amp_d - amp) - (bf16_d - bf16) == 16 * s * s * (1 - 3)


def _knobs(**changes: object) -> PlanKnobs:
    base = {"strategy": "fsdp-full", "zero_stage": 3, "dp": 8, "tp": 1, "pp": 1, "shard_group_size": 8,
            "micro_batch_size": 1, "grad_accum_steps": 1, "seq_len": 8192, "precision": "amp-bf16"}
    return PlanKnobs(**{**base, **changes})  # type: ignore[arg-type]


def test_autocast_weight_casts_are_cached_or_saved() -> None:
    params = count_parameters(LLAMA_8B)
    stage = stage_shapes(params, 1, 1, 1, False)[0]
    per_block = block_matmul_params(LLAMA_8B)
    head = LLAMA_8B.vocab_size * LLAMA_8B.hidden_size
    # Checkpointed blocks: the casts live in autocast's cache to the end of forward; the head's is saved.
    full = dict(stage_activation_bytes(LLAMA_8B, stage, _knobs(activation_checkpointing="full")))
    assert full[AUTOCAST_CACHE_ITEM] == 2 * 32 * per_block
    assert full[AUTOCAST_SAVED_ITEM] == 2 * head
    # No checkpointing: every cast is saved for backward, nothing only cached.
    none = dict(stage_activation_bytes(LLAMA_8B, stage, _knobs(activation_checkpointing="none")))
    assert none[AUTOCAST_SAVED_ITEM] == 2 * (32 * per_block + head) and AUTOCAST_CACHE_ITEM not in none
    # cache_enabled=False
    uncached = dict(stage_activation_bytes(LLAMA_8B, stage, _knobs(activation_checkpointing="full"),
                                           Assumptions(autocast_weight_cache=False)))
    assert AUTOCAST_CACHE_ITEM not in uncached
    # bf16 mixed precision: no casts at all
    bf16 = dict(stage_activation_bytes(LLAMA_8B, stage, _knobs(precision="bf16")))
    assert AUTOCAST_CACHE_ITEM not in bf16 and AUTOCAST_SAVED_ITEM not in bf16
    # q, o (h x h); k, v (h x 8 kv heads x 128); w1, w3, w2 (h x 14336)
    assert per_block == 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336


def test_torch_autocast_keeps_a_checkpointed_weights_cast_until_the_region_exits() -> None:
    """The mechanism the cache term counts, in the installed torch: ``at::autocast::cached_cast``
    (aten/src/ATen/autocast_mode.cpp) caches the 16-bit cast of an fp32 leaf that requires grad,
    and ``torch.autocast.__exit__`` clears the cache only when the outermost region exits
    (torch/amp/autocast_mode.py, ``autocast_decrement_nesting() == 0``). A checkpointed block
    saves nothing for backward, yet its weight's cast stays alive; without the cache it dies."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import checkpoint

    class WeightCasts(TorchDispatchMode):
        def __init__(self, weight: torch.Tensor) -> None:
            super().__init__()
            self.weight, self.casts = weight, []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten._to_copy.default and args[0] is self.weight:
                self.casts.append(weakref.ref(out))
            return out

    def run(cache_enabled: bool) -> tuple[int, list[bool], list[bool]]:
        linear = torch.nn.Linear(16, 16)
        x = torch.randn(2, 16, requires_grad=True)
        with WeightCasts(linear.weight) as mode:
            with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache_enabled):
                for _ in range(2):  # two checkpointed uses of the same weight in one forward
                    checkpoint(linear, x, use_reentrant=False)
                inside = [cast() is not None for cast in mode.casts]
            after = [cast() is not None for cast in mode.casts]
        return len(mode.casts), inside, after

    assert run(cache_enabled=True) == (1, [True], [False])  # cast once, alive to the region's end
    assert run(cache_enabled=False) == (2, [False, False], [False, False])


def test_cache_counts_at_the_loss_moment_only() -> None:
    params = count_parameters(LLAMA_8B)
    knobs = _knobs(activation_checkpointing="full")
    on = memory_breakdown(LLAMA_8B, params, params.total, knobs, 8)
    off = memory_breakdown(LLAMA_8B, params, params.total, knobs, 8, Assumptions(autocast_weight_cache=False))
    on_moments, off_moments = dict(on.moments), dict(off.moments)
    cache = 2 * 32 * block_matmul_params(LLAMA_8B)
    margin = 1 + Assumptions().fragmentation_fraction
    assert on_moments["loss"] - off_moments["loss"] == pytest.approx(cache * margin, rel=1e-6)
    assert on_moments["backward"] == off_moments["backward"]


def test_pure_bf16_halves_fsdp_model_states_against_bf16() -> None:
    params = count_parameters(LLAMA_8B)
    mixed = memory_breakdown(LLAMA_8B, params, params.total, _knobs(precision="bf16"), 8)
    pure = memory_breakdown(LLAMA_8B, params, params.total, _knobs(precision="bf16-pure"), 8)
    assert pure.optimizer_states * 2 == mixed.optimizer_states
    assert pure.parameters * 2 == mixed.parameters


def test_amp_and_pure_use_the_tensor_core_peak() -> None:
    h100 = lookup_gpu("h100-sxm")
    assert h100.peak_flops("amp-bf16") == h100.peak_flops("bf16-pure") == h100.peak_flops("bf16")
    assert h100.peak_flops("amp-fp16") == h100.peak_flops("fp16")
    assert h100.peak_flops("fp32") < h100.peak_flops("bf16")


def _plan(precision: str, pins: object = None, gpus: int = 8) -> object:
    from fstrain.core.plan.plancluster import uniform_cluster
    from fstrain.core.plan.planner import Pins, PlanModel, TrainingSpec, plan
    from fstrain.io.recipes import load_shipped_recipe

    spec = load_shipped_recipe("llama3.1-8b").model
    training = TrainingSpec(spec.seq_len, 64, precision=precision)
    return plan(PlanModel.from_spec(spec), training, uniform_cluster(1, gpus, "h100-sxm"),
                pins if pins is not None else Pins())


def test_the_planner_never_proposes_pure_bf16_under_deepspeed_and_refuses_a_pin() -> None:
    from fstrain.core.plan.planner import Pins

    result = _plan("bf16-pure")
    strategies = {p.knobs.strategy for p in (*result.plans, *result.rejected)}  # type: ignore[attr-defined]
    assert strategies and not strategies & {"zero1", "zero2", "zero3"}
    with pytest.raises(FstrainError, match="bf16-pure with strategy zero3"):
        _plan("bf16-pure", Pins(strategy="zero3"))
    amp = _plan("amp-bf16", Pins(strategy="zero3"))
    assert amp.plans or amp.rejected  # type: ignore[attr-defined]


def test_v100_amp_bf16_points_to_amp_fp16() -> None:
    from fstrain.core.plan.plancluster import uniform_cluster
    from fstrain.core.plan.planner import Pins, PlanModel, TrainingSpec, plan
    from fstrain.io.recipes import load_shipped_recipe

    spec = load_shipped_recipe("gpt2-1.5b").model
    with pytest.raises(FstrainError) as caught:
        plan(PlanModel.from_spec(spec), TrainingSpec(spec.seq_len, 64, precision="amp-bf16"),
             uniform_cluster(1, 8, "v100-32gb"), Pins())
    assert "amp-fp16" in caught.value.hint


def test_host_start_up_and_checkpoint_bytes_follow_the_mode() -> None:
    from fstrain.core.doctor.plan import checkpoint_bytes
    from fstrain.core.plan.memory import host_bytes_per_node

    states = model_states(N, "ddp", 1, "bf16-pure")
    a = Assumptions(cpu_buffer_factor=1.0)
    assert host_bytes_per_node(states, "ddp", N, N, 8, a, "bf16-pure") == 2 * N * 8  # built in bf16
    assert host_bytes_per_node(states, "ddp", N, N, 8, a, "amp-bf16") == 4 * N * 8
    # params + master + AdamW states, summed over ranks
    assert checkpoint_bytes(N, "bf16-pure", "adamw") == (2 + 0 + 4) * N
    assert checkpoint_bytes(N, "amp-bf16", "adamw") == (4 + 0 + 8) * N
    assert checkpoint_bytes(N, "bf16", "adamw") == (2 + 4 + 8) * N
