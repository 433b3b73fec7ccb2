"""Framework profiles: what the training code keeps that the parallel layout alone does not say.

Two jobs with the same strategy, TP, micro-batch and checkpointing hold different memory when
different frameworks run them. A profile (``fstrain plan --framework NAME``, ``framework`` in
plan.yaml) sets what differs, each number cited to the framework's source (file, line, commit):

- ``loss``: the loss kernel the framework calls, and so its bytes per logit
  (:mod:`fstrain.core.plan.losses`). The default of ``--loss``; a ``--loss`` given wins.
- ``fsdp1``: the framework wraps the model in FSDP1 (``FullyShardedDataParallel``), not FSDP2
  (``fully_shard``). Gradient accumulation under FSDP1's ``no_sync`` (Lightning Fabric's
  ``no_backward_sync``, Accelerate's ``accumulate``) keeps the whole stage's gradient unsharded on
  every GPU between optimizer steps, where FSDP2 as torchtitan and the bundled trainer run it
  reduce-scatters every micro-batch into sharded gradients; and FSDP1 keeps the root unit (the
  embeddings, final norm and head) gathered from its forward to its backward, through the loss
  (torch 2.13 ``torch/distributed/fsdp/_runtime_utils.py`` L493-498 ``_post_forward_reshard``:
  ``free_unsharded_flat_param = not state._is_root and ...``).
- ``tp_gather_buffer``: with sequence parallelism, Megatron-LM and nanotron all-gather a column
  linear's input into one global buffer that is allocated once and never freed (``s b h`` in the
  compute dtype, what the rank's sequence shard becomes when gathered).
- ``sequence_parallel``: the framework's default for splitting the TP-replicated activations
  (None: fstrain's assumption, on).
- ``deepspeed_buckets``: whose ZeRO bucket sizes the DeepSpeed config carries: ``rendered``
  (``fstrain render``'s, :mod:`fstrain.core.plan.buckets`), ``deepspeed`` (a hand-written
  config: DeepSpeed's defaults, allocated whole whatever the model's size) or ``hf-auto``
  (Hugging Face's ``"auto"`` values, derived from the hidden size). With anything but
  ``rendered`` ZeRO-3 also keeps every parameter below the persistence threshold whole on
  every GPU.
- ``megatron_ddp``: ``ddp`` and ``zero1`` are Megatron-core's DistributedDataParallel with its
  plain or its distributed optimizer (a contiguous gradient buffer, fp32 under bf16; fp32 main
  parameters and Adam's states sharded by the distributed optimizer: :mod:`fstrain.core.plan.megatron`),
  run with Megatron's pipeline schedules (1F1B or interleaved), not torch's DDP and DeepSpeed's ZeRO-1.
- ``fused_mlp``, ``mlp_checkpoint_lvl``, ``fused_dropout_add_ln``, ``packed_qkv``: flash-attention's
  fused GeLU MLP and its checkpoint level, its fused dropout + residual add + norm kernel, as the
  framework's model config turns them on, and its one q/k/v linear (what each keeps: :mod:`fstrain.core.plan.kernels`).
  The fused MLP applies to GeLU models only: flash-attention's GPT asserts a GeLU (or ReLU)
  activation under ``fused_mlp`` and builds an unfused ``GatedMlp`` for SwiGLU, so for another
  FFN the profile leaves it off (and the plan says so).

Pure: no I/O; :func:`profile` is the one reader of a name.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.kernels import fused_block, fused_mlp_applies
from fstrain.core.plan.schema import ModelSpec
from fstrain.errors import InputError

DEFAULT_FRAMEWORK = "fstrain"
# DeepSpeed's defaults (microsoft/DeepSpeed deepspeed/runtime/zero/config.py @38327e0).
DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 500_000_000  # L109 reduce_bucket_size pp_int(5e8)
DEEPSPEED_PREFETCH_BUCKET_ELEMENTS = 50_000_000  # L208 stage3_prefetch_bucket_size pp_int(5e7)
DEEPSPEED_PERSISTENCE_THRESHOLD = 100_000  # L214 stage3_param_persistence_threshold pp_int(1e5)
# (L231 stage3_max_live_parameters 1e9 is fstrain's assumption zero3_max_live_parameters already.)
# Hugging Face's "auto" (huggingface/transformers v4.57.1 src/transformers/integrations/deepspeed.py
# L245-254, HfTrainerDeepSpeedConfig.trainer_config_finalize): reduce_bucket_size hidden^2,
# stage3_prefetch_bucket_size 0.9 hidden^2, stage3_param_persistence_threshold 10 hidden.
HF_AUTO_PREFETCH_FRACTION = 0.9
HF_AUTO_PERSISTENCE_PER_HIDDEN = 10


@dataclass(frozen=True)
class FrameworkProfile:
    """What one framework's training code keeps; ``citations`` name the source of each setting."""

    name: str
    summary: str
    loss: str = "full"
    fsdp1: bool = False
    tp_gather_buffer: bool = False
    sequence_parallel: bool | None = None
    deepspeed_buckets: str = "rendered"  # rendered | deepspeed | hf-auto
    megatron_ddp: bool = False
    fused_mlp: bool = False
    mlp_checkpoint_lvl: int = 0
    fused_dropout_add_ln: bool = False
    packed_qkv: bool = False
    citations: tuple[tuple[str, str], ...] = ()

    def bucket_elements(self, hidden_size: int) -> tuple[int, int, int]:
        """(reduce bucket, ZeRO-3 prefetch bucket, ZeRO-3 persistence threshold) in elements for a
        hand-written DeepSpeed config; (0, 0, 0) for ``rendered`` (the planner then uses what
        render writes)."""
        if self.deepspeed_buckets == "deepspeed":
            return DEEPSPEED_REDUCE_BUCKET_ELEMENTS, DEEPSPEED_PREFETCH_BUCKET_ELEMENTS, DEEPSPEED_PERSISTENCE_THRESHOLD
        if self.deepspeed_buckets == "hf-auto":
            h2 = hidden_size * hidden_size
            return h2, int(HF_AUTO_PREFETCH_FRACTION * h2), HF_AUTO_PERSISTENCE_PER_HIDDEN * hidden_size
        return 0, 0, 0


