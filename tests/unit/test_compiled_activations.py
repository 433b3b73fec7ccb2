"""What a compiled block and a fused RMSNorm keep for backward, against PyTorch itself.

``torch.compile(backend="aot_eager_decomp_partition")`` runs Inductor's decompositions and its
min-cut rematerialisation partitioner (what decides which tensors a compiled block saves) and
executes the result eagerly, so no C++ compiler is needed; saved-tensor hooks see every tensor
the compiled backward will read. The fused RMSNorm is the bundled trainer's
:class:`~fstrain.train.model.FusedRMSNorm` (the plan's ``--fused-rmsnorm``)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from fstrain.core.plan.memory import layer_activation_bytes
from fstrain.core.plan.schema import ModelSpec
from fstrain.train.model import TransformerBlock, rotary_tables
from tests.plans import TINY_MODEL

SEQ, BATCH = 96, 3  # seq x batch differs from every weight dimension below


def spec_for(norm: str, activation: str, position: str = "rope") -> ModelSpec:
    return replace(TINY_MODEL, dropout=0.0, norm=norm, activation=activation, position_embedding=position,
                   hidden_size=256, num_heads=8, num_kv_heads=2, ffn_hidden_size=704)


def saved_bytes(spec: ModelSpec, ac: str, compiled: bool = False, fused_rmsnorm: bool = False) -> int:
    """Distinct storages one bf16 block keeps for backward (parameters and rotary tables excluded)."""
    block = TransformerBlock(spec, ac, fused_rmsnorm=fused_rmsnorm).to(torch.bfloat16)
    x = torch.randn(BATCH, SEQ, spec.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    cos, sin = rotary_tables(SEQ, spec.attn_head_dim)
    shared = {t.untyped_storage().data_ptr() for t in (*block.parameters(), cos, sin)}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in shared:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    torch._dynamo.reset()
    run = torch.compile(block, backend="aot_eager_decomp_partition") if compiled else block
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run(x, cos, sin)
    out.float().sum().backward()  # the compiled backward runs too: what was saved is what it reads
    assert x.grad is not None
    return sum(storages.values())


def predicted(spec: ModelSpec, ac: str, compiled: bool = False, fused_rmsnorm: bool = False) -> int:
    return layer_activation_bytes(spec, BATCH, SEQ, ac=ac, flash_attention=True, precision="bf16",
                                  compiled=compiled, fused_rmsnorm=fused_rmsnorm)


@pytest.mark.parametrize(("activation", "position"), list(itertools.product(("swiglu", "gelu"), ("rope", "learned"))))
def test_fused_rmsnorm_keeps_its_input_not_an_fp32_copy(activation: str, position: str) -> None:
    spec = spec_for("rmsnorm", activation, position)
    fused = saved_bytes(spec, "none", fused_rmsnorm=True)
    assert fused == predicted(spec, "none", fused_rmsnorm=True)
    # each of the two norms keeps its bf16 input (2 bytes per element) instead of an fp32 copy and
    # the bf16 normalised tensor the weight's gradient reads (4 + 2)
    assert saved_bytes(spec, "none") - fused == 2 * 4 * SEQ * BATCH * spec.hidden_size


# Inductor's import path touches torch.jit.script_method, deprecated in this torch
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.parametrize(("norm", "activation"), list(itertools.product(("rmsnorm", "layernorm"), ("swiglu", "gelu"))))
@pytest.mark.parametrize("ac", ["none", "selective-op"])
def test_compiled_block_activations_match_the_partitioner(norm: str, activation: str, ac: str) -> None:
    spec = spec_for(norm, activation)
    assert saved_bytes(spec, ac, compiled=True) == predicted(spec, ac, compiled=True)


def test_compiling_a_llama_block_drops_the_norm_copies_and_one_ffn_tensor() -> None:
    spec = spec_for("rmsnorm", "swiglu")
    eager, compiled = predicted(spec, "none"), predicted(spec, "none", compiled=True)
    tokens = SEQ * BATCH
    assert eager - compiled == 2 * 4 * tokens * spec.hidden_size + 2 * tokens * spec.ffn_hidden_size
    # op-level SAC: the down projection's output (read by nothing in backward) is not kept
    saved_down = 2 * tokens * spec.hidden_size
    assert predicted(spec, "selective-op") - predicted(spec, "selective-op", compiled=True) == saved_down
    assert predicted(spec, "full", compiled=True) == predicted(spec, "full") == 2 * tokens * spec.hidden_size


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 1e-1)])
def test_fused_rmsnorm_computes_what_the_eager_norm_does(dtype: torch.dtype, tolerance: float) -> None:
    from fstrain.train.model import FusedRMSNorm, RMSNorm

    torch.manual_seed(0)
    eager, fused = RMSNorm(64).to(dtype), FusedRMSNorm(64).to(dtype)
    with torch.no_grad():
        eager.weight.copy_(torch.randn(64))
        fused.weight.copy_(eager.weight)
    x = torch.randn(3, 5, 64, dtype=dtype, requires_grad=True)
    x_fused = x.detach().clone().requires_grad_()
    grad = torch.randn(3, 5, 64, dtype=dtype)
    eager(x).backward(grad)
    fused(x_fused).backward(grad)
    torch.testing.assert_close(fused(x_fused), eager(x), rtol=0, atol=0)  # the same forward ops
    assert x.grad is not None and x_fused.grad is not None and eager.weight.grad is not None
    torch.testing.assert_close(x_fused.grad, x.grad, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(fused.weight.grad, eager.weight.grad, rtol=tolerance, atol=tolerance)
