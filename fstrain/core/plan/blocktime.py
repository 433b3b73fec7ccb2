"""The kernels one micro-batch runs on one rank, priced (:mod:`fstrain.core.plan.kernelcost`).

Per transformer block: every linear's three GEMMs (forward; backward's grad-input and
grad-weight) at its ``(M, N, K)`` on this rank (``M = b s`` tokens, ``s / cp`` under context
parallelism; a column-parallel linear's ``N`` and a row-parallel one's ``K`` split by ``tp``);
recompute runs forwards again (full: every linear, ``every-k:N`` one block in N, op-level
selective every other matmul, an MoE layer's whole FFN; flash-attention's FusedMLP at level 2
its fc1; Megatron's selective recompute the attention kernel, FlashAttention's too); fp8 linears
run on the fp8 curve and pay their casts as HBM traffic and their scale kernels (torchao's
float8 roofline, pytorch/ao torchao/float8/roofline_utils.py @d370196).
Attention by its kernel at the full sequence length (eager: its softmax, mask and dropout
traffic, :func:`fstrain.core.plan.kernelcost.eager_score_bytes`). Elementwise ops, norms and
dropouts as :func:`fstrain.core.plan.kernels.elementwise_bytes_per_token` counts them, eager or
fused (``--compile``, ``--fused-rmsnorm``, flash-attention's fused MLP and dropout-add-norm), with
the residual stream in fp32 under autocast; autocast's casts of the weights and of the norm
outputs as their own term (:mod:`fstrain.core.plan.autocast`). The last
stage adds the output layer's GEMMs and the loss's traffic over the logits. The GPU's work, times
the fitted ``compute_time_scale``, or the host's time issuing the kernels when that takes longer
(:mod:`fstrain.core.plan.hostlaunch`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fstrain.core.plan.acpolicy import every_k
from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.autocast import activation_casts, weight_casts
from fstrain.core.plan.fitted import COMPUTE_TIME_SCALE
from fstrain.core.plan.fsdp2habits import logits_split
from fstrain.core.plan.gemmcurve import MeasuredGemmCurve, dtype_name, weighted_log_mean
from fstrain.core.plan.hostlaunch import HostCosts, kernels_host_s
from fstrain.core.plan.kernelcost import (
    DTYPE_BYTES,
    GemmEfficiency,
    GemmPricer,
    GpuRates,
    KernelTime,
    PublishedGemmCurve,
    eager_attention_s,
    flash_attention_s,
    generation,
)
from fstrain.core.plan.kernels import (
    EAGER_BLOCK,
    FusedBlock,
    attended_keys,
    elementwise_bytes_per_token,
    elementwise_passes,
    fused_mlp_recompute_bytes,
)
from fstrain.core.plan.losses import has_vocab_head
from fstrain.core.plan.memory import (
    block_kernels,
    block_matmuls,
    converted_linears,
    ffn_matmuls,
    replicated_split,
    shared_expert_matmuls,
)
from fstrain.core.plan.precision import compute_dtype, mode
from fstrain.core.plan.schema import ModelSpec, PlanKnobs

FP32 = 4
# Bytes the optimizer's update moves per local parameter: AdamW reads the fp32 parameter,
# gradient and both moments and writes the parameter and moments back (28), plus a 16-bit copy
# of the parameter; SGD with momentum and the factored/8-bit optimizers about half.
OPTIMIZER_BYTES_PER_PARAM = {"adamw": 30.0, "sgd": 14.0, "adam8bit": 14.0, "adafactor": 14.0}


def host_costs(assumptions: Assumptions, compiled: bool) -> HostCosts:
    """What the host spends per kernel under ``assumptions`` (:mod:`fstrain.core.plan.hostlaunch`)."""
    return HostCosts(assumptions.kernel_launch_s, assumptions.python_op_s, assumptions.eager_forward_op_s, compiled,
                     assumptions.cuda_graphs)


def fitted_scale(gpu_name: str) -> float:
    """The shipped ``compute_time_scale`` of the GPU's generation (all runs' for one without runs)."""
    return COMPUTE_TIME_SCALE.get(generation(gpu_name), COMPUTE_TIME_SCALE["all"])


@dataclass(frozen=True)
class ComputeTerms:
    """Seconds of one micro-batch's kernels on one rank, by kind."""

    gemm_s: float
    attention_s: float
    memory_s: float  # elementwise, norms, loss: HBM traffic
    launch_s: float  # launch overhead not hidden behind GPU work
    attention_forward_flops_per_s: float  # the attention kernel's rate (ring attention overlaps it)
    host_s: float = 0.0  # the host's time issuing the kernels (launch_s is what the GPU work does not hide)
    autocast_s: float = 0.0  # autocast's casts of weights and norm outputs (fstrain.core.plan.autocast)

    @property
    def total_s(self) -> float:
        return self.gemm_s + self.attention_s + self.memory_s + self.autocast_s + self.launch_s


