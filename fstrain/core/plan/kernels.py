"""What kernel fusion changes: ``torch.compile`` of each transformer block, or torchtitan's fused
RMSNorm kernel alone. Neither changes the parallel layout; both change what a block saves for
backward and how many bytes its memory-bound (elementwise) ops move through HBM.

Saved activations, checked against PyTorch's own partitioner (``torch.compile`` with the
``aot_eager_decomp_partition`` backend runs Inductor's decompositions and its min-cut
rematerialisation partitioner, ``torch/_functorch/partitioners.py``, without generating code;
tests/unit/test_compiled_activations.py compares it with :func:`fstrain.core.plan.memory.layer_activation_bytes`):

- an RMSNorm keeps its input in the compute dtype and the fp32 ``1/rms`` instead of an fp32 copy
  of its input (what a LayerNorm keeps in eager mode): the fused norm recomputes the rest;
- SwiGLU keeps three FFN-wide tensors (gate, up, and the product the down projection reads)
  instead of four: ``silu(gate)`` is recomputed inside the fused backward;
- under op-level selective AC a saved matmul output that backward never reads (the down
  projection's, feeding only the residual add) is not kept.

torchtitan's ``fused_rmsnorm`` (a Triton kernel, ``torchtitan/models/norms.py`` of 2024:
``ctx.save_for_backward(x, weight, rstd)``) keeps exactly the first of these and nothing else.

Time: eager PyTorch runs every elementwise op as its own kernel, reading and writing whole
tensors; Inductor fuses a chain into one kernel that reads its inputs and writes its outputs once.
:func:`elementwise_bytes_per_token` counts that traffic op by op for torchtitan's Llama block
(fp32 RMSNorm, complex-multiply rotary, ``silu(w1 x) * w3 x``, residual adds); the time saved is
the difference over the HBM bandwidth large copies reach (assumption ``hbm_efficiency``). The
matmuls, attention and GQA's K/V repeat are the same kernels either way.
"""

from __future__ import annotations

from dataclasses import dataclass

from fstrain.core.plan.schema import ModelSpec

FP32 = 4


def norm_is_fused(compiled: bool, fused_rmsnorm: bool) -> bool:
    """Whether an RMSNorm keeps its compute-dtype input (fused) rather than an fp32 copy (eager)."""
    return compiled or fused_rmsnorm


def swiglu_saved_tensors(compiled: bool) -> int:
    """FFN-wide tensors a SwiGLU keeps for backward: gate, up and their product, and eagerly
    also ``silu(gate)`` (the compiled backward recomputes it)."""
    return 3 if compiled else 4


@dataclass(frozen=True)
class ElementwiseBytes:
    """HBM bytes one block's elementwise ops move per token in forward, by tensor layout:
    ``replicated`` (hidden-wide, split by TP only with sequence parallelism) and ``sharded``
    (q/k/v- and FFN-wide, split by TP)."""

    replicated: float
    sharded: float


def _rmsnorm_bytes(a: int, fused: bool) -> float:
    """Per hidden element. Eager (``x.float()``, ``pow(2)``, ``mean``, ``* rsqrt``, ``.to()``,
    ``* weight``): read a write 4, read 4 write 4, read 4, read 4 write 4, read 4 write a, read a
    write a. Fused: read the input, write the output."""
    if fused:
        return 2 * a
    return (a + FP32) + 2 * FP32 + FP32 + 2 * FP32 + (FP32 + a) + 2 * a


def elementwise_bytes_per_token(model: ModelSpec, a: int, compiled: bool, fused_rmsnorm: bool) -> ElementwiseBytes:
    """Forward HBM traffic of one block's elementwise ops per token (``a``: compute-dtype bytes).

    - two residual adds, ``3a`` each (read two, write one); compiled, each folds into the next
      norm's kernel (or the block's output) and costs one write of ``a``;
    - two norms (:func:`_rmsnorm_bytes`; a LayerNorm is one eager kernel, ``2a``, either way);
    - rotary on q and k (torchtitan's ``apply_rotary_emb``: ``.float()``, a complex multiply,
      ``type_as``: ``a + 4``, ``4 + 4``, ``4 + a`` per element), ``2a`` compiled;
    - SwiGLU's ``silu(gate) * up``: ``2a`` then ``3a`` per FFN element eager, ``3a`` compiled;
      GeLU's activation is one kernel (``2a``) either way (Inductor does not fuse it into the
      matmul by default).
    """
    h = model.hidden_size
    fused_norm = norm_is_fused(compiled, fused_rmsnorm)
    norms = 2 * (_rmsnorm_bytes(a, fused_norm) if model.norm == "rmsnorm" else 2.0 * a)
    adds = 2 * (a if compiled else 3 * a)
    replicated = h * (norms + adds)
    sharded = 0.0
    if model.position_embedding == "rope":
        width = (model.num_heads + model.num_kv_heads) * model.head_dim
        sharded += width * (2 * a if compiled else (a + FP32) + 2 * FP32 + (FP32 + a))
    ffn = model.ffn_hidden_size if model.moe is None else model.moe.top_k * model.moe.expert_ffn_hidden_size
    if model.activation == "swiglu":
        sharded += ffn * (3 * a if compiled else 5 * a)
    else:
        sharded += ffn * 2 * a
    return ElementwiseBytes(replicated, sharded)


def elementwise_passes(ac: str, k: int) -> float:
    """How many times a block's elementwise forward traffic is paid per step of one micro-batch:
    forward once, backward about twice (each op's gradient reads what it saved and the incoming
    gradient and writes one), plus a recomputed forward (``full``; ``every-k:N`` one block in N;
    ``selective-op`` recomputes every elementwise op, it saves only matmul and attention outputs)."""
    recompute = 1.0 if ac in ("full", "selective-op") else (1.0 / k if k else 0.0)
    return 3.0 + recompute


def fusion_seconds_saved_per_token(
    model: ModelSpec,
    a: int,
    tp: int,
    replicated_split: int,
    ac: str,
    every_k: int,
    compiled: bool,
    fused_rmsnorm: bool,
    hbm_bytes_per_s: float,
) -> float:
    """Seconds per token and block that fusion saves on one GPU, against eager PyTorch."""
    if not (compiled or fused_rmsnorm) or hbm_bytes_per_s <= 0:
        return 0.0
    eager = elementwise_bytes_per_token(model, a, False, False)
    fused = elementwise_bytes_per_token(model, a, compiled, fused_rmsnorm)
    saved = (eager.replicated - fused.replicated) / replicated_split + (eager.sharded - fused.sharded) / tp
    return saved * elementwise_passes(ac, every_k) / hbm_bytes_per_s