_LIGHTNING = "Lightning-AI/pytorch-lightning@7f0c343"
_ACCELERATE = "huggingface/accelerate@16cb6eb"
_DEEPSPEED = "microsoft/DeepSpeed@38327e0"
_NANOTRON = "huggingface/nanotron@2411b02"
_MEGATRON = "NVIDIA/Megatron-LM@d98e8a6"
_TORCHTITAN = "pytorch/torchtitan@b5bcd76"
_FLASH_ATTN = "Dao-AILab/flash-attention@0251105"
_DEEPSPEED_BUCKETS = (
    "deepspeed_buckets",
    f"{_DEEPSPEED} deepspeed/runtime/zero/config.py L109 reduce_bucket_size 5e8, L208 "
    "stage3_prefetch_bucket_size 5e7, L214 stage3_param_persistence_threshold 1e5, L231 "
    "stage3_max_live_parameters 1e9; stage3.py L538 allocates the reduce bucket whole at start",
)
_ACCELERATE_NO_SYNC = (
    "fsdp1",
    f"{_ACCELERATE} src/accelerate/accelerator.py L1255-1296 accumulate() enters no_sync() between "
    "optimizer steps; L1175 FSDP1's model.no_sync (fsdp_version defaults to 1: "
    "utils/dataclasses.py L1591), L1166 FSDP2's set_requires_gradient_sync(False)",
)

