"""PlanFile -> DeepSpeed configuration (the content of ``ds_config.json``).

Every key written here is one DeepSpeed 0.19 reads: the pydantic sections (``zero_optimization``,
``bf16``, ``fp16``, ``comms_logger``) forbid unknown keys, and the tests load every variant with
``deepspeed.runtime.config.DeepSpeedConfig`` and record which top-level and
``activation_checkpointing`` keys it looked up.

Every value that decides speed is DeepSpeed's own default or has its reason beside it, with the
line of DeepSpeed 0.19.8 it acts on; docs/configs.md ("Why these ZeRO values") has the measured
effect. Bucket sizes are DeepSpeed's defaults capped at the model's size
(fstrain.core.plan.buckets), not sizes scaled by the model's hidden size: buckets of hidden^2
split ZeRO-1/2's gradient reduction into one reduction per weight matrix
(benchmarks/deepspeed_render_speed.py).
"""

from __future__ import annotations

from typing import Any

from fstrain.core.plan.acpolicy import every_k
from fstrain.core.plan.buckets import bucket_sizes
from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.plan.planfile import PlanFile
from fstrain.core.plan.schema import PlanKnobs
from fstrain.core.render.common import Rendered, check_plan
from fstrain.core.render.options import TrainingOptions
from fstrain.errors import ConfigError

# fp16 dynamic loss scaling: DeepSpeed's documented defaults, written out so the file says what
# it does. loss_scale 0 selects dynamic scaling; the scale starts at 2**initial_scale_power.
FP16_LOSS_SCALING = {
    "loss_scale": 0,
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1,
}
# ZeRO-3 caps on gathered parameters: DeepSpeed's defaults (1e9 elements, 2 GB in bf16;
# deepspeed/runtime/zero/config.py lines 245 and 251). They bound memory, not communication
# granularity, so they do not scale with the model.
STAGE3_MAX_LIVE_PARAMETERS = 1_000_000_000
STAGE3_MAX_REUSE_DISTANCE = 1_000_000_000
STEPS_PER_PRINT = 100  # the bundled trainer logs every step itself


def _zero_section(plan: PlanFile) -> dict[str, Any]:
    knobs = plan.knobs
    stage = knobs.zero_stage
    if stage == 0:
        return {"stage": 0}
    buckets = bucket_sizes(count_parameters(plan.model).total)
    zero: dict[str, Any] = {
        "stage": stage,
        # Reduce each full bucket on a side stream while backward goes on (stage_1_and_2.py
        # average_tensor, line 1600; stage3.py reduce_and_partition_stream). DeepSpeed's default
        # for stage 3 only (config.py line 386); with buckets of 5e8 a ZeRO-1/2 micro-batch closes a
        # few buckets, so its cost, a second bucket buffer and one synchronize per micro-batch
        # (stage_1_and_2.py line 1028), is small against the reduction it hides on many GPUs.
        "overlap_comm": True,
        # Copy each gradient into the preallocated bucket as it is produced (stage_1_and_2.py line
        # 1455) instead of leaving it where autograd put it: less fragmentation. DeepSpeed's
        # default (config.py line 102).
        "contiguous_gradients": True,
        # DeepSpeed's default 5e8 elements (config.py line 113), or the model's size if smaller: a
        # bucket holds several blocks' gradients, so they are reduced in a few large collectives
        # (fstrain.core.plan.buckets says why).
        "reduce_bucket_size": buckets["reduce_bucket_size"],
    }
    if stage in (1, 2):
        # Stage 3 gathers parameters with its own prefetcher and ignores this key.
        zero["allgather_bucket_size"] = buckets["allgather_bucket_size"]
    else:
        zero["stage3_prefetch_bucket_size"] = buckets["stage3_prefetch_bucket_size"]
        zero["stage3_param_persistence_threshold"] = buckets["stage3_param_persistence_threshold"]
        zero["stage3_max_live_parameters"] = STAGE3_MAX_LIVE_PARAMETERS
        zero["stage3_max_reuse_distance"] = STAGE3_MAX_REUSE_DISTANCE
    if knobs.offload in ("optimizer", "optimizer+params"):
        # pin_memory: page-locked host buffers make the GPU<->CPU copies asynchronous.
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if knobs.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return zero


