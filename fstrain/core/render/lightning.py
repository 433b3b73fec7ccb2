"""PlanFile -> Lightning's Trainer and strategy arguments (``lightning.yaml``).

Written for Lightning 2.6 (``lightning.pytorch``). The file is YAML a script loads with
``yaml.safe_load``; what must be a Python object (the model's block class, torch dtypes, a
tuple) is kept as plain values in its own section for the script to build:

- ``trainer``: ``lightning.pytorch.Trainer`` keyword arguments: ``accelerator``, ``devices``
  (processes per node), ``num_nodes``, ``precision``, ``accumulate_grad_batches``, and
  ``gradient_clip_val`` and ``max_steps`` where they apply.
- ``strategy``: ``class_path`` and ``init_args`` (plain keyword arguments):
  ``FSDPStrategy`` (FSDP1: ``sharding_strategy`` FULL_SHARD, SHARD_GRAD_OP or HYBRID_SHARD,
  ``cpu_offload``, ``state_dict_type``) for ``fsdp-*`` plans; ``DeepSpeedStrategy(config=...)``
  with the plan's DeepSpeed config for ``zero1/2/3`` (less the two keys Lightning sets itself,
  ``gradient_accumulation_steps`` from ``accumulate_grad_batches``, and ``train_batch_size``,
  which DeepSpeed then derives); ``DDPStrategy`` for ``ddp``.
- ``fsdp`` (FSDPStrategy only): ``mixed_precision`` (torch's ``MixedPrecision`` dtypes by name:
  the plan's parameter and reduction dtypes, which Lightning's ``precision`` alone would set
  to bf16 for both), ``device_mesh`` (``(replicate, shard)`` for HYBRID_SHARD), and whether
  ``activation_checkpointing_policy`` and ``auto_wrap_policy`` name the model's block class.
- ``batch`` (the DataLoader's ``batch_size`` is ``micro_batch_size``), ``activation_checkpointing``,
  ``optimizer`` / ``scheduler`` for ``configure_optimizers`` (unless DeepSpeed's config holds an
  optimizer: then Lightning does not call it), ``seed_everything``.
"""

from __future__ import annotations

from typing import Any

from fstrain.core.plan.planfile import PlanFile
from fstrain.core.render.common import Rendered, check_plan
from fstrain.core.render.deepspeed import render_deepspeed
from fstrain.core.render.fsdp import optimizer_section, scheduler_section
from fstrain.core.render.options import TrainingOptions
from fstrain.core.render.trainers import cannot_run, check_fsdp2_habits, check_model_parallel

TRAINER = "lightning"
LIGHTNING_FILE_VERSION = 1
STRATEGIES = "lightning.pytorch.strategies"
FSDP_SHARDING = {"fsdp-full": "FULL_SHARD", "fsdp-grad-op": "SHARD_GRAD_OP", "fsdp-hybrid": "HYBRID_SHARD"}
# fstrain precision -> Lightning's Trainer(precision=...)
LIGHTNING_PRECISION = {"bf16": "bf16-mixed", "amp-bf16": "bf16-mixed", "fp16": "16-mixed", "amp-fp16": "16-mixed",
                       "fp32": "32-true", "bf16-pure": "bf16-true"}
# fstrain precision -> torch MixedPrecision(param_dtype, reduce_dtype, buffer_dtype) under FSDPStrategy:
# the parameters FSDP gathers and the gradients it reduces, as fsdp.yaml holds them (fp32 reductions).
FSDP_MIXED_PRECISION = {
    "bf16": ("bfloat16", "float32", "bfloat16"),
    "fp16": ("float16", "float32", "float16"),
    "amp-bf16": ("float32", "float32", "float32"),  # autocast over fp32 weights: FSDP casts nothing
    "amp-fp16": ("float32", "float32", "float32"),
}


def check_lightning(plan: PlanFile) -> None:
    """Refuse what Lightning's strategies cannot run as planned, naming the knob and what instead."""
    check_plan(plan)
    knobs = plan.knobs
    check_fsdp2_habits(knobs, TRAINER)
    check_model_parallel(knobs, TRAINER)
    if not knobs.strategy.startswith("fsdp"):
        return
    if knobs.activation_checkpointing not in ("none", "full"):
        raise cannot_run(TRAINER, "activation_checkpointing", knobs.activation_checkpointing,
                         "FSDPStrategy's activation_checkpointing_policy checkpoints whole blocks",
                         "re-plan with --ac full or --ac none")
    if knobs.precision == "bf16-pure":
        raise cannot_run(TRAINER, "precision", "bf16-pure", "FSDPStrategy keeps a full-precision copy of the "
                         "parameters under bf16-true", "re-plan with --precision bf16")
    if knobs.strategy == "fsdp-hybrid" and knobs.dp % knobs.shard_group_size:
        raise cannot_run(TRAINER, "shard_group_size", knobs.shard_group_size,
                         f"HYBRID_SHARD needs dp ({knobs.dp}) to be a multiple of the shard group",
                         "re-plan with a shard group that divides dp")


def _deepspeed_config(plan: PlanFile, options: TrainingOptions, debug: bool) -> tuple[dict[str, Any], list[str]]:
    rendered = render_deepspeed(plan, options, debug=debug)
    # Lightning refuses gradient_accumulation_steps in the config (it sets it from
    # accumulate_grad_batches) and DeepSpeed derives train_batch_size from the rest.
    config = {key: value for key, value in rendered.config.items()
              if key not in ("gradient_accumulation_steps", "train_batch_size")}
    return config, list(rendered.notes)


