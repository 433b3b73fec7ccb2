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

flash-attention's GPT blocks (``flash_attn/models/gpt.py`` @0251105, as its training configs set
them; :class:`FusedBlock`) run two more fused kernels and one packed projection:

- ``fused_mlp``: ``FusedMLPFunc`` (``flash_attn/ops/fused_dense.py`` L249-345) computes fc1, its
  bias and the tanh GeLU in one cuBLASLt GEMM and saves ``x, weight1, weight2, pre_act, output1``
  at ``checkpoint_lvl`` 0 (the FFN input and two FFN-wide tensors, what eager PyTorch keeps),
  ``x, weight1, weight2, pre_act`` at 1 and ``x, weight1, weight2, bias1`` at 2 (L337-343). Its
  backward recomputes what was not saved (L368-395: the GeLU at 1, fc1's GEMM and the GeLU at
  2), so the block in backward holds the same FFN-wide tensors at every level.
- ``packed_qkv``: its attention projects q, k and v with one linear (``flash_attn/modules/mha.py``
  L459, ``self.Wqkv = nn.Linear(embed_dim, qkv_dim)``), so under autocast the block saves one
  cast of the normalised input for them, not one per projection.
- ``fused_dropout_add_ln``: ``layer_norm_fn`` (``flash_attn/ops/triton/layer_norm.py``,
  ``LayerNormFn.forward`` L846-916) runs dropout, the residual add and the norm as one Triton
  kernel and saves ``residual_out`` (the sum, in the residual's dtype), ``mean`` (LayerNorm) and
  ``rstd`` (fp32 per row) and, with dropout, one int64 seed per row (L408-409): the backward
  regenerates the mask from the seed instead of reading a 1-byte mask per element.
"""

from __future__ import annotations

from dataclasses import dataclass

from fstrain.core.plan.schema import ModelSpec
from fstrain.errors import InputError

FP32 = 4
SEED_BYTES = 8  # int64, one per row (token) and norm: layer_norm.py L408-409
MLP_CHECKPOINT_LEVELS = (0, 1, 2)


@dataclass(frozen=True)
class FusedBlock:
    """flash-attention's fused kernels in a block: ``mlp_checkpoint_lvl`` None for an eager
    MLP, else FusedMLP's level; ``dropout_add_ln`` for the fused dropout-add-norm kernel;
    ``packed_qkv`` for one q/k/v linear."""

    mlp_checkpoint_lvl: int | None = None
    dropout_add_ln: bool = False
    packed_qkv: bool = False

    @property
    def mlp_recomputed(self) -> int:
        """FFN-wide tensors the fused MLP does not save and its backward recomputes (its level)."""
        return self.mlp_checkpoint_lvl or 0

    def describe(self) -> str:
        """The kernels as the plan names them ('' for eager PyTorch)."""
        parts = []
        if self.mlp_checkpoint_lvl is not None:
            parts.append(f"fused MLP lvl {self.mlp_checkpoint_lvl}")
        if self.dropout_add_ln:
            parts.append("fused dropout-add-norm")
        if self.packed_qkv:
            parts.append("packed qkv")
        return ", ".join(parts)


EAGER_BLOCK = FusedBlock()


def fused_block(fused_mlp: bool, mlp_checkpoint_lvl: int, fused_dropout_add_ln: bool,
                packed_qkv: bool = False) -> FusedBlock:
    """The block the assumptions ``fused_mlp``, ``mlp_checkpoint_lvl``, ``fused_dropout_add_ln``
    and ``packed_qkv`` describe."""
    return FusedBlock(mlp_checkpoint_lvl if fused_mlp else None, fused_dropout_add_ln, packed_qkv)


def check_fused_block(model: ModelSpec, fused_mlp: bool, mlp_checkpoint_lvl: int, where: str = "--assume") -> None:
    """Refuse, in one line, a fused MLP the model cannot run or a level FusedMLP does not have."""
    if mlp_checkpoint_lvl not in MLP_CHECKPOINT_LEVELS:
        raise InputError(f"mlp_checkpoint_lvl is {mlp_checkpoint_lvl}, FusedMLP has levels 0, 1 and 2",
                         "use mlp_checkpoint_lvl=0, 1 or 2", where)
    if mlp_checkpoint_lvl and not fused_mlp:
        raise InputError(f"mlp_checkpoint_lvl={mlp_checkpoint_lvl} is a level of flash-attention's FusedMLP, "
                         "but fused_mlp is off", "add --assume fused_mlp=true (or --framework flash-attn)", where)
    if fused_mlp and not fused_mlp_applies(model):
        what = ("is a mixture of experts" if model.moe is not None else
                f"uses {model.activation} (flash-attention runs it as an unfused GatedMlp)")
        raise InputError(f"fused_mlp is flash-attention's fc1 + GeLU kernel, but {model.name} {what}",
                         "leave fused_mlp out for this model", where)


def fused_mlp_applies(model: ModelSpec) -> bool:
    """Whether flash-attention's FusedMLP (fc1 + bias + GeLU in one GEMM) can run ``model``'s
    FFN: a dense GeLU MLP (flash_attn/models/gpt.py @0251105 L128-136 asserts a GeLU or ReLU
    activation under fused_mlp; SwiGLU runs as the unfused GatedMlp, L156-162)."""
    return model.activation == "gelu" and model.moe is None


def fused_norm_saved_bytes(model: ModelSpec, residual_bytes: int) -> int:
    """Per token: what one fused dropout-add-norm saves: the residual (``residual_bytes`` an
    element), ``rstd`` and, for a LayerNorm, ``mean`` (fp32), and a dropout seed."""
    statistics = FP32 if model.norm == "rmsnorm" else 2 * FP32
    return residual_bytes * model.hidden_size + statistics + (SEED_BYTES if model.dropout > 0 else 0)


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


def attended_keys(model: ModelSpec, seq_len: int) -> float:
    """Keys per query one layer's attention computes, averaged over the layers, in the FLOP
    convention of ``4 s d`` per query and head (the full square; causal kernels do half of it).

    A sliding window of ``w < s`` tokens leaves a causal query ``min(i, w)`` keys, ``w - w^2 / 2s``
    on average where a causal layer has ``s / 2``: ``2w - w^2 / s`` in this convention. FlashAttention
    skips the blocks outside the window, so this is what it computes; the windowed layers are
    ``model.windowed_layers`` of ``model.num_layers`` (Gemma 2: half, Mistral 7B v0.1: all)."""
    window = model.sliding_window
    if not window or window >= seq_len:
        return float(seq_len)
    windowed = 2.0 * window - window * window / seq_len
    share = model.windowed_layers / model.num_layers
    return share * windowed + (1.0 - share) * seq_len


def elementwise_bytes_per_token(model: ModelSpec, a: int, compiled: bool, fused_rmsnorm: bool,
                                fused: FusedBlock = EAGER_BLOCK, residual: int | None = None) -> ElementwiseBytes:
    """Forward HBM traffic of one block's elementwise ops per token (``a``: compute-dtype bytes;
    ``residual``: bytes of an element of the residual stream and of the norms' input and output,
    ``a`` unless given: 4 under autocast, where ``layer_norm`` is on the fp32 list and a residual
    add of a 16-bit branch output to the fp32 stream promotes to fp32).

    - two residual adds, ``a + 2r`` each (read the branch output and the residual, write the sum);
      compiled, each folds into the next norm's kernel (or the block's output) and costs one
      write of ``r``;
    - two norms (:func:`_rmsnorm_bytes`; a LayerNorm is one eager kernel, ``2r``, either way), four
      with ``post_norms``, and the RMSNorms of q and k with ``qk_norm``;
    - with ``model.dropout`` (eager, without the fused dropout-add-norm) the two residual-branch
      dropouts (``nn.Dropout`` on the attention output and on the FFN output, as GPT-2's and BERT's
      blocks run them): ``native_dropout`` reads the branch output and writes the dropped-out copy
      and a 1-byte mask, ``2a + 1`` per hidden element (its backward reads the gradient and the mask
      and writes one, the same bytes);
    - rotary on q and k (torchtitan's ``apply_rotary_emb``: ``.float()``, a complex multiply,
      ``type_as``: ``a + 4``, ``4 + 4``, ``4 + a`` per element), ``2a`` compiled;
    - SwiGLU's ``silu(gate) * up`` (GeGLU's alike): ``2a`` then ``3a`` per FFN element eager, ``3a``
      compiled (a mixture of experts: its top-k routed copies and its shared expert);
      GeLU's activation is one kernel (``2a``) either way (Inductor does not fuse it into the
      matmul by default);
    - flash-attention's kernels (``fused``): FusedMLP computes the GeLU in fc1's GEMM epilogue,
      which writes the pre-activation besides the GEMM's output (``a`` per FFN element, in place
      of the GeLU kernel's ``2a``; its backward's epilogue likewise); the fused dropout-add-norm
      reads the block's output and the residual and writes the normalised output and the new
      residual in one kernel (``4a`` per hidden element, in place of the add and the norm).
    """
    h = model.hidden_size
    r = a if residual is None else residual
    fused_norm = norm_is_fused(compiled, fused_rmsnorm)
    one_norm = _rmsnorm_bytes(r, fused_norm) if model.norm == "rmsnorm" else 2.0 * r
    norms = model.norms_per_block * one_norm
    adds = 2 * (r if compiled else a + 2 * r)
    dropouts = 2 * (2 * a + 1) if model.dropout > 0 and not compiled else 0
    replicated = h * (2 * 4 * a if fused.dropout_add_ln else norms + adds + dropouts)
    sharded = 0.0
    qk_width = model.q_width + model.kv_width
    if model.qk_norm != "none":  # RMSNorms over q and k, whatever the block's norm
        sharded += qk_width * _rmsnorm_bytes(a, fused_norm)
    if model.position_embedding == "rope":
        sharded += qk_width * (2 * a if compiled else (a + FP32) + 2 * FP32 + (FP32 + a))
    ffn = model.ffn_hidden_size if model.moe is None else model.moe.top_k * model.moe.expert_ffn_hidden_size
    if model.moe is not None:
        ffn += model.moe.shared_ffn_hidden_size
    if model.gated:
        sharded += ffn * (3 * a if compiled else 5 * a)
    else:
        sharded += ffn * (a if fused.mlp_checkpoint_lvl is not None else 2 * a)
    return ElementwiseBytes(replicated, sharded)


def fused_mlp_recompute_bytes(a: int, fused: FusedBlock) -> float:
    """HBM bytes per FFN element that FusedMLP's backward adds by recomputing (fused_dense.py
    L368-395): at level 1 the GeLU from the saved pre-activation (read ``a``, write ``a``); at
    level 2 fc1's GEMM again (priced as a GEMM), whose epilogue writes the pre-activation (``a``)."""
    return {1: 2.0 * a, 2: 1.0 * a}.get(fused.mlp_recomputed, 0.0)


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
    block: FusedBlock = EAGER_BLOCK,
) -> float:
    """Seconds per token and block that fusion saves on one GPU, against eager PyTorch (with
    flash-attention's FusedMLP at level 1 or 2, less what its backward's recompute moves)."""
    if not (compiled or fused_rmsnorm or block != EAGER_BLOCK) or hbm_bytes_per_s <= 0:
        return 0.0
    eager = elementwise_bytes_per_token(model, a, False, False)
    fused = elementwise_bytes_per_token(model, a, compiled, fused_rmsnorm, block)
    saved = (eager.replicated - fused.replicated) / replicated_split + (eager.sharded - fused.sharded) / tp
    recompute = model.ffn_hidden_size * fused_mlp_recompute_bytes(a, block) / tp
    return (saved * elementwise_passes(ac, every_k) - recompute) / hbm_bytes_per_s