def _precision(precision: str, zero_stage: int) -> tuple[dict[str, Any], list[str]]:
    """DeepSpeed's precision sections for ``precision`` at ``zero_stage``.

    ``amp-*`` is DeepSpeed's ``torch_autocast`` section (deepspeed/runtime/constants.py
    ``TORCH_AUTOCAST``): fp32 parameters and optimizer, forward under ``torch.autocast``; the
    engine adds a GradScaler for float16 at stage 0 only. What DeepSpeed does not run (pure bf16;
    amp-fp16 with ZeRO) is refused for DeepSpeed strategies (fstrain.core.plan.precision); for a
    ddp/fsdp plan, whose DeepSpeed file is only an equivalent, the nearest mode is written and
    the note says so.
    """
    if precision in ("bf16", "bf16-pure"):
        notes = ["bf16: no loss scaling section, because bf16 has fp32's exponent range and gradients do not underflow"]
        if precision == "bf16-pure":
            notes.append("bf16-pure: DeepSpeed keeps an fp32 master copy beside bf16 parameters, so this file runs "
                         "bf16 mixed precision; fsdp.yaml runs pure bf16")
        return {"bf16": {"enabled": True}}, notes
    if precision == "fp16" or (precision == "amp-fp16" and zero_stage > 0):
        notes = ["fp16: dynamic loss scaling (loss_scale 0) starting at 2^16, halved on overflow"]
        if precision == "amp-fp16":
            notes.append("amp-fp16: DeepSpeed's torch_autocast has no loss scaler with ZeRO, so this file runs "
                         "DeepSpeed's fp16 optimizer; fsdp.yaml runs autocast")
        return {"fp16": {"enabled": True, **FP16_LOSS_SCALING}}, notes
    if precision in ("amp-bf16", "amp-fp16"):
        dtype = "bfloat16" if precision == "amp-bf16" else "float16"
        scaler = ", with DeepSpeed's GradScaler (ZeRO stage 0)" if precision == "amp-fp16" else ""
        return {"torch_autocast": {"enabled": True, "dtype": dtype}}, [
            f"{precision}: torch_autocast ({dtype}) over fp32 parameters, gradients and optimizer states{scaler}; "
            "Linear layers communicate in the autocast dtype"
        ]
    return {}, ["fp32: no mixed precision; parameters, gradients and optimizer states are fp32"]


def _optimizer(plan: PlanFile, options: TrainingOptions) -> tuple[dict[str, Any], list[str]]:
    knobs = plan.knobs
    if knobs.optimizer == "adamw":
        params: dict[str, Any] = {
            "lr": options.lr,
            "betas": list(options.betas),
            "eps": options.eps,
            "weight_decay": options.weight_decay,
        }
        if knobs.offload == "none":
            # torch.optim.AdamW instead of DeepSpeed's FusedAdam (engine.py line 2380): same math,
            # no JIT build of a CUDA extension on every node. ZeRO hands the optimizer one flat
            # fp32 partition per parameter group, so torch's foreach update (its default on CUDA)
            # is a handful of kernels over one tensor, as FusedAdam's is.
            params["torch_adam"] = True
            return {"optimizer": {"type": "AdamW", "params": params}}, []
        return {"optimizer": {"type": "AdamW", "params": params}}, [
            "offload: AdamW runs as DeepSpeedCPUAdam, which DeepSpeed JIT-compiles on first use (needs a C++ compiler)"
        ]
    if knobs.optimizer == "sgd":
        params = {"lr": options.lr, "momentum": options.momentum, "weight_decay": options.weight_decay}
        # torch.optim.SGD is outside DeepSpeed's list of ZeRO-tested optimizers.
        extra: dict[str, Any] = {"zero_allow_untested_optimizer": True} if knobs.zero_stage > 0 else {}
        return {"optimizer": {"type": "SGD", "params": params}, **extra}, []
    # adam8bit, adafactor: DeepSpeed has neither; the training script must pass one in.
    extra = {"zero_allow_untested_optimizer": True} if knobs.zero_stage > 0 else {}
    client = {
        "adam8bit": "bitsandbytes.optim.AdamW8bit",
        "adafactor": "transformers.optimization.Adafactor(params, lr=..., scale_parameter=False, "
        "relative_step=False) (what the Hugging Face Trainer's optim='adafactor' builds)",
    }[knobs.optimizer]
    return extra, [f"{knobs.optimizer}: no optimizer block; pass {client} to deepspeed.initialize(optimizer=...)"]