def _strategy(plan: PlanFile, options: TrainingOptions, debug: bool) -> tuple[dict[str, Any], list[str]]:
    knobs = plan.knobs
    if knobs.strategy in FSDP_SHARDING:
        init_args = {"sharding_strategy": FSDP_SHARDING[knobs.strategy], "cpu_offload": knobs.offload != "none",
                     "state_dict_type": "sharded"}
        return {"class_path": f"{STRATEGIES}.FSDPStrategy", "init_args": init_args}, []
    if knobs.strategy == "ddp":
        return {"class_path": f"{STRATEGIES}.DDPStrategy", "init_args": {}}, []
    config, notes = _deepspeed_config(plan, options, debug)
    return {"class_path": f"{STRATEGIES}.DeepSpeedStrategy", "init_args": {"config": config}}, notes


def _fsdp_section(plan: PlanFile) -> dict[str, Any]:
    knobs = plan.knobs
    dtypes = FSDP_MIXED_PRECISION.get(knobs.precision)
    mixed = dict(zip(("param_dtype", "reduce_dtype", "buffer_dtype"), dtypes, strict=True)) if dtypes else None
    hybrid = knobs.strategy == "fsdp-hybrid"
    return {
        "mixed_precision": mixed,
        "device_mesh": [knobs.dp // knobs.shard_group_size, knobs.shard_group_size] if hybrid else None,
        "activation_checkpointing": knobs.activation_checkpointing == "full",
        "auto_wrap": True,
    }


def _trainer(plan: PlanFile, options: TrainingOptions) -> dict[str, Any]:
    knobs = plan.knobs
    precision = knobs.precision
    deepspeed = knobs.strategy in ("zero1", "zero2", "zero3")
    if deepspeed and precision.startswith("amp-"):
        precision = "fp32"  # DeepSpeed's torch_autocast section autocasts; Lightning adds nothing
    num_nodes = max(1, plan.cluster.num_nodes)
    trainer: dict[str, Any] = {
        "accelerator": "gpu",
        "devices": knobs.dp // num_nodes,
        "num_nodes": num_nodes,
        "precision": LIGHTNING_PRECISION[precision],
        "accumulate_grad_batches": knobs.grad_accum_steps,
    }
    if not deepspeed:  # DeepSpeed's config holds gradient_clipping
        trainer["gradient_clip_val"] = options.gradient_clipping
    if options.total_steps:
        trainer["max_steps"] = options.total_steps
    return trainer


def render_lightning(plan: PlanFile, options: TrainingOptions | None = None, *, debug: bool = False) -> Rendered:
    """The content of ``lightning.yaml`` for ``plan``."""
    options = options or TrainingOptions()
    check_lightning(plan)
    options.validate()
    knobs = plan.knobs
    strategy, notes = _strategy(plan, options, debug)
    config: dict[str, Any] = {
        "fstrain_lightning": LIGHTNING_FILE_VERSION,
        "trainer": _trainer(plan, options),
        "strategy": strategy,
        "batch": {
            "micro_batch_size": knobs.micro_batch_size,
            "grad_accum_steps": knobs.grad_accum_steps,
            "global_batch_size": knobs.global_batch_size,
        },
        "activation_checkpointing": knobs.activation_checkpointing,
        "seed_everything": options.seed,
    }
    if knobs.strategy in FSDP_SHARDING:
        config["fsdp"] = _fsdp_section(plan)
        notes.append("FSDPStrategy is FSDP1: pass your model's block class as auto_wrap_policy (and "
                     "activation_checkpointing_policy when fsdp.activation_checkpointing is true)")
    deepspeed_config = strategy["init_args"].get("config", {})
    if "optimizer" in deepspeed_config:
        # DeepSpeedStrategy._initialize_deepspeed_train: an optimizer in the config replaces configure_optimizers.
        notes.append("DeepSpeedStrategy builds the optimizer (and scheduler) of its config; configure_optimizers "
                     "is not called")
    else:
        config["optimizer"] = optimizer_section(knobs.optimizer, options)
        config["scheduler"] = scheduler_section(options)
    if deepspeed_config:
        if knobs.activation_checkpointing != "none":
            notes.append(f"activation checkpointing {knobs.activation_checkpointing}: the model's forward calls "
                         "deepspeed.checkpointing.checkpoint, set up by the config's activation_checkpointing section")
        if knobs.precision.startswith("amp-"):
            notes.append(f"{knobs.precision}: precision 32-true; DeepSpeed's torch_autocast section autocasts")
    if knobs.strategy == "ddp" and knobs.activation_checkpointing != "none":
        notes.append(f"activation checkpointing {knobs.activation_checkpointing}: applied by the model's own code")
    if knobs.fp8 or knobs.compile:
        notes.append("fp8 and compile: the Trainer has no argument for them; the script converts the linears "
                     "(torchao's convert_to_float8_training) or compiles the blocks itself")
    if knobs.framework != "lightning":
        notes.append(f"the plan was made for --framework {knobs.framework}; `fstrain plan --framework lightning` "
                     "counts what Lightning keeps")
    return Rendered(config=config, notes=tuple(notes))
