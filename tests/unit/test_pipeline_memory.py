"""FSDP under pipeline parallelism, on values: each stage stays gathered and its gradients stay
unsharded until the last micro-batch (torchtitan's ``reshard_after_forward = not pp_enabled``;
torch.distributed.pipelining's stage runs every micro-batch's backward without gradient sync)."""

from __future__ import annotations

import dataclasses

import pytest

from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.memory import (
    PP_GATHERED_ITEM,
    buffer_items,
    memory_breakdown,
    model_states,
    pipeline_fsdp_gradient_bytes,
    stage_shapes,
)
from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.plan.schema import PlanKnobs
from fstrain.core.plan.timemodel import step_time
from fstrain.io.recipes import load_shipped_recipe

from .test_timemodel import LINKS, LLAMA, NO_OVERLAP

L405 = load_shipped_recipe("llama3.1-405b").model
P405 = count_parameters(L405)
# torchtitan's Llama 3.1 405B benchmark layout (benchmarks/llama3_h100_202412_torchtitan.md, Table 5):
# 512 GPUs as dp 8 x tp 8 x pp 8, full AC, seq 8192; here 32 micro-batches of one sequence.
KNOBS_405B = PlanKnobs("fsdp-full", 3, 8, 8, 8, 8, 1, 32, "full", "none", "bf16", "adamw", 8192)


def test_the_whole_stage_is_gathered_in_the_compute_dtype() -> None:
    first, _ = stage_shapes(P405, 8, 8, 32, L405.tied_embeddings)
    # 126 blocks over 8 stages: the heaviest stage has 16; the first adds the vocab-parallel embedding.
    assert first.layers == 16
    assert first.params == 16 * first.block + P405.embedding // 8
    items = dict(buffer_items("fsdp-full", first, KNOBS_405B, L405.hidden_size))
    assert items == {
        PP_GATHERED_ITEM: 2 * first.params,
        "FSDP unsharded gradient (one block)": 4 * first.block,
        "pipeline send/recv": 2 * 1 * 8192 * 16384 * 2 // 8,
    }
    assert items[PP_GATHERED_ITEM] / 2**30 == pytest.approx(12.37, abs=0.01)
    # Without a pipeline FSDP2 gathers one block, the prefetched one and the root unit only.
    flat = dict(buffer_items("fsdp-full", first, dataclasses.replace(KNOBS_405B, pp=1), L405.hidden_size))
    assert PP_GATHERED_ITEM not in flat and "FSDP gathered blocks (1 + 1 prefetched)" in flat


def test_gradients_stay_unsharded_while_other_micro_batches_are_in_flight() -> None:
    first, last = stage_shapes(P405, 8, 8, 32, L405.tied_embeddings)
    assert (first.in_flight, last.in_flight) == (8, 1)
    # 32 micro-batches: both stages run a backward while holding another micro-batch.
    assert pipeline_fsdp_gradient_bytes(first, KNOBS_405B) == 4 * first.params
    assert pipeline_fsdp_gradient_bytes(last, KNOBS_405B) == 4 * last.params
    # As many micro-batches as stages: the first stage's peak (all 8 in flight) precedes its
    # first backward; the last stage still accumulates from the second micro-batch on.
    eight = dataclasses.replace(KNOBS_405B, grad_accum_steps=8)
    first8, last8 = stage_shapes(P405, 8, 8, 8, L405.tied_embeddings)
    assert pipeline_fsdp_gradient_bytes(first8, eight) == 0
    assert pipeline_fsdp_gradient_bytes(last8, eight) == 4 * last8.params
    one = dataclasses.replace(KNOBS_405B, grad_accum_steps=1)
    assert pipeline_fsdp_gradient_bytes(last8, one) == 0
    bf16_reduce = Assumptions(fsdp_reduce_bytes_per_element=2)
    assert pipeline_fsdp_gradient_bytes(last, KNOBS_405B, bf16_reduce) == 2 * last.params


def test_the_405b_pipeline_breakdown_on_values() -> None:
    memory = memory_breakdown(L405, P405, P405.total, KNOBS_405B, 8)
    first, _ = stage_shapes(P405, 8, 8, 32, L405.tied_embeddings)
    # The first stage peaks: 8 micro-batches' block inputs in flight beside its gathered stage.
    states = model_states(first.params, "fsdp-full", 8)
    details = dict(memory.details)
    assert memory.phase == "backward"
    assert details["activations (16 layers x 8 micro-batches, AC full)"] == 16 * 8 * 8192 * 16384 * 2 // 8
    assert details["parameters"] == states.parameters == 4 * first.params // 8
    assert details["gradients"] == 4 * first.params  # unsharded, fp32, not 4 Psi / 8
    assert details[PP_GATHERED_ITEM] == 2 * first.params
    # The sharded layout this replaced counted a twentieth of these two items.
    gathered_and_grads = details["gradients"] + details[PP_GATHERED_ITEM]
    assert gathered_and_grads / 2**30 == pytest.approx(37.1, abs=0.1)
    # At the optimizer step the stage is resharded and the gradients reduce-scattered.
    moments = dict(memory.moments)
    assert moments["optimizer step"] < moments["backward"]


def test_one_stage_keeps_the_fsdp_layout_it_had() -> None:
    knobs = dataclasses.replace(KNOBS_405B, pp=1, dp=64, shard_group_size=64, grad_accum_steps=4)
    memory = memory_breakdown(L405, P405, P405.total, knobs, 8)
    [stage] = stage_shapes(P405, 8, 1, 4, L405.tied_embeddings)
    details = dict(memory.details)
    assert PP_GATHERED_ITEM not in details
    assert details["gradients"] == 4 * stage.params // 64  # FSDP2 accumulates into the sharded gradient


def test_pipelined_fsdp_gathers_and_reduces_once_a_step() -> None:
    """Under pp, DP traffic no longer grows with the micro-batches: one all-gather, one exposed
    reduce-scatter, against an all-gather forward, one backward and a reduce-scatter per micro-batch."""
    params = 8_000_000_000
    base = PlanKnobs("fsdp-full", 3, 16, 1, 8, 16, 1, 8, "none", "none", "bf16", "adamw", 8192)
    eight = step_time(LLAMA, params, base, 400e12, 128 * 989e12, LINKS, NO_OVERLAP)
    thirty_two = step_time(LLAMA, params, dataclasses.replace(base, grad_accum_steps=32), 400e12, 128 * 989e12,
                           LINKS, NO_OVERLAP)
    assert eight.dp_comm_s == pytest.approx(thirty_two.dp_comm_s)
    ring = 15 / 16
    bandwidth = 8 * LINKS.inter_node_bytes_per_s  # a ring with all 8 GPUs of each node: its 8 NICs
    assert eight.dp_comm_s == pytest.approx(ring * (2 + 4) * params / bandwidth)
    assert eight.dp_exposed_s == pytest.approx(eight.dp_comm_s)  # no overlap assumed
    flat = step_time(LLAMA, params, dataclasses.replace(base, pp=1, dp=128, shard_group_size=128), 400e12,
                     128 * 989e12, LINKS, NO_OVERLAP)
    # Without a pipeline: all-gather (forward), all-gather (backward), reduce-scatter, per micro-batch.
    assert flat.dp_comm_s == pytest.approx(8 * 127 / 128 * (2 + 2 + 4) * params / bandwidth)