def _scheduler(options: TrainingOptions) -> dict[str, Any]:
    if not options.has_schedule:
        return {}
    warmup = max(1, options.warmup_steps)
    if options.total_steps:
        params: dict[str, Any] = {
            "total_num_steps": options.total_steps,
            "warmup_min_ratio": 1.0 / warmup,  # the first step already moves (DeepSpeed starts at the min)
            "warmup_num_steps": warmup,
            "cos_min_ratio": options.min_lr_ratio,
            "warmup_type": "linear",
        }
        return {"scheduler": {"type": "WarmupCosineLR", "params": params}}
    params = {
        "warmup_min_lr": options.lr / warmup,
        "warmup_max_lr": options.lr,
        "warmup_num_steps": warmup,
        "warmup_type": "linear",  # DeepSpeed's default is 'log'
    }
    return {"scheduler": {"type": "WarmupLR", "params": params}}


def _activation_checkpointing(plan: PlanFile) -> dict[str, Any]:
    """DeepSpeed's section, for the policies its checkpoint function runs (whole blocks, or
    Megatron's attention core). Op-level selective AC is torch's own (no section)."""
    ac = plan.knobs.activation_checkpointing
    if ac in ("none", "selective-op"):
        return {}
    k = every_k(ac)
    return {
        "activation_checkpointing": {
            # Partitioning splits checkpoints across tensor-parallel ranks; without TP there
            # is nothing to split.
            "partition_activations": plan.knobs.tp > 1,
            "cpu_checkpointing": False,
            "contiguous_memory_optimization": False,
            "number_checkpoints": plan.model.num_layers // k if k else plan.model.num_layers,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
    }


def check_no_context_parallel(plan: PlanFile, where: str = "plan") -> None:
    """DeepSpeed's ZeRO engine has no ring-attention context parallelism."""
    if plan.knobs.cp > 1:
        raise ConfigError(
            f"the plan has cp={plan.knobs.cp}: DeepSpeed has no ring-attention context parallelism "
            "(DeepSpeed-Ulysses is a different sequence-parallel scheme, with other memory and traffic)",
            "render the FSDP files (fsdp.yaml) for this plan, or re-plan with --cp 1 for DeepSpeed",
            f"{where}: plan.cp",
        )


def megatron_notes(knobs: PlanKnobs) -> list[str]:
    """What a plan made for Megatron-LM's DDP or distributed optimizer (``--framework megatron``,
    :mod:`fstrain.core.plan.megatron`) runs with there: Megatron takes no DeepSpeed config, and its
    arguments (megatron/training/arguments.py @d98e8a6 L3156 ``--use-distributed-optimizer``, L3116
    ``--num-virtual-stages-per-pipeline-rank``, L3121 and L3148 ``--overlap-grad-reduce`` and
    ``--overlap-param-gather``, both off by default, which the time model assumes) set what the
    plan counted."""
    if knobs.framework != "megatron" or knobs.strategy not in ("ddp", "zero1"):
        return []
    flags = ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"] if (
        knobs.strategy == "zero1") else ["--overlap-grad-reduce"]
    if knobs.pp_schedule == "interleaved":
        flags.append(f"--num-virtual-stages-per-pipeline-rank {knobs.pp_virtual_stages}")
    which = "distributed optimizer" if knobs.strategy == "zero1" else "DDP with its plain optimizer"
    run = f" with {' '.join(flags)}" if flags else ""
    return [f"the plan was made for Megatron-LM's {which} (--framework megatron): Megatron reads no DeepSpeed "
            f"config; run it{run}, which keeps the contiguous gradient buffer the plan counted"]


