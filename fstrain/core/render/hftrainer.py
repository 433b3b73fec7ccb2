"""PlanFile -> Hugging Face ``TrainingArguments`` (``hf_training_args.json``) and, for a ZeRO
plan, the DeepSpeed config its ``deepspeed`` key points at (``hf_ds_config.json``).

Written for transformers 5.25 (``src/transformers/training_args.py``), whose
``HfArgumentParser(TrainingArguments).parse_json_file`` reads the arguments file:

- the batch: ``per_device_train_batch_size`` (the plan's micro-batch) and
  ``gradient_accumulation_steps``; the data-parallel size is the number of processes the
  script is launched with, so the global batch is micro x accumulation x processes.
- precision: ``bf16`` / ``fp16`` (Accelerate's autocast; under FSDP2 also its
  ``MixedPrecisionPolicy``).
- activation checkpointing: ``activation_checkpointing`` (``gradient_checkpointing`` is its
  deprecated alias in transformers 5), ``activation_checkpointing_kwargs.every_n_layers`` for
  ``every-k:N``; for FSDP plans ``fsdp_config.activation_checkpointing`` (FSDP's own wrapper,
  which the Trainer prefers under FSDP: the other costs an extra all-gather in backward).
- sharding: ``deepspeed`` (ZeRO 1-3) or ``fsdp`` + ``fsdp_config`` with ``version: 2`` (FSDP2,
  transformers 5's default: ``reshard_after_forward`` true for full sharding, false for
  SHARD_GRAD_OP, ``cpu_offload``, the model's own ``_no_split_modules`` as the wrapped blocks).
- optimizer and schedule: ``optim``, ``learning_rate``, Adam's betas and epsilon, weight decay,
  ``max_grad_norm``, ``warmup_steps``, and a cosine to ``min_lr_rate`` over ``max_steps``
  (``cosine_with_min_lr``) or a constant rate after warm-up.

The DeepSpeed file is ``ds_config.json``'s content with ``"auto"`` wherever the Trainer fills the
value from these arguments (``HfTrainerDeepSpeedConfig.trainer_config_process``): batch sizes,
accumulation, clipping, the optimizer's hyperparameters, bf16/fp16 on or off. It has no
``scheduler`` block, so the Trainer builds its own (``lr_scheduler_type``) around DeepSpeed's
optimizer. ZeRO's bucket sizes are ``"auto"`` (hidden-size based, filled by
``trainer_config_finalize``) only for a plan made with ``--framework hf-trainer``, which is the
plan that counted them; any other plan keeps the rendered sizes it counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fstrain.core.plan.acpolicy import every_k
from fstrain.core.plan.planfile import PlanFile
from fstrain.core.render.common import Rendered, check_plan
from fstrain.core.render.deepspeed import render_deepspeed
from fstrain.core.render.options import TrainingOptions
from fstrain.core.render.trainers import cannot_run, check_fsdp2_habits, check_model_parallel

TRAINER = "hf-trainer"
# fstrain's optimizer -> the Trainer's `optim` (transformers' OptimizerNames). adamw_torch_fused is
# the Trainer's own default on torch >= 2.8.
HF_OPTIMIZERS = {"adamw": "adamw_torch_fused", "sgd": "sgd", "adam8bit": "adamw_bnb_8bit", "adafactor": "adafactor"}
DEEPSPEED_STRATEGIES = ("zero1", "zero2", "zero3")
FSDP_RESHARD = {"fsdp-full": True, "fsdp-grad-op": False}
# Where the Trainer fills "auto" from its arguments (transformers 5.25 integrations/deepspeed.py
# HfTrainerDeepSpeedConfig.trainer_config_process); the bucket keys are filled from the model's
# hidden size in trainer_config_finalize.
AUTO_TOP_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                 "gradient_clipping")
AUTO_OPTIMIZER_PARAMS = ("lr", "betas", "eps", "weight_decay")
AUTO_BUCKET_KEYS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")


def check_hf_trainer(plan: PlanFile) -> None:
    """Refuse what the Trainer's arguments cannot hold, naming the knob and what to plan instead."""
    check_plan(plan)
    knobs = plan.knobs
    check_fsdp2_habits(knobs, TRAINER)
    check_model_parallel(knobs, TRAINER)
    if knobs.strategy == "fsdp-hybrid":
        raise cannot_run(
            TRAINER, "strategy", "fsdp-hybrid",
            "TrainingArguments hold no hybrid mesh (its parallelism_config is an Accelerate object, not JSON)",
            "re-plan with --strategy fsdp-full or zero3; accelerate.yaml holds the hybrid mesh for an Accelerate loop",
        )
    if knobs.activation_checkpointing in ("selective-op", "megatron-selective"):
        raise cannot_run(
            TRAINER, "activation_checkpointing", knobs.activation_checkpointing,
            "the Trainer checkpoints whole decoder layers only (activation_checkpointing, every_n_layers)",
            "re-plan with --ac full, --ac every-k:N or --ac none",
        )


