"""The planner's per-block activation bytes against what autograd really keeps for the bundled
trainer's block (PyTorch's saved-tensor hooks see every tensor a backward will read), over a grid
of norms, activations, positions, biases and attention layouts."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from fstrain.core.memory import layer_activation_bytes
from fstrain.core.planfile import ModelSpec, MoESpec
from fstrain.train.model import TransformerBlock, rotary_tables
from tests.plans import TINY_MODEL


def saved_bytes(spec: ModelSpec, seq_len: int, micro_batch: int) -> int:
    """Distinct storages one block's forward saves for backward (its parameters excluded)."""
    block = TransformerBlock(spec).to(torch.bfloat16)
    x = torch.randn(micro_batch, seq_len, spec.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    cos, sin = rotary_tables(seq_len, spec.head_dim)
    shared = {t.untyped_storage().data_ptr() for t in (*block.parameters(), cos, sin)}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        pointer = t.untyped_storage().data_ptr()
        if pointer not in shared:
            storages[pointer] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x, cos, sin)
    return sum(storages.values())


GRID = list(itertools.product(("rmsnorm", "layernorm"), ("swiglu", "gelu"), ("rope", "learned"), (False, True),
                              (2, 8)))


@pytest.mark.parametrize(("norm", "activation", "position", "bias", "kv_heads"), GRID)
def test_block_activations_match_autograd(norm: str, activation: str, position: str, bias: bool,
                                          kv_heads: int) -> None:
    spec = replace(TINY_MODEL, dropout=0.0, norm=norm, activation=activation, position_embedding=position,
                   linear_bias=bias, hidden_size=128, num_heads=8, num_kv_heads=kv_heads, ffn_hidden_size=352)
    predicted = layer_activation_bytes(spec, 2, 64, ac="none", flash_attention=True, precision="bf16")
    assert predicted == pytest.approx(saved_bytes(spec, 64, 2), rel=0.05)


MOE_GRID = list(itertools.product(("swiglu", "gelu"), ((8, 2), (4, 1), (8, 4)), ("rmsnorm", "layernorm")))


@pytest.mark.parametrize(("activation", "experts_top_k", "norm"), MOE_GRID)
def test_moe_block_activations_match_autograd(activation: str, experts_top_k: tuple[int, int], norm: str) -> None:
    # Dropless routing: top_k routed copies, their FFN-wide tensors and outputs, router state.
    experts, top_k = experts_top_k
    spec = replace(TINY_MODEL, dropout=0.0, norm=norm, activation=activation, position_embedding="rope",
                   linear_bias=False, hidden_size=128, num_heads=8, num_kv_heads=2,
                   moe=MoESpec(num_experts=experts, top_k=top_k, expert_ffn_hidden_size=160))
    predicted = layer_activation_bytes(spec, 2, 64, ac="none", flash_attention=True, precision="bf16")
    assert predicted == pytest.approx(saved_bytes(spec, 64, 2), rel=0.05)
    dense = replace(spec, moe=None, ffn_hidden_size=160 * top_k)
    # A dense FFN as wide as the active experts saves the same FFN-wide tensors; MoE adds its routing.
    assert predicted > layer_activation_bytes(dense, 2, 64, ac="none", flash_attention=True, precision="bf16")
