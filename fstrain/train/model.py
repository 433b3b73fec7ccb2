"""A small GPT-style decoder built from a :class:`~fstrain.core.plan.schema.ModelSpec`.

The spec's fields pick the parts: ``norm`` (RMSNorm or LayerNorm), ``position_embedding``
(rotary, or learned absolute positions), ``activation`` (GeLU MLP with two matrices, SwiGLU or
GeGLU with three), ``head_dim``, the biases (``linear_bias``, ``attention_bias``, ``mlp_bias``),
``qk_norm`` (Qwen3's per-head or OLMo 2's whole-projection RMSNorms on q and k, before the
rotary positions), ``post_norms`` (Gemma 2's norm after each sublayer), ``dropout`` and
``tied_embeddings``; attention is grouped-query attention whenever ``num_kv_heads < num_heads``.
GPT-2, Llama, Qwen2, Qwen3 and OLMo 2 layouts come out of it, with the parameter count
:func:`fstrain.core.plan.modelsize.count_parameters` predicts. Sliding-window attention, shared
experts and an fp32 router are not built: :func:`fstrain.core.job.plan.check_supported` refuses
them. The
projections are separate matrices in torchtitan's Llama order (q, k, v, o; gate, up, down), so
op-level selective checkpointing saves the same matmul outputs it saves there. The transformer
block class is :class:`TransformerBlock`; the rendered FSDP file names it as the unit to shard,
and the activation checkpointing policy (:mod:`fstrain.core.plan.acpolicy`) applies per block.

A recipe with ``moe`` gets a mixture-of-experts block (:class:`MoE`) in place of the MLP, in
Hugging Face Mixtral's layout: a bias-free router (hidden -> experts), softmax over the experts,
the top-k renormalised, each expert a SwiGLU (w1, w3, w2) or GeLU (w1, w2) FFN.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fstrain.core.job.plan import check_supported
from fstrain.core.plan.acpolicy import block_is_checkpointed, parse_ac
from fstrain.core.plan.schema import ModelSpec
from fstrain.train.checkpointing import selective_op_checkpoint, torch_checkpoint
from fstrain.train.grouped_mm import grouped_mm

CheckpointFn = Callable[..., Any]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 so bf16 compute keeps the statistics exact enough.
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


class _FusedRMSNormFunction(torch.autograd.Function):
    """RMSNorm as one fused kernel keeps it (torchtitan's Triton ``fused_rmsnorm``,
    ``torchtitan/models/norms.py`` of 2024: ``ctx.save_for_backward(x, weight, rstd)``): the input
    in its own dtype and the fp32 ``1/rms`` per row are all backward reads; the fp32 copies are
    temporaries of forward and of backward, never saved."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.float()
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (x32 * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        normed = x.float() * rstd
        grad32 = grad.float()
        grad_weight = (grad32 * normed.to(x.dtype).float()).reshape(-1, x.shape[-1]).sum(0)
        scaled = grad32 * weight.float()
        grad_x = rstd * (scaled - normed * (scaled * normed).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight.to(weight.dtype), None


class FusedRMSNorm(RMSNorm):
    """The same parameters and output as :class:`RMSNorm`, with a fused kernel's saved tensors
    (the plan's ``--fused-rmsnorm``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _FusedRMSNormFunction.apply(x, self.weight, self.eps)
        return out


def rotary_tables(seq_len: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (batch, heads, seq, head_dim); rotate the two halves of each head.
    x1, x2 = x.float().chunk(2, dim=-1)
    cos = cos[: x.shape[-2]]
    sin = sin[: x.shape[-2]]
    rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, selective_checkpoint: bool, checkpoint_fn: CheckpointFn,
                 fused_rmsnorm: bool = False) -> None:
        super().__init__()
        self.checkpoint_fn = checkpoint_fn
        self.num_heads = spec.num_heads
        self.num_kv_heads = spec.num_kv_heads
        self.head_dim = spec.attn_head_dim
        self.rotary = spec.position_embedding == "rope"
        self.selective_checkpoint = selective_checkpoint
        self.dropout = spec.dropout
        self.q_proj = nn.Linear(spec.hidden_size, spec.q_width, bias=spec.qkv_bias)
        self.k_proj = nn.Linear(spec.hidden_size, spec.kv_width, bias=spec.qkv_bias)
        self.v_proj = nn.Linear(spec.hidden_size, spec.kv_width, bias=spec.qkv_bias)
        self.out_proj = nn.Linear(spec.q_width, spec.hidden_size, bias=spec.out_bias)
        # q/k norms (Hugging Face's q_norm, k_norm): Qwen3's over each head's head_dim values, one
        # weight shared by the heads; OLMo 2's over the whole projection. Both before rotary.
        self.per_head_norm = spec.qk_norm == "head"
        q_norm_width, k_norm_width = (self.head_dim, self.head_dim) if self.per_head_norm else (spec.q_width,
                                                                                               spec.kv_width)
        norm = FusedRMSNorm if fused_rmsnorm else RMSNorm
        self.q_norm = norm(q_norm_width) if spec.qk_norm != "none" else None
        self.k_norm = norm(k_norm_width) if spec.qk_norm != "none" else None

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.num_kv_heads != self.num_heads:  # GQA: each kv head serves a group of query heads
            repeat = self.num_heads // self.num_kv_heads
            k = k.repeat_interleave(repeat, dim=1)
            v = v.repeat_interleave(repeat, dim=1)
        dropout = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k = self.q_proj(x), self.k_proj(x)
        if self.q_norm is not None and self.k_norm is not None and not self.per_head_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(batch, seq, self.num_heads, self.head_dim)
        k = k.view(batch, seq, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None and self.per_head_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.rotary:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.selective_checkpoint and self.training:
            # Megatron's selective recomputation: keep the projections, recompute the attention
            # core (the part whose activations grow with seq^2 without flash attention).
            out = self.checkpoint_fn(self._core, q, k, v)
        else:
            out = self._core(q, k, v)
        return self.out_proj(out.transpose(1, 2).reshape(batch, seq, -1))


def gate_activation(spec: ModelSpec) -> Callable[[torch.Tensor], torch.Tensor]:
    """The gated unit's activation: SwiGLU's silu, or GeGLU's tanh-approximated GeLU (Gemma)."""
    if spec.activation == "geglu":
        return lambda gate: F.gelu(gate, approximate="tanh")
    return F.silu


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        bias = spec.ffn_bias
        width = spec.ffn_hidden_size
        # SwiGLU: down(silu(gate(x)) * up(x)), torchtitan's w2(silu(w1(x)) * w3(x)); GeGLU the same
        # with GeLU.
        self.gate_proj = nn.Linear(spec.hidden_size, width, bias=bias) if spec.gated else None
        self.gate_act = gate_activation(spec)
        self.up_proj = nn.Linear(spec.hidden_size, width, bias=bias)
        self.down_proj = nn.Linear(width, spec.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_proj is not None:
            gate = self.gate_proj(x)  # computed before up: the matmul order op-level AC counts
            return self.down_proj(self.gate_act(gate) * self.up_proj(x))
        return self.down_proj(F.gelu(self.up_proj(x), approximate="tanh"))


class MoE(nn.Module):
    """Token-choice top-k mixture of experts, dropless, with static shapes.

    Routing follows Hugging Face's ``MixtralSparseMoeBlock``: ``softmax(router(x))`` in fp32, the
    top-k probabilities renormalised to sum to one, cast to the compute dtype, and each expert's
    output scaled by its weight. The dispatch follows torchtitan's MoE
    (torchtitan/models/moe/moe.py): the token copies (tokens x top_k) are sorted by expert and every
    expert's matmul runs as one grouped matmul (``torch._grouped_mm`` in bf16, see
    :mod:`fstrain.train.grouped_mm`) over its contiguous slice, given as offsets in a tensor.
    Every shape is a function of the batch alone (no token is dropped and no Python int depends
    on the routing), so the block runs for real on CPU and traces under
    ``FakeTensorMode``. What it stores for backward, per token: the router's fp32 probabilities,
    its top-k indices and weights, top_k routed copies of the input, the experts' FFN-wide
    tensors for top_k copies (SwiGLU 4, GeLU 2, as the dense MLP keeps per token) and top_k
    expert outputs before they are weighted and summed (see ``fstrain.core.plan.memory``).

    The experts' weights are stacked per matrix, torchtitan's ``GroupedExperts`` layout: ``w1``
    and ``w3`` (experts, expert_ffn, hidden) are the stacked ``nn.Linear`` weights of Hugging
    Face's ``experts.{e}.w1``/``w3``, ``w2`` (experts, hidden, expert_ffn) those of ``w2``; the
    parameter count is the same. No auxiliary load-balancing loss is added (Mixtral's default
    ``output_router_logits: false`` leaves it out of the loss too).
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        assert spec.moe is not None
        self.num_experts = spec.moe.num_experts
        self.top_k = spec.moe.top_k
        h, width, experts = spec.hidden_size, spec.moe.expert_ffn_hidden_size, spec.moe.num_experts
        self.router = nn.Linear(h, experts, bias=False)  # Hugging Face's `gate`
        self.w1 = nn.Parameter(torch.empty(experts, width, h))
        self.w3 = nn.Parameter(torch.empty(experts, width, h)) if spec.gated else None
        self.w2 = nn.Parameter(torch.empty(experts, h, width))
        self.gate_act = gate_activation(spec)

    def _experts(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        # x: (token copies sorted by expert, hidden); offsets: where each expert's rows end.
        up = grouped_mm(x, self.w1.transpose(-2, -1), offsets)
        if self.w3 is not None:
            inner = self.gate_act(up) * grouped_mm(x, self.w3.transpose(-2, -1), offsets)
        else:
            inner = F.gelu(up, approximate="tanh")
        return grouped_mm(inner, self.w2.transpose(-2, -1), offsets)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        probs = F.softmax(self.router(flat), dim=-1, dtype=torch.float32)
        weights, experts = probs.topk(self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        # Sort the token copies by expert; the sort and the counts carry no gradient.
        with torch.no_grad():
            chosen = experts.reshape(-1)
            order = torch.argsort(chosen, stable=True)
            counts = torch.histc(chosen.float(), bins=self.num_experts, min=0, max=self.num_experts - 1)
            offsets = torch.cumsum(counts, dim=0).to(torch.int32)
            token = order // self.top_k
            unsort = torch.argsort(order)  # each (token, slot) copy's row among the sorted ones
        out = self._experts(flat.index_select(0, token), offsets).index_select(0, unsort)
        # Weighted sum of each token's top_k outputs (index_add would save its source as well).
        out = out.view(-1, self.top_k, shape[-1]) * weights.unsqueeze(-1)
        return out.sum(dim=1).reshape(shape)


def _norm(spec: ModelSpec, fused_rmsnorm: bool = False) -> nn.Module:
    if spec.norm == "rmsnorm":
        return FusedRMSNorm(spec.hidden_size) if fused_rmsnorm else RMSNorm(spec.hidden_size)
    return nn.LayerNorm(spec.hidden_size)


class TransformerBlock(nn.Module):
    """Pre-norm attention + MLP (with ``post_norms``, Gemma 2's norm after each too): the unit FSDP
    shards and activation checkpointing wraps."""

    def __init__(
        self,
        spec: ModelSpec,
        activation_checkpointing: str = "none",
        checkpoint_fn: CheckpointFn = torch_checkpoint,
        index: int = 0,
        fused_rmsnorm: bool = False,
    ) -> None:
        super().__init__()
        ac = parse_ac(activation_checkpointing, "activation_checkpointing")
        self.whole_checkpoint = block_is_checkpointed(ac, index)  # full, or every-k's k-th blocks
        self.selective_op = ac == "selective-op"
        self.checkpoint_fn = checkpoint_fn
        self.attn_norm = _norm(spec, fused_rmsnorm)
        self.attn = Attention(spec, ac == "megatron-selective", checkpoint_fn, fused_rmsnorm)
        self.mlp_norm = _norm(spec, fused_rmsnorm)
        self.mlp: nn.Module = MoE(spec) if spec.moe is not None else MLP(spec)
        self.attn_post_norm = _norm(spec, fused_rmsnorm) if spec.post_norms else nn.Identity()
        self.mlp_post_norm = _norm(spec, fused_rmsnorm) if spec.post_norms else nn.Identity()
        self.dropout = nn.Dropout(spec.dropout)
        # torchtitan recomputes the MoE router's matmul under op-level SAC (see checkpointing).
        router = frozenset({(spec.hidden_size, spec.moe.num_experts)}) if spec.moe is not None else frozenset()
        self.recompute_shapes = router

    def _block(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attn_post_norm(self.attn(self.attn_norm(x), cos, sin)))
        return x + self.dropout(self.mlp_post_norm(self.mlp(self.mlp_norm(x))))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor
        if self.whole_checkpoint and self.training:
            out = self.checkpoint_fn(self._block, x, cos, sin)
        elif self.selective_op and self.training:
            out = selective_op_checkpoint(self._block, x, cos, sin, recompute_shapes=self.recompute_shapes)
        else:
            out = self._block(x, cos, sin)
        return out


class GPT(nn.Module):
    def __init__(
        self,
        spec: ModelSpec,
        activation_checkpointing: str = "none",
        checkpoint_fn: CheckpointFn = torch_checkpoint,
        loss_chunks: int = 1,
        fused_rmsnorm: bool = False,
        compile_blocks: bool = False,
    ) -> None:
        super().__init__()
        check_supported(spec)
        self.spec = spec
        # More than one: the head runs per chunk of tokens and forward returns the chunks' logits
        # (torchtune's chunked_output, for the plan's --loss chunked:N; steps.lm_loss takes both).
        self.loss_chunks = loss_chunks
        self.tok_embeddings = nn.Embedding(spec.vocab_size, spec.hidden_size)
        # GPT-2 learns absolute positions; Llama uses rotary tables (no parameters).
        learned = spec.position_embedding == "learned"
        self.pos_embeddings = nn.Embedding(spec.seq_len, spec.hidden_size) if learned else None
        self.embed_dropout = nn.Dropout(spec.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(spec, activation_checkpointing, checkpoint_fn, index, fused_rmsnorm)
            for index in range(spec.num_layers)
        )
        if compile_blocks:
            # torchtitan's apply_compile: each block on its own (repeated blocks reuse one compiled
            # graph), before FSDP wraps them. Module.compile() keeps the block's class and its
            # parameter names, so checkpoints and the FSDP wrap rule do not change.
            for block in self.blocks:
                block.compile()
        self.final_norm = _norm(spec, fused_rmsnorm)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tied_embeddings:
            self.lm_head.weight = self.tok_embeddings.weight
        cos, sin = rotary_tables(spec.seq_len, spec.attn_head_dim)
        # Not persistent: recomputed on build, so checkpoints hold only trained state.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # GPT-2 initialisation: N(0, 0.02), output projections scaled by 1/sqrt(2 * layers).
        std = 0.02
        for name, param in self.named_parameters():
            if param.dim() < 2:
                continue
            residual = name.endswith(("out_proj.weight", "down_proj.weight", "mlp.w2"))
            scale = 1.0 / math.sqrt(2 * self.spec.num_layers) if residual else 1.0
            nn.init.normal_(param, mean=0.0, std=std * scale)
        for module in self.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        x = self.tok_embeddings(tokens)
        if self.pos_embeddings is not None:
            x = x + self.pos_embeddings(torch.arange(tokens.shape[1], device=tokens.device))
        x = self.embed_dropout(x)
        # Only this batch's positions: FSDP's mixed precision casts each block's inputs, and a
        # block saves its (cast) tables for backward, so passing the recipe's whole length would
        # keep a copy of it per block.
        tables: tuple[torch.Tensor, torch.Tensor] = (self.rope_cos, self.rope_sin)  # type: ignore[assignment]
        cos, sin = (table[: tokens.shape[1]] for table in tables)
        for block in self.blocks:
            x = block(x, cos, sin)
        return head_logits(self.lm_head, self.final_norm(x), self.loss_chunks)


def compiled_blocks(model: nn.Module) -> int:
    """How many transformer blocks run under torch.compile (``Module.compile()`` gives a module a
    compiled call)."""
    return sum(1 for m in model.modules() if isinstance(m, TransformerBlock) and m._compiled_call_impl is not None)


def head_logits(head: nn.Module, hidden: torch.Tensor, chunks: int = 1) -> torch.Tensor | list[torch.Tensor]:
    """The output projection: the logits, or with ``chunks`` > 1 a list of each chunk of tokens'
    logits (torchtune's ``chunked_output``: every chunk is materialised, only the loss's fp32 copy
    is made a chunk at a time)."""
    if chunks > 1:
        return [head(chunk) for chunk in hidden.tensor_split(chunks, dim=1)]
    logits: torch.Tensor = head(hidden)
    return logits


def num_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