def render_hf_deepspeed(plan: PlanFile, options: TrainingOptions | None = None, *, debug: bool = False) -> Rendered:
    """The DeepSpeed config for the Trainer: ``ds_config.json`` with ``"auto"`` where the Trainer fills it."""
    check_hf_trainer(plan)
    base = render_deepspeed(plan, options, debug=debug)
    config: dict[str, Any] = {**base.config, **dict.fromkeys(AUTO_TOP_KEYS, "auto")}
    config.pop("scheduler", None)  # the Trainer's own scheduler (lr_scheduler_type) drives DeepSpeed's optimizer
    for section in ("bf16", "fp16"):
        if section in config:
            config[section] = {**config[section], "enabled": "auto"}
    if "optimizer" in config:
        params = config["optimizer"]["params"]
        auto = {key: "auto" for key in AUTO_OPTIMIZER_PARAMS if key in params}
        config["optimizer"] = {**config["optimizer"], "params": {**params, **auto}}
    notes = [note for note in base.notes if "deepspeed.initialize(optimizer=" not in note]
    if plan.knobs.framework == "hf-trainer":
        zero = dict(config["zero_optimization"])
        for key in AUTO_BUCKET_KEYS:
            if key in zero:
                zero[key] = "auto"
        config["zero_optimization"] = zero
        notes.append("bucket sizes 'auto': the Trainer sets them from the model's hidden size, as the plan "
                     "(--framework hf-trainer) counted them")
    else:
        notes.append(f"bucket sizes as in ds_config.json, which the plan (--framework {plan.knobs.framework}) "
                     "counted; a plan made with --framework hf-trainer gets the Trainer's 'auto' sizes")
    return Rendered(config=config, notes=tuple(notes))