@dataclass(frozen=True)
class MeasuredFirst:
    """A measured GEMM curve over the published one: a measured shape at its measured rate; any
    other shape at the published rate times the measured/published ratio of the nearest
    measured shapes (weighted as the measured curve weighs them), so a sweep of few shapes
    corrects the published curve's level without losing what it knows of small and skinny
    GEMMs; a dtype the sweep did not measure on the published curve alone (a bf16 sweep says
    nothing of fp8's tensor cores)."""

    measured: MeasuredGemmCurve
    published: GemmEfficiency

    def tflops(self, m: int, n: int, k: int, dtype: str) -> float:
        if dtype_name(dtype) not in self.measured.dtypes:
            return self.published.tflops(m, n, k, dtype)
        nearest = self.measured.nearest(m, n, k, dtype)
        if nearest[0][0] == 0.0:
            return nearest[0][1].tflops
        ratios = [(d, p.tflops / self.published.tflops(p.m, p.n, p.k, dtype)) for d, p in nearest]
        return self.published.tflops(m, n, k, dtype) * math.exp(weighted_log_mean(ratios))


class KernelModel:
    """Prices a rank's micro-batch on one GPU type; caches per configuration and per GEMM shape."""

    def __init__(self, gpu: GpuRates, assumptions: Assumptions) -> None:
        self.gpu = gpu
        self.assumptions = assumptions
        published = PublishedGemmCurve(gpu, assumptions.hbm_efficiency)
        measured = assumptions.gemm_curve
        self.gemms = GemmPricer(MeasuredFirst(measured, published) if measured else published)
        self.hbm_bytes_per_s = gpu.hbm_bytes_per_s * assumptions.hbm_efficiency
        self.scale = assumptions.compute_time_scale or fitted_scale(gpu.name)
        self.fused = block_kernels(assumptions)  # flash-attention's fused MLP and dropout-add-norm
        self._cache: dict[Any, ComputeTerms] = {}
        self._models: list[ModelSpec] = []  # keeps each id() in the cache keys alive

    def micro_batch(self, model: ModelSpec, knobs: PlanKnobs, layers: int, last_stage: bool = True) -> ComputeTerms:
        """``layers`` blocks (and the output layer when ``last_stage``) of one micro-batch on one
        rank of ``knobs`` (with ``cp > 1``, ``seq_len / cp`` tokens of each sequence, attending over
        all ``seq_len``)."""
        # Only these knobs change a micro-batch's kernels (not dp, the strategy, accumulation...):
        # the search asks for the same few many times.
        k = knobs
        key = (id(model), k.tp, k.cp, k.micro_batch_size, k.seq_len, k.activation_checkpointing, k.precision,
               k.flash_attention, k.loss, k.compile, k.fused_rmsnorm, k.fp8, k.tp_replicated_logits,
               k.shard_group_size if k.fp8_all_gather else 0, layers, last_stage)
        cached = self._cache.get(key)
        if cached is None:
            self._models.append(model)
            cached = self._price(model, knobs, layers, last_stage)
            self._cache[key] = cached
        return cached

    def _price(self, model: ModelSpec, knobs: PlanKnobs, layers: int, last_stage: bool) -> ComputeTerms:
        block, attention_rate = self._block(model, knobs)
        total = KernelTime()
        total.add(block, layers)
        if last_stage:
            total.add(self._head(model, knobs))
        scale = self.scale
        gpu_s = scale * total.gpu_s
        host = kernels_host_s(total.forward_kernels, total.backward_kernels,
                              host_costs(self.assumptions, knobs.compile), total.graph_launches)
        launch = max(0.0, host - gpu_s)
        return ComputeTerms(scale * total.gemm_s, scale * total.attention_s, scale * total.memory_s, launch,
                            attention_rate / scale, host, scale * total.autocast_s)

    def _block(self, model: ModelSpec, knobs: PlanKnobs) -> tuple[KernelTime, float]:
        """One block's kernels for one micro-batch (forward, backward, recompute)."""
        t, b = knobs.tp, knobs.micro_batch_size
        full_seq = knobs.seq_len
        tokens = b * knobs.seq_len // knobs.cp
        dtype = compute_dtype(knobs.precision)
        a = DTYPE_BYTES.get(dtype, 2)
        autocast = mode(knobs.precision).autocast
        ac = knobs.activation_checkpointing
        k = every_k(ac)
        full_again = 1.0 if ac == "full" else (1.0 / k if k else 0.0)
        out = KernelTime()
        matmuls = block_matmuls(model)
        converted = len(converted_linears(model)) if knobs.fp8 else 0
        forward_kernels = 0.0
        fused = self.fused
        split = replicated_split(t, self.assumptions.sequence_parallel)
        for index, (n_in, n_out) in enumerate(matmuls):
            moe_ffn = model.moe is not None and index >= 4
            again = full_again or (1.0 if ac == "selective-op" and (index % 2 == 1 or moe_ffn) else 0.0)
            if index == 4 and fused.mlp_recomputed == 2:  # FusedMLP level 2 runs fc1 again in backward
                again += 1.0
            rows = tokens * model.moe.top_k if (moe_ffn and model.moe is not None) else tokens
            row_parallel = index == 3 or index == len(matmuls) - 1
            n_in_local, n_out_local = (n_in // t, n_out) if row_parallel else (n_in, max(1, n_out // t))
            gemm_dtype = "fp8" if index < converted else dtype
            forward, backward = self.gemms.linear(rows, n_in_local, n_out_local, gemm_dtype)
            out.gemm_s += (1 + again) * forward + backward
            forward_kernels += 1
            if autocast:  # the weight (and bias) cast each forward, the gradient cast back
                bias = model.linear_bias
                weights = weight_casts(n_in_local * n_out_local + (n_out_local if bias else 0), 2 if bias else 1,
                                       a, 1 + again)
                out.autocast_s += weights.bytes / self.hbm_bytes_per_s
                out.backward_kernels += weights.kernels  # issued from C++, priced like backward's kernels
            if index < converted:  # casts to fp8 (torchao's roofline) and their amax kernels
                share = 1.0 / knobs.shard_group_size if knobs.fp8_all_gather else 1.0
                casts = (1 + again) * (4.0 * rows * n_in + 6.0 * n_in * n_out * share) + 4.0 * rows * n_out
                out.memory_s += casts / t / self.hbm_bytes_per_s
                scale_kernels = 3 + 2 * again
                out.memory_s += scale_kernels * self.assumptions.fp8_scale_kernel_s
                out.forward_kernels += 1 + 2 * again
                out.backward_kernels += 2
        if model.moe is not None:  # the router
            forward, backward = self.gemms.linear(tokens, model.hidden_size, model.moe.num_experts, dtype)
            out.gemm_s += (1 + full_again) * forward + backward
            forward_kernels += 2
        shared = shared_expert_matmuls(model)
        for index, (n_in, n_out) in enumerate(shared):  # every token's, recomputed as the experts are
            again = full_again or (1.0 if ac == "selective-op" else 0.0)
            row_parallel = index == len(ffn_matmuls(model, 1)) - 1  # the down projection
            n_in_local, n_out_local = (n_in // t, n_out) if row_parallel else (n_in, max(1, n_out // t))
            forward, backward = self.gemms.linear(tokens, n_in_local, n_out_local, dtype)
            out.gemm_s += (1 + again) * forward + backward
            forward_kernels += 1
        heads = max(1, model.num_heads // t)
        # FlashAttention computes only the blocks a sliding window leaves (eager attention masks
        # the whole square, so it keeps full_seq).
        attention_flops = tokens * 4.0 * attended_keys(model, full_seq) * heads * model.attn_head_dim
        dropout = model.dropout > 0
        if knobs.flash_attention:
            forward, backward = flash_attention_s(self.gpu, dtype, attention_flops, full_seq, causal=not model.pooler)
            # Megatron checkpoints the core attention whatever its kernel (TE's fused attention
            # included), so its forward runs again in backward: Megatron-LM@d98e8a6
            # megatron/core/transformer/attention.py L392-395, L1555-1556.
            attention_again = full_again or (1.0 if ac == "megatron-selective" else 0.0)
            forward_kernels += 1
        else:
            forward, backward = eager_attention_s(self.gemms, self.hbm_bytes_per_s, dtype, b * heads, full_seq,
                                                  model.attn_head_dim, autocast, dropout)
            forward, backward = forward / knobs.cp, backward / knobs.cp  # a CP rank's share of the scores
            attention_again = full_again or (1.0 if ac == "megatron-selective" else 0.0)
            forward_kernels += 5 + (1 if dropout else 0) + (1 if autocast else 0)  # QK^T, scale, mask, softmax, AV
        out.attention_s += (1 + attention_again) * forward + backward
        elementwise = elementwise_bytes_per_token(model, a, knobs.compile, knobs.fused_rmsnorm, fused,
                                                  FP32 if autocast else a)
        per_token = elementwise.replicated / split + elementwise.sharded / t
        passes = elementwise_passes(ac, k)
        out.memory_s += tokens * per_token * passes / self.hbm_bytes_per_s
        if autocast:
            inputs = activation_casts(model, fused, tokens, a, 1 + full_again, split)
            out.autocast_s += inputs.bytes / self.hbm_bytes_per_s
            out.backward_kernels += inputs.kernels  # issued from C++, priced like backward's kernels
        recompute = model.ffn_hidden_size * fused_mlp_recompute_bytes(a, fused) / t
        out.memory_s += tokens * recompute / self.hbm_bytes_per_s
        forward_kernels += _elementwise_kernels(model, knobs.compile, knobs.fused_rmsnorm, fused)
        out.forward_kernels += forward_kernels * (passes - 2)  # forward, and recomputed forward
        out.backward_kernels += 2 * forward_kernels  # each op's gradient about two kernels
        out.graph_launches += passes - 1  # forward (and recompute) graphs, one backward graph
        return out, attention_flops / forward

    def _head(self, model: ModelSpec, knobs: PlanKnobs) -> KernelTime:
        """The output layer and the loss of one micro-batch (the last stage's)."""
        t, b = knobs.tp, knobs.micro_batch_size
        tokens = b * knobs.seq_len // knobs.cp
        dtype = compute_dtype(knobs.precision)
        a = DTYPE_BYTES.get(dtype, 2)
        h = model.hidden_size
        out = KernelTime()
        if mode(knobs.precision).autocast:  # the final norm's fp32 output and the head's weights, cast
            weights = h * (max(1, model.vocab_size // t) if has_vocab_head(knobs.loss) else model.num_labels)
            head = weight_casts(weights, 1, a, 1.0)
            out.autocast_s += (head.bytes + tokens * h * 2 * (FP32 + a)) / self.hbm_bytes_per_s
            out.backward_kernels += head.kernels + 2  # issued from C++, priced like backward's kernels
        if has_vocab_head(knobs.loss):
            forward, backward = self.gemms.linear(tokens, h, max(1, model.vocab_size // t), dtype)
            # log-softmax over fp32 logits and its gradient: read a write 4, read 4 write 4, read 4 write a
            logits = tokens * model.vocab_size / logits_split(knobs)  # all V when gathered to every rank
            out.memory_s += logits * (3 * FP32 + 2 * a) / self.hbm_bytes_per_s
            out.forward_kernels += 3
            out.backward_kernels += 6
        else:
            rows = b if model.pooler else tokens
            forward, backward = self.gemms.linear(rows, h, max(1, model.num_labels), dtype)
            if model.pooler:
                pool_forward, pool_backward = self.gemms.linear(rows, h, h, dtype)
                forward, backward = forward + pool_forward, backward + pool_backward
            out.forward_kernels += 3
            out.backward_kernels += 6
        out.gemm_s += forward + backward
        return out

    def grad_accumulation_s(self, local_grad_elements: float, grad_bytes: int, micro_batches: int) -> float:
        """Seconds a step spends adding each micro-batch's gradients after the first into those
        accumulated so far (HBM-bound): autograd's ``AccumulateGrad`` adds a new gradient into an
        existing ``.grad`` in place (torch/csrc/autograd/functions/accumulate_grad.h
        ``accumulateGrad``: ``variable_grad += new_grad`` once ``.grad`` is defined; the first
        micro-batch's gradient is stolen, not copied), reading both and writing one:
        ``3 x grad_bytes`` per accumulated element, ``micro_batches - 1`` times a step."""
        if micro_batches <= 1:
            return 0.0
        return self.scale * (micro_batches - 1) * local_grad_elements * 3 * grad_bytes / self.hbm_bytes_per_s

    def optimizer_s(self, local_params: float, optimizer: str) -> float:
        """Seconds of one optimizer step over ``local_params`` on the GPU (HBM-bound)."""
        bytes_per_param = OPTIMIZER_BYTES_PER_PARAM.get(optimizer, OPTIMIZER_BYTES_PER_PARAM["adamw"])
        return self.scale * local_params * bytes_per_param / self.hbm_bytes_per_s


def _elementwise_kernels(model: ModelSpec, compiled: bool, fused_rmsnorm: bool,
                         fused: FusedBlock = EAGER_BLOCK) -> int:
    """Forward kernels of one block besides its GEMMs and attention: eager, each norm's ops
    (RMSNorm: ``float``, ``pow``, ``mean``, ``rsqrt`` multiply, ``to``, ``* weight``; a LayerNorm or
    a fused RMSNorm one; four norms with ``post_norms``, two more RMSNorms with ``qk_norm``), two
    residual adds, rotary on q and k (three each), the activation (gated two, GeLU one, none in
    FusedMLP's epilogue); compiled, Inductor fuses each chain between GEMMs into one kernel;
    flash-attention's dropout-add-norm is one kernel a norm."""
    if compiled:
        return 4 + (1 if model.position_embedding == "rope" else 0)
    rmsnorm = 6 if not fused_rmsnorm else 1
    norm = rmsnorm if model.norm == "rmsnorm" else 1
    norms_and_adds = 2 if fused.dropout_add_ln else model.norms_per_block * norm + 2
    qk_norms = 2 * rmsnorm if model.qk_norm != "none" else 0
    rope = 6 if model.position_embedding == "rope" else 0
    activation = 2 if model.gated else (0 if fused.mlp_checkpoint_lvl is not None else 1)
    dropouts = 2 if model.dropout > 0 and not fused.dropout_add_ln else 0  # the residual branches'
    return norms_and_adds + qk_norms + rope + activation + dropouts
