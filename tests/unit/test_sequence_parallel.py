"""Sequence parallelism with tensor parallelism on values: what DTensor's TP (torchtitan, the
bundled profiles) keeps whole that Megatron-LM keeps sharded, and the whole-sequence gradients of
a TP block's backward (fstrain/core/plan/memory.py)."""

from __future__ import annotations

import dataclasses

import pytest

from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.memory import (
    block_backward_extra_bytes,
    head_input_bytes,
    layer_activation_bytes,
    sp_gathered_input_bytes,
)
from fstrain.core.plan.schema import ModelSpec, PlanKnobs

LLAMA = ModelSpec("llama3.1-8b", 32, 4096, 32, 8, 14336, "swiglu", 128256, 8192)
GPT = ModelSpec("gpt", 24, 2048, 16, 16, 8192, "gelu", 50257, 2048, norm="layernorm")
S, B, H = 8192, 1, 4096


def knobs(**changes: object) -> PlanKnobs:
    base = PlanKnobs("fsdp-full", 3, 8, 8, 1, 8, B, 1, seq_len=S)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "assumptions", "expected"),
    [
        ({}, Assumptions(), 2),  # torchtitan's DTensor TP: the gathered bf16 input is saved
        ({"framework": "torchtitan"}, Assumptions(), 2),
        ({"fp8": True}, Assumptions(), 1),  # gathered in fp8 (PrepareFloat8ModuleInput)
        ({"framework": "megatron"}, Assumptions(), 0),  # saves the shard, re-gathers in backward
        ({"framework": "nanotron"}, Assumptions(), 0),
        ({"strategy": "zero3", "zero_stage": 3}, Assumptions(), 0),  # DeepSpeed: Megatron-style layers
        ({"strategy": "ddp", "zero_stage": 0, "shard_group_size": 1}, Assumptions(), 2),
        ({"tp": 1}, Assumptions(), 0),
        ({}, Assumptions(sequence_parallel=False), 0),  # no SP: the inputs are whole anyway
    ],
)
def test_which_frameworks_keep_the_gathered_input(changes: dict[str, object], assumptions: Assumptions,
                                                  expected: int) -> None:
    assert sp_gathered_input_bytes(knobs(**changes), assumptions) == expected


def test_the_gathered_linear_inputs_are_whole_on_every_tp_rank() -> None:
    """Llama 3.1 8B at 8192 tokens, TP 8 with SP: the attention and FFN inputs (two bf16 s x h
    tensors, 134,217,728 bytes) stay whole instead of an eighth (16,777,216)."""
    sharded = layer_activation_bytes(LLAMA, B, S, 8, "none")
    gathered = layer_activation_bytes(LLAMA, B, S, 8, "none", gathered_input_bytes=2)
    assert gathered - sharded == 2 * S * B * H * 2 * 7 // 8 == 117_440_512
    # Without FlashAttention (Korthikanti's count) the same two tensors move.
    eager = layer_activation_bytes(GPT, 1, 2048, 8, "none", flash_attention=False)
    eager_gathered = layer_activation_bytes(GPT, 1, 2048, 8, "none", flash_attention=False, gathered_input_bytes=2)
    assert eager_gathered - eager == 2 * 2048 * 2048 * 2 * 7 // 8
    # Full recompute keeps the block's input only: nothing gathered is saved.
    assert layer_activation_bytes(LLAMA, B, S, 8, "full", gathered_input_bytes=2) == S * B * H * 2 // 8
    # No SP (split 1): the inputs were whole already.
    assert layer_activation_bytes(LLAMA, B, S, 8, "none", sequence_parallel=False, gathered_input_bytes=2) == (
        layer_activation_bytes(LLAMA, B, S, 8, "none", sequence_parallel=False))


def test_the_head_keeps_its_gathered_input() -> None:
    """The final RMSNorm keeps 4h + 4 + 2h bytes per token on its shard; the output layer's input
    (2h per token) is gathered to the whole sequence."""
    k = knobs()
    norm = S * (4 * H + 4 + 2 * H) // 8
    assert head_input_bytes(LLAMA, k, True, 2) == norm + S * 2 * H
    assert head_input_bytes(LLAMA, k, True, 0) == S * (4 * H + 4 + 2 * H + 2 * H) // 8


def test_backward_gradients_are_whole_sequence_under_tp() -> None:
    """GeLU block, TP 8 with SP: the down projection's output gradient (gathered) is s b h in
    bf16, the FFN-wide gradient and the weight gradient an eighth each."""
    tokens, h, ffn = 2048, 2048, 8192
    got = block_backward_extra_bytes(GPT, 1, 2048, tp=8, weight_grads="block")
    assert got == tokens * h * 2 + tokens * ffn * 2 // 8 + h * ffn * 2 // 8
    assert block_backward_extra_bytes(GPT, 1, 2048, tp=1, weight_grads="block") == (
        tokens * h * 2 + tokens * ffn * 2 + h * ffn * 2)
