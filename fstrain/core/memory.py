"""Per-GPU memory of one parallel configuration, broken down by what holds it.

Four parts, each a function that can be tested alone:

- model states (:func:`model_states`): parameters, gradients and optimizer states for DDP,
  ZeRO-1/2/3 and FSDP full-shard / grad-op / hybrid, with CPU offload. With
  ``deepspeed_fp32_grad_partition=False`` this is the ZeRO paper's Table 1 (2 + 2 + K bytes with
  K = 12); with the default it is DeepSpeed's own estimators (2 + 18/N for ZeRO-2, 18/N + the
  gathered largest layer for ZeRO-3; DeepSpeed counts an fp32 gradient partition besides the
  16-bit one for ZeRO-2, and only the fp32 one for ZeRO-3).
- activations (:func:`layer_activation_bytes`, :func:`stage_activation_bytes`): Korthikanti et
  al. 2022 per layer, generalised to GQA, SwiGLU, MoE and no dropout; FlashAttention removes the
  s^2 terms; Megatron's selective recompute drops the attention core, op-level selective AC
  keeps every other matmul output and the attention output, full recompute keeps each layer's
  input, every-k:N does that for every N-th layer; tensor (+ sequence) parallel divides; 1F1B
  keeps ``min(pp, micro-batches)`` in flight on the first stage; the last stage adds the
  logits/loss spike.
- transient buffers (:func:`buffer_items`, :func:`backward_buffer_items`): DDP buckets, DeepSpeed
  reduce buckets and offload staging, ZeRO-3 gathered layer + prefetch, FSDP unsharded units +
  prefetch, pipeline send/recv.
- moments (:func:`_moments`): the peak is the highest of the loss (between forward and backward,
  at the higher of the loss's own forward and backward peaks: :mod:`fstrain.core.losses`),
  backward and the optimizer step, each charging only what is live then; a plan fits when the
  peak less the allocator's cache margin does (:attr:`MemoryBreakdown.required`).
- overhead: CUDA context, NCCL communicators, allocator fragmentation.

Every number that is not arithmetic comes from :class:`~fstrain.core.assumptions.Assumptions`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fstrain.core.acpolicy import checkpointed_blocks, recomputes
from fstrain.core.assumptions import Assumptions
from fstrain.core.buckets import bucket_sizes
from fstrain.core.losses import LossPeaks, loss_peaks
from fstrain.core.modelsize import ParamCount
from fstrain.core.planfile import ModelSpec, PlanKnobs

GIB = 1 << 30
LOGITS_ITEM = "logits and loss"  # the activation items of the loss moment only (see _moments)
HEAD_INPUT_ITEM = "final norm and head input"

STRATEGY_LABELS = {
    "ddp": "DDP",
    "zero1": "ZeRO-1",
    "zero2": "ZeRO-2",
    "zero3": "ZeRO-3",
    "fsdp-full": "FSDP full-shard",
    "fsdp-grad-op": "FSDP grad-op",
    "fsdp-hybrid": "FSDP hybrid",
}
# The ZeRO stage each strategy corresponds to (what `zero_stage` in a plan means for FSDP).
ZERO_STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp-full": 3, "fsdp-grad-op": 2, "fsdp-hybrid": 3}
# DeepSpeed offloads the optimizer for ZeRO-1/2/3 and parameters only for ZeRO-3; FSDP's
# CPUOffload moves parameters, gradients and the optimizer step together.
OFFLOAD_ALLOWED = {
    "ddp": ("none",),
    "zero1": ("none", "optimizer"),
    "zero2": ("none", "optimizer"),
    "zero3": ("none", "optimizer", "optimizer+params"),
    "fsdp-full": ("none", "optimizer+params"),
    "fsdp-grad-op": ("none", "optimizer+params"),
    "fsdp-hybrid": ("none", "optimizer+params"),
}
OPTIMIZER_STATE_BYTES = {"adamw": 8, "sgd": 4, "adam8bit": 2}  # m + v fp32; momentum; 8-bit m + v


def weight_bytes(precision: str) -> int:
    """Bytes of a compute-dtype element: 2 for bf16/fp16, 4 for fp32."""
    return 4 if precision == "fp32" else 2


@dataclass(frozen=True)
class ModelStates:
    """Model-state bytes on one GPU, and what was moved to the host per rank."""

    parameters: int
    gradients: int
    optimizer_states: int
    host_bytes: int = 0

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_states


def model_states(
    num_params: int,
    strategy: str,
    shard: int,
    precision: str = "bf16",
    optimizer: str = "adamw",
    offload: str = "none",
    assumptions: Assumptions = Assumptions(),
) -> ModelStates:
    """Model states of ``num_params`` parameters (one rank's TP/PP share) sharded ``shard`` ways.

    Mixed precision keeps 2-byte weights and gradients for compute and an fp32 master copy (4)
    plus the optimizer's state (Adam 8) for the update: the ZeRO paper's 2 + 2 + K, K = 12.
    FSDP's sharded flat parameter *is* the fp32 master, and its gradient is fp32 too.
    """
    mixed = precision != "fp32"
    w = weight_bytes(precision)
    master = 4 if mixed else 0
    states = OPTIMIZER_STATE_BYTES[optimizer]
    n = 1 if strategy == "ddp" else shard

    def sharded(bytes_per_param: int) -> int:
        return bytes_per_param * num_params // n

    if strategy.startswith("fsdp"):
        full_params = w * num_params if strategy == "fsdp-grad-op" else 0  # gathered forward -> backward
        shard_states = ModelStates(sharded(4), sharded(4), sharded(states))
        if offload == "optimizer+params":
            return ModelStates(full_params, 0, 0, shard_states.total)
        return ModelStates(shard_states.parameters + full_params, shard_states.gradients, shard_states.optimizer_states)

    stage = ZERO_STAGE[strategy]
    fp32_grad = 4 if mixed and stage >= 1 and assumptions.deepspeed_fp32_grad_partition else 0
    parameters = sharded(w) if stage == 3 else w * num_params
    if stage == 3 and fp32_grad:
        # DeepSpeed counts ZeRO-3 gradients once, as the fp32 partition the 16-bit gradients are
        # reduced into (stage3.py: 18 = 2 + 4 + 4 + 8), but ZeRO-2's twice (2 + 18/N).
        gradients = sharded(fp32_grad)
    elif stage >= 2:
        gradients = sharded(w + fp32_grad)
    else:
        gradients = w * num_params + sharded(fp32_grad)
    optimizer_states = sharded(master + states)
    if offload == "none":
        return ModelStates(parameters, gradients, optimizer_states)
    # Offloaded: the update runs on the host, on fp32 gradient partitions there. ZeRO-2/3 stream
    # each reduced gradient to the host; ZeRO-1 still accumulates full gradients on the GPU.
    host = optimizer_states + sharded(4)
    device_gradients = w * num_params if stage == 1 else 0
    if offload == "optimizer+params":
        return ModelStates(0, 0, 0, host + parameters)
    return ModelStates(parameters, device_gradients, 0, host)


def zero3_gathered_layer_bytes(largest_layer_params: int, precision: str = "bf16") -> int:
    """ZeRO-3's gathered largest layer: its full parameters and gradients in the compute dtype."""
    return 2 * weight_bytes(precision) * largest_layer_params


def host_bytes_per_node(
    states: ModelStates,
    strategy: str,
    rank_params: int,
    largest_layer_params: int,
    gpus_per_node: int,
    assumptions: Assumptions = Assumptions(),
) -> int:
    """Host memory a node needs: start-up (each process builds its fp32 model, or one layer of it
    under zero.Init / meta-device init) or the offloaded state, whichever is larger, times
    DeepSpeed's additional buffer factor."""
    sharded_init = assumptions.sharded_init and strategy in ("zero3", "fsdp-full", "fsdp-hybrid", "fsdp-grad-op")
    init = 4 * (largest_layer_params if sharded_init else rank_params) * gpus_per_node
    steady = states.host_bytes * gpus_per_node
    return int(max(init, steady) * assumptions.cpu_buffer_factor)


@dataclass(frozen=True)
class StageShape:
    """What one rank of a pipeline stage holds: its share of the model after TP and PP."""

    params: int  # parameters on this rank (the model-state count)
    layers: int  # transformer blocks on this stage
    largest_layer: int  # biggest single module on this rank (DeepSpeed's "largest layer")
    fsdp_unit: int  # biggest FSDP unit on this rank (a block, or the embedding / head)
    has_head: bool  # the stage computes the logits and the loss
    in_flight: int  # micro-batches whose activations it holds at once (1F1B)
    outside_blocks: int = 0  # embeddings, final norm and head on this rank: FSDP2's root unit
    block: int = 0  # one transformer block on this rank (0 when the architecture is not known)


def stage_shapes(params: ParamCount, tp: int, pp: int, micro_batches: int, tied: bool) -> list[StageShape]:
    """The first and (when pp > 1) last pipeline stage; the middle ones are never heavier.

    Layers split as evenly as they can (the heaviest stage gets ceil(L/pp)). Linears, the
    embedding and the head are split over TP (vocab-parallel); norms are replicated.
    """
    layers = math.ceil(params.num_layers / pp)
    block_sharded = params.per_layer - params.norms_per_layer
    block_rank = block_sharded // tp + params.norms_per_layer
    embedding = (params.embedding + params.position_embedding) // tp
    # A tied head on its own stage keeps a copy of the embedding (Megatron syncs their grads).
    head = (params.head if not tied or pp == 1 else params.embedding) // tp
    largest = params.largest_module // tp
    first_params = layers * block_rank + embedding
    if pp == 1:
        total = first_params + head + params.final_norm
        return [StageShape(total, layers, largest, max(block_rank, embedding, head), True, 1,
                           embedding + head + params.final_norm, block_rank)]
    first = StageShape(first_params, layers, largest, max(block_rank, embedding), False, min(pp, micro_batches),
                       embedding, block_rank)
    last_params = layers * block_rank + head + params.final_norm
    last = StageShape(last_params, layers, largest, max(block_rank, head), True, 1, head + params.final_norm,
                      block_rank)
    return [first, last]


def block_matmuls(model: ModelSpec) -> list[tuple[int, int]]:
    """(in, out) widths of a block's matmuls in forward order, per token (MoE: one expert).

    The order is the bundled trainer's and torchtitan's Llama: q, k, v, o, then gate (w1), up
    (w3), down (w2) for SwiGLU, or up, down for GeLU. Op-level selective AC saves the outputs
    of the 1st, 3rd, 5th, ... of them.
    """
    h = model.hidden_size
    q_width = model.num_heads * model.head_dim
    kv_width = model.num_kv_heads * model.head_dim
    ffn = model.ffn_hidden_size if model.moe is None else model.moe.expert_ffn_hidden_size
    attention = [(h, q_width), (h, kv_width), (h, kv_width), (q_width, h)]
    mlp = [(h, ffn), (h, ffn), (ffn, h)] if model.activation == "swiglu" else [(h, ffn), (ffn, h)]
    return attention + mlp


def _selective_op_saved(model: ModelSpec, s: int, b: int, a: int, flash_attention: bool) -> int:
    """Bytes op-level SAC saves inside one block (sharded by TP): every other matmul output and
    the attention kernel's outputs (output + fp32 log-sum-exp); MoE experts see top_k copies."""
    mms = block_matmuls(model)
    top_k = 1 if model.moe is None else model.moe.top_k
    saved = 0
    for index, (_, out) in enumerate(mms):
        if index % 2 == 0:  # 1st, 3rd, ... (counting from 1: odd)
            saved += out * (top_k if index >= 4 else 1)
    saved *= s * b * a
    if flash_attention:
        saved += s * b * model.num_heads * model.head_dim * a + 4 * model.num_heads * s * b
    return saved


def layer_activation_bytes(
    model: ModelSpec,
    micro_batch: int,
    seq_len: int,
    tp: int = 1,
    ac: str = "none",
    flash_attention: bool = True,
    precision: str = "bf16",
    sequence_parallel: bool = True,
) -> int:
    """Activations one transformer block saves for backward, per GPU, under policy ``ac``
    (``none``, ``selective-op``, ``megatron-selective`` or ``full``; see
    :mod:`fstrain.core.acpolicy`; ``every-k:N`` mixes full and none, see
    :func:`stage_activation_bytes`).

    Without FlashAttention: Korthikanti et al. 2022 section 4.1 with 16-bit activations,
    generalised: Q/K/V widths follow GQA; GeLU saves 2 ffn-wide tensors, SwiGLU 4 (gate input,
    gate output, up output, product); dropout masks (1 byte) only when dropout > 0. For GPT (MHA,
    GeLU 4h, dropout) this is ``sbh(34 + 5as/h)``, and ``sbh(10 + 24/t + 5as/(ht))`` with TP but
    no SP. With it: PyTorch eager with SDPA, op by op (what the bundled trainer and torchtitan
    run; ``fstrain plan --trace`` checks it); ``megatron-selective`` then stores what ``none`` does.
    """
    a = weight_bytes(precision)
    s, b, h = seq_len, micro_batch, model.hidden_size
    sbh = s * b * h
    split_replicated = tp if (sequence_parallel and tp > 1) else 1
    if ac == "full" or ac.startswith("every-k:"):
        return sbh * a // split_replicated  # only the block's input is kept
    if ac == "selective-op":
        return sbh * a // split_replicated + _selective_op_saved(model, s, b, a, flash_attention) // tp
    mask = 1 if model.dropout > 0 else 0
    q_width = model.num_heads * model.head_dim
    kv_width = model.num_kv_heads * model.head_dim
    ffn_width = model.ffn_hidden_size if model.moe is None else model.moe.expert_ffn_hidden_size
    tokens_per_expert_slot = 1 if model.moe is None else model.moe.top_k
    ffn_saved = (4 if model.activation == "swiglu" else 2) * s * b * ffn_width * tokens_per_expert_slot * a
    moe_extra = 0
    if model.moe is not None:  # routed copies of the token and fp32 router probabilities
        moe_extra = (model.moe.top_k - 1) * sbh * a + 4 * s * b * model.moe.num_experts
    if flash_attention:
        # PyTorch eager with SDPA (the bundled trainer, torchtitan), counted op by op and checked
        # against what autograd saves (tests/unit/test_activation_grid.py): an RMSNorm keeps its
        # fp32 input and 1/rms and its output in the compute dtype (LayerNorm: its input and one
        # fp32 statistic); the q/k/v and FFN inputs; SDPA keeps q, K and V repeated to all heads
        # (GQA), its output and the fp32 log-sum-exp; the out-projection input is a contiguous
        # copy of that output; rotary positions add a rotated copy of q.
        norm = (4 * h + 4 + a * h) if model.norm == "rmsnorm" else (a * h + 4)
        replicated = s * b * (2 * norm + 2 * a * h) + 2 * mask * sbh
        q_copies = 5 if model.position_embedding == "rope" else 4
        sharded = q_copies * s * b * q_width * a + 4 * model.num_heads * s * b + ffn_saved + moe_extra
        return replicated // split_replicated + sharded // tp
    # Korthikanti et al. (Megatron): both norm inputs, the QKV and FFN inputs and dropout masks are
    # kept whole under TP without SP; Q, K, V, the out-projection input, the FFN tensors and the
    # attention core are split. Eager attention keeps the softmax output (and, with dropout, its
    # mask and the dropped-out output).
    replicated = 4 * sbh * a + 2 * mask * sbh
    sharded = s * b * (q_width + 2 * kv_width) * a + s * b * q_width * a + ffn_saved + moe_extra
    if ac == "none":
        sharded += model.num_heads * s * s * b * (a + mask * (1 + a))
    return replicated // split_replicated + sharded // tp


def stage_activation_bytes(
    model: ModelSpec,
    stage: StageShape,
    knobs: PlanKnobs,
    assumptions: Assumptions = Assumptions(),
) -> list[tuple[str, int]]:
    """Activation items of one pipeline stage: stored layers, recompute working set, logits."""
    ac = knobs.activation_checkpointing

    def per_layer(policy: str) -> int:
        return layer_activation_bytes(
            model,
            knobs.micro_batch_size,
            knobs.seq_len,
            knobs.tp,
            policy,
            knobs.flash_attention,
            knobs.precision,
            assumptions.sequence_parallel,
        )

    whole = checkpointed_blocks(ac, stage.layers)
    if ac.startswith("every-k:"):
        stored = (whole * per_layer("full") + (stage.layers - whole) * per_layer("none")) * stage.in_flight
    else:
        stored = per_layer(ac) * stage.layers * stage.in_flight
    label = f"{stage.layers} layers x {stage.in_flight} micro-batch" + ("es" if stage.in_flight > 1 else "")
    items = [(f"activations ({label}, AC {ac})", stored)]
    if recomputes(ac) and ac != "megatron-selective":
        # A recomputed block's backward rebuilds what it did not keep.
        working = per_layer("none") - (per_layer(ac) if ac == "selective-op" else 0)
        items.append(("recompute working set (one layer)", working))
    if stage.has_head:
        items.append((HEAD_INPUT_ITEM, head_input_bytes(model, knobs, assumptions.sequence_parallel)))
        items.append((LOGITS_ITEM, loss_bytes(model, knobs, assumptions).peak))
    return items


def head_input_bytes(model: ModelSpec, knobs: PlanKnobs, sequence_parallel: bool = True) -> int:
    """What the final norm and the output projection keep for backward (the stage with the head):
    the norm's saved tensors, counted as in a block (RMSNorm: its fp32 input, 1/rms and its output;
    LayerNorm: its input and one fp32 statistic), and the head's input in the compute dtype."""
    a = weight_bytes(knobs.precision)
    h = model.hidden_size
    norm = (4 * h + 4 + a * h) if model.norm == "rmsnorm" else (a * h + 4)
    split = knobs.tp if (sequence_parallel and knobs.tp > 1) else 1
    return knobs.seq_len * knobs.micro_batch_size * (norm + a * h) // split


def loss_bytes(model: ModelSpec, knobs: PlanKnobs, assumptions: Assumptions = Assumptions()) -> LossPeaks:
    """The loss's forward and backward peaks over this rank's logits (``s x b x V / t``), by
    ``--loss`` (:func:`fstrain.core.losses.loss_peaks`); ``logits_bytes_per_element``, when set,
    replaces both with that many bytes per logit."""
    logits = knobs.seq_len * knobs.micro_batch_size * model.vocab_size // knobs.tp
    if assumptions.logits_bytes_per_element:
        stated = logits * int(assumptions.logits_bytes_per_element)
        return LossPeaks(stated, stated)
    return loss_peaks(knobs.loss, logits, weight_bytes(knobs.precision))


def buffer_items(
    strategy: str,
    stage: StageShape,
    knobs: PlanKnobs,
    hidden_size: int,
    assumptions: Assumptions = Assumptions(),
) -> list[tuple[str, int]]:
    """Transient buffers the framework keeps through forward and backward, on top of the model
    states (the ones allocated once for good are :func:`persistent_buffer_items`, the ones only
    backward allocates :func:`backward_buffer_items`). For FSDP: the root unit (embeddings, final
    norm, head; FSDP2 does not reshard it after forward), the current and the prefetched block,
    and one block's unsharded gradient in the reduce dtype."""
    w = weight_bytes(knobs.precision)
    rendered = bucket_sizes(hidden_size)
    reduce_bucket = assumptions.reduce_bucket_elements or rendered["reduce_bucket_size"]
    prefetch_bucket = assumptions.zero3_prefetch_bucket_elements or rendered["stage3_prefetch_bucket_size"]
    items: list[tuple[str, int]] = []
    if strategy == "zero3":
        items.append(
            ("ZeRO-3 gathered layer (param + grad)", zero3_gathered_layer_bytes(stage.largest_layer, knobs.precision))
        )
        room = max(0, assumptions.zero3_max_live_parameters - stage.largest_layer)
        prefetch = min(prefetch_bucket, room, stage.params)
        items.append(("ZeRO-3 prefetch", w * prefetch))
        items.append(("DeepSpeed reduce bucket", w * min(reduce_bucket, stage.params)))
    items += fsdp_unit_items(strategy, stage, knobs, assumptions)
    if knobs.pp > 1:
        p2p = 2 * knobs.micro_batch_size * knobs.seq_len * hidden_size * w // knobs.tp
        items.append(("pipeline send/recv", p2p))
    return items


def fsdp_unit_items(
    strategy: str, stage: StageShape, knobs: PlanKnobs, assumptions: Assumptions = Assumptions()
) -> list[tuple[str, int]]:
    """FSDP's gathered units and unsharded gradient, live while a unit's forward or backward runs.

    None of them is live in the loss: for full and hybrid sharding the rendered FSDP file reshards
    every unit after its forward, the root unit included (torch's FSDP2 keeps the root gathered
    only when ``reshard_after_forward`` is left unset; grad-op's gathered parameters are counted
    with the model states), and the first gradient comes after the loss. The root unit is gathered
    again for the head's backward and stays so to the end of backward.
    """
    w = weight_bytes(knobs.precision)
    if strategy == "fsdp-grad-op":
        return [("FSDP unsharded gradient (one unit)", stage.fsdp_unit * assumptions.fsdp_reduce_bytes_per_element)]
    if strategy not in ("fsdp-full", "fsdp-hybrid"):
        return []
    # Each block is its own unit; in backward the root unit (embeddings, final norm, head) is
    # gathered beside the current and the prefetched block.
    block = stage.block
    gathered = block * w * (1 + assumptions.fsdp_prefetch_units)
    items = [(f"FSDP gathered blocks (1 + {assumptions.fsdp_prefetch_units} prefetched)", gathered)]
    if stage.outside_blocks:
        items.append(("FSDP root unit, gathered (embeddings, final norm, head)", stage.outside_blocks * w))
    items.append(("FSDP unsharded gradient (one block)", block * assumptions.fsdp_reduce_bytes_per_element))
    return items


def persistent_buffer_items(
    strategy: str, stage: StageShape, knobs: PlanKnobs, assumptions: Assumptions = Assumptions()
) -> list[tuple[str, int]]:
    """Buffers allocated once that stay through every moment, the optimizer step included."""
    w = weight_bytes(knobs.precision)
    if strategy == "ddp":
        return [("DDP gradient buckets", min(2 * assumptions.ddp_bucket_bytes, w * stage.params))]
    if strategy in ("zero1", "zero2") and knobs.offload != "none":
        # stage_1_and_2.py allocates temp_grad_buffer_for_gpu_offload (the largest parameter, in
        # the 16-bit dtype) on the GPU once, to stage gradients on their way to the host.
        return [("DeepSpeed offload staging buffer", w * stage.largest_layer)]
    return []


def backward_buffer_items(
    strategy: str,
    stage: StageShape,
    knobs: PlanKnobs,
    hidden_size: int,
    assumptions: Assumptions = Assumptions(),
) -> list[tuple[str, int]]:
    """Buffers that exist only while gradients are being reduced, not at the end of forward.

    DeepSpeed ZeRO-1/2 (runtime/zero/stage_1_and_2.py): ``setup_buckets`` allocates the reduce
    bucket (``reduce_bucket_size`` elements of the 16-bit dtype) at the first gradient hook,
    twice with ``overlap_comm`` (which ``fstrain render`` writes), and ``_release_ipg_buffers``
    frees it at the end of backward. Under pipeline parallelism the engine reduces after the
    schedule instead, into one bucket (``reduce_gradients(pipeline_parallel=True)``); it is counted
    with backward all the same. DeepSpeed's all-gather of the updated partitions writes into the
    flat 16-bit parameter buffer itself (``all_gather_into_tensor``, or views of it), so
    ``allgather_bucket_size`` allocates nothing.
    """
    if strategy not in ("zero1", "zero2"):
        return []
    w = weight_bytes(knobs.precision)
    reduce_bucket = assumptions.reduce_bucket_elements or bucket_sizes(hidden_size)["reduce_bucket_size"]
    copies = 1 if knobs.pp > 1 else 2
    label = "DeepSpeed reduce bucket" if copies == 1 else "DeepSpeed reduce buckets (2, overlap_comm)"
    return [(label, copies * w * min(reduce_bucket, stage.params))]


def optimizer_step_items(knobs: PlanKnobs, states: ModelStates) -> list[tuple[str, int]]:
    """Temporaries of the optimizer update. torch's AdamW (FSDP, DDP) runs ``foreach`` kernels on
    GPU, whose ``_foreach_sqrt`` of the second moment is one fp32 copy of the local shard; measured
    on an H200 (the bundled trainer, Llama 3.1 8B with 8 layers: optimizer-step peak = parameters +
    gradients + states + 4 bytes per local parameter). DeepSpeed's fused Adam updates in place."""
    if knobs.optimizer != "adamw" or knobs.offload != "none" or knobs.strategy.startswith("zero"):
        return []
    return [("AdamW foreach temporaries", states.optimizer_states // 2)]


def communicator_count(knobs: PlanKnobs) -> int:
    """Process groups with more than one rank that a rank belongs to (each has NCCL buffers)."""
    if knobs.world_size == 1:
        return 0
    groups = 1  # the default (world) group
    for size in (knobs.tp, knobs.pp, knobs.dp):
        groups += 1 if 1 < size < knobs.world_size else 0
    if knobs.strategy == "fsdp-hybrid" and 1 < knobs.shard_group_size < knobs.dp:
        groups += 2  # shard group and replicate group
    return groups


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on the most loaded GPU, by component; ``details`` names each item."""

    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    buffers: int
    overhead: int
    host_bytes_per_node: int
    details: tuple[tuple[str, int], ...]
    phase: str = "backward"  # the moment of the peak: "loss", "backward" or "optimizer step"
    moments: tuple[tuple[str, int], ...] = ()  # the peak each moment would have (bytes)
    fragmentation: int = 0  # the allocator's cache margin (part of overhead)

    @property
    def model_states(self) -> int:
        return self.parameters + self.gradients + self.optimizer_states

    @property
    def peak(self) -> int:
        return self.model_states + self.activations + self.buffers + self.overhead

    @property
    def required(self) -> int:
        """What must fit on the GPU: the peak less the allocator's cache margin. PyTorch's caching
        allocator frees its cached blocks and retries before it fails an allocation
        (``CUDACachingAllocator``: ``release_cached_blocks``), so a run whose reserve would
        overflow still trains with the GPU full (DeepSpeed's ZeRO-Offload tutorial: nvidia-smi
        32,290 of 32,480 MiB); the live tensors, the CUDA context and NCCL's buffers cannot
        shrink."""
        return self.peak - self.fragmentation

    def largest_item(self) -> tuple[str, int]:
        return max(self.details, key=lambda item: item[1])

    def to_dict(self) -> dict[str, Any]:
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer_states": self.optimizer_states,
            "model_states": self.model_states,
            "activations": self.activations,
            "buffers": self.buffers,
            "overhead": self.overhead,
            "peak": self.peak,
            "host_bytes_per_node": self.host_bytes_per_node,
            "phase": self.phase,
            "required": self.required,
            "moments": {name: value for name, value in self.moments},
            "details": {name: value for name, value in self.details},
        }


def memory_breakdown(
    model: ModelSpec | None,
    params: ParamCount | None,
    num_params: int,
    knobs: PlanKnobs,
    gpus_per_node: int,
    assumptions: Assumptions = Assumptions(),
    cache: dict[Any, Any] | None = None,
) -> MemoryBreakdown:
    """The per-GPU breakdown of ``knobs`` on the heaviest pipeline stage.

    Without an architecture (``model`` None: ``--model-params``) only model states, buffers and
    overhead are counted; activations are not modelled. ``cache`` (a dict the caller keeps for
    one model and assumption set) reuses the parts that many configurations share.
    """
    memo: dict[Any, Any] = {} if cache is None else cache
    if model is not None and params is not None:
        in_flight = min(knobs.pp, knobs.grad_accum_steps)
        stages = _memo(
            memo,
            ("stages", knobs.tp, knobs.pp, in_flight),
            lambda: stage_shapes(params, knobs.tp, knobs.pp, knobs.grad_accum_steps, model.tied_embeddings),
        )
    else:
        stages = [StageShape(num_params // (knobs.tp * knobs.pp), 0, 0, 0, False, 1)]
    best: MemoryBreakdown | None = None
    for stage in stages:
        candidate = _stage_breakdown(model, stage, knobs, gpus_per_node, assumptions, memo)
        if best is None or candidate.peak > best.peak:
            best = candidate
    assert best is not None
    return best


def _memo(cache: dict[Any, Any], key: tuple[Any, ...], compute: Any) -> Any:
    if key not in cache:
        cache[key] = compute()
    return cache[key]


def _stage_breakdown(
    model: ModelSpec | None,
    stage: StageShape,
    knobs: PlanKnobs,
    gpus_per_node: int,
    assumptions: Assumptions,
    memo: dict[Any, Any],
) -> MemoryBreakdown:
    k = knobs
    states: ModelStates = _memo(
        memo,
        ("states", stage.params, k.strategy, k.shard_group_size, k.precision, k.optimizer, k.offload),
        lambda: model_states(
            stage.params, k.strategy, k.shard_group_size, k.precision, k.optimizer, k.offload, assumptions
        ),
    )
    activation_items: list[tuple[str, int]] = []
    if model is not None:
        activation_items = _memo(
            memo,
            (
                "activations",
                stage,
                k.micro_batch_size,
                k.seq_len,
                k.tp,
                k.activation_checkpointing,
                k.flash_attention,
                k.precision,
                k.loss,
            ),
            lambda: stage_activation_bytes(model, stage, k, assumptions),
        )
    persistent = persistent_buffer_items(k.strategy, stage, k, assumptions)
    shared: list[tuple[str, int]] = _memo(
        memo,
        ("buffers", k.strategy, stage, k.precision, k.micro_batch_size, k.seq_len, k.tp, k.pp),
        lambda: buffer_items(k.strategy, stage, k, model.hidden_size if model else 0, assumptions),
    )
    buffers = [*persistent, *shared]
    units = fsdp_unit_items(k.strategy, stage, k, assumptions)
    loss_buffers = [item for item in buffers if item not in units]
    backward_buffers = backward_buffer_items(k.strategy, stage, k, model.hidden_size if model else 0, assumptions)
    # FSDP2 creates its sharded gradients during backward (after set_to_none), so they are not
    # there during forward and backward unless micro-batches accumulate into them; DeepSpeed's
    # and DDP's gradient buffers are allocated once and stay.
    fsdp = k.strategy.startswith("fsdp")
    compute_gradients = 0 if fsdp and k.grad_accum_steps == 1 else states.gradients
    step_items = [*persistent, *optimizer_step_items(k, states)]
    moments = _moments(activation_items, loss_buffers, buffers, backward_buffers, step_items)
    communicators = communicator_count(k)
    fixed = assumptions.cuda_context_bytes + communicators * assumptions.nccl_bytes_per_communicator

    def moment_live(name: str, items: list[tuple[str, int]]) -> int:
        gradients = states.gradients if name == "optimizer step" else compute_gradients
        return states.parameters + gradients + states.optimizer_states + sum(v for _, v in items)

    def moment_peak(live: int) -> int:
        return live + fixed + int(live * assumptions.fragmentation_fraction)

    lives = [moment_live(name, items) for name, items in moments]  # each moment summed once
    # The peak is the highest moment; a tie goes to the earlier one.
    chosen = max(range(len(moments)), key=lives.__getitem__)
    phase, live_items = moments[chosen]
    gradients = states.gradients if phase == "optimizer step" else compute_gradients
    live = lives[chosen]
    activation_names = {name for name, _ in activation_items}
    activations = sum(v for name, v in live_items if name in activation_names)
    buffer_total = sum(v for name, v in live_items if name not in activation_names)
    fragmentation = int(live * assumptions.fragmentation_fraction)
    overhead = (
        ("CUDA context", assumptions.cuda_context_bytes),
        ("NCCL communicators", communicators * assumptions.nccl_bytes_per_communicator),
        ("allocator fragmentation", fragmentation),
    )
    details = (
        ("parameters", states.parameters),
        ("gradients", gradients),
        ("optimizer states", states.optimizer_states),
        *live_items,
        *overhead,
    )
    host = host_bytes_per_node(states, k.strategy, stage.params, stage.largest_layer, gpus_per_node, assumptions)
    return MemoryBreakdown(
        parameters=states.parameters,
        gradients=gradients,
        optimizer_states=states.optimizer_states,
        activations=activations,
        buffers=buffer_total,
        overhead=fixed + fragmentation,
        host_bytes_per_node=host,
        details=details,
        phase=phase,
        moments=tuple((name, moment_peak(value)) for (name, _), value in zip(moments, lives, strict=True)),
        fragmentation=fragmentation,
    )


def _moments(
    activation_items: list[tuple[str, int]],
    loss_buffers: list[tuple[str, int]],
    buffers: list[tuple[str, int]],
    backward_buffers: list[tuple[str, int]],
    step_items: list[tuple[str, int]],
) -> list[tuple[str, list[tuple[str, int]]]]:
    """What is live besides the model states at each moment that can hold the peak.

    ``loss``: between the model's forward and its backward, every stored activation, what the
    final norm and the head keep, and the loss at the higher of its forward and backward peaks
    (:func:`fstrain.core.losses.loss_peaks`), with the buffers live then (not FSDP's units: see
    :func:`fsdp_unit_items`). ``backward``: the stored activations (all of them at its start), a
    recomputed block's working set, the buffers forward and backward share and the ones only
    backward allocates (DeepSpeed's reduce buckets). ``optimizer step``: the activations are freed;
    the update's temporaries. Items of different moments are never added together.
    """
    stored = activation_items[:1]
    loss_only = (LOGITS_ITEM, HEAD_INPUT_ITEM)
    loss = [item for item in activation_items[1:] if item[0] in loss_only]
    working = [item for item in activation_items[1:] if item[0] not in loss_only]
    moments = [
        ("loss", [*stored, *loss, *loss_buffers]),
        ("backward", [*stored, *working, *buffers, *backward_buffers]),
        ("optimizer step", list(step_items)),
    ]
    return moments if loss else moments[1:]
