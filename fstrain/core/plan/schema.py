"""The values a plan is made of: a model's architecture (:class:`ModelSpec`), one parallel
configuration (:class:`PlanKnobs`), what the plan assumed of the cluster (:class:`ClusterSummary`),
and the names each knob accepts.

Plain frozen dataclasses: :mod:`.recipe` reads a ``model:`` section into a ModelSpec, the
planner's search makes PlanKnobs, and :mod:`.planfile` holds them in ``plan.yaml`` and checks
every field when it reads one back. The planner's modules, the recipe reader and the plan file
all build on this module, so it imports nothing but the vocabularies it names.
"""

from __future__ import annotations

from dataclasses import dataclass

from fstrain.core.plan.acpolicy import AC_NAMES
from fstrain.core.plan.losses import LOSS_KINDS

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp-full", "fsdp-grad-op", "fsdp-hybrid")
ACTIVATION_CHECKPOINTING = AC_NAMES  # see fstrain.core.plan.acpolicy (every-k:N takes a number)
OFFLOAD = ("none", "optimizer", "optimizer+params")
OPTIMIZERS = ("adamw", "sgd", "adam8bit", "adafactor")  # adafactor: Hugging Face's (fstrain/core/plan/adafactor.py)
# How the loss is computed over the logits, which sets their memory (fstrain/core/plan/losses.py):
# full, fused, megatron, megatron-core, megatron-inplace, litgpt, chunked:N, or none (no vocabulary
# head: a classification or regression head; validated by losses.parse_loss).
LOSSES = LOSS_KINDS
# Pipeline schedules (fstrain/core/plan/pipeline.py): "1f1b" (PipeDream-Flush, DeepSpeed's and torch's
# Schedule1F1B), "interleaved" (Narayanan et al. 2021's interleaved 1F1B, ``pp_virtual_stages``
# model chunks per rank), "zero-bubble" (Qi et al. 2023's ZB-H1).
PP_SCHEDULES = ("1f1b", "interleaved", "zero-bubble")
# DeepSpeed's pipeline engine runs its own 1F1B schedule (deepspeed/runtime/pipe/schedule.py,
# TrainSchedule) and nothing else.
DEEPSPEED_STRATEGIES = ("zero1", "zero2", "zero3")
# Feed-forward activations: GeLU's two matrices (up, down), or a gated unit's three (gate, up,
# down): SwiGLU ``silu(gate) * up`` (Llama) and GeGLU ``gelu_tanh(gate) * up`` (Gemma).
ACTIVATIONS = ("gelu", "swiglu", "geglu")
GATED_ACTIVATIONS = ("swiglu", "geglu")
# Normalisation of the queries and keys before attention (and before rotary positions):
# "head" normalises each head's head_dim values with one head_dim-wide weight (Qwen3, Gemma 3),
# "projection" normalises the whole q (num_heads x head_dim) and k (num_kv_heads x head_dim)
# projections (OLMo 2, OLMoE).
QK_NORMS = ("none", "head", "projection")
# Attention biases besides linear_bias: "qkv" on the q, k and v projections only (Qwen2),
# "all" on those and the output projection (Llama's attention_bias).
ATTENTION_BIASES = ("none", "qkv", "all")
# The dtype of a mixture of experts' router matmul: "compute" runs it in the compute dtype (its
# input is the normed hidden state already kept, Hugging Face Mixtral and Qwen), "fp32" casts the
# input and weight to fp32 first (Megatron's moe_router_dtype fp32, DeepSeek-V3), which keeps an
# fp32 copy of every token's input for backward.
ROUTER_DTYPES = ("compute", "fp32")


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts feed-forward: ``num_experts`` experts, ``top_k`` active per token."""

    num_experts: int
    top_k: int
    expert_ffn_hidden_size: int
    shared_ffn_hidden_size: int = 0
    """Width of an always-on shared expert every token also runs (Qwen2-MoE's
    ``shared_expert_intermediate_size``; DeepSeek's ``n_shared_experts x moe_intermediate_size``,
    which its code builds as one FFN that wide); 0: none."""
    shared_expert_gate: bool = False
    """Qwen2-MoE's sigmoid gate on the shared expert's output: a bias-free hidden -> 1 linear."""
    router_dtype: str = "compute"
    """One of :data:`ROUTER_DTYPES`."""


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, as a recipe describes it."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    activation: str  # one of ACTIVATIONS: "gelu" (two matrices), "swiglu" or "geglu" (three)
    vocab_size: int
    seq_len: int
    tied_embeddings: bool = False
    moe: MoESpec | None = None
    norm: str = "rmsnorm"  # "rmsnorm" (weight only) or "layernorm" (weight and bias)
    linear_bias: bool = False  # biases on the attention and FFN linears (GPT-2: true)
    position_embedding: str = "rope"  # "rope" (no parameters) or "learned" (seq_len x hidden)
    dropout: float = 0.0  # > 0 keeps 1-byte dropout masks in the activations
    # A sequence-classification head (trained with loss "none": no vocabulary logits): BERT's
    # pooler, a hidden x hidden linear + tanh on the first token, and a hidden x num_labels
    # classifier; biases follow linear_bias. 0 / false: none (fstrain.core.plan.modelsize).
    pooler: bool = False
    num_labels: int = 0
    head_dim: int = 0
    """Width of one attention head as the recipe states it; 0 means hidden_size / num_heads (read
    :attr:`attn_head_dim` for the width either way). Qwen3, Gemma and Mistral-Nemo
    state their own (Qwen3-4B: 32 heads of 128 on a 2560-wide hidden state), so the q projection
    is num_heads x head_dim wide, not hidden_size."""
    qk_norm: str = "none"
    """One of :data:`QK_NORMS`."""
    attention_bias: str = "none"
    """One of :data:`ATTENTION_BIASES` (linear_bias puts biases on every linear already)."""
    mlp_bias: bool = False
    """Biases on the feed-forward linears without linear_bias (Llama's and Granite's mlp_bias)."""
    post_norms: bool = False
    """A norm after each sublayer too, before its residual add (Gemma 2 and 3: four per block)."""
    sliding_window: int = 0
    """Tokens a query attends back to in the windowed layers (Mistral 7B v0.1: 4096); 0: none."""
    sliding_window_layers: int = 0
    """How many layers use the window (Gemma 2: every other, Gemma 3: five in six); the rest attend
    to the whole causal context. 0 with a window means every layer."""

    @property
    def attn_head_dim(self) -> int:
        """The width of one attention head: head_dim, or hidden_size / num_heads when it is 0."""
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def windowed_layers(self) -> int:
        """How many layers attend through the sliding window (0 without one)."""
        return (self.sliding_window_layers or self.num_layers) if self.sliding_window else 0

    @property
    def norms_per_block(self) -> int:
        """Norms in one block: before attention and before the FFN, and after each with post_norms."""
        return 4 if self.post_norms else 2

    @property
    def gated(self) -> bool:
        """Whether the feed-forward is a gated unit (three matrices: gate, up, down)."""
        return self.activation in GATED_ACTIVATIONS

    @property
    def q_width(self) -> int:
        """Output width of the q projection (and input width of the output projection)."""
        return self.num_heads * self.attn_head_dim

    @property
    def kv_width(self) -> int:
        """Output width of the k and of the v projection."""
        return self.num_kv_heads * self.attn_head_dim

    @property
    def qkv_bias(self) -> bool:
        return self.linear_bias or self.attention_bias in ("qkv", "all")

    @property
    def out_bias(self) -> bool:
        """A bias on the attention output projection."""
        return self.linear_bias or self.attention_bias == "all"

    @property
    def ffn_bias(self) -> bool:
        return self.linear_bias or self.mlp_bias


@dataclass(frozen=True)
class PlanKnobs:
    """One parallel configuration: every knob the planner chooses and the renderers read.

    ``dp * cp * tp * pp`` is the world size. ``shard_group_size`` is the number of data-parallel
    ranks a model state is sharded over: ``dp`` for ZeRO-1/2/3 and FSDP full/grad-op, the
    hybrid group (an NVLink domain or a node) for ``fsdp-hybrid``, 1 for ``ddp``. With context
    parallelism FSDP shards over those ranks times ``cp`` (see ``cp`` below).
    """

    strategy: str
    zero_stage: int
    dp: int
    tp: int
    pp: int
    shard_group_size: int
    micro_batch_size: int
    grad_accum_steps: int
    activation_checkpointing: str = "none"
    offload: str = "none"
    precision: str = "bf16"
    optimizer: str = "adamw"
    seq_len: int = 0
    flash_attention: bool = True
    loss: str = "full"  # one of LOSSES
    pp_schedule: str = "1f1b"  # one of PP_SCHEDULES (meaningful with pp > 1)
    pp_virtual_stages: int = 1  # model chunks per pipeline rank: >= 2 for "interleaved", else 1
    # Expert parallelism (MoE only): each rank of an ``ep``-rank group holds num_experts/ep
    # experts; ``ep`` divides dp (the group is carved out of the data-parallel ranks, as
    # torchtitan's parallel_dims.py borrows it from dp_shard), so expert states are data-parallel
    # over dp/ep ranks. 1: every rank holds its FSDP/ZeRO shard of every expert.
    ep: int = 1
    # Context parallelism (torchtitan's ring attention, fstrain/core/plan/contextparallel.py): each
    # sequence is split over ``cp`` ranks, each holding and computing seq_len/cp of its tokens.
    # The cp ranks of one sequence are not data-parallel replicas (``dp`` and the global batch
    # do not count them), but FSDP shards the parameters and reduces the gradients over
    # ``dp x cp`` ranks (torchtitan's "dp_shard_cp" mesh). 1: no context parallelism.
    cp: int = 1
    # fp8 compute of the transformer blocks' linear layers (torchao Float8Linear with tensorwise
    # scaling as torchtitan converts them, or Transformer Engine's Linear): their matmuls run on
    # the fp8 tensor cores; attention, norms and the output layer stay in the compute dtype.
    fp8: bool = False
    # FSDP2 gathers the converted linears' weights in fp8 (torchao's enable_fsdp_float8_all_gather):
    # one byte a weight in the all-gathers and the gathered blocks. Needs fp8 and an fsdp-* strategy.
    fp8_all_gather: bool = False
    # Kernels, not layout: torch.compile of each transformer block (Inductor fuses the elementwise
    # ops and its min-cut partitioner picks what backward keeps), or only the norms as one fused
    # RMSNorm kernel (torchtitan's norm_type "fused_rmsnorm"). Both change the activations a
    # block saves and the time of its memory-bound ops (fstrain.core.plan.kernels).
    compile: bool = False
    fused_rmsnorm: bool = False
    # FSDP2 accumulates micro-batches under set_requires_gradient_sync(False): every gradient held
    # unsharded in the reduce dtype until the last micro-batch reduce-scatters it (fsdp2habits).
    fsdp2_no_sync: bool = False
    # Under TP the head gathers its logits to every TP rank (the loss not vocabulary-parallel) and
    # the token embedding stays whole on each (fstrain.core.plan.fsdp2habits).
    tp_replicated_logits: bool = False
    # The training framework whose memory habits the plan models (fstrain.core.plan.frameworks:
    # FSDP1 no_sync accumulation, TP all-gather buffers, hand-written DeepSpeed buckets).
    framework: str = "fstrain"

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def global_batch_size(self) -> int:
        """Sequences per optimizer step: micro-batch x grad-accum x DP."""
        return self.micro_batch_size * self.grad_accum_steps * self.dp


@dataclass(frozen=True)
class ClusterSummary:
    """What the plan assumed about the cluster."""

    num_nodes: int
    gpus_per_node: int
    gpu: str
    gpu_memory_bytes: int
    hosts: tuple[str, ...] = ()
    nvlink_domain_size: int = 0  # GPUs per NVLink domain (0: unknown)
    inter_node_gbps: float = 0.0
