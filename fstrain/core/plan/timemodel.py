"""Step time of one parallel configuration: compute, pipeline bubble and communication.

- FLOPs: matmul FLOPs from the architecture (2 per multiply-add), attention scores ``4 s q``
  per token and layer (QK^T and AV, full s x s like Megatron and torchtitan: a causal mask is not
  credited, and a bidirectional encoder's attention is the same count), logits ``2 V h`` (none
  with ``--loss none``: a classification head's instead);
  training = 3 x forward (Kaplan's 6N plus attention). Hardware FLOPs add recompute: full
  activation checkpointing repeats every layer's forward (Narayanan eq. 3's 96 instead of 72),
  every-k:N every N-th layer's, op-level selective AC every other matmul of each layer,
  Megatron's selective the attention core; FlashAttention's backward recomputes QK^T.
- Compute time: hardware FLOPs / (peak x achievable MFU) on the slowest GPU of the cluster, an
  eager PyTorch figure; ``--compile`` and ``--fused-rmsnorm`` take off the HBM time of the
  elementwise traffic they fuse away (:mod:`fstrain.core.plan.kernels`).
- Tensor parallel: 4 all-reduces of ``b s h`` per layer and micro-batch (2 forward, 2 backward;
  +2 with full recompute) over NVLink. Pipeline: ``m`` micro-batch slots plus the schedule's
  bubble (:mod:`fstrain.core.plan.pipeline`: ``p - 1`` slots for 1F1B, ``(p - 1)/v`` interleaved, a
  third of ``p - 1`` for ZB-H1); activations sent point-to-point at each stage boundary, ``v``
  times as often when interleaved.
- Data parallel: DDP all-reduce (2 Psi) once a step; ZeRO-1 reduce-scatter + all-gather once a
  step; ZeRO-2 reduce-scatter every micro-batch, all-gather once; ZeRO-3 and FSDP full-shard
  all-gather (forward, backward) and reduce-scatter every micro-batch (3 Psi); grad-op gathers
  once per micro-batch; hybrid sharding, and ZeRO-1/2 with ``shard_group_size < dp``, shard
  inside a group and all-reduce the shard across groups. Each collective pays NCCL's latency
  (:mod:`fstrain.core.plan.nccllatency`: ring hops, or a tree for all-reduces). Ring
  collectives move ``(n-1)/n`` of the buffer per step of the ring; bandwidth is NVLink inside a
  domain, PCIe inside a node without it, the node's NICs shared by its GPUs across nodes.
  What can overlap with compute hides behind it (assumption ``dp_overlap``); FSDP's and
  ZeRO-3's forward all-gathers only behind the forward's compute (:class:`DpTraffic`).
- Expert parallelism (``ep > 1``, MoE): each MoE layer dispatches and combines its tokens with
  an all-to-all in forward and again in backward (4 per layer and micro-batch, +2 when its
  forward is recomputed, each moving
  ``b s / tp x top_k x h`` compute-dtype elements, ``(ep-1)/ep`` of them to other ranks), over
  the EP group's bandwidth, not overlapped with compute (torchtitan expert_parallel.py runs them
  synchronously between the router and the experts). Expert gradients are reduced over the
  ``dp/ep`` ranks holding the same experts (DeepSpeed-MoE, arXiv 2201.05596 sec. 5.1).
- Context parallelism (``cp > 1``, :mod:`fstrain.core.plan.contextparallel`): each rank computes
  ``s / cp`` tokens of every sequence, with attention at the full ``s`` per token (load-balanced
  causal sharding gives every rank ``1/cp`` of the attention work), and moves them through TP and
  PP; FSDP's traffic is that of ``dp x cp`` ranks (:func:`~fstrain.core.plan.contextparallel.cp_rank_view`).
  Ring attention's K/V all-gather (forward, and again in backward) hides behind the first (local)
  chunk's SDPA; backward's fp32 dK/dV rotation hides each step behind the next chunk's SDPA, the
  last one exposed (:func:`ring_attention_time`).
- Gradient accumulation (``grad_accum > 1``): every micro-batch after the first adds its
  gradients into those kept so far, HBM-bound (:meth:`KernelModel.grad_accumulation_s`): the whole
  stage's where they stay unsharded until the step (DDP, ZeRO-1, FSDP2's no_sync), else the fp32
  shard FSDP and ZeRO-2/3 reduce into.
- CPU offload (:mod:`fstrain.core.plan.offload`): PCIe transfers and the CPU optimizer step
  (DeepSpeed's CPU Adam, or torch's AdamW on the host under FSDP), not overlapped.
- fp8 (``knobs.fp8``): the blocks' linear layers run their three matmuls on the fp8 tensor cores
  and pay for the casts, after torchao's float8 roofline (:func:`fp8_linear_saving_s`); the
  attention core, the output layer and everything else keep the compute dtype's time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from fstrain.core.plan.acpolicy import every_k
from fstrain.core.plan.adafactor import step_kernels as adafactor_step_kernels
from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.blocktime import ComputeTerms, KernelModel, host_costs
from fstrain.core.plan.contextparallel import cp_rank_view, ring_chunk_bytes
from fstrain.core.plan.fsdp2habits import logits_gather_bytes
from fstrain.core.plan.hostlaunch import optimizer_host_s, parameter_tensors, sharding_host_s
from fstrain.core.plan.kernels import attended_keys, fusion_seconds_saved_per_token
from fstrain.core.plan.losses import has_vocab_head
from fstrain.core.plan.megatron import megatron_reduce_bytes
from fstrain.core.plan.memory import (
    block_kernels,
    block_matmuls,
    comm_bytes,
    converted_linears,
    fp8_gathered_block_params,
    replicated_split,
    residual_bytes,
    shared_expert_matmuls,
    uses_megatron_ddp,
    weight_bytes,
)
from fstrain.core.plan.nccllatency import PCIE_RING_HOP_S, Hops, all_reduce_latency_s, ring_latency_s
from fstrain.core.plan.offload import offload_time
from fstrain.core.plan.pipeline import boundary_crossings, bubble_slots, layers_per_rank
from fstrain.core.plan.precision import mode
from fstrain.core.plan.schema import ModelSpec, PlanKnobs


@dataclass(frozen=True)
class FlopsPerToken:
    """Forward FLOPs per token, by part (training is 3x, recompute adds to it)."""

    layer_matmuls: float  # one layer's linears (active experts only for MoE)
    attention_core: float  # one layer's QK^T and AV
    head: float  # logits
    num_layers: int
    selective_op_recompute: float = 0.0  # the matmuls op-level selective AC runs again (every other one)

    @property
    def layer(self) -> float:
        return self.layer_matmuls + self.attention_core

    @property
    def forward(self) -> float:
        return self.num_layers * self.layer + self.head

    @property
    def training(self) -> float:
        """Model FLOPs per token for forward + backward, no recompute (what MFU counts)."""
        return 3 * self.forward


def flops_per_token(model: ModelSpec, seq_len: int, loss: str = "full") -> FlopsPerToken:
    """Forward FLOPs per token of ``model`` at ``seq_len`` (biases and norms are negligible).

    ``loss`` ``none`` has no logits over the vocabulary: the head is the recipe's classification
    head, a pooler (hidden x hidden) and a classifier (hidden x num_labels) run once per sequence
    on its first token (BERT), or the classifier on every token without a pooler
    (``LlamaForSequenceClassification``'s ``score``)."""
    h, q_width, kv_width = model.hidden_size, model.q_width, model.kv_width
    matrices = 3 if model.gated else 2
    if model.moe is None:
        ffn = matrices * h * model.ffn_hidden_size
    else:
        ffn = model.moe.top_k * matrices * h * model.moe.expert_ffn_hidden_size + h * model.moe.num_experts
    shared = sum(n_in * n_out for n_in, n_out in shared_expert_matmuls(model))  # every token's
    linears = 2 * h * q_width + 2 * h * kv_width + ffn + shared
    mms = block_matmuls(model)
    recomputed = sum(2.0 * n_in * n_out for index, (n_in, n_out) in enumerate(mms) if index % 2 == 1)
    if model.moe is not None:
        # Op-level SAC saves none of an MoE layer's matmuls (the router's is forced to recompute,
        # the experts' grouped matmuls are not in torchtitan's save list): all of it runs again.
        attention = sum(2.0 * n_in * n_out for index, (n_in, n_out) in enumerate(mms[:4]) if index % 2 == 1)
        recomputed = attention + 2.0 * (ffn + shared)
    return FlopsPerToken(
        layer_matmuls=2.0 * linears,
        attention_core=4.0 * attended_keys(model, seq_len) * q_width,
        head=_head_flops(model, seq_len, loss),
        num_layers=model.num_layers,
        selective_op_recompute=recomputed,
    )


def _head_flops(model: ModelSpec, seq_len: int, loss: str) -> float:
    """Forward FLOPs per token of the output head (see :func:`flops_per_token`)."""
    h = model.hidden_size
    if has_vocab_head(loss):
        return 2.0 * model.vocab_size * h
    classifier = 2.0 * h * model.num_labels
    if model.pooler:
        return (2.0 * h * h + classifier) / max(1, seq_len)
    return classifier


def layer_hardware_flops(flops: FlopsPerToken, ac: str, flash_attention: bool) -> float:
    """FLOPs one layer executes per token for forward + backward, recompute included."""
    total = 3 * flops.layer
    if flash_attention:
        total += 0.5 * flops.attention_core  # FA's backward recomputes QK^T
    k = every_k(ac)
    if k:
        total += flops.layer / k  # the whole forward again, for every k-th layer
    elif ac == "selective-op":
        total += flops.selective_op_recompute  # the attention kernel's outputs are saved
    elif ac == "megatron-selective":  # the attention core's forward again, FlashAttention's too
        total += flops.attention_core
    return total


@dataclass(frozen=True)
class Fp8Rates:
    """What fp8's time depends on, of the GPU that bounds the step (the slowest)."""

    peak_flops: float  # dense tensor-core peak of the compute dtype (bf16/fp16)
    fp8_peak_flops: float  # dense fp8 tensor-core peak
    hbm_bytes_per_s: float
    achievable_mfu: float  # effective / peak: what the whole step reaches in the compute dtype


def fp8_linear_saving_s(model: ModelSpec, knobs: PlanKnobs, rates: Fp8Rates, assumptions: Assumptions) -> float:
    """Seconds one block's converted linears save on one rank and micro-batch with fp8 (negative
    when fp8 is slower: small shapes).

    torchao's float8 roofline (pytorch/ao torchao/float8/roofline_utils.py @d370196,
    ``get_gemm_time_sympy`` and ``get_float8_mem_sympy``), per linear of forward shape
    ``M x K -> N`` (``M = b s`` tokens; ``b s / cp`` on a context-parallel rank, whose knobs
    :func:`fstrain.core.contextparallel.cp_rank_view` gives): the forward, grad-input and
    grad-weight matmuls (``6 M K N`` FLOPs, plus ``2 M K N`` for a recomputed forward) run at
    ``gemm_peak_fraction`` of the bf16 or the fp8 peak; fp8 adds its dynamic tensorwise casts,
    memory-bound at ``hbm_efficiency`` of the HBM bandwidth (the roofline assumes 0.92): the
    input ``4 M K`` bytes (bf16 read, row- and column-major fp8 written; its amax fused into the
    previous op), the weight ``6 K N`` (amax read, then the cast), the output gradient
    ``4 M N``, the forward's two again when recomputed, each pass's second-stage amax kernels
    (``fp8_scale_kernel_s`` each). What a tensor-parallel rank holds is ``1/tp`` of each; under
    FSDP's float8 all-gather each rank casts its weight shard before the gather (``1/shard`` of
    the weight's cast). The rest of the step (attention, norms, elementwise) is
    unchanged.
    """
    tokens = knobs.micro_batch_size * knobs.seq_len
    ac = knobs.activation_checkpointing
    k = every_k(ac)
    gemm = max(assumptions.gemm_peak_fraction, rates.achievable_mfu)  # bf16's linears fit inside the step
    matmul_flops = 0.0
    cast_bytes = 0.0
    kernels = 0.0
    weight_share = 1.0 / knobs.shard_group_size if knobs.fp8_all_gather else 1.0
    for index, (n_in, n_out) in enumerate(converted_linears(model)):
        again = 1.0 / k if k else (1.0 if ac == "selective-op" and index % 2 == 1 else 0.0)
        forward = 2.0 * tokens * n_in * n_out
        matmul_flops += (3 + again) * forward
        forward_casts = 4.0 * tokens * n_in + 6.0 * n_in * n_out * weight_share
        cast_bytes += (1 + again) * forward_casts + 4.0 * tokens * n_out
        kernels += 3 + 2 * again
    matmul_flops /= knobs.tp
    cast_bytes /= knobs.tp
    bf16_s = matmul_flops / (rates.peak_flops * gemm)
    fp8_s = matmul_flops / (rates.fp8_peak_flops * gemm)
    casts_s = cast_bytes / (rates.hbm_bytes_per_s * assumptions.hbm_efficiency)
    return bf16_s - fp8_s - casts_s - kernels * assumptions.fp8_scale_kernel_s


@dataclass(frozen=True)
class Links:
    """Per-GPU, per-direction bandwidths in bytes/s, and where the boundaries are."""

    nvlink_bytes_per_s: float
    pcie_bytes_per_s: float
    inter_node_bytes_per_s: float  # this GPU's share of its node's NICs
    host_link_bytes_per_s: float  # GPU <-> host, for offload
    nvlink_domain_size: int
    gpus_per_node: int
    num_nodes: int
    hbm_bytes_per_s: float = 0.0  # the slowest GPU's memory bandwidth (0: not known)
    nvls_efficiency: float = 0.0  # NCCL's NVLink SHARP efficiency inside the NVLink domain (0: none)


# NCCL's default number of NVLS channels (NCCL_NVLS_NCHANNELS, 16); one of them is lost to the
# pipeline in NCCL's NVLS cost model ((nChannels - 1) / nChannels).
NVLS_CHANNELS = 16


def group_bandwidth(size: int, stride: int, links: Links) -> float:
    """Bus bandwidth per rank of a ring (or tree) over ``size`` ranks spaced ``stride`` apart
    (ranks numbered node by node).

    Across nodes, NCCL runs one ring (channel) per NIC, each crossing every node boundary once on
    its own rail, so a group with ``k`` members on each node uses ``k`` of the node's NICs: its
    per-rank bus bandwidth is ``k`` x one GPU's NIC share (the node's whole scale-out bandwidth
    when every GPU of the node is in the group), capped by the intra-node links every ring step
    also crosses. ``k`` is 1 when the group has one member per node (a DP group across nodes
    with TP filling the node), which is one NIC per ring.
    """
    span = size * stride
    intra = links.nvlink_bytes_per_s if links.nvlink_bytes_per_s > 0 else links.pcie_bytes_per_s
    if span <= links.nvlink_domain_size and links.nvlink_bytes_per_s > 0:
        return links.nvlink_bytes_per_s
    if span <= links.gpus_per_node:
        return links.pcie_bytes_per_s
    members_per_node = max(1, min(size, links.gpus_per_node // max(1, stride)))
    if members_per_node == 1:
        return links.inter_node_bytes_per_s
    return min(members_per_node * links.inter_node_bytes_per_s, intra)


def all_reduce_bandwidth(size: int, stride: int, links: Links) -> float:
    """Bus bandwidth per rank of an all-reduce: the ring's (:func:`group_bandwidth`), or inside an
    NVSwitch domain of Hopper or Blackwell GPUs NCCL's NVLS all-reduce, whose bus bandwidth NCCL's
    cost model (src/tuning/nvls.cc) puts at NVLink x efficiency x (nChannels - 1)/nChannels x 2
    (x1.59 on Hopper, x1.39 on Blackwell); NCCL picks whichever is faster. All-gathers and
    reduce-scatters gain nothing from NVLS in that model (no factor 2), and across nodes NVLS needs
    in-network reduction (SHARP), which fstrain does not assume."""
    ring = group_bandwidth(size, stride, links)
    inside = size * stride <= links.nvlink_domain_size and links.nvlink_bytes_per_s > 0
    if not inside or links.nvls_efficiency <= 0:
        return ring
    nvls = links.nvlink_bytes_per_s * links.nvls_efficiency * (NVLS_CHANNELS - 1) / NVLS_CHANNELS * 2
    return max(ring, nvls)


def collective_latency(size: int, stride: int, links: Links, assumptions: Assumptions, tree: bool = False) -> float:
    """The alpha of one collective over ``size`` ranks spaced ``stride`` apart, by NCCL's tuning
    model (:mod:`fstrain.core.plan.nccllatency`): a ring all-gather or reduce-scatter, or with
    ``tree`` an all-reduce, ring or tree, whichever NCCL finds cheaper."""
    if size <= 1:
        return 0.0
    hops = Hops(size, _nodes_spanned(size, stride, links.gpus_per_node),
                assumptions.nvlink_latency_s if links.nvlink_bytes_per_s > 0 else PCIE_RING_HOP_S,
                assumptions.collective_latency_s, assumptions.collective_base_latency_s)
    return all_reduce_latency_s(hops) if tree else ring_latency_s(hops)


def _nodes_spanned(size: int, stride: int, gpus_per_node: int) -> int:
    """Nodes a group of ``size`` ranks ``stride`` apart covers (ranks numbered node by node)."""
    if size * stride <= gpus_per_node:
        return 1
    per_node = max(1, min(size, gpus_per_node // max(1, stride)))
    return math.ceil(size / per_node)


def _ring(size: int) -> float:
    return (size - 1) / size if size > 1 else 0.0


@dataclass(frozen=True)
class StepTime:
    """Predicted time of one optimizer step and what it is made of (seconds)."""

    step_time_s: float
    compute_s: float
    bubble_s: float
    tp_comm_s: float
    pp_comm_s: float
    dp_comm_s: float
    dp_exposed_s: float
    offload_s: float
    tokens_per_step: int
    model_flops_per_step: float
    mfu: float
    ep_comm_s: float = 0.0  # MoE all-to-all of the step (ep > 1), inside the pipeline slots
    cp_comm_s: float = 0.0  # ring attention's exposed K/V and dK/dV traffic (cp > 1), inside the slots
    # compute_s by kind of kernel (the kernel model; all 0 when --mfu prices compute instead)
    gemm_s: float = 0.0
    attention_s: float = 0.0
    elementwise_s: float = 0.0  # elementwise, norms, loss, fp8 casts: HBM traffic
    autocast_s: float = 0.0  # torch.autocast's casts of weights and norm outputs (fstrain.core.plan.autocast)
    launch_s: float = 0.0  # kernel launches not hidden behind GPU work
    optimizer_s: float = 0.0  # the optimizer's update, once a step (not in compute_s): GPU or host time, the longer
    grad_accumulation_s: float = 0.0  # adding micro-batches' gradients into .grad (grad_accum > 1; not in compute_s)
    host_s: float = 0.0  # the host's time issuing the step's kernels (what launch_s and optimizer_s wait for)
    offload_pcie_s: float = 0.0  # of offload_s: the offloaded state's PCIe transfers
    cpu_optimizer_s: float = 0.0  # of offload_s: the optimizer step on the host's CPUs

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    def seconds_for(self, tokens: int) -> float:
        return tokens / self.tokens_per_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_time_s": self.step_time_s,
            "compute_s": self.compute_s,
            "bubble_s": self.bubble_s,
            "tp_comm_s": self.tp_comm_s,
            "pp_comm_s": self.pp_comm_s,
            "dp_comm_s": self.dp_comm_s,
            "dp_exposed_s": self.dp_exposed_s,
            "offload_s": self.offload_s,
            **({"offload_pcie_s": self.offload_pcie_s, "cpu_optimizer_s": self.cpu_optimizer_s}
               if self.offload_s else {}),
            **({"ep_comm_s": self.ep_comm_s} if self.ep_comm_s else {}),
            **({"cp_comm_s": self.cp_comm_s} if self.cp_comm_s else {}),
            "gemm_s": self.gemm_s,
            "attention_s": self.attention_s,
            "elementwise_s": self.elementwise_s,
            **({"autocast_s": self.autocast_s} if self.autocast_s else {}),
            "launch_s": self.launch_s,
            "host_s": self.host_s,
            "optimizer_s": self.optimizer_s,
            **({"grad_accumulation_s": self.grad_accumulation_s} if self.grad_accumulation_s else {}),
        }


def step_time(
    model: ModelSpec,
    stage_params: int,
    knobs: PlanKnobs,
    effective_flops_per_gpu: float,
    cluster_peak_flops: float,
    links: Links,
    assumptions: Assumptions = Assumptions(),
    expert_params: int = 0,
    fp8_rates: Fp8Rates | None = None,
    kernels: KernelModel | None = None,
) -> StepTime:
    """Step time of ``knobs`` for ``model``; ``stage_params`` is the heaviest rank's parameter share,
    ``expert_params`` the part of it that is experts under expert parallelism (reduced over dp/ep).

    ``effective_flops_per_gpu`` is the slowest GPU's peak x achievable MFU; MFU is reported
    against ``cluster_peak_flops``, the sum of every GPU's peak in the compute dtype (with fp8
    too: its MFU is not well defined, torchtitan benchmarks/llama3_h100_202412_torchtitan.md).
    ``kernels``: the kernel model of that GPU (:mod:`fstrain.core.plan.blocktime`, whose GEMM
    curve a measured one replaces); with it, and no ``mfu`` assumption, compute is the sum of
    the kernels a micro-batch runs. Without it, or with ``--mfu``, compute is hardware FLOPs /
    ``effective_flops_per_gpu`` (``fp8_rates``: that GPU's rates, needed when ``knobs.fp8``).
    """
    # One context-parallel rank computes s / cp tokens of each sequence (attention over all s)
    # and is one of dp x cp ranks to FSDP; without CP this is knobs itself.
    rank = cp_rank_view(knobs)
    s, b, m, t, p, d = (rank.seq_len, knobs.micro_batch_size, knobs.grad_accum_steps, knobs.tp, knobs.pp, rank.dp)
    w = weight_bytes(knobs.precision)
    eff = assumptions.collective_efficiency
    flops = flops_per_token(model, knobs.seq_len, knobs.loss)
    chunks = knobs.pp_virtual_stages if p > 1 else 1
    layers = layers_per_rank(model.num_layers, p, chunks)
    terms: ComputeTerms | None = None
    attention_rate = effective_flops_per_gpu
    host_mb = launch_mb = 0.0
    if kernels is not None and not assumptions.mfu:
        terms = kernels.micro_batch(model, knobs, layers)  # the last stage's (it adds the logits)
        # The host also issues FSDP's per-unit collectives (under PP the stage stays gathered).
        units = layers if p == 1 else 0
        host_mb = terms.host_s + sharding_host_s(knobs.strategy, units, host_costs(assumptions, knobs.compile))
        gpu_mb = terms.total_s - terms.launch_s
        launch_mb = max(0.0, host_mb - gpu_mb)
        compute_mb = gpu_mb + launch_mb
        attention_rate = terms.attention_forward_flops_per_s
    else:
        compute_mb = _mfu_compute_s(model, knobs, rank, flops, layers, effective_flops_per_gpu, links, assumptions,
                                    fp8_rates)

    tp_mb = 0.0
    if t > 1:
        k = every_k(knobs.activation_checkpointing)
        collectives = 4 + (2 / k if k else 0)  # a recomputed layer's forward all-reduces again
        # With sequence parallelism the all-reduces are reduce-scatters + all-gathers of the same
        # bytes, which NVLS does not speed up; plain all-reduces take NVLS where the switch has it.
        tp_bw = links.nvlink_bytes_per_s
        if not assumptions.sequence_parallel:
            tp_bw = max(tp_bw, all_reduce_bandwidth(t, 1, links))
        all_reduce = 2 * _ring(t) * b * s * model.hidden_size * w / (tp_bw * eff)
        all_reduce += collective_latency(t, 1, links, assumptions, tree=False) * 2
        tp_mb = layers * collectives * all_reduce * (1 - assumptions.tp_overlap)
        # The head's logits gathered to every TP rank (fstrain.core.plan.fsdp2habits), before the
        # loss can start: not overlapped.
        gathered = logits_gather_bytes(model, rank)
        if gathered:
            tp_mb += _ring(t) * gathered / (tp_bw * eff) + collective_latency(t, 1, links, assumptions, tree=False)
    pp_mb = 0.0
    if p > 1:
        boundary = group_bandwidth(p, t * d, links)
        crossings = boundary_crossings(knobs.pp_schedule, chunks)  # v times the traffic, interleaved
        pp_mb = crossings * 2 * b * s * model.hidden_size * residual_bytes(knobs.precision) / t / (boundary * eff)
    ep_mb = layers * moe_all_to_all_time(model, rank, links, assumptions)
    cp_mb = layers * ring_attention_time(model, knobs, flops, attention_rate, links, assumptions)
    slot = compute_mb + tp_mb + pp_mb + ep_mb + cp_mb
    bubble = bubble_slots(knobs.pp_schedule, p, chunks) * slot
    pipeline = m * slot + bubble

    dense_params = stage_params - expert_params
    fp8_gathered = 0.0  # of the non-expert parameters, the share FSDP gathers in fp8
    if knobs.fp8_all_gather and dense_params > 0:
        fp8_gathered = min(1.0, layers * fp8_gathered_block_params(model, rank) / dense_params)
    dp_total, dp_exposed = _data_parallel_time(rank, stage_params, compute_mb, links, assumptions, layers,
                                               expert_params, fp8_gathered)
    offload = offload_time(rank, stage_params, links.host_link_bytes_per_s, links.gpus_per_node, assumptions,
                           expert_params)
    optimizer = optimizer_host = accumulation = 0.0
    if terms is not None and kernels is not None and knobs.offload == "none":
        local = stage_params / (rank.shard_group_size if knobs.zero_stage else 1)
        optimizer_host = _optimizer_host_s(model, knobs, layers, assumptions)
        optimizer = max(kernels.optimizer_s(local, knobs.optimizer), optimizer_host)  # host-bound when tiny
        accumulation = kernels.grad_accumulation_s(*_accumulated_gradients(rank, stage_params), m)
    total = pipeline + dp_exposed + offload.total_s + optimizer + accumulation
    tokens = knobs.global_batch_size * knobs.seq_len
    model_flops = flops.training * tokens
    return StepTime(
        step_time_s=total,
        compute_s=m * compute_mb,
        bubble_s=bubble,
        tp_comm_s=m * tp_mb,
        pp_comm_s=m * pp_mb,
        dp_comm_s=dp_total,
        dp_exposed_s=dp_exposed,
        offload_s=offload.total_s,
        tokens_per_step=tokens,
        model_flops_per_step=model_flops,
        mfu=model_flops / (total * cluster_peak_flops),
        ep_comm_s=m * ep_mb,
        cp_comm_s=m * cp_mb,
        gemm_s=m * terms.gemm_s if terms else 0.0,
        attention_s=m * terms.attention_s if terms else 0.0,
        elementwise_s=m * terms.memory_s if terms else 0.0,
        autocast_s=m * terms.autocast_s if terms else 0.0,
        launch_s=m * launch_mb,
        optimizer_s=optimizer,
        grad_accumulation_s=accumulation,
        host_s=m * host_mb + optimizer_host,
        offload_pcie_s=offload.pcie_s,
        cpu_optimizer_s=offload.cpu_optimizer_s,
    )


def _accumulated_gradients(knobs: PlanKnobs, stage_params: int) -> tuple[float, int]:
    """(elements, bytes per element) of the gradients a rank accumulates across micro-batches:
    the whole stage's in the gradient dtype where they stay unsharded until the step (DDP, ZeRO-1,
    FSDP's no_sync accumulation), else the rank's fp32 shard that FSDP and ZeRO-2/3 reduce each
    micro-batch into."""
    unsharded = knobs.strategy in ("ddp", "zero1") or knobs.fsdp2_no_sync
    if unsharded:
        return stage_params, mode(knobs.precision).grad_bytes
    return stage_params / max(1, knobs.shard_group_size), 4


def _optimizer_host_s(model: ModelSpec, knobs: PlanKnobs, layers: int, assumptions: Assumptions) -> float:
    """The host's seconds issuing one optimizer step over the stage's parameter tensors: AdamW
    as its implementation issues it (:func:`optimizer_host_s`), Adafactor as transformers' loop
    does, its own kernels a tensor (:func:`fstrain.core.plan.adafactor.step_kernels`)."""
    costs = host_costs(assumptions, knobs.compile)
    tensors = parameter_tensors(model, layers)
    if knobs.optimizer != "adafactor":
        return optimizer_host_s(tensors, _optimizer_implementation(knobs, assumptions), costs)
    matrices = min(tensors, layers * len(block_matmuls(model)) + 2)  # the linears, embedding and head
    issued = adafactor_step_kernels(knobs.strategy, knobs.precision, matrices, tensors - matrices)
    return issued * (costs.launch_s + costs.python_op_s)


def _optimizer_implementation(knobs: PlanKnobs, assumptions: Assumptions) -> str:
    """How the optimizer issues its update: DeepSpeed's FusedAdam (one multi-tensor kernel) under
    ZeRO, else torch's foreach or per-parameter loop (``adamw_foreach``)."""
    if knobs.strategy.startswith("zero"):
        return "fused"
    return "foreach" if assumptions.adamw_foreach else "loop"


def _mfu_compute_s(
    model: ModelSpec, knobs: PlanKnobs, rank: PlanKnobs, flops: FlopsPerToken, layers: int,
    effective_flops_per_gpu: float, links: Links, assumptions: Assumptions, fp8_rates: Fp8Rates | None,
) -> float:
    """One micro-batch's compute on the last stage at an achievable MFU (``--mfu``): hardware
    FLOPs over peak x MFU (with FusedMLP's level-2 recompute of fc1), a fixed cost per block, less
    what fusion and fp8 save."""
    b, s, t = knobs.micro_batch_size, rank.seq_len, knobs.tp
    per_token = layers * layer_hardware_flops(flops, knobs.activation_checkpointing, knobs.flash_attention)
    per_token += 3 * flops.head  # the last stage (or the only one) also computes the logits
    if block_kernels(assumptions).mlp_recomputed == 2:  # flash-attention's FusedMLP runs fc1 again in backward
        per_token += layers * 2 * model.hidden_size * model.ffn_hidden_size
    compute_mb = b * s * per_token / t / effective_flops_per_gpu + layers * assumptions.layer_overhead_s
    compute_mb -= b * s * layers * _fusion_saved_s(model, knobs, links, assumptions)
    if knobs.fp8:
        if fp8_rates is None:
            raise ValueError("knobs.fp8 needs the GPU's fp8 rates")
        compute_mb -= layers * fp8_linear_saving_s(model, rank, fp8_rates, assumptions)
    return compute_mb


def _fusion_saved_s(model: ModelSpec, knobs: PlanKnobs, links: Links, assumptions: Assumptions) -> float:
    """Seconds per token and block that --compile / --fused-rmsnorm / flash-attention's fused MLP and
    dropout-add-norm save against eager PyTorch (the achievable MFU is eager PyTorch's;
    fstrain.core.plan.kernels counts the traffic removed)."""
    return fusion_seconds_saved_per_token(
        model, weight_bytes(knobs.precision), knobs.tp, replicated_split(knobs.tp, assumptions.sequence_parallel),
        knobs.activation_checkpointing, every_k(knobs.activation_checkpointing), knobs.compile, knobs.fused_rmsnorm,
        links.hbm_bytes_per_s * assumptions.hbm_efficiency, block_kernels(assumptions))


def ring_attention_time(
    model: ModelSpec,
    knobs: PlanKnobs,
    flops: FlopsPerToken,
    effective_flops_per_gpu: float,
    links: Links,
    assumptions: Assumptions,
) -> float:
    """Exposed seconds of one layer's ring attention traffic for one micro-batch (0 without CP).

    torch's ring attention with torchtitan's all-gather rotater (:mod:`fstrain.core.plan.contextparallel`):
    forward all-gathers the ``cp`` K/V chunks (``(cp-1)`` chunks arrive, ``cp - 1`` ring steps of
    latency) while the local chunk's SDPA runs, ``1/cp`` of the rank's attention, and waits for it
    before the next chunk; backward all-gathers K/V again behind the first chunk's SDPA backward,
    then sends the fp32 dK/dV accumulator to the next rank once per step (``cp`` times), each
    hidden behind the next chunk's SDPA backward except the last. Exposed = max(0, traffic -
    the compute it overlaps), per step. A layer whose forward is recomputed (full AC, every-k:N)
    runs the forward ring again. The CP group is ``cp`` consecutive ranks ``tp`` apart (torchtitan's
    mesh order ... dp_shard, cp, tp): NVLink inside a node, else the cross-node group bandwidth.
    """
    cp, t = knobs.cp, knobs.tp
    if cp == 1:
        return 0.0
    tokens = knobs.micro_batch_size * knobs.seq_len / cp
    attention = tokens * flops.attention_core / t / effective_flops_per_gpu  # this rank's forward attention
    backward = attention * (2.5 if knobs.flash_attention else 2.0)  # FlashAttention's backward recomputes QK^T
    bandwidth = group_bandwidth(cp, t, links) * assumptions.collective_efficiency
    latency = collective_latency(cp, t, links, assumptions)  # (cp - 1) steps
    gather = (cp - 1) * ring_chunk_bytes(model, knobs) / bandwidth + latency
    dkv = ring_chunk_bytes(model, knobs, 4) / bandwidth + latency / (cp - 1)
    forward = max(0.0, gather - attention / cp)
    step = backward / cp
    exposed_backward = max(0.0, gather - step) + (cp - 1) * max(0.0, dkv - step) + dkv
    k = every_k(knobs.activation_checkpointing)
    return forward * (1 + (1 / k if k else 0)) + exposed_backward


def moe_all_to_all_time(model: ModelSpec, knobs: PlanKnobs, links: Links, assumptions: Assumptions) -> float:
    """Seconds of one MoE layer's expert-parallel all-to-alls for one micro-batch (0 without EP).

    Forward dispatch and combine, and both again in backward: 4 all-to-alls, each sending
    ``(ep-1)/ep`` of the rank's ``b s / tp x top_k`` routed copies (``h`` compute-dtype elements
    each) to the other ranks of its EP group: ``ep`` consecutive data-parallel ranks (stride
    ``tp``), inside a node when ``ep x tp`` fits one. Each pays the group's latency. A layer whose
    forward is recomputed (full, every-k:N) dispatches and combines again (2 more, averaged over
    the layers like TP's all-reduces); op-level selective AC is counted as keeping the
    all-to-all's outputs, as it keeps the other collectives' (torchtitan's save list).
    """
    if model.moe is None or knobs.ep <= 1:
        return 0.0
    ep, t = knobs.ep, knobs.tp
    k = every_k(knobs.activation_checkpointing)
    collectives = 4 + (2 / k if k else 0)
    tokens = knobs.micro_batch_size * knobs.seq_len / t
    volume = tokens * model.moe.top_k * model.hidden_size * weight_bytes(knobs.precision) * _ring(ep)
    bandwidth = group_bandwidth(ep, t, links) * assumptions.collective_efficiency
    return collectives * (volume / bandwidth + collective_latency(ep, t, links, assumptions))


def _data_parallel_time(
    knobs: PlanKnobs,
    params: int,
    compute_mb: float,
    links: Links,
    assumptions: Assumptions,
    layers: int = 1,
    expert_params: int = 0,
    fp8_gathered: float = 0.0,
) -> tuple[float, float]:
    """(total, exposed) seconds of data-parallel communication in one step.

    Parameters move in their gather dtype ``w`` and gradients in their reduce dtype (``red``,
    ``memory.comm_bytes``): under autocast DDP and FSDP move fp32 (twice bf16's bytes),
    DeepSpeed the autocast dtype; pure bf16 moves bf16 everywhere. Under expert parallelism the
    ``expert_params`` move over their own data-parallel group, ``dp/ep`` ranks ``ep x tp`` apart,
    in the same collectives; both hide behind the same compute. FSDP's float8 all-gather moves
    the ``fp8_gathered`` share of the non-expert parameters in one byte. FSDP's and ZeRO-3's
    forward all-gathers hide behind the forward's compute only, the rest behind backward's
    (:class:`DpTraffic`)."""
    parts = [_dp_parts(knobs, params - expert_params, compute_mb, links, assumptions, layers, knobs.tp,
                       fp8_gathered)]
    if expert_params:
        ep = knobs.ep
        expert_knobs = replace(knobs, dp=knobs.dp // ep, shard_group_size=max(1, knobs.shard_group_size // ep))
        parts.append(_dp_parts(expert_knobs, expert_params, compute_mb, links, assumptions, layers, knobs.tp * ep))
    hidden = sum(part.hidden for part in parts)
    forward = sum(part.forward for part in parts)
    exposed_only = sum(part.exposed_only for part in parts)
    exposed = (exposed_only + max(0.0, hidden - assumptions.dp_overlap * parts[0].window)
               + max(0.0, forward - assumptions.dp_overlap * parts[0].forward_window))
    return hidden + forward + exposed_only, exposed


@dataclass(frozen=True)
class DpTraffic:
    """Seconds of one step's data-parallel traffic by what compute it can hide behind.

    FSDP and ZeRO-3 gather each unit's parameters just before its forward (prefetching the next
    unit's while this one computes) and again before its backward: a forward all-gather can
    only hide behind forward compute, whatever backward leaves idle, so the forward's traffic
    and window are priced apart (``forward``, ``forward_window``: a unit's forward is ``1 / (3 +
    r)`` of its compute, ``r`` the recomputed share of its forward, backward the rest)."""

    hidden: float  # overlappable traffic of backward (or of the whole step where no phase is kept apart)
    window: float  # the compute it can hide behind
    exposed_only: float = 0.0  # traffic nothing hides
    forward: float = 0.0  # the forward passes' all-gathers
    forward_window: float = 0.0  # the forward passes' compute


def forward_share(ac: str) -> float:
    """A micro-batch's forward as a share of its compute: forward 1, backward 2, and the
    recomputed share of the forward (full 1, every-k:N 1/N) again in backward."""
    k = every_k(ac)
    recompute = 1.0 if ac == "full" else (1.0 / k if k else 0.0)
    return 1.0 / (3.0 + recompute)


def _dp_parts(
    knobs: PlanKnobs, params: int, compute_mb: float, links: Links, assumptions: Assumptions, layers: int,
    stride: int,
    fp8_gathered: float = 0.0,
) -> DpTraffic:
    """(overlappable seconds, compute window they can hide behind, exposed-only seconds) of the
    data-parallel traffic of ``params`` over ``knobs.dp`` ranks ``stride`` apart (FSDP gathers the
    ``fp8_gathered`` share of them in one byte)."""
    d, m, t = knobs.dp, knobs.grad_accum_steps, stride
    if d == 1 or params == 0:
        return DpTraffic(0.0, 0.0)
    w_int, red = comm_bytes(knobs.precision, knobs.strategy, assumptions)
    if uses_megatron_ddp(knobs):  # Megatron reduces its gradient buffer in place, fp32 under bf16
        red = megatron_reduce_bytes(knobs.precision, assumptions.megatron_fp32_main_grads)
    w = w_int - (w_int - 1) * fp8_gathered if knobs.strategy.startswith("fsdp") else float(w_int)
    eff = assumptions.collective_efficiency
    hierarchical = knobs.strategy in ("fsdp-hybrid", "zero1", "zero2")  # zero1/2: sharded within groups
    group = knobs.shard_group_size if hierarchical else d
    bandwidth = group_bandwidth(group, t, links) * eff

    def move(
        bytes_per_param: float, size: int = group, bw: float = bandwidth, count: int = 1, passes: int = 1,
        spacing: int = t, all_reduce: bool = False,
    ) -> float:
        # One collective per block and pass (FSDP / ZeRO-3 units; DDP and ZeRO buckets are of
        # the same order): each pays NCCL's latency besides the bytes.
        latency = passes * layers * collective_latency(size, spacing, links, assumptions, tree=all_reduce)
        return count * (_ring(size) * bytes_per_param * params / bw + latency)

    def across(bytes_per_param: float, count: int = 1) -> float:
        # The shards' all-reduce across the d / group replicas (hybrid sharding, ZeRO-1/2 sharded
        # within groups), one rank per group, ``t x group`` apart.
        replicas = d // group
        if replicas <= 1:
            return 0.0
        bw = group_bandwidth(replicas, t * group, links) * eff
        return move(2 * bytes_per_param / group, size=replicas, bw=bw, count=count, spacing=t * group,
                    all_reduce=True)

    backward_last = 2 / 3 * compute_mb  # what a once-per-step collective can hide behind
    all_compute = m * compute_mb
    strategy = knobs.strategy
    exposed_only = 0.0
    if strategy == "ddp":
        hidden, window = move(2 * red, bw=all_reduce_bandwidth(group, t, links) * eff, all_reduce=True), backward_last
    elif strategy == "zero1" and uses_megatron_ddp(knobs):
        # Megatron with --overlap-grad-reduce --overlap-param-gather (the flags fstrain's render note
        # names): the reduce-scatter hides behind backward, the all-gather behind the next forward.
        hidden, window = move(red) + move(w), backward_last + compute_mb / 3
    elif strategy == "zero1":
        hidden, window, exposed_only = move(red) + across(red), backward_last, move(w)
    elif strategy == "zero2":
        hidden, window, exposed_only = move(red, count=m) + across(red, count=m), 2 / 3 * all_compute, move(w)
    elif strategy == "zero3":
        fwd = forward_share(knobs.activation_checkpointing) * all_compute
        return DpTraffic(move(w + red, count=m, passes=2), all_compute - fwd, 0.0, move(w, count=m), fwd)
    elif strategy.startswith("fsdp") and knobs.pp > 1:
        # Under PP the stage stays gathered across micro-batches (reshard_after_forward=False in
        # torchtitan) and reduces its gradients once, after the last micro-batch's backward
        # (torch.distributed.pipelining's perform_reduce_grad): one all-gather a step, prefetched
        # block by block behind the first micro-batch's forward, and one exposed reduce-scatter.
        hidden, window, exposed_only = move(w), compute_mb / 3, move(red) + across(red)
    elif strategy == "fsdp-grad-op":  # gathered once a micro-batch, in forward, kept through backward
        fwd = forward_share(knobs.activation_checkpointing) * all_compute
        return DpTraffic(move(red, count=1 if knobs.fsdp2_no_sync else m), all_compute - fwd, 0.0,
                         move(w, count=m), fwd)
    else:  # fsdp-full, fsdp-hybrid
        # Under fsdp2_no_sync the gradients are reduced in the last micro-batch's backward only.
        reductions = 1 if knobs.fsdp2_no_sync else m
        fwd = forward_share(knobs.activation_checkpointing) * all_compute
        hidden = move(w, count=m) + move(red, count=reductions) + across(red, count=reductions)
        return DpTraffic(hidden, all_compute - fwd, 0.0, move(w, count=m), fwd)
    return DpTraffic(hidden, window, exposed_only)
