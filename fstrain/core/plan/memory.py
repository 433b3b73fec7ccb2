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
  input, every-k:N does that for every N-th layer; tensor (+ sequence) parallel divides; the
  pipeline schedule sets what each rank keeps in flight (1F1B and ZB-H1 ``min(pp, micro-batches)``
  on the first stage, interleaved Megatron's warm-up: :mod:`fstrain.core.plan.pipeline`); the last
  stage adds the logits/loss spike.
- transient buffers (:func:`buffer_items`, :func:`backward_buffer_items`): DDP buckets, DeepSpeed
  reduce buckets and offload staging, ZeRO-3 gathered layer + prefetch, FSDP unsharded units +
  prefetch (the whole stage, with unsharded gradients, under pipeline parallelism:
  :func:`pipeline_fsdp_gradient_bytes`), pipeline send/recv.
- moments (:func:`_moments`): the peak is the highest of the loss (between forward and backward,
  at the higher of the loss's own forward and backward peaks: :mod:`fstrain.core.plan.losses`),
  backward and the optimizer step, each charging only what is live then; a plan fits when the
  peak less the allocator's cache margin does (:attr:`MemoryBreakdown.required`).
- overhead: CUDA context, NCCL communicators, allocator fragmentation.

Every number that is not arithmetic comes from :class:`~fstrain.core.plan.assumptions.Assumptions`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from fstrain.core.plan.acpolicy import block_is_checkpointed, checkpointed_blocks, every_k, recomputes
from fstrain.core.plan.adafactor import state_bytes_per_param, step_temporary_bytes
from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.buckets import bucket_sizes
from fstrain.core.plan.contextparallel import RING_BUFFER_ITEM, cp_rank_view, ring_buffer_bytes
from fstrain.core.plan.frameworks import profile
from fstrain.core.plan.fsdp2habits import NO_SYNC_ITEM as FSDP2_NO_SYNC_ITEM
from fstrain.core.plan.fsdp2habits import logits_split, replicated_embedding_extra
from fstrain.core.plan.fsdp2habits import no_sync_gradient_bytes as fsdp2_no_sync_gradient_bytes
from fstrain.core.plan.kernels import (
    EAGER_BLOCK,
    FusedBlock,
    fused_block,
    fused_norm_saved_bytes,
    norm_is_fused,
    swiglu_saved_tensors,
)
from fstrain.core.plan.losses import LossPeaks, has_vocab_head, loss_peaks
from fstrain.core.plan.megatron import MEGATRON_STRATEGIES, megatron_bytes
from fstrain.core.plan.modelsize import ParamCount, parameter_shapes
from fstrain.core.plan.pipeline import in_flight_chunks, layers_per_rank
from fstrain.core.plan.precision import mode, optimizer_state_bytes
from fstrain.core.plan.schema import ModelSpec, PlanKnobs

GIB = 1 << 30
LOGITS_ITEM = "logits and loss"  # the activation item of the loss moment (see _moments)
PP_GATHERED_ITEM = "FSDP stage parameters, gathered across micro-batches (pp > 1)"
# torch.autocast's cache of the casts of the weights, kept to the end of the autocast region
# (the forward and the loss): an item of the loss moment only (see _moments).
AUTOCAST_CACHE_ITEM = "autocast weight casts (cached to the end of forward)"
AUTOCAST_SAVED_ITEM = "autocast weight casts (saved for backward)"  # loss and backward moments
HEAD_INPUT_ITEM = "final norm and head input"
CLASSIFIER_ITEM = "classification head input (loss none)"  # the loss moment's item without a vocabulary head
RECOMPUTE_ITEM = "recompute working set (one layer)"
FP8_CASTS_ITEM = "fp8 casts of one linear's backward (--fp8)"
EP_ALL_TO_ALL_ITEM = "MoE all-to-all send/recv (one layer, ep > 1)"  # what a recomputed block's backward rebuilds
# What a framework profile adds (fstrain.core.plan.frameworks).
NO_SYNC_ITEM = "FSDP1 no_sync: unsharded gradients of the whole stage (grad accumulation)"
FSDP1_ROOT_ITEM = "FSDP1 root unit, kept gathered after forward (embeddings, final norm, head)"
TP_GATHER_ITEM = "TP all-gather buffer (sequence parallel, global)"
ZERO3_PERSISTENT_ITEM = "ZeRO-3 persistent parameters (below the threshold, whole)"

STRATEGY_LABELS = {
    "ddp": "DDP",
    "zero1": "ZeRO-1",
    "zero2": "ZeRO-2",
    "zero3": "ZeRO-3",
    "fsdp-full": "FSDP full-shard",
    "fsdp-grad-op": "FSDP grad-op",
    "fsdp-hybrid": "FSDP hybrid",
}
ZERO_STRATEGIES = ("zero1", "zero2", "zero3")  # DeepSpeed's
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
# m + v fp32; momentum; 8-bit m + v; Adafactor's full fp32 second moment (factored: see adafactor.py)
OPTIMIZER_STATE_BYTES = {"adamw": 8, "sgd": 4, "adam8bit": 2, "adafactor": 4}


def weight_bytes(precision: str) -> int:
    """Bytes of a compute-dtype element (what matmuls read and save): 2 for bf16/fp16 and the
    modes that compute in them (bf16-pure, amp-*), 4 for fp32."""
    return mode(precision).compute_bytes


def residual_bytes(precision: str) -> int:
    """Bytes of the residual stream between blocks: the compute dtype, but fp32 under autocast
    (the fp32 embeddings plus each block's low-precision output promote to fp32)."""
    m = mode(precision)
    return 4 if m.autocast else m.compute_bytes


def param_bytes(precision: str) -> int:
    """Bytes of a parameter as the model holds it (DDP / ZeRO replicas, FSDP gathered units):
    2 for bf16/fp16/bf16-pure, 4 for fp32 and amp-* (autocast runs over fp32 weights)."""
    return mode(precision).param_bytes


def comm_bytes(precision: str, strategy: str, assumptions: Assumptions = Assumptions()) -> tuple[int, int]:
    """(parameter all-gather, gradient reduction) bytes per element of the data-parallel traffic.

    FSDP: units are gathered in the parameter dtype (MixedPrecisionPolicy param_dtype; fp32 under
    autocast, where no policy is set) and gradients reduced in ``fsdp_reduce_bytes_per_element``
    (reduce_dtype) -- or, without a policy, in the gradient dtype (4 under autocast, 2 in pure
    bf16). DeepSpeed under ``torch_autocast`` tags the parameters of ``torch.nn.Linear`` (nearly
    all of them) with the autocast dtype as their communication dtype, and ZeRO reduces and
    gathers them in it (deepspeed/runtime/torch_autocast.py ``init_autocast_params``). DDP and
    ZeRO otherwise move the parameter dtype.
    """
    m = mode(precision)
    if strategy.startswith("fsdp"):
        no_policy = m.master_bytes == 0 and precision != "fp32"  # pure bf16, autocast: no MixedPrecisionPolicy
        return m.param_bytes, m.grad_bytes if no_policy else assumptions.fsdp_reduce_bytes_per_element
    if m.autocast and strategy != "ddp":
        return m.compute_bytes, m.compute_bytes
    return m.param_bytes, m.grad_bytes


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


def _state_bytes_per_param(precision: str, optimizer: str, state_bytes: float | None) -> float:
    """The optimizer's state bytes per parameter in ``precision``, or ``state_bytes`` when the
    caller counted them (Adafactor's factored states)."""
    if state_bytes is not None:
        return state_bytes
    return optimizer_state_bytes(precision, optimizer, OPTIMIZER_STATE_BYTES[optimizer])


def model_states(
    num_params: int,
    strategy: str,
    shard: int,
    precision: str = "bf16",
    optimizer: str = "adamw",
    offload: str = "none",
    assumptions: Assumptions = Assumptions(),
    state_bytes: float | None = None,
) -> ModelStates:
    """Model states of ``num_params`` parameters (one rank's TP/PP share) sharded ``shard`` ways.
    ``state_bytes`` replaces the optimizer's bytes per parameter (Adafactor's factored states
    depend on the tensors' shapes: :func:`fstrain.core.plan.adafactor.state_bytes_per_param`).

    Mixed precision (bf16, fp16) keeps 2-byte weights and gradients for compute and an fp32
    master copy (4) plus the optimizer's state (Adam 8) for the update: the ZeRO paper's
    2 + 2 + K, K = 12. FSDP's sharded flat parameter *is* the fp32 master, and its gradient is
    fp32 too. Pure bf16 has no master: 2 + 2 + 4 (AdamW's m and v in bf16). Autocast (amp-*)
    trains fp32 parameters: 4 + 4 + 8, the same as fp32 (its per-forward casts of the weights
    are activations: :func:`autocast_weight_copies`). See :mod:`fstrain.core.plan.precision`.
    """
    m = mode(precision)
    mixed = m.master_bytes > 0
    w = m.param_bytes
    master = m.master_bytes
    states = _state_bytes_per_param(precision, optimizer, state_bytes)
    n = 1 if strategy == "ddp" else shard

    def sharded(bytes_per_param: float) -> int:
        return round(bytes_per_param * num_params) // n

    if strategy.startswith("fsdp"):
        full_params = w * num_params if strategy == "fsdp-grad-op" else 0  # gathered forward -> backward
        shard_bytes = max(master, w)  # the fp32 master under a MixedPrecisionPolicy, else the params
        shard_states = ModelStates(sharded(shard_bytes), sharded(shard_bytes), sharded(states))
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


def uses_megatron_ddp(knobs: PlanKnobs) -> bool:
    """Whether ``knobs`` run on Megatron-core's DDP and optimizer (``--framework megatron`` with
    ``ddp`` or ``zero1``: :mod:`fstrain.core.plan.megatron`)."""
    return knobs.strategy in MEGATRON_STRATEGIES and profile(knobs.framework).megatron_ddp


def megatron_model_states(
    num_params: int,
    strategy: str,
    shard: int,
    precision: str = "bf16",
    optimizer: str = "adamw",
    offload: str = "none",
    assumptions: Assumptions = Assumptions(),
    state_bytes: float | None = None,
) -> ModelStates:
    """Model states of ``num_params`` parameters under Megatron's DDP (``ddp``: its plain optimizer)
    or its distributed optimizer (``zero1``: the fp32 main parameters and the optimizer's states
    sharded ``shard`` ways), :func:`fstrain.core.plan.megatron.megatron_bytes`: the parameter
    buffer, the whole contiguous gradient buffer (fp32 under bf16) and the sharded states. The
    fp32 main gradient a 16-bit gradient buffer is cast to exists at the step only
    (:func:`optimizer_step_items`). ``--optimizer-cpu-offload`` (offload ``optimizer``; Megatron's
    ``--optimizer-offload-fraction`` 1.0, arguments.py L2918-2923) keeps the states and an fp32
    gradient shard on the host."""
    states = _state_bytes_per_param(precision, optimizer, state_bytes)
    per_param = megatron_bytes(precision, states, assumptions.megatron_fp32_main_grads)
    n = shard if strategy == "zero1" else 1
    parameters = per_param.parameters * num_params
    gradients = per_param.grad_buffer * num_params
    optimizer_states = round(per_param.optimizer * num_params) // n
    if offload == "none":
        return ModelStates(parameters, gradients, optimizer_states)
    return ModelStates(parameters, gradients, 0, optimizer_states + 4 * num_params // n)


def stage_model_states(
    stage: StageShape, knobs: PlanKnobs, assumptions: Assumptions = Assumptions(), state_bytes: float | None = None
) -> ModelStates:
    """Model states of one rank of ``stage``: :func:`model_states`, with expert parallelism split
    in two. The non-expert parameters are sharded over the data-parallel shard group as usual;
    the rank's ``num_experts/ep`` experts (``stage.experts``) only over the expert-data-parallel
    group, ``shard/ep`` ranks: the ranks holding the same experts (DeepSpeed-MoE, arXiv
    2201.05596 sec. 5.1, expert + data parallelism; torchtitan parallel_dims.py shards experts
    with FSDP over dp_shard/ep)."""
    k = knobs
    count_states = megatron_model_states if uses_megatron_ddp(k) else model_states

    def states(count: int, shard: int) -> ModelStates:
        return count_states(count, k.strategy, shard, k.precision, k.optimizer, k.offload, assumptions, state_bytes)

    dense = states(stage.params - stage.experts, k.shard_group_size)
    if not stage.experts:
        return dense
    experts = states(stage.experts, max(1, k.shard_group_size // k.ep))
    return ModelStates(
        dense.parameters + experts.parameters,
        dense.gradients + experts.gradients,
        dense.optimizer_states + experts.optimizer_states,
        dense.host_bytes + experts.host_bytes,
    )


def moe_all_to_all_bytes(model: ModelSpec, knobs: PlanKnobs) -> int:
    """The send and receive buffers of one MoE layer's expert-parallel all-to-all: each of the
    rank's ``b s / tp`` tokens (sequence parallel shards them over TP) goes out as ``top_k``
    hidden-wide copies in the compute dtype, and as many come back (torchtitan
    expert_parallel.py: ``all_to_all_single_autograd`` into a new tensor for dispatch and
    combine). One layer's worth is in flight at a time; the routed copies the experts then
    compute on are the activations counted by :func:`moe_routing_bytes_per_token`."""
    if model.moe is None or knobs.ep <= 1:
        return 0
    tokens = knobs.micro_batch_size * (knobs.seq_len or model.seq_len) // knobs.tp
    return 2 * tokens * model.moe.top_k * model.hidden_size * weight_bytes(knobs.precision)


def zero3_gathered_layer_bytes(largest_layer_params: int, precision: str = "bf16") -> int:
    """ZeRO-3's gathered largest layer: its full parameters and gradients in the parameter dtype."""
    return 2 * param_bytes(precision) * largest_layer_params


def host_bytes_per_node(
    states: ModelStates,
    strategy: str,
    rank_params: int,
    largest_layer_params: int,
    gpus_per_node: int,
    assumptions: Assumptions = Assumptions(),
    precision: str = "bf16",
) -> int:
    """Host memory a node needs: start-up (each process builds its model, or one layer of it
    under zero.Init / meta-device init: fp32, or bf16 for pure bf16) or the offloaded state,
    whichever is larger, times DeepSpeed's additional buffer factor."""
    sharded_init = assumptions.sharded_init and strategy in ("zero3", "fsdp-full", "fsdp-hybrid", "fsdp-grad-op")
    built = 2 if precision == "bf16-pure" else 4  # the model's dtype at construction
    init = built * (largest_layer_params if sharded_init else rank_params) * gpus_per_node
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
    in_flight: int  # (micro-batch, model chunk) pairs whose activations it holds at once
    outside_blocks: int = 0  # embeddings, final norm and head on this rank: FSDP2's root unit
    block: int = 0  # one transformer block on this rank (0 when the architecture is not known)
    chunks: int = 1  # model chunks on this rank (the interleaved schedule's virtual stages)
    experts: int = 0  # of ``params``, the expert parameters (num_experts/ep experts' share under EP)


def stage_shapes(
    params: ParamCount,
    tp: int,
    pp: int,
    micro_batches: int,
    tied: bool,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    ep: int = 1,
) -> list[StageShape]:
    """The first and (when pp > 1) last pipeline rank; the middle ones are never heavier.

    Layers split as evenly as they can (the heaviest rank gets ceil(L/pp), or ``v`` chunks of
    ceil(L/(pp v)) when interleaved). Linears, the embedding and the head are split over TP
    (vocab-parallel); norms are replicated. What each rank holds in flight follows the
    schedule (:func:`fstrain.core.plan.pipeline.in_flight_chunks`). Expert parallelism keeps
    ``num_experts/ep`` experts per rank (DeepSpeed-MoE, arXiv 2201.05596 sec. 5.1): a block's
    expert parameters are divided by ``ep`` (the router stays whole on every rank).
    """
    chunks = virtual_stages if pp > 1 else 1
    layers = layers_per_rank(params.num_layers, pp, chunks)
    # 0 without EP: the experts are then sharded like any other parameter (and counted as such).
    experts_rank = params.ffn_per_layer // tp // ep if params.router_per_layer and ep > 1 else 0
    block_sharded = params.per_layer - params.norms_per_layer
    block_rank = block_sharded // tp + params.norms_per_layer
    if experts_rank:
        block_rank = (block_sharded - params.ffn_per_layer) // tp + experts_rank + params.norms_per_layer
    embedding = (params.embedding + params.position_embedding) // tp
    # A tied head on its own stage keeps a copy of the embedding (Megatron syncs their grads).
    # A classification head (loss "none") is small and kept whole on the last stage.
    tied_copy = tied and pp > 1 and params.vocab_head
    head = (params.embedding if tied_copy else params.head) // tp + params.classifier
    largest = params.largest_module // tp
    first_params = layers * block_rank + embedding
    if pp == 1:
        total = first_params + head + params.final_norm
        return [StageShape(total, layers, largest, max(block_rank, embedding, head), True, 1,
                           embedding + head + params.final_norm, block_rank, experts=layers * experts_rank)]
    first = StageShape(first_params, layers, largest, max(block_rank, embedding), False,
                       in_flight_chunks(schedule, pp, micro_batches, 0, chunks), embedding, block_rank, chunks,
                       layers * experts_rank)
    last_params = layers * block_rank + head + params.final_norm
    last = StageShape(last_params, layers, largest, max(block_rank, head), True,
                      in_flight_chunks(schedule, pp, micro_batches, pp - 1, chunks), head + params.final_norm,
                      block_rank, chunks, layers * experts_rank)
    return [first, last]


def with_replicated_embedding(stage: StageShape, embedding_params: int, knobs: PlanKnobs) -> StageShape:
    """``stage`` with the token embedding whole on every TP rank under ``tp_replicated_logits``
    (:func:`fstrain.core.plan.fsdp2habits.replicated_embedding_extra`): in its model states, its
    FSDP root unit and, when larger than a block, its largest unit."""
    extra = replicated_embedding_extra(embedding_params, knobs)
    if not extra:
        return stage
    return replace(stage, params=stage.params + extra, outside_blocks=stage.outside_blocks + extra,
                   fsdp_unit=max(stage.fsdp_unit, embedding_params),
                   largest_layer=max(stage.largest_layer, embedding_params))


def ffn_width(model: ModelSpec) -> int:
    """The width of one FFN: the dense one's, or one expert's."""
    return model.ffn_hidden_size if model.moe is None else model.moe.expert_ffn_hidden_size


def replicated_split(tp: int, sequence_parallel: bool) -> int:
    """How many ways the tensors TP replicates (norm inputs, the residual stream) are split:
    ``tp`` with sequence parallelism, else none."""
    return tp if (sequence_parallel and tp > 1) else 1


def block_matmuls(model: ModelSpec) -> list[tuple[int, int]]:
    """(in, out) widths of a block's matmuls in forward order, per token (MoE: one expert).

    The order is the bundled trainer's and torchtitan's Llama: q, k, v, o, then gate (w1), up
    (w3), down (w2) for SwiGLU, or up, down for GeLU. Op-level selective AC saves the outputs
    of the 1st, 3rd, 5th, ... of them.
    """
    h, q_width, kv_width = model.hidden_size, model.q_width, model.kv_width
    attention = [(h, q_width), (h, kv_width), (h, kv_width), (q_width, h)]
    return attention + ffn_matmuls(model, ffn_width(model))


def ffn_matmuls(model: ModelSpec, width: int) -> list[tuple[int, int]]:
    """(in, out) widths of one FFN of ``width``: gate, up, down (gated) or up, down (GeLU)."""
    h = model.hidden_size
    return [(h, width), (h, width), (width, h)] if model.gated else [(h, width), (width, h)]


def shared_expert_matmuls(model: ModelSpec) -> list[tuple[int, int]]:
    """(in, out) widths of the shared expert every token runs besides its routed ones (Qwen2-MoE,
    DeepSeek), with Qwen2-MoE's hidden -> 1 gate last; empty without one."""
    if model.moe is None or not model.moe.shared_ffn_hidden_size:
        return []
    gate = [(model.hidden_size, 1)] if model.moe.shared_expert_gate else []
    return ffn_matmuls(model, model.moe.shared_ffn_hidden_size) + gate


def converted_linears(model: ModelSpec) -> list[tuple[int, int]]:
    """(in, out) widths of the linears an fp8 converter swaps, per block, in forward order.

    torchtitan's float8 converter swaps every ``nn.Linear`` its filter lets through, and its
    Llama configs filter the output layer (torchtitan models/llama3/train_configs/llama3_8b.toml
    @01424cb: ``filter_fqns = "output"``; converters skip dims not divisible by 16, which no
    shipped shape has); llm-foundry's ``fc_type: te`` swaps the blocks' attention and FFN
    linears, and MPT's head is the tied embedding. So: the blocks' linears. A mixture of
    experts converts its attention projections only: the experts are grouped matmuls, not
    ``nn.Linear`` (torchtitan converts them with a separate, rowwise converter).
    """
    matmuls = block_matmuls(model)
    return matmuls[:4] if model.moe is not None else matmuls


def fp8_gathered_block_params(model: ModelSpec | None, knobs: PlanKnobs) -> int:
    """Parameters of one block on this rank that FSDP gathers in fp8 (``knobs.fp8_all_gather``):
    the converted linears' weights. torchao's ``WeightWithDynamicFloat8CastTensor``
    (torchao/float8/fsdp_utils.py) casts the local shard to fp8 in ``fsdp_pre_all_gather``, so the
    all-gather and the gathered weight are one byte an element."""
    if model is None or not knobs.fp8_all_gather:
        return 0
    return sum(n_in * n_out for n_in, n_out in converted_linears(model)) // knobs.tp


def fp8_cast_bytes(model: ModelSpec, knobs: PlanKnobs) -> int:
    """Bytes of the fp8 copies one converted linear's backward holds at once (the largest).

    torchao's ``matmul_with_hp_or_float8_args`` (pytorch/ao torchao/float8/float8_linear.py
    @7ca1bfb) saves the high-precision input and weight for backward
    (``ctx.save_for_backward(input_hp, weight_hp_t)``), so the stored activations are bf16's. Its
    backward casts, one byte per element, the output gradient twice (for grad-input and for
    grad-weight), the weight and the input again, and holds all four until it returns:
    ``2 M N + K N + M K`` bytes for ``M = b s`` tokens, ``1/tp`` of them on a tensor-parallel
    rank. The forward's casts (input and weight) are fewer and freed before backward.
    """
    tokens = knobs.micro_batch_size * knobs.seq_len
    largest = max(2 * tokens * n_out + n_in * n_out + tokens * n_in for n_in, n_out in converted_linears(model))
    return largest // knobs.tp


def _selective_op_saved(model: ModelSpec, s: int, b: int, a: int, flash_attention: bool,
                        compiled: bool = False) -> int:
    """Bytes op-level SAC saves inside one block (sharded by TP): every other matmul output and
    the attention kernel's outputs (output + fp32 log-sum-exp). A mixture of experts saves none of
    its own: torchtitan recomputes the router's matmul without counting it, and the experts'
    grouped matmuls are not in its save list (fstrain.train.checkpointing). Compiled, the block's
    last matmul (the down projection, read only by the residual add) is not kept even when the
    policy marks it saved: the partitioner drops what backward never reads."""
    mms = block_matmuls(model)
    if model.moe is not None:
        mms = mms[:4]  # q, k, v, o
    elif compiled:
        mms = mms[:-1]
    saved = 0
    for index, (_, out) in enumerate(mms):
        if index % 2 == 0:  # 1st, 3rd, ... (counting from 1: odd)
            saved += out
    saved *= s * b * a
    if flash_attention:
        saved += s * b * model.q_width * a + 4 * model.num_heads * s * b
    return saved


def moe_routing_bytes_per_token(model: ModelSpec, a: int) -> int:
    """What a mixture-of-experts block keeps per token besides its normalised input (which the
    router reads, as a dense FFN's first matmul does) and the experts' FFN-wide tensors, in the
    bundled trainer's dropless dispatch (fstrain.train.model.MoE, torchtitan's): the top_k routed
    copies of the input the experts read and their top_k outputs before weighting (each
    ``top_k x hidden`` in the compute dtype), the router's fp32 probabilities (experts), the top-k
    indices, the sort order and each copy's token (three int64 per copy), the fp32 top-k weights
    and their sum (the renormalisation) and the weights in the compute dtype. 0 for a dense model."""
    if model.moe is None:
        return 0
    k, experts = model.moe.top_k, model.moe.num_experts
    # An fp32 router keeps its input's fp32 copy for its weight's gradient (no copy in fp32).
    router_input = 4 * model.hidden_size if model.moe.router_dtype == "fp32" and a < 4 else 0
    return 2 * k * model.hidden_size * a + 4 * experts + 3 * 8 * k + 4 * k + 4 + a * k + router_input


def shared_expert_bytes_per_token(model: ModelSpec, a: int, compiled: bool = False) -> int:
    """What a shared expert keeps per token, counted as the dense FFN it is (its FFN-wide tensors;
    its input is the normed hidden state the router reads, kept already) and, gated (Qwen2-MoE),
    its output and the gate's sigmoid, which their product keeps. The bundled trainer does not
    build shared experts, so unlike the rest of the block this is not checked against autograd."""
    if model.moe is None or not model.moe.shared_ffn_hidden_size:
        return 0
    tensors = swiglu_saved_tensors(compiled) if model.gated else 2
    gate = (model.hidden_size + 1) * a if model.moe.shared_expert_gate else 0
    return tensors * model.moe.shared_ffn_hidden_size * a + gate


def qk_norm_bytes_per_token(model: ModelSpec, a: int, fused_norm: bool) -> int:
    """What one token's q and k norms keep (sharded with the heads under TP): an eager RMSNorm its
    fp32 input, its output in the compute dtype and a 4-byte 1/rms per normalised row (per head
    for Qwen3's per-head norm, one for OLMo 2's whole projection); a fused one its input in the
    compute dtype and the 1/rms. Checked against autograd (tests/unit/test_activation_grid.py)."""
    if model.qk_norm == "none":
        return 0
    width = model.q_width + model.kv_width
    rows = model.num_heads + model.num_kv_heads if model.qk_norm == "head" else 2
    return (a if fused_norm else 4 + a) * width + 4 * rows


def post_norm_bytes_per_token(model: ModelSpec, a: int, autocast: bool, fused_norm: bool) -> int:
    """What one token's two post-sublayer norms keep (Gemma 2 and 3; hidden-wide, replicated under
    TP without SP). Their input is the sublayer's output, in the compute dtype, and the residual
    add after them keeps nothing, so each keeps what a norm keeps of such an input: an eager
    RMSNorm its fp32 copy, its output and 1/rms; a LayerNorm or a fused RMSNorm its input and its
    fp32 statistics (a LayerNorm under autocast, which runs it in fp32, one more). Checked against
    autograd (tests/unit/test_activation_grid.py)."""
    h = model.hidden_size
    if model.norm == "rmsnorm" and not fused_norm:
        return 2 * (4 * h + 4 + a * h)
    return 2 * (a * h + 4 + (4 if model.norm == "layernorm" and autocast else 0))


def layer_activation_bytes(
    model: ModelSpec,
    micro_batch: int,
    seq_len: int,
    tp: int = 1,
    ac: str = "none",
    flash_attention: bool = True,
    precision: str = "bf16",
    sequence_parallel: bool = True,
    compiled: bool = False,
    fused_rmsnorm: bool = False,
    fused: FusedBlock = EAGER_BLOCK,
    gathered_input_bytes: int = 0,
) -> int:
    """Activations one transformer block saves for backward, per GPU, under policy ``ac``
    (``none``, ``selective-op``, ``megatron-selective`` or ``full``; see
    :mod:`fstrain.core.plan.acpolicy`; ``every-k:N`` mixes full and none, see
    :func:`stage_activation_bytes`).

    Without FlashAttention: Korthikanti et al. 2022 section 4.1 with 16-bit activations,
    generalised: Q/K/V widths follow GQA; GeLU saves 2 ffn-wide tensors, SwiGLU 4 (gate input,
    gate output, up output, product); dropout masks (1 byte) only when dropout > 0. For GPT (MHA,
    GeLU 4h, dropout) this is ``sbh(34 + 5as/h)``, and ``sbh(10 + 24/t + 5as/(ht))`` with TP but
    no SP. With it: PyTorch eager with SDPA, op by op (what the bundled trainer and torchtitan
    run; ``fstrain plan --trace`` checks it); ``megatron-selective`` then stores what ``none`` does
    but the attention kernel's fp32 log-sum-exp.

    Under autocast (``amp-*``) the matmuls and SDPA save their inputs' low-precision casts (each
    linear its own cast of a shared input: q, k and v three, SwiGLU's gate and up two), but
    the residual stream stays fp32 (so does a checkpointed block's input), and the norms run in
    fp32 (``layer_norm`` is on autocast's fp32 list; an RMSNorm over an fp32 input computes in
    fp32): each keeps an fp32 output where the other modes keep a compute-dtype one (a LayerNorm
    both fp32 statistics); eager
    attention's ``softmax`` (fp32 list) keeps an fp32 output beside the cast its matmul saves.
    Pure bf16 saves what bf16 mixed precision does (the same compute dtype, the same ops).

    ``compiled`` (torch.compile of the block) and ``fused_rmsnorm`` (a fused norm kernel) keep
    less, as :mod:`fstrain.core.plan.kernels` describes: a fused RMSNorm keeps what a LayerNorm does,
    compiled SwiGLU three FFN-wide tensors, compiled op-level SAC no down-projection output.

    ``fused``: flash-attention's fused kernels (:class:`~fstrain.core.plan.kernels.FusedBlock`):
    its FusedMLP keeps ``2 - checkpoint_lvl`` of GeLU's two FFN-wide tensors, and its fused
    dropout-add-norm keeps the residual, the row statistics and a dropout seed per row in place of
    each norm's input and statistics and the 1-byte dropout mask; under autocast its packed q/k/v
    linear saves one cast of its input, not three.

    ``gathered_input_bytes``: with sequence parallelism, the q/k/v and FFN linears keep their
    input all-gathered to the whole sequence, that many bytes an element (0: kept as the rank's
    sequence shard, Megatron-LM's and nanotron's re-gather in backward;
    :func:`sp_gathered_input_bytes`).
    """
    a = weight_bytes(precision)
    autocast = mode(precision).autocast
    r = residual_bytes(precision)  # block inputs and norm outputs
    s, b, h = seq_len, micro_batch, model.hidden_size
    sbh = s * b * h
    split_replicated = replicated_split(tp, sequence_parallel)
    if ac == "full" or ac.startswith("every-k:"):
        return sbh * r // split_replicated  # only the block's input is kept
    if ac == "selective-op":
        saved = _selective_op_saved(model, s, b, a, flash_attention, compiled)
        return sbh * r // split_replicated + saved // tp
    mask = 1 if model.dropout > 0 else 0
    # The q/k/v and FFN inputs: one tensor each, but under autocast every linear saves its own
    # cast of the shared input (q, k and v; gate and up), since only weights are cached.
    qkv_casts = 1 if fused.packed_qkv else 3
    linear_inputs = (qkv_casts + (2 if model.gated else 1)) if autocast else 2
    q_width, kv_width = model.q_width, model.kv_width
    ffn = ffn_width(model)
    tokens_per_expert_slot = 1 if model.moe is None else model.moe.top_k
    ffn_tensors = swiglu_saved_tensors(compiled) if model.gated else 2 - fused.mlp_recomputed
    ffn_saved = ffn_tensors * s * b * ffn * tokens_per_expert_slot * a
    fused_norm = norm_is_fused(compiled, fused_rmsnorm)
    moe_extra = s * b * (moe_routing_bytes_per_token(model, a) + shared_expert_bytes_per_token(model, a, compiled)
                         + qk_norm_bytes_per_token(model, a, fused_norm))
    post_norms = s * b * post_norm_bytes_per_token(model, a, autocast, fused_norm) if model.post_norms else 0
    if flash_attention:
        # PyTorch eager with SDPA (the bundled trainer, torchtitan), counted op by op and checked
        # against what autograd saves (tests/unit/test_activation_grid.py): an RMSNorm keeps its
        # fp32 input and 1/rms and its output in the compute dtype (LayerNorm: its input and one
        # fp32 statistic); the q/k/v and FFN inputs; SDPA keeps q, K and V repeated to all heads
        # (GQA), its output and the fp32 log-sum-exp; the out-projection input is a contiguous
        # copy of that output; rotary positions add a rotated copy of q.
        eager_rmsnorm = model.norm == "rmsnorm" and not fused_norm
        norm = (4 * h + 4 + r * h) if eager_rmsnorm else (r * h + 4 + (4 if autocast else 0))
        norms = 2 * s * b * norm + 2 * mask * sbh  # with the residual dropouts' masks
        if fused.dropout_add_ln:
            norms = 2 * s * b * fused_norm_saved_bytes(model, r)
        replicated = norms + post_norms + s * b * linear_inputs * a * h
        gathered = 0
        if gathered_input_bytes and split_replicated > 1:
            replicated -= s * b * linear_inputs * a * h
            gathered = s * b * linear_inputs * gathered_input_bytes * h
        q_copies = 5 if model.position_embedding == "rope" else 4
        # Megatron's selective recompute checkpoints the attention kernel (attention.py L1555-1556):
        # its inputs q, k, v stay saved and its output is the out-projection's saved input, so only
        # the kernel's own fp32 log-sum-exp is not kept.
        lse = 0 if ac == "megatron-selective" else 4 * model.num_heads * s * b
        sharded = q_copies * s * b * q_width * a + lse + ffn_saved + moe_extra
        return gathered + replicated // split_replicated + sharded // tp
    # Korthikanti et al. (Megatron): both norm inputs, the QKV and FFN inputs and dropout masks are
    # kept whole under TP without SP; Q, K, V, the out-projection input, the FFN tensors and the
    # attention core are split. Eager attention keeps the softmax output (and, with dropout, its
    # mask and the dropped-out output).
    norms = 2 * s * b * fused_norm_saved_bytes(model, r) if fused.dropout_add_ln else 2 * sbh * r + 2 * mask * sbh
    replicated = norms + post_norms + linear_inputs * sbh * a
    gathered = 0
    if gathered_input_bytes and split_replicated > 1:
        replicated -= linear_inputs * sbh * a
        gathered = linear_inputs * sbh * gathered_input_bytes
    sharded = s * b * (q_width + 2 * kv_width) * a + s * b * q_width * a + ffn_saved + moe_extra
    if ac == "none":
        # Softmax saves its output, dropout its mask, and the AV matmul its input (the dropped-out
        # probabilities); under autocast the softmax output is fp32 and the matmul saves a 16-bit
        # cast of whichever tensor feeds it, so dropout's fp32 output is not kept.
        probs = 4 + a if autocast else a
        sharded += model.num_heads * s * s * b * (probs + mask * (1 if autocast else 1 + a))
    return gathered + replicated // split_replicated + sharded // tp


def sp_gathered_input_bytes(knobs: PlanKnobs, assumptions: Assumptions = Assumptions()) -> int:
    """Bytes an element of the all-gathered linear inputs a block keeps whole under sequence
    parallelism (``tp > 1``); 0 where it keeps only its sequence shard.

    torch's DTensor tensor parallelism (torchtitan, the TP plans of the torch-native frameworks)
    all-gathers a block's sequence-sharded input to ``Replicate`` at the attention's and the
    FFN's boundary (pytorch/torchtitan@b5bcd76 torchtitan/models/common/decoder_sharding.py
    L233-238 and L329-330: ``in_dst_shardings`` with ``tp=spmd.R``; @81c1243
    torchtitan/models/llama3/infra/parallelize.py ``apply_tp``: ``PrepareModuleInput(...
    desired_input_layouts=(Replicate(), None))``), and the column-parallel q/k/v and FFN linears
    save that gathered tensor for their weight gradients: ``s b h`` each, not ``s b h / t``.
    Megatron-LM saves the shard and gathers it again in backward into its global buffer
    (megatron/core/tensor_parallel/layers.py @d98e8a6 L604 ``ctx.save_for_backward(input,
    weight)`` before the all-gather at L627-629); nanotron does the same
    (``tp_recompute_allgather``): the profiles with ``tp_gather_buffer``. DeepSpeed's ZeRO runs
    tensor parallelism through Megatron-style layers the training script brings (Megatron-DeepSpeed,
    ATorch's 3D example: ``deepspeed.initialize(mpu=...)``), so its strategies keep the shard too.
    With fp8 linears torchtitan gathers in fp8 (``PrepareFloat8ModuleInput``), one byte an element."""
    if (knobs.tp == 1 or not assumptions.sequence_parallel or knobs.strategy in ZERO_STRATEGIES
            or profile(knobs.framework).tp_gather_buffer):
        return 0
    return 1 if knobs.fp8 else weight_bytes(knobs.precision)


# How long the compute-dtype weight gradients autograd writes stay on the GPU: FSDP keeps a
# block's until the block's backward ends (then copies them for the reduce-scatter); DeepSpeed
# ZeRO-2/3 copies each into its reduce bucket from the parameter's gradient hook; DDP's and
# ZeRO-1's gradients are a buffer that stays (counted with the model states).
WEIGHT_GRADS_IN_FLIGHT = {"fsdp-full": "block", "fsdp-grad-op": "block", "fsdp-hybrid": "block",
                          "zero2": "each", "zero3": "each"}


def block_backward_extra_bytes(
    model: ModelSpec,
    micro_batch: int,
    seq_len: int,
    tp: int = 1,
    precision: str = "bf16",
    sequence_parallel: bool = True,
    weight_grads: str = "block",
    grad_bytes: int | None = None,
    compiled: bool = False,
    fused_rmsnorm: bool = False,
    fused: FusedBlock = EAGER_BLOCK,
) -> int:
    """What one block's backward holds at its highest point beyond the tensors it saved (the
    ``none`` set, recomputed or kept): the gradient arriving from the next block, the gradients
    of its intermediate tensors, the fp32 temporaries of an eager RMSNorm's backward, and the
    weights' gradients in the compute dtype while they wait to be reduced (``weight_grads``:
    ``block`` keeps a whole block's, ``each`` one weight's at a time, ``none`` none in flight;
    ``grad_bytes``: their dtype, the parameters' as the model holds them, default the compute dtype).
    Followed op by op on PyTorch's eager kernels (fake tensors, the bundled trainer's block);
    the peak is at one of two points:

    - in the FFN's backward, after the down projection: its weight gradient, the gradient of its
      input, and (SwiGLU) the gradients of the gate and up outputs;
    - SwiGLU with RMSNorm: in the second norm's backward, after the FFN: the FFN weights'
      gradients, the FFN's saved tensors freed, two hidden-wide input gradients (gate and up
      projections) and three fp32 hidden-wide temporaries of the norm's backward.

    Wide, short blocks (Llama 3.1 405B at 8K tokens) and mixtures of experts (Mixtral: every
    expert's gradients, against the FFN tensors of the top-k routed copies) peak at the second
    point, narrow ones with many tokens (8B) at the first. ``fstrain plan --trace`` checks both
    against PyTorch. A fused norm (``compiled``, ``fused_rmsnorm``) computes its backward in one
    kernel without the fp32 temporaries; compiled SwiGLU frees three saved FFN-wide tensors, not four.
    flash-attention's FusedMLP at ``checkpoint_lvl`` 1 or 2 recomputes in its backward the
    FFN-wide tensors it did not save (fused_dense.py @0251105 L368-395), so they are here.

    Under tensor parallelism the hidden-wide gradients around the linears are whole even with
    sequence parallelism: a row-parallel linear's backward gathers its output's gradient to the
    full sequence, and a column-parallel one computes its input's gradient for the full sequence
    before the reduce-scatter (Megatron-LM @d98e8a6 megatron/core/tensor_parallel/layers.py L683
    ``grad_input = grad_output.matmul(weight)``, reduce-scattered into a shard at L700-709; DTensor's
    ``Replicate`` input takes a ``Partial`` gradient of the same size). Only the norm's fp32
    temporaries run on the sequence shard.
    """
    a = weight_bytes(precision)
    tokens = seq_len * micro_batch
    split = replicated_split(tp, sequence_parallel)
    ffn = ffn_width(model)
    experts, top_k = (1, 1) if model.moe is None else (model.moe.num_experts, model.moe.top_k)
    hidden = tokens * model.hidden_size * a  # one hidden-wide gradient, the whole sequence under TP
    wide = tokens * top_k * ffn * a // tp  # one FFN-wide tensor (MoE: of every routed copy)
    # One FFN matrix's gradient (MoE: every expert's; the grouped matmul computes them at once).
    weight = experts * model.hidden_size * ffn * (grad_bytes or a) // tp if weight_grads != "none" else 0
    if not model.gated:
        return hidden + (1 + fused.mlp_recomputed) * wide + weight
    kept = weight if weight_grads == "block" else 0  # the down projection's, while its input's flow on
    in_ffn = hidden + max(weight + wide, kept + 2 * wide)
    if model.norm != "rmsnorm":
        return in_ffn
    fp32_hidden = 0 if norm_is_fused(compiled, fused_rmsnorm) else tokens * model.hidden_size * 4 // split
    ffn_weights = 3 * weight if weight_grads == "block" else 0
    in_norm = hidden + ffn_weights - swiglu_saved_tensors(compiled) * wide + 2 * hidden + 3 * fp32_hidden
    return max(in_ffn, in_norm)


def block_kernels(assumptions: Assumptions) -> FusedBlock:
    """The fused kernels of a block the assumptions name (flash-attention's: ``fused_mlp``,
    ``mlp_checkpoint_lvl``, ``fused_dropout_add_ln``, ``packed_qkv``)."""
    return fused_block(assumptions.fused_mlp, assumptions.mlp_checkpoint_lvl, assumptions.fused_dropout_add_ln,
                       assumptions.packed_qkv)


# Buffers holding one block's gradient for its reduction, which only exist from the second
# block's backward on (see _moments).
BLOCK_REDUCE_ITEMS = ("FSDP unsharded gradient (one block)", "FSDP unsharded gradient (one unit)")


def stage_activation_bytes(
    model: ModelSpec,
    stage: StageShape,
    knobs: PlanKnobs,
    assumptions: Assumptions = Assumptions(),
) -> list[tuple[str, int]]:
    """Activation items of one pipeline stage: stored layers, recompute working set, logits."""
    ac = knobs.activation_checkpointing
    fused = block_kernels(assumptions)

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
            knobs.compile,
            knobs.fused_rmsnorm,
            fused,
            sp_gathered_input_bytes(knobs, assumptions),
        )

    # One chunk's blocks per (micro-batch, chunk) pair in flight; with one chunk, the rank's blocks.
    chunk_layers = stage.layers // stage.chunks
    whole = checkpointed_blocks(ac, chunk_layers)
    if ac.startswith("every-k:"):
        stored = (whole * per_layer("full") + (chunk_layers - whole) * per_layer("none")) * stage.in_flight
    else:
        stored = per_layer(ac) * chunk_layers * stage.in_flight
    label = f"{stage.layers} layers x {stage.in_flight} micro-batch" + ("es" if stage.in_flight > 1 else "")
    if stage.chunks > 1:
        label = f"{stage.chunks} chunks of {chunk_layers} layers, {stage.in_flight} chunk micro-batches in flight"
    kernels = fused.describe()
    items = [(f"activations ({label}, AC {ac}{', ' + kernels if kernels else ''})", stored)]
    if recomputes(ac):
        # A recomputed block's backward rebuilds what it did not keep (Megatron's selective: one
        # layer's attention core, the s^2 scores without FlashAttention).
        working = per_layer("none") - (per_layer(ac) if ac in ("selective-op", "megatron-selective") else 0)
        items.append((RECOMPUTE_ITEM, working))
    in_flight = WEIGHT_GRADS_IN_FLIGHT.get(knobs.strategy, "none")
    temporaries = block_backward_extra_bytes(model, knobs.micro_batch_size, knobs.seq_len, knobs.tp,
                                             knobs.precision, assumptions.sequence_parallel, in_flight,
                                             param_bytes(knobs.precision), knobs.compile, knobs.fused_rmsnorm,
                                             fused)
    items.append(("backward temporaries (one block)", temporaries))
    vocab = has_vocab_head(knobs.loss)
    if stage.has_head and vocab and knobs.strategy.startswith("fsdp"):
        # FSDP2 reduce-scatters the root unit's gradients after the whole backward, so the head's
        # weight gradient (compute dtype) is live through every block's backward.
        head = (model.vocab_size * model.hidden_size // knobs.tp + model.hidden_size) * param_bytes(knobs.precision)
        items.append(("FSDP root unit's gradient (head, compute dtype)", head))
    if mode(knobs.precision).autocast:
        items += autocast_weight_copies(model, stage, knobs, assumptions)
    if stage.has_head and vocab:
        items.append((HEAD_INPUT_ITEM, head_input_bytes(model, knobs, assumptions.sequence_parallel,
                                                        sp_gathered_input_bytes(knobs, assumptions))))
        items.append((LOGITS_ITEM, loss_bytes(model, knobs, assumptions).peak))
    elif stage.has_head:
        items.append((CLASSIFIER_ITEM, classifier_head_bytes(model, knobs, assumptions.sequence_parallel)))
    return items


def classifier_head_bytes(model: ModelSpec, knobs: PlanKnobs, sequence_parallel: bool = True) -> int:
    """What a model without a vocabulary head (``--loss none``) keeps for its own head's backward.

    The last block's output (``s b h`` in the residual dtype) stays: BERT's pooler reads the
    first token through a view (``hidden_states[:, 0]``), which keeps the whole tensor alive, and a
    per-token head (``LlamaForSequenceClassification``'s ``score``) reads all of it. The pooler
    adds its tanh output and the classifier's input (dropout's output), ``b h`` each in the
    compute dtype, and a 1-byte dropout mask (transformers ``modeling_bert.py``: ``BertPooler``,
    ``BertForSequenceClassification``). The logits (``b x num_labels``) are negligible."""
    a = weight_bytes(knobs.precision)
    h, b = model.hidden_size, knobs.micro_batch_size
    last_hidden = knobs.seq_len * b * h * residual_bytes(knobs.precision) // replicated_split(knobs.tp,
                                                                                               sequence_parallel)
    pooled = b * h * (2 * a + (1 if model.dropout > 0 else 0)) if model.pooler else 0
    return last_hidden + pooled


def block_matmul_params(model: ModelSpec) -> int:
    """Weights of one block's matmuls (every expert of an MoE block)."""
    mms = block_matmuls(model)
    experts = 1 if model.moe is None else model.moe.num_experts
    return sum(i * o for i, o in mms[:4]) + experts * sum(i * o for i, o in mms[4:])


def autocast_weight_copies(
    model: ModelSpec, stage: StageShape, knobs: PlanKnobs, assumptions: Assumptions = Assumptions()
) -> list[tuple[str, int]]:
    """The low-precision casts of the matmul weights that autocast makes each forward.

    A matmul under autocast saves its cast weight for backward, so a block that is not
    checkpointed (and the head) keeps one compute-dtype copy of its weights until its backward.
    Inside a checkpointed block nothing is saved, but autocast caches the cast of every leaf
    weight that requires grad until the outermost autocast region (forward and loss) exits, so a
    copy of every block's weights is live at the loss. The mechanism, torch 2.13:
    ``at::autocast::cached_cast`` (aten/src/ATen/autocast_mode.cpp, declared in the wheel's
    include/ATen/autocast_mode.h) keeps the lower-precision cast of an fp32 tensor that requires
    grad, is a leaf and not a view, while the cache is enabled; ``torch.autocast.__exit__``
    (torch/amp/autocast_mode.py) calls ``torch.clear_autocast_cache()`` only when
    ``autocast_decrement_nesting()`` returns 0. A recomputed block runs under a fresh autocast
    region (torch/utils/checkpoint.py re-enters autocast with the forward's settings), so it
    casts again. tests/unit/test_precision_modes.py shows the cast alive inside the region and
    gone after it on CPU; FSDP2's unsharded parameters are such leaves (not views), FSDP1's flat
    parameter views are not. ATorch's FSDP runs (tests/fixtures/planner/measured) measure within
    3 % with the term and 33-42 % under without it. A script that passes
    ``torch.autocast(cache_enabled=False)`` keeps none: ``--assume autocast_weight_cache=false``.
    """
    a = weight_bytes(knobs.precision)
    per_block = block_matmul_params(model) // knobs.tp
    ac = knobs.activation_checkpointing
    if ac in ("none", "megatron-selective"):
        checkpointed = 0
    elif ac.startswith("every-k:"):
        checkpointed = checkpointed_blocks(ac, stage.layers)
    else:  # full, selective-op
        checkpointed = stage.layers
    head = 0
    if stage.has_head:  # the output head's weights, or (loss none) the classification head's
        h = model.hidden_size
        vocab = model.vocab_size * h // knobs.tp
        head = vocab if has_vocab_head(knobs.loss) else (h * h if model.pooler else 0) + h * model.num_labels
    saved = a * ((stage.layers - checkpointed) * per_block * stage.in_flight + head)
    items = []
    if saved:
        items.append((AUTOCAST_SAVED_ITEM, saved))
    if checkpointed:
        # A recomputed block casts its weights again and saves them for its own backward.
        items.append(("autocast weight casts (recomputed block)", a * per_block))
        if assumptions.autocast_weight_cache:
            items.append((AUTOCAST_CACHE_ITEM, a * checkpointed * per_block))
    return items


def head_input_bytes(model: ModelSpec, knobs: PlanKnobs, sequence_parallel: bool = True,
                     gathered_input_bytes: int = 0) -> int:
    """What the final norm and the output projection keep for backward (the stage with the head):
    the norm's saved tensors, counted as in a block (RMSNorm: its fp32 input, 1/rms and its output;
    LayerNorm: its input and one fp32 statistic), and the head's input in the compute dtype.
    ``gathered_input_bytes`` (:func:`sp_gathered_input_bytes`): with sequence parallelism the head
    keeps its input all-gathered to the whole sequence (torchtitan@b5bcd76
    torchtitan/models/common/decoder_sharding.py L159-178: the final norm's output is
    redistributed to ``tp=spmd.R`` before the output layer); the output layer is not an fp8
    linear, so it keeps the compute dtype."""
    a = weight_bytes(knobs.precision)
    h = model.hidden_size
    norm = (4 * h + 4 + a * h) if model.norm == "rmsnorm" else (a * h + 4)
    split = replicated_split(knobs.tp, sequence_parallel)
    tokens = knobs.seq_len * knobs.micro_batch_size
    if gathered_input_bytes and split > 1:
        return tokens * norm // split + tokens * a * h
    return tokens * (norm + a * h) // split


def loss_bytes(model: ModelSpec, knobs: PlanKnobs, assumptions: Assumptions = Assumptions()) -> LossPeaks:
    """The loss's forward and backward peaks over this rank's logits (``s x b x V / t``), by
    ``--loss`` (:func:`fstrain.core.plan.losses.loss_peaks`); ``logits_bytes_per_element``, when set,
    replaces both with that many bytes per logit. ``tp_replicated_logits``: all ``V`` on every rank."""
    logits = knobs.seq_len * knobs.micro_batch_size * model.vocab_size // logits_split(knobs)
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
    fp8_block_params: int = 0,
) -> list[tuple[str, int]]:
    """Transient buffers the framework keeps through forward and backward, on top of the model
    states (the ones allocated once for good are :func:`persistent_buffer_items`, the ones only
    backward allocates :func:`backward_buffer_items`). For FSDP: :func:`fsdp_unit_items`, and
    under pipeline parallelism the whole stage gathered (``fp8_block_params`` of each block in
    fp8: :func:`fp8_gathered_block_params`)."""
    w = param_bytes(knobs.precision)
    gather, reduce = comm_bytes(knobs.precision, strategy, assumptions)
    reduce_bucket, prefetch_bucket, cap = deepspeed_bucket_elements(stage, knobs, hidden_size, assumptions)
    items: list[tuple[str, int]] = []
    if strategy == "zero3":
        items.append(
            ("ZeRO-3 gathered layer (param + grad)", zero3_gathered_layer_bytes(stage.largest_layer, knobs.precision))
        )
        room = max(0, assumptions.zero3_max_live_parameters - stage.largest_layer)
        prefetch = min(prefetch_bucket, room, stage.params)
        items.append(("ZeRO-3 prefetch", w * prefetch))
        items.append(("DeepSpeed reduce bucket", reduce * min(reduce_bucket, cap)))
    elif strategy in ("fsdp-full", "fsdp-hybrid") and knobs.pp > 1:
        # Under pipeline parallelism torchtitan shards each stage with reshard_after_forward=False
        # (parallelize.py: `reshard_after_forward = not pp_enabled`), and torch's pipeline stage
        # runs every micro-batch's backward with set_reshard_after_backward(False) until
        # perform_reduce_grad after the last one (torch/distributed/pipelining/stage.py): the whole
        # stage stays gathered in the compute dtype through forward and backward.
        items.append((PP_GATHERED_ITEM, stage.params * gather - stage.layers * fp8_block_params * (gather - 1)))
    items += fsdp_unit_items(strategy, stage, knobs, assumptions, fp8_block_params)
    if knobs.pp > 1:
        # A send and a receive buffer of one micro-batch's boundary activations per model chunk.
        boundary = knobs.micro_batch_size * knobs.seq_len * hidden_size * residual_bytes(knobs.precision)
        p2p = 2 * boundary // knobs.tp * stage.chunks
        items.append(("pipeline send/recv", p2p))
    return items


def deepspeed_bucket_elements(
    stage: StageShape, knobs: PlanKnobs, hidden_size: int, assumptions: Assumptions = Assumptions()
) -> tuple[int, int, int]:
    """(reduce bucket, ZeRO-3 prefetch bucket, cap on the reduce bucket) in elements.

    An ``--assume`` wins; then a framework's hand-written config (DeepSpeed's defaults or Hugging
    Face's ``"auto"``: :meth:`~fstrain.core.plan.frameworks.FrameworkProfile.bucket_elements`),
    which DeepSpeed allocates whole whatever the model's size (stage3.py L538, ``torch.empty(
    reduce_bucket_size)``); else what ``fstrain render`` writes, capped at the model's size."""
    rendered = bucket_sizes(stage.params)
    own_reduce, own_prefetch, _ = profile(knobs.framework).bucket_elements(hidden_size)
    reduce_bucket = assumptions.reduce_bucket_elements or own_reduce or rendered["reduce_bucket_size"]
    prefetch = assumptions.zero3_prefetch_bucket_elements or own_prefetch or rendered["stage3_prefetch_bucket_size"]
    cap = reduce_bucket if own_reduce else stage.params
    return reduce_bucket, prefetch, cap


def zero3_persistent_params(model: ModelSpec, stage: StageShape, knobs: PlanKnobs) -> int:
    """Parameters of ``stage`` that ZeRO-3 keeps whole on every GPU under a framework's
    hand-written config: each tensor of at most ``stage3_param_persistence_threshold`` elements
    (norm weights, biases; DeepSpeed partition_parameters.py ``_convert_to_zero_parameters`` marks
    them ``ds_persist``). 0 for the rendered config (a threshold the planner does not count yet)."""
    _, _, threshold = profile(knobs.framework).bucket_elements(model.hidden_size)
    if not threshold or not stage.layers:
        return 0
    small = 0
    for shape in parameter_shapes(model, has_vocab_head(knobs.loss)):
        size = 1
        for dim in shape:
            size *= dim
        small += size if size <= threshold else 0
    return small * stage.layers // model.num_layers


def fsdp_unit_items(
    strategy: str, stage: StageShape, knobs: PlanKnobs, assumptions: Assumptions = Assumptions(),
    fp8_block_params: int = 0,
) -> list[tuple[str, int]]:
    """FSDP's gathered units and unsharded gradient, live while a unit's forward or backward runs
    (gathered in the mode's gather dtype, reduced in its reduce dtype: :func:`comm_bytes`).

    None of them is live in the loss: for full and hybrid sharding the rendered FSDP file reshards
    every unit after its forward, the root unit included (torch's FSDP2 keeps the root gathered
    only when ``reshard_after_forward`` is left unset; grad-op's gathered parameters are counted
    with the model states), and the first gradient comes after the loss. The root unit is gathered
    again for the head's backward and stays so to the end of backward; in backward it is gathered
    beside the current and the prefetched block. Under pipeline parallelism the whole stage stays
    gathered (:data:`PP_GATHERED_ITEM`, not one of these) and only a block's gradient is added.
    """
    gather, reduce = comm_bytes(knobs.precision, strategy, assumptions)
    if strategy == "fsdp-grad-op":
        return [("FSDP unsharded gradient (one unit)", stage.fsdp_unit * reduce)]
    if strategy not in ("fsdp-full", "fsdp-hybrid"):
        return []
    block = stage.block
    if knobs.pp > 1:
        return [("FSDP unsharded gradient (one block)", block * reduce)]
    gathered = (block * gather - fp8_block_params * (gather - 1)) * (1 + assumptions.fsdp_prefetch_units)
    items = [(f"FSDP gathered blocks (1 + {assumptions.fsdp_prefetch_units} prefetched)", gathered)]
    if stage.outside_blocks:
        items.append(("FSDP root unit, gathered (embeddings, final norm, head)", stage.outside_blocks * gather))
    items.append(("FSDP unsharded gradient (one block)", block * reduce))
    staging = fsdp_all_gather_staging_bytes(stage, knobs)
    if staging:
        items.append((FSDP_STAGING_ITEM, staging))
    return items


FSDP_STAGING_ITEM = "FSDP all-gather inputs of the largest unit (cast, or copied from the host)"


def fsdp_all_gather_staging_bytes(stage: StageShape, knobs: PlanKnobs) -> int:
    """What FSDP2 allocates to feed the all-gather of its largest unit (the root, or a block),
    beside the gathered output: the inputs are the rank's shards, and where they are not already
    in the gather dtype on the GPU each is made anew (torch 2.13 torch/distributed/fsdp/
    _fully_shard/_fsdp_collectives.py ``_get_param_all_gather_inputs`` L382-430: under a
    MixedPrecisionPolicy one flat buffer of the unit's shards cast to ``param_dtype``; with
    CPUOffloadPolicy each shard is copied from the host, ``_fsdp_param.py`` L895-900
    ``sharded_param_data.to(self.device, non_blocking=True)``, and cast). They are made before the
    output is allocated and live until the all-gather is issued (``foreach_all_gather``); the
    all-gather input is a view of the output (``all_gather_copy_in_cuda``, L263-276). So a unit of
    ``P`` parameters sharded ``N`` ways holds ``2P/N`` bytes of casts beside its ``2P`` output
    (an offloaded parameter's fp32 host copy, ``4/N`` a parameter, is freed by its cast before the
    output exists); without a policy an offloaded unit holds its host copies in the parameter
    dtype, and a unit on the GPU nothing (the shards are the inputs). At ``N = 1``, FSDP with CPU
    offload on one GPU, the casts are as large as the gathered unit. Without offload a
    MixedPrecisionPolicy's casts are counted nowhere: PyTorch's trace of FSDP2 (transformers'
    Mistral 7B, 8 ranks, full AC, tests/unit/test_trace_hf.py) holds none of them at the
    backward peak, which comes after the prefetched unit's casts were copied in and freed."""
    m = mode(knobs.precision)
    offloaded = knobs.offload == "optimizer+params"
    policy = m.master_bytes > 0  # a MixedPrecisionPolicy casts the fp32 shards to the compute dtype
    if not offloaded:
        return 0
    unit = max(stage.outside_blocks, stage.block)
    return (m.compute_bytes if policy else m.param_bytes) * unit // max(1, knobs.shard_group_size)


def persistent_buffer_items(
    strategy: str, stage: StageShape, knobs: PlanKnobs, assumptions: Assumptions = Assumptions()
) -> list[tuple[str, int]]:
    """Buffers allocated once that stay through every moment, the optimizer step included.
    Megatron's DDP has none: its gradient buffer (a model state) is its bucket."""
    w = param_bytes(knobs.precision)
    if uses_megatron_ddp(knobs):
        return []
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
    assumptions: Assumptions = Assumptions(),
    hidden_size: int = 0,
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
    if strategy not in ("zero1", "zero2") or uses_megatron_ddp(knobs):
        return []  # Megatron's distributed optimizer reduce-scatters in place in its gradient buffer
    _, w = comm_bytes(knobs.precision, strategy, assumptions)
    reduce_bucket, _, cap = deepspeed_bucket_elements(stage, knobs, hidden_size, assumptions)
    copies = 1 if knobs.pp > 1 else 2
    label = "DeepSpeed reduce bucket" if copies == 1 else "DeepSpeed reduce buckets (2, overlap_comm)"
    return [(label, copies * w * min(reduce_bucket, cap))]


def optimizer_step_items(
    knobs: PlanKnobs,
    states: ModelStates,
    stage: StageShape | None = None,
    assumptions: Assumptions = Assumptions(),
) -> list[tuple[str, int]]:
    """Temporaries of the optimizer update. torch's AdamW (FSDP, DDP) runs ``foreach`` kernels on
    GPU, whose ``_foreach_sqrt`` of the second moment is one fp32 copy of the local shard; measured
    on an H200 (the bundled trainer, Llama 3.1 8B with 8 layers: optimizer-step peak = parameters +
    gradients + states + 4 bytes per local parameter). DeepSpeed's fused Adam updates in place.
    A per-parameter AdamW (``--assume adamw_foreach=false``: Hugging Face's ``AdamW``, the
    Trainer's ``optim="adamw_hf"``, ``denom = exp_avg_sq.sqrt().add_(eps)``) holds one fp32 copy
    of one parameter at a time: the largest (``stage.largest_layer``, a module's weight with its
    bias). Adafactor: :func:`fstrain.core.plan.adafactor.step_temporary_bytes`. Megatron's
    optimizers (TE's or apex's fused Adam) update in place; a 16-bit gradient buffer is cast to
    fp32 main gradients for the step (:mod:`fstrain.core.plan.megatron`), over the rank's shard
    with the distributed optimizer."""
    if uses_megatron_ddp(knobs):
        return megatron_step_items(knobs, stage, assumptions)
    if knobs.offload != "none":
        return []
    if knobs.optimizer == "adafactor" and stage is not None:
        local = stage.params // (1 if knobs.strategy == "ddp" else knobs.shard_group_size)
        temporaries = step_temporary_bytes(knobs.strategy, knobs.precision, stage.largest_layer, local)
        return [("Adafactor update temporaries", temporaries)]
    if knobs.optimizer != "adamw" or knobs.strategy.startswith("zero"):
        return []
    if not assumptions.adamw_foreach and stage is not None:
        return [("AdamW temporaries (one parameter)", 4 * stage.largest_layer)]
    return [("AdamW foreach temporaries", states.optimizer_states // 2)]


MEGATRON_STEP_GRADS_ITEM = "Megatron fp32 main gradients (16-bit gradient buffer, at the step)"


def megatron_step_items(
    knobs: PlanKnobs, stage: StageShape | None, assumptions: Assumptions = Assumptions()
) -> list[tuple[str, int]]:
    """The fp32 main gradients Megatron's optimizer casts a 16-bit gradient buffer to at the
    step (distrib_optimizer.py L2792 ``shard_model_grad.float()``; freed by ``zero_grad`` before
    the next forward), on the GPU unless the optimizer is offloaded; none with an fp32 buffer."""
    if stage is None or knobs.offload != "none":
        return []
    per_param = megatron_bytes(knobs.precision, fp32_main_grads=assumptions.megatron_fp32_main_grads)
    shard = knobs.shard_group_size if knobs.strategy == "zero1" else 1
    copy = per_param.step_grad_copy * stage.params // shard
    return [(MEGATRON_STEP_GRADS_ITEM, copy)] if copy else []


def no_sync_gradient_bytes(stage: StageShape, knobs: PlanKnobs) -> int:
    """The unsharded gradients FSDP1 keeps while accumulating under ``no_sync`` (a framework with
    ``fsdp1``: Lightning Fabric's ``no_backward_sync``, Accelerate's ``accumulate``): autograd
    accumulates every micro-batch's gradient into the unsharded flat
    parameter's ``.grad``, in the parameter dtype FSDP gathers in, for the whole stage, and
    reduce-scatters only in the last micro-batch's backward (torch 2.13
    torch/distributed/fsdp/fully_sharded_data_parallel.py L1034-1045 ``no_sync``: "FSDP will
    accumulate the full model gradients (instead of gradient shards) until the eventual sync").
    From the second micro-batch on they are live
    beside its activations. 0 with one micro-batch, under pipeline parallelism (counted by
    :func:`pipeline_fsdp_gradient_bytes`), outside FSDP and for FSDP2 frameworks."""
    if (not knobs.strategy.startswith("fsdp") or knobs.grad_accum_steps == 1 or knobs.pp > 1
            or not profile(knobs.framework).fsdp1):
        return 0
    return stage.params * param_bytes(knobs.precision)


def fsdp1_root_bytes(stage: StageShape, knobs: PlanKnobs, assumptions: Assumptions = Assumptions()) -> int:
    """The root unit FSDP1 keeps gathered from its forward to its backward, so through the loss
    (torch 2.13 torch/distributed/fsdp/_runtime_utils.py L493-498: the post-forward reshard frees
    no root parameters). FSDP2 as ``fstrain render`` writes it reshards the root too. Full and
    hybrid sharding without pipeline parallelism; 0 for FSDP2 frameworks."""
    if (knobs.strategy not in ("fsdp-full", "fsdp-hybrid") or knobs.pp > 1
            or not profile(knobs.framework).fsdp1):
        return 0
    gather, _ = comm_bytes(knobs.precision, knobs.strategy, assumptions)
    return stage.outside_blocks * gather


def framework_persistent_items(
    model: ModelSpec | None, stage: StageShape, knobs: PlanKnobs, assumptions: Assumptions = Assumptions()
) -> list[tuple[str, int]]:
    """What a framework allocates once and keeps (fstrain.core.plan.frameworks): Megatron-LM's and
    nanotron's global all-gather buffer under sequence parallelism (a column linear's input
    gathered to the full sequence, ``s b h`` in the compute dtype, reused by every layer and by
    backward's re-gather), and ZeRO-3's persistent parameters under a hand-written config."""
    if model is None:
        return []
    fw = profile(knobs.framework)
    items = []
    if fw.tp_gather_buffer and knobs.tp > 1 and assumptions.sequence_parallel:
        gathered = knobs.micro_batch_size * knobs.seq_len * model.hidden_size * weight_bytes(knobs.precision)
        items.append((TP_GATHER_ITEM, gathered))
    if knobs.strategy == "zero3":
        persistent = zero3_persistent_params(model, stage, knobs)
        if persistent:
            items.append((ZERO3_PERSISTENT_ITEM, param_bytes(knobs.precision) * persistent))
    return items


def pipeline_fsdp_gradient_bytes(stage: StageShape, knobs: PlanKnobs, assumptions: Assumptions = Assumptions()) -> int:
    """FSDP gradients live during forward and backward of a pipeline stage (pp > 1).

    torch's pipeline stage (torch/distributed/pipelining/stage.py, ``backward_maybe_with_nosync``)
    runs each micro-batch's backward with ``set_requires_gradient_sync(False)``: FSDP2 keeps the
    stage's gradients unsharded, accumulated in the reduce dtype (``to_accumulated_grad_if_needed``
    in _fsdp_param.py), and reduce-scatters them once, in ``perform_reduce_grad`` after the last
    micro-batch. They are live while the stage holds another micro-batch's activations, that is
    when it runs more micro-batches than it keeps in flight: always on the last stage (one in
    flight) once m > 1, on the first stage once m > pp. With one micro-batch the gradients grow
    while the activations are freed, so they are not added to the activation peak.
    """
    if knobs.grad_accum_steps * stage.chunks <= stage.in_flight:
        return 0
    return stage.params * assumptions.fsdp_reduce_bytes_per_element


def communicator_count(knobs: PlanKnobs) -> int:
    """Process groups with more than one rank that a rank belongs to (each has NCCL buffers)."""
    if knobs.world_size == 1:
        return 0
    groups = 1  # the default (world) group
    for size in (knobs.tp, knobs.pp, knobs.dp, knobs.cp):
        groups += 1 if 1 < size < knobs.world_size else 0
    if knobs.cp > 1 and knobs.dp > 1 and knobs.dp * knobs.cp < knobs.world_size:
        groups += 1  # FSDP's flattened dp x cp mesh (torchtitan's dp_shard_cp)
    if knobs.strategy == "fsdp-hybrid" and 1 < knobs.shard_group_size < knobs.dp:
        groups += 2  # shard group and replicate group
    if knobs.ep > 1:
        groups += 1 + (1 if knobs.dp > knobs.ep else 0)  # the all-to-all group and the experts' dp group
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

    Under context parallelism (``cp > 1``) every part is that of one CP rank as FSDP sees it
    (:func:`fstrain.core.plan.contextparallel.cp_rank_view`: ``seq_len / cp`` tokens, states sharded
    over ``dp x cp`` ranks), plus the ring attention's buffers in the backward moment and the
    CP process groups' communicators.
    """
    memo: dict[Any, Any] = {} if cache is None else cache
    communicators = communicator_count(knobs)
    ring = [(RING_BUFFER_ITEM, ring_buffer_bytes(model, knobs))] if model is not None and knobs.cp > 1 else []
    knobs = cp_rank_view(knobs)
    if model is not None and params is not None:
        k = knobs
        # 1F1B and ZB-H1 depend on the micro-batches only up to pp of them (shares the cache).
        micro_batches = k.grad_accum_steps if k.pp_schedule == "interleaved" else min(k.pp, k.grad_accum_steps)
        stages = _memo(
            memo,
            ("stages", k.tp, k.pp, micro_batches, k.pp_schedule, k.pp_virtual_stages, k.ep),
            lambda: stage_shapes(params, k.tp, k.pp, k.grad_accum_steps, model.tied_embeddings, k.pp_schedule,
                                 k.pp_virtual_stages, k.ep),
        )
        stages = [with_replicated_embedding(s, params.embedding + params.position_embedding, k) for s in stages]
    else:
        stages = [StageShape(num_params // (knobs.tp * knobs.pp), 0, 0, 0, False, 1)]
    best: MemoryBreakdown | None = None
    for stage in stages:
        candidate = _stage_breakdown(model, stage, knobs, gpus_per_node, assumptions, memo, communicators, ring)
        if best is None or candidate.peak > best.peak:
            best = candidate
    assert best is not None
    return best


def adafactor_bytes(model: ModelSpec | None, knobs: PlanKnobs, memo: dict[Any, Any]) -> float | None:
    """Adafactor's state bytes per parameter for ``model`` under ``knobs`` (None for the other
    optimizers, and without an architecture, where its full fp32 second moment is counted)."""
    if knobs.optimizer != "adafactor" or model is None:
        return None
    shapes = _memo(memo, ("shapes", knobs.loss), lambda: parameter_shapes(model, has_vocab_head(knobs.loss)))
    return state_bytes_per_param(knobs.strategy, knobs.precision, shapes)


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
    communicators: int,
    ring: list[tuple[str, int]],
) -> MemoryBreakdown:
    k = knobs
    states: ModelStates = _memo(
        memo,
        ("states", stage.params, stage.experts, k.ep, k.strategy, k.shard_group_size, k.precision, k.optimizer,
         k.offload, uses_megatron_ddp(k)),
        lambda: stage_model_states(stage, k, assumptions, adafactor_bytes(model, k, memo)),
    )
    activation_items: list[tuple[str, int]] = []
    if model is not None:
        activation_items = _memo(
            memo,
            (
                "activations",
                WEIGHT_GRADS_IN_FLIGHT.get(k.strategy, "none"),  # what the strategy changes here
                k.strategy.startswith("fsdp"),
                stage,
                k.micro_batch_size,
                k.seq_len,
                k.tp,
                k.activation_checkpointing,
                k.flash_attention,
                k.precision,
                k.loss,
                k.compile,
                k.fused_rmsnorm,
                k.tp_replicated_logits,
                block_kernels(assumptions),
                sp_gathered_input_bytes(k, assumptions),
            ),
            lambda: stage_activation_bytes(model, stage, k, assumptions),
        )
    persistent = [*persistent_buffer_items(k.strategy, stage, k, assumptions),
                  *framework_persistent_items(model, stage, k, assumptions)]
    fp8_block = fp8_gathered_block_params(model, k)
    shared: list[tuple[str, int]] = _memo(
        memo,
        ("buffers", k.strategy, stage, k.precision, k.micro_batch_size, k.seq_len, k.tp, k.pp, fp8_block, k.framework),
        lambda: buffer_items(k.strategy, stage, k, model.hidden_size if model else 0, assumptions, fp8_block),
    )
    buffers = [*persistent, *shared]
    if model is not None and model.moe is not None and k.ep > 1:
        buffers.append((EP_ALL_TO_ALL_ITEM, moe_all_to_all_bytes(model, k)))
    units = _memo(memo, ("units", k.strategy, stage, k.precision, k.pp, fp8_block),
                  lambda: fsdp_unit_items(k.strategy, stage, k, assumptions, fp8_block))
    loss_buffers = [item for item in buffers if item not in units]
    backward_buffers = backward_buffer_items(k.strategy, stage, k, assumptions, model.hidden_size if model else 0)
    backward_buffers += ring
    if model is not None and k.fp8:
        backward_buffers = [*backward_buffers, (FP8_CASTS_ITEM, fp8_cast_bytes(model, k))]
    # FSDP2 creates its sharded gradients during backward (after set_to_none), so they are not
    # there during forward and backward unless micro-batches accumulate into them; DeepSpeed's
    # and DDP's gradient buffers are allocated once and stay.
    fsdp = k.strategy.startswith("fsdp")
    compute_gradients = 0 if fsdp and k.grad_accum_steps == 1 else states.gradients
    if fsdp and k.pp > 1:
        compute_gradients = pipeline_fsdp_gradient_bytes(stage, k, assumptions)
    no_sync = no_sync_gradient_bytes(stage, k)
    no_sync_label = NO_SYNC_ITEM
    if not no_sync:  # FSDP2's own (fstrain.core.plan.fsdp2habits), in the reduce dtype
        no_sync, no_sync_label = fsdp2_no_sync_gradient_bytes(stage.params, k, assumptions), FSDP2_NO_SYNC_ITEM
    if no_sync:  # replaces the sharded gradients through forward and backward
        compute_gradients = 0
        buffers.append((no_sync_label, no_sync))
        loss_buffers.append((no_sync_label, no_sync))
    root = fsdp1_root_bytes(stage, k, assumptions)
    if root:  # backward gathers it anyway (fsdp_unit_items); FSDP1 never let it go
        loss_buffers.append((FSDP1_ROOT_ITEM, root))
    step_items = [*persistent, *optimizer_step_items(k, states, stage, assumptions)]
    first_block_stored = 0
    recomputing = (True, True)
    if model is not None and stage.layers and k.pp == 1:  # FSDP under PP reduces once, after the last micro-batch
        last = k.activation_checkpointing
        if every_k(last) > 1:  # only every N-th block recomputes: the first two in backward may not
            recomputing = (block_is_checkpointed(last, stage.layers - 1), block_is_checkpointed(last, stage.layers - 2))
            last = "full" if recomputing[0] else "none"
        first_block_stored = _memo(
            memo,
            ("block", k.micro_batch_size, k.seq_len, k.tp, last, k.flash_attention, k.precision, k.compile,
             k.fused_rmsnorm, block_kernels(assumptions), sp_gathered_input_bytes(k, assumptions)),
            lambda: layer_activation_bytes(model, k.micro_batch_size, k.seq_len, k.tp, last, k.flash_attention,
                                           k.precision, assumptions.sequence_parallel, k.compile, k.fused_rmsnorm,
                                           block_kernels(assumptions), sp_gathered_input_bytes(k, assumptions)),
        )
    moments = _moments(activation_items, loss_buffers, buffers, backward_buffers, step_items, first_block_stored,
                       recomputing)
    fixed = assumptions.cuda_context_bytes + communicators * assumptions.nccl_bytes_per_communicator

    def moment_live(name: str, items: list[tuple[str, int]]) -> int:
        gradients = states.gradients if name == "optimizer step" else compute_gradients
        return states.parameters + gradients + states.optimizer_states + sum(v for _, v in items)

    allocated_once = states.parameters + states.optimizer_states  # no freed blocks of theirs to cache

    def moment_peak(live: int) -> int:
        return live + fixed + int((live - allocated_once) * assumptions.fragmentation_fraction)

    lives = [moment_live(name, items) for name, items in moments]  # each moment summed once
    # The peak is the highest moment; a tie goes to the earlier one.
    chosen = max(range(len(moments)), key=lives.__getitem__)
    phase, live_items = moments[chosen]
    gradients = states.gradients if phase == "optimizer step" else compute_gradients
    live = lives[chosen]
    activation_names = {name for name, _ in activation_items} | {name for name, _ in live_items
                                                                 if name.startswith("activations (")}
    activations = sum(v for name, v in live_items if name in activation_names)
    buffer_total = sum(v for name, v in live_items if name not in activation_names)
    fragmentation = int((live - allocated_once) * assumptions.fragmentation_fraction)
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
    host = host_bytes_per_node(
        states, k.strategy, stage.params, stage.largest_layer, gpus_per_node, assumptions, k.precision
    )
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
    first_block_stored: int = 0,
    recomputing: tuple[bool, bool] = (True, True),
) -> list[tuple[str, list[tuple[str, int]]]]:
    """What is live besides the model states at each moment that can hold the peak.

    ``loss``: between the model's forward and its backward, every stored activation, what the
    final norm and the head keep, and the loss at the higher of its forward and backward peaks
    (:func:`fstrain.core.plan.losses.loss_peaks`), with the buffers live then (not FSDP's units: see
    :func:`fsdp_unit_items`). ``backward``: the stored activations (all of them at its start), a
    recomputed block's working set, the buffers forward and backward share and the ones only
    backward allocates (DeepSpeed's reduce buckets). ``optimizer step``: the activations are freed;
    the update's temporaries. Items of different moments are never added together.
    ``first_block_stored``: what the block whose backward comes first stored (freed when its
    gradient is reduced: FSDP's per-block reduce-scatter); ``recomputing``: whether that block and
    the next one run their forward again (``every-k:N`` recomputes every N-th block only).
    """
    stored = activation_items[:1]
    loss_only = (LOGITS_ITEM, HEAD_INPUT_ITEM, AUTOCAST_CACHE_ITEM, CLASSIFIER_ITEM)
    loss = [item for item in activation_items[1:] if item[0] in loss_only]
    working = [item for item in activation_items[1:] if item[0] not in loss_only]
    saved = [item for item in working if item[0] == AUTOCAST_SAVED_ITEM]
    backward = [*stored, *working, *buffers, *backward_buffers]
    reduce = [item for item in buffers if item[0] in BLOCK_REDUCE_ITEMS]
    if reduce and stored and first_block_stored:
        # The first block's backward has no gradient to reduce yet; from the second on, the
        # previous block's unsharded gradient is being reduced but that block's activations are
        # freed. Whichever is higher is the backward peak.
        first_working, later_working = (
            [w for w in working if again or w[0] != RECOMPUTE_ITEM] for again in recomputing
        )
        first = [*stored, *first_working, *[b for b in buffers if b not in reduce], *backward_buffers]
        name, value = stored[0]
        later = [(f"{name} less one block's, freed", value - first_block_stored), *later_working, *buffers,
                 *backward_buffers]
        backward = max(first, later, key=lambda items: sum(v for _, v in items))
    moments = [
        ("loss", [*stored, *saved, *loss, *loss_buffers]),
        ("backward", backward),
        ("optimizer step", list(step_items)),
    ]
    return moments if any(name in (LOGITS_ITEM, CLASSIFIER_ITEM) for name, _ in loss) else moments[1:]