def _precision(plan: PlanFile, ds_config: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """``bf16`` / ``fp16`` for the Trainer, and what a reader should know about them."""
    precision = plan.knobs.precision
    if ds_config is not None:
        # DeepSpeed's own sections decide; the Trainer's flags must agree with them (it fills "auto"
        # from them). amp-* runs as DeepSpeed's torch_autocast section with both flags off.
        return {"bf16": "bf16" in ds_config, "fp16": "fp16" in ds_config}, []
    flags = {"bf16": precision in ("bf16", "amp-bf16"), "fp16": precision in ("fp16", "amp-fp16")}
    notes: list[str] = []
    if precision == "bf16-pure":
        notes.append("bf16-pure: bf16 and fp16 off; load the model in bf16 (dtype=torch.bfloat16), so "
                     "parameters and optimizer states are bf16")
    elif plan.knobs.strategy.startswith("fsdp") and precision != "fp32":
        notes.append(f"{precision}: the Trainer's FSDP2 casts parameters and reduces gradients in the "
                     "low-precision dtype (Accelerate's MixedPrecisionPolicy(param_dtype=reduce_dtype)); "
                     "fsdp.yaml reduces in fp32")
    return flags, notes


def _activation_checkpointing(plan: PlanFile, fsdp: bool) -> tuple[dict[str, Any], list[str]]:
    ac = plan.knobs.activation_checkpointing
    k = every_k(ac)
    if k == 0:
        return {"activation_checkpointing": False}, []
    if k == 1 and fsdp:
        return {"activation_checkpointing": False}, []  # fsdp_config.activation_checkpointing
    args: dict[str, Any] = {"activation_checkpointing": True}
    notes: list[str] = []
    if k > 1:
        args["activation_checkpointing_kwargs"] = {"every_n_layers": k}
        # transformers checkpoints layers 0, k, 2k, ... (modeling_utils.py: layer_index % every_n_layers == 0);
        # fstrain's every-k:N counts blocks N, 2N, ...: the same number when N divides the layers.
        if plan.model.num_layers % k:
            notes.append(f"every_n_layers {k}: the Trainer checkpoints layers 0, {k}, {2 * k}, ... "
                         f"({-(-plan.model.num_layers // k)} of {plan.model.num_layers}), one more than the plan's "
                         f"{plan.model.num_layers // k}")
        if fsdp:
            notes.append("every_n_layers under FSDP: the Trainer's own checkpointing, which gathers each checkpointed "
                         "layer's parameters once more in backward")
    return args, notes


def _optimizer_and_schedule(plan: PlanFile, options: TrainingOptions) -> dict[str, Any]:
    args: dict[str, Any] = {
        "optim": HF_OPTIMIZERS[plan.knobs.optimizer],
        "learning_rate": options.lr,
        "weight_decay": options.weight_decay,
        "adam_beta1": options.betas[0],
        "adam_beta2": options.betas[1],
        "adam_epsilon": options.eps,
        "max_grad_norm": options.gradient_clipping,
        "warmup_steps": options.warmup_steps,
        "seed": options.seed,
    }
    if plan.knobs.optimizer == "sgd":
        args["optim_args"] = f"momentum={options.momentum}"
    if options.total_steps:
        args["max_steps"] = options.total_steps
        args["lr_scheduler_type"] = "cosine_with_min_lr"
        args["lr_scheduler_kwargs"] = {"min_lr_rate": options.min_lr_ratio}
    else:
        args["lr_scheduler_type"] = "constant_with_warmup"
    return args


def _fsdp_config(plan: PlanFile, ac_full: bool) -> dict[str, Any]:
    return {
        "version": 2,
        "reshard_after_forward": FSDP_RESHARD[plan.knobs.strategy],
        "cpu_offload": plan.knobs.offload != "none",
        # No class list: Accelerate wraps the model's own _no_split_modules (its decoder layer).
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "state_dict_type": "SHARDED_STATE_DICT",
        "activation_checkpointing": ac_full,
    }


@dataclass(frozen=True)
class HfTrainerFiles:
    """The arguments file, and the DeepSpeed file it points at (None: not a ZeRO plan)."""

    arguments: Rendered
    deepspeed: Rendered | None


def render_hf_trainer(
    plan: PlanFile, options: TrainingOptions | None = None, *, deepspeed_path: str = "hf_ds_config.json",
    debug: bool = False,
) -> HfTrainerFiles:
    """The ``TrainingArguments`` for ``plan`` and, for a ZeRO plan, the DeepSpeed config they name
    as ``deepspeed_path`` (where the caller writes it)."""
    options = options or TrainingOptions()
    check_hf_trainer(plan)
    options.validate()
    knobs = plan.knobs
    fsdp = knobs.strategy in FSDP_RESHARD
    ds = render_hf_deepspeed(plan, options, debug=debug) if knobs.strategy in DEEPSPEED_STRATEGIES else None
    precision, precision_notes = _precision(plan, ds.config if ds is not None else None)
    ac, ac_notes = _activation_checkpointing(plan, fsdp)
    args: dict[str, Any] = {
        "per_device_train_batch_size": knobs.micro_batch_size,
        "gradient_accumulation_steps": knobs.grad_accum_steps,
        **precision,
        **ac,
        **_optimizer_and_schedule(plan, options),
        "torch_compile": knobs.compile,
    }
    notes = [
        f"launch {knobs.dp} processes (torchrun --nnodes {plan.cluster.num_nodes} --nproc-per-node "
        f"{max(1, plan.cluster.gpus_per_node)}): per_device_train_batch_size {knobs.micro_batch_size} "
        f"x gradient_accumulation_steps {knobs.grad_accum_steps} x {knobs.dp} processes = {knobs.global_batch_size} "
        "sequences per step",
        *precision_notes,
        *ac_notes,
        "the Trainer's warm-up starts at learning rate 0 (fstrain's trainer at lr/warmup_steps)",
    ]
    if ds is not None:
        args["deepspeed"] = deepspeed_path
    elif fsdp:
        args["fsdp"] = True
        args["fsdp_config"] = _fsdp_config(plan, every_k(knobs.activation_checkpointing) == 1)
        if knobs.offload == "optimizer":
            notes.append("FSDP2's CPU offload moves parameters and gradients with the optimizer states")
    if knobs.fp8:
        notes.append("fp8: TrainingArguments have no fp8 key; the linears run in the compute dtype unless the script "
                     "converts them (torchao's convert_to_float8_training)")
    if knobs.framework != "hf-trainer":
        notes.append(f"the plan was made for --framework {knobs.framework}; `fstrain plan --framework hf-trainer` "
                     "counts what the Trainer keeps")
    return HfTrainerFiles(Rendered(config=args, notes=tuple(notes)), ds)
