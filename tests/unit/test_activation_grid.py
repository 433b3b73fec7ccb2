"""The planner's per-block activation bytes against what autograd really keeps for the bundled
trainer's block (PyTorch's saved-tensor hooks see every tensor a backward will read), over a grid
of norms, activations, positions, biases and attention layouts."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from fstrain.core.plan.memory import layer_activation_bytes
from fstrain.core.plan.schema import ModelSpec, MoESpec
from fstrain.train.model import TransformerBlock, rotary_tables
from tests.plans import TINY_MODEL


def saved_bytes(spec: ModelSpec, seq_len: int, micro_batch: int) -> int:
    """Distinct storages one block's forward saves for backward (its parameters excluded)."""
    block = TransformerBlock(spec).to(torch.bfloat16)
    x = torch.randn(micro_batch, seq_len, spec.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    cos, sin = rotary_tables(seq_len, spec.attn_head_dim)
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


def saved_bytes_under_autocast(spec: ModelSpec, seq_len: int, micro_batch: int) -> tuple[int, int]:
    """(activations, weight casts) one fp32 block saves under ``torch.autocast(bfloat16)``: the
    16-bit casts of its weights are told apart by their shapes (``seq_len x micro_batch`` must
    not equal a weight dimension)."""
    block = TransformerBlock(spec)
    x = torch.randn(micro_batch, seq_len, spec.hidden_size, requires_grad=True)
    cos, sin = rotary_tables(seq_len, spec.attn_head_dim)
    shared = {t.untyped_storage().data_ptr() for t in (*block.parameters(), cos, sin)}
    weight_shapes = {tuple(p.shape) for p in block.parameters() if p.dim() == 2}
    activations: dict[int, int] = {}
    casts: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        pointer = t.untyped_storage().data_ptr()
        if pointer not in shared:
            is_cast = t.dtype == torch.bfloat16 and t.dim() == 2 and (
                tuple(t.shape) in weight_shapes or tuple(t.t().shape) in weight_shapes)
            (casts if is_cast else activations)[pointer] = t.untyped_storage().nbytes()
        return t

    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x, cos, sin)
    return sum(activations.values()), sum(casts.values())


@pytest.mark.parametrize(("norm", "activation", "position", "bias", "kv_heads"),
                         [g for g in GRID if g[-1] == 2 or g[:3] == ("rmsnorm", "swiglu", "rope")])
def test_autocast_block_activations_and_weight_casts_match_autograd(
    norm: str, activation: str, position: str, bias: bool, kv_heads: int
) -> None:
    """amp-bf16: fp32 norms and residual inputs, one cast of the shared input per linear, and one
    16-bit copy of every weight (the planner's autocast weight casts)."""
    from fstrain.core.plan.memory import block_matmul_params

    spec = replace(TINY_MODEL, dropout=0.0, norm=norm, activation=activation, position_embedding=position,
                   linear_bias=bias, hidden_size=128, num_heads=8, num_kv_heads=kv_heads, ffn_hidden_size=352)
    activations, casts = saved_bytes_under_autocast(spec, 64, 3)
    predicted = layer_activation_bytes(spec, 3, 64, ac="none", flash_attention=True, precision="amp-bf16")
    assert predicted == pytest.approx(activations, rel=0.05)
    assert casts == 2 * block_matmul_params(spec)


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


# Qwen3's and OLMo 2's q/k norms, a head_dim of its own, Gemma's GeGLU and post-sublayer norms,
# and the narrower biases, each on its own and together, against what autograd keeps.
FEATURES = {
    "head-dim": {"head_dim": 40},
    "qk-norm-head": {"qk_norm": "head"},
    "qk-norm-projection": {"qk_norm": "projection"},
    "geglu-post-norms": {"activation": "geglu", "post_norms": True},
    "biases": {"attention_bias": "qkv", "mlp_bias": True},
    "qwen3-like": {"head_dim": 40, "qk_norm": "head", "attention_bias": "all"},
    "gemma3-like": {"head_dim": 40, "qk_norm": "head", "activation": "geglu", "post_norms": True},
}


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("feature", FEATURES)
def test_new_architecture_features_match_autograd(feature: str, norm: str) -> None:
    """bf16 and amp-bf16 (where the q/k norms meet fp32 weights and the post norms bf16 inputs);
    micro-batch 3 x 64 tokens is no weight's width, so the weight casts are told apart."""
    from fstrain.core.plan.memory import block_matmul_params

    base = {"dropout": 0.0, "norm": norm, "activation": "swiglu", "position_embedding": "rope", "linear_bias": False,
            "hidden_size": 128, "num_heads": 8, "num_kv_heads": 2, "ffn_hidden_size": 352}
    spec = replace(TINY_MODEL, **{**base, **FEATURES[feature]})
    predicted = layer_activation_bytes(spec, 2, 64, ac="none", flash_attention=True, precision="bf16")
    assert predicted == saved_bytes(spec, 64, 2)
    activations, casts = saved_bytes_under_autocast(spec, 64, 3)
    assert layer_activation_bytes(spec, 3, 64, ac="none", flash_attention=True, precision="amp-bf16") == activations
    assert casts == 2 * block_matmul_params(spec)