PROFILES: dict[str, FrameworkProfile] = {
    p.name: p
    for p in (
        FrameworkProfile(
            "fstrain",
            "the bundled trainer (python -m fstrain.train): FSDP2 or the rendered DeepSpeed config",
            citations=(("loss", "fstrain/train/steps.py L29: F.cross_entropy(output[:, :-1].float()...)"),),
        ),
        FrameworkProfile(
            "torchtitan",
            "torchtitan: FSDP2, reduce-scatter every micro-batch, loss on an fp32 copy",
            citations=(("loss", f"{_TORCHTITAN} torchtitan/components/loss.py L32-58 cross_entropy_loss: "
                                "F.cross_entropy(pred.float(), ...)"),),
        ),
        FrameworkProfile(
            "megatron",
            "Megatron-LM core: vocab-parallel cross-entropy in place, a global all-gather buffer under SP",
            loss="megatron-inplace",
            tp_gather_buffer=True,
            megatron_ddp=True,
            citations=(
                ("loss", f"{_MEGATRON} megatron/core/tensor_parallel/cross_entropy.py L25 "
                         "vocab_parallel_logits.float(), L42 subtracts the max in place"),
                ("tp_gather_buffer", f"{_MEGATRON} megatron/core/tensor_parallel/layers.py L627 and L671 "
                                     "get_global_memory_buffer().get_tensor(dim_size, input.dtype, 'mpu')"),
                ("megatron_ddp", f"{_MEGATRON} megatron/core/distributed/param_and_grad_buffer.py L1181-1195 "
                                 "contiguous param_data and grad_data; megatron/training/arguments.py L1213-1216 "
                                 "fp32 main grads for --bf16; megatron/core/optimizer/distrib_optimizer.py L445 "
                                 "fp32 main params of the shard; docs/user-guide/features/dist_optimizer.md L16-20 "
                                 "bytes per parameter; megatron/core/pipeline_parallel/schedules.py L161-168 "
                                 "1F1B or interleaved"),
            ),
        ),
        FrameworkProfile(
            "nanotron",
            "nanotron: TP without sequence parallelism by default, sharded cross-entropy on an fp32 copy",
            loss="megatron-core",
            tp_gather_buffer=True,
            sequence_parallel=False,
            citations=(
                ("loss", f"{_NANOTRON} src/nanotron/models/llama.py L993-997 sharded_cross_entropy(..., "
                         "dtype=torch.float); parallel/tensor_parallel/functional.py L43 subtracts the max "
                         "out of place"),
                ("sequence_parallel", f"{_NANOTRON} src/nanotron/config/parallelism_config.py L45-46 tp_mode "
                                      "defaults to ALL_REDUCE (REDUCE_SCATTER is sequence parallelism)"),
                ("tp_gather_buffer", f"{_NANOTRON} src/nanotron/parallel/tensor_parallel/functional.py L487 "
                                     "MemoryBuffer().get('allgather', ...) with tp_recompute_allgather "
                                     "(parallelism_config.py L36, default True); parallel/utils.py L13-27 "
                                     "keeps the buffer"),
            ),
        ),
        FrameworkProfile(
            "deepspeed",
            "a hand-written DeepSpeed config: DeepSpeed's own bucket defaults",
            deepspeed_buckets="deepspeed",
            citations=(_DEEPSPEED_BUCKETS,),
        ),
        FrameworkProfile(
            "lightning",
            "Lightning Fabric / LitGPT with FSDPStrategy (FSDP1): no_backward_sync while accumulating",
            loss="litgpt",
            fsdp1=True,
            deepspeed_buckets="deepspeed",
            citations=(
                ("loss", "Lightning-AI/litgpt@2685705 litgpt/utils.py L302-352 chunked_cross_entropy "
                         "(chunk_size=128, no upcast), called from litgpt/finetune/full.py L284"),
                ("fsdp1", f"{_LIGHTNING} src/lightning/fabric/strategies/fsdp.py L840-854 "
                                           "no_backward_sync returns module.no_sync() (FSDP1); "
                                           "Lightning-AI/litgpt@2685705 litgpt/pretrain.py L352 enters it "
                                           "while accumulating"),
                _DEEPSPEED_BUCKETS,
            ),
        ),
        FrameworkProfile(
            "accelerate",
            "Hugging Face Accelerate: no_sync while accumulating, DeepSpeed's bucket defaults",
            fsdp1=True,
            deepspeed_buckets="deepspeed",
            citations=(_ACCELERATE_NO_SYNC, _DEEPSPEED_BUCKETS),
        ),
        FrameworkProfile(
            "hf-trainer",
            "the Hugging Face Trainer: Accelerate's no_sync, DeepSpeed's 'auto' buckets from the hidden size",
            fsdp1=True,
            deepspeed_buckets="hf-auto",
            citations=(
                _ACCELERATE_NO_SYNC,
                ("deepspeed_buckets", "huggingface/transformers v4.57.1 src/transformers/integrations/deepspeed.py "
                                      "L245 reduce_bucket_size hidden*hidden, L250 stage3_prefetch_bucket_size "
                                      "0.9*hidden*hidden, L254 stage3_param_persistence_threshold 10*hidden "
                                      "(trainer_config_finalize fills the 'auto' values)"),
            ),
        ),
        FrameworkProfile(
            "flash-attn",
            "flash-attention's training scripts: fused cross-entropy, fused GeLU MLP (level 0), "
            "fused dropout-add-LayerNorm, one q/k/v linear",
            loss="fused",
            fused_mlp=True,
            mlp_checkpoint_lvl=0,
            fused_dropout_add_ln=True,
            packed_qkv=True,
            citations=(
                ("loss", f"{_FLASH_ATTN} training/configs/experiment/owt/base.yaml L57-58 and "
                         "pile/base.yaml L57-58: flash_attn.losses.cross_entropy.CrossEntropyLoss"),
                ("fused_mlp", f"{_FLASH_ATTN} training/configs/experiment/owt/gpt2s-flash.yaml L13 and "
                              "pile/gpt3s-flash.yaml L13 fused_mlp: True (every gpt2*/gpt3* -flash experiment "
                              "inherits one of them); flash_attn/models/gpt.py L127, L219-241 build FusedMLP"),
                ("mlp_checkpoint_lvl", f"{_FLASH_ATTN} flash_attn/models/gpt.py L214 getattr(config, "
                                       "'mlp_checkpoint_lvl', 0); pile/gpt3-2.7B-flash*.yaml L11 "
                                       "mlp_checkpoint_lvl: 0; the other experiments leave it unset (level 1 "
                                       "only in comments: owt/gpt2m-flash.yaml L6-9, gpt2xl-flash.yaml L6-21)"),
                ("fused_dropout_add_ln", f"{_FLASH_ATTN} training/configs/experiment/owt/gpt2s-flash.yaml L14 "
                                         "and pile/gpt3s-flash.yaml L12 fused_dropout_add_ln: True; "
                                         "flash_attn/models/gpt.py L287; modules/block.py L142-152 and "
                                         "L179-189 call layer_norm_fn"),
                ("packed_qkv", f"{_FLASH_ATTN} flash_attn/modules/mha.py L459 self.Wqkv = nn.Linear(embed_dim, "
                               "qkv_dim): one linear for q, k and v, whatever fused_bias_fc"),
            ),
        ),
    )
}
FRAMEWORKS = tuple(PROFILES)