def render_deepspeed(plan: PlanFile, options: TrainingOptions | None = None, *, debug: bool = False) -> Rendered:
    """The DeepSpeed config for ``plan``; ``debug`` turns on timers and the comms logger."""
    options = options or TrainingOptions()
    check_plan(plan)
    check_no_context_parallel(plan)
    options.validate()
    knobs = plan.knobs
    precision, precision_notes = _precision(knobs.precision, knobs.zero_stage)
    optimizer, optimizer_notes = _optimizer(plan, options)
    config: dict[str, Any] = {
        # DeepSpeed asserts train_batch_size == micro x accumulation x data-parallel size.
        "train_batch_size": knobs.global_batch_size,
        "train_micro_batch_size_per_gpu": knobs.micro_batch_size,
        "gradient_accumulation_steps": knobs.grad_accum_steps,
        "steps_per_print": STEPS_PER_PRINT,
        "zero_optimization": _zero_section(plan),
        "gradient_clipping": options.gradient_clipping,
        "wall_clock_breakdown": debug,
        "comms_logger": {"enabled": debug, "verbose": False, "prof_all": True, "debug": False},
        **precision,
        **optimizer,
        **_scheduler(options),
        **_activation_checkpointing(plan),
    }
    notes = [*precision_notes, *optimizer_notes]
    if knobs.activation_checkpointing == "selective-op":
        notes.append(
            "activation checkpointing selective-op: torch's op-level selective checkpoint "
            "(torch.utils.checkpoint.create_selective_checkpoint_contexts) in the training script; "
            "DeepSpeed's checkpointing has no op-level policy, so there is no activation_checkpointing section"
        )
    if knobs.tp > 1 or knobs.pp > 1:
        notes.append(
            f"tp={knobs.tp} pp={knobs.pp}: train_batch_size counts data-parallel ranks only; the training "
            "script must pass its model-parallel groups (mpu) to deepspeed.initialize"
        )
    if knobs.ep > 1:
        notes.append(
            f"ep={knobs.ep}: DeepSpeed's config has no expert-parallel key; DeepSpeed-MoE takes it in the model "
            f"code (deepspeed.moe.layer.MoE(..., ep_size={knobs.ep})) and the optimizer needs the expert parameter "
            "groups (deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer); the bundled "
            "trainer does not run expert parallelism"
        )
    if knobs.fp8:
        notes.append(
            "fp8: DeepSpeed's config has no fp8 compute key; the training script swaps the blocks' linears itself "
            "(Transformer Engine's te.Linear under te.fp8_autocast, as llm-foundry's amp_fp8 does, or torchao's "
            "convert_to_float8_training, skipping the output layer); the bundled trainer computes them in bf16"
        )
    if knobs.compile:
        notes.append(
            "compile: DeepSpeed's config has no key for it; the training script calls engine.compile() after "
            "deepspeed.initialize (torch.compile of the module); the bundled trainer compiles each block"
        )
    notes += megatron_notes(knobs)
    if knobs.pp > 1 and knobs.pp_schedule != "1f1b":
        notes.append(
            f"pp_schedule {knobs.pp_schedule}: DeepSpeed's pipeline engine runs its own 1F1B schedule "
            "(deepspeed.runtime.pipe.schedule.TrainSchedule) only, so under DeepSpeed this plan runs 1F1B, with "
            "more bubble than predicted; fsdp.yaml's pipeline section names the torch.distributed.pipelining "
            "schedule the plan was made for"
        )
    if knobs.strategy == "fsdp-hybrid":
        notes.append(
            f"the plan's strategy is fsdp-hybrid; this file is its ZeRO-{knobs.zero_stage} equivalent, sharded over "
            f"all {knobs.dp} data-parallel ranks (fsdp.yaml shards within groups of {knobs.shard_group_size})"
        )
    elif knobs.strategy.startswith("fsdp"):
        notes.append(f"the plan's strategy is {knobs.strategy}; this file is its ZeRO-{knobs.zero_stage} equivalent")
    return Rendered(config=config, notes=tuple(notes))