def profile(name: str, where: str = "--framework") -> FrameworkProfile:
    """The profile called ``name``; an unknown name is one line listing the names."""
    try:
        return PROFILES[name]
    except KeyError:
        raise InputError(f"unknown framework {name!r}", f"use one of {', '.join(FRAMEWORKS)}", where) from None


def framework_assumptions(
    framework: FrameworkProfile, assumptions: Assumptions, model: ModelSpec | None = None
) -> Assumptions:
    """``assumptions`` with the framework's defaults in the fields still at fstrain's: an
    ``--assume`` that differs from fstrain's default wins over the profile. The fused MLP is
    set only for a dense GeLU ``model`` (:func:`fused_mlp_applies`)."""
    defaults = {f.name: f.default for f in fields(Assumptions)}
    wanted: dict[str, Any] = {}
    if framework.sequence_parallel is not None:
        wanted["sequence_parallel"] = framework.sequence_parallel
    if framework.fused_mlp and model is not None and fused_mlp_applies(model):
        wanted.update(fused_mlp=True, mlp_checkpoint_lvl=framework.mlp_checkpoint_lvl)
    if framework.fused_dropout_add_ln:
        wanted["fused_dropout_add_ln"] = True
    if framework.packed_qkv:
        wanted["packed_qkv"] = True
    changes = {key: value for key, value in wanted.items() if getattr(assumptions, key) == defaults[key]}
    return replace(assumptions, **changes) if changes else assumptions


def fused_kernels_note(framework: FrameworkProfile, assumptions: Assumptions, model: ModelSpec) -> str:
    """The fused block kernels a plan counts, as the plan's training line names them, and the
    profile's fused MLP where the model's FFN cannot run it ('' for eager PyTorch)."""
    a = framework_assumptions(framework, assumptions, model)
    parts = [fused_block(a.fused_mlp, a.mlp_checkpoint_lvl, a.fused_dropout_add_ln, a.packed_qkv).describe()]
    if framework.fused_mlp and not fused_mlp_applies(model):
        what = "MoE" if model.moe is not None else model.activation
        parts.append(f"no fused MLP ({framework.name} fuses dense GeLU MLPs, {model.name} is {what})")
    return ", ".join(p for p in parts if p)
