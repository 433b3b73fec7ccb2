"""PlanFile -> torchtitan's command-line overrides (``torchtitan.args``).

torchtitan 0.3 has no job TOML: ``torchtitan.config.ConfigManager`` builds the job from a Python
config function (``--module llama3 --config llama3_8b``) and takes every other setting as a
``--section.field`` override, parsed by tyro into ``Trainer.Config``. So the plan renders to
those overrides, one per line, for the model's own config function to be run with::

    torchrun ... -m torchtitan.train --module llama3 --config llama3_8b $(cat torchtitan.args)

What each override holds (torchtitan/config/configs.py, trainer.py):

- ``parallelism``: ``data_parallel_replicate_degree`` x ``data_parallel_shard_degree`` is the
  plan's data-parallel mesh (``ddp``: replicate only; ``fsdp-hybrid``: replicate groups x the
  shard group; the others: shard over dp), with the tensor, pipeline, context and expert
  degrees; ``fsdp_reshard_after_forward`` ``always`` (ZeRO-3 / FULL_SHARD) or ``never``
  (ZeRO-2 / SHARD_GRAD_OP, and every pipeline plan, as fsdp.yaml); the pipeline schedule and
  its microbatch size.
- ``training``: ``local_batch_size`` per data-parallel rank and accumulation step (with a
  pipeline, the micro-batch x the plan's micro-batches, split into microbatches of
  ``pipeline_parallel_microbatch_size``), ``global_batch_size`` (torchtitan derives the
  gradient accumulation steps as global / (local x dp)), ``seq_len``, ``max_norm``,
  ``enable_cpu_offload`` (FSDP2's CPUOffloadPolicy), ``dtype`` and ``mixed_precision_param``
  / ``mixed_precision_reduce``.
- ``activation_checkpoint``: tyro's subcommand ``activation_checkpoint:none``, ``:full`` or
  ``:selective`` (op-level SAC, fstrain's ``selective-op``).
- ``lr_scheduler``, ``compile``, ``debug.seed``.
"""

from __future__ import annotations

from typing import Any

from fstrain.core.plan.planfile import PlanFile
from fstrain.core.render.common import Rendered, check_plan
from fstrain.core.render.fsdp import TORCH_SCHEDULES
from fstrain.core.render.options import TrainingOptions
from fstrain.core.render.trainers import cannot_run, check_fsdp2_habits

TRAINER = "torchtitan"
# fstrain's activation checkpointing -> torchtitan's subcommand of `activation_checkpoint`
# (torchtitan/distributed/activation_checkpoint.py ActivationCheckpointingConfig).
AC_MODES = {"none": "none", "full": "full", "selective-op": "selective"}
# fstrain precision -> (training.dtype, training.mixed_precision_param)
PRECISIONS = {"bf16": ("float32", "bfloat16"), "fp32": ("float32", "float32"), "bf16-pure": ("bfloat16", "bfloat16"),
              "amp-bf16": ("float32", "bfloat16")}
AC_SUBCOMMAND = "activation_checkpoint"


def check_torchtitan(plan: PlanFile) -> None:
    """Refuse what torchtitan 0.3 does not run, naming the knob and what to plan instead."""
    check_plan(plan)
    knobs = plan.knobs
    check_fsdp2_habits(knobs, TRAINER)
    if knobs.strategy == "zero1":
        raise cannot_run(TRAINER, "strategy", "zero1", "torchtitan shards with FSDP2, which has no "
                         "optimizer-only sharding", "re-plan with --strategy zero2 or fsdp-full")
    if knobs.precision in ("fp16", "amp-fp16"):
        raise cannot_run(TRAINER, "precision", knobs.precision, "torchtitan trains in bfloat16 or float32 only "
                         "(training.mixed_precision_param)", "re-plan with --precision bf16")
    if knobs.precision == "amp-bf16" and knobs.strategy != "ddp":
        raise cannot_run(TRAINER, "precision", "amp-bf16", "torchtitan autocasts only without sharding; under "
                         "FSDP it casts the parameters (bf16)", "re-plan with --precision bf16")
    if knobs.activation_checkpointing not in AC_MODES:
        raise cannot_run(TRAINER, "activation_checkpointing", knobs.activation_checkpointing,
                         "torchtitan 0.3 checkpoints none, full, selective (op-level) or by memory budget",
                         "re-plan with --ac full, --ac selective-op or --ac none")


def mesh_degrees(plan: PlanFile) -> tuple[int, int]:
    """(data_parallel_replicate_degree, data_parallel_shard_degree) for the plan's dp ranks."""
    knobs = plan.knobs
    if knobs.strategy == "ddp":
        return knobs.dp, 1
    if knobs.strategy == "fsdp-hybrid":
        return knobs.dp // knobs.shard_group_size, knobs.shard_group_size
    return 1, knobs.dp


def render_torchtitan(plan: PlanFile, options: TrainingOptions | None = None) -> Rendered:
    """The overrides for ``plan`` as ``{section: {field: value}}``, with the activation
    checkpointing subcommand under ``activation_checkpoint`` (see :func:`format_torchtitan_args`)."""
    options = options or TrainingOptions()
    check_torchtitan(plan)
    options.validate()
    knobs = plan.knobs
    replicate, shard = mesh_degrees(plan)
    reshard = knobs.strategy in ("zero3", "fsdp-full", "fsdp-hybrid") and knobs.pp == 1
    dtype, param_dtype = PRECISIONS[knobs.precision]
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": "always" if reshard else "never",
        "tensor_parallel_degree": knobs.tp,
        "pipeline_parallel_degree": knobs.pp,
        "context_parallel_degree": knobs.cp,
        "expert_parallel_degree": knobs.ep,
    }
    # One torchtitan step takes local_batch_size sequences per data-parallel rank; with a pipeline
    # they are the plan's micro-batches, so the accumulation happens inside the schedule.
    pipeline_microbatches = knobs.grad_accum_steps if knobs.pp > 1 else 1
    local_batch = knobs.micro_batch_size * pipeline_microbatches
    if knobs.pp > 1:
        parallelism["pipeline_parallel_schedule"] = TORCH_SCHEDULES[knobs.pp_schedule].removeprefix("Schedule")
        parallelism["pipeline_parallel_microbatch_size"] = knobs.micro_batch_size
    training: dict[str, Any] = {
        "local_batch_size": local_batch,
        "global_batch_size": knobs.global_batch_size,
        "seq_len": knobs.seq_len or plan.model.seq_len,
        "max_norm": options.gradient_clipping,
        "enable_cpu_offload": knobs.offload != "none",
        "dtype": dtype,
        "mixed_precision_param": param_dtype,
        "mixed_precision_reduce": "float32",
    }
    lr_scheduler: dict[str, Any] = {"warmup_steps": options.warmup_steps}
    if options.total_steps:
        training["steps"] = options.total_steps
        lr_scheduler.update(decay_type="cosine", min_lr_factor=options.min_lr_ratio)
    config: dict[str, Any] = {
        "parallelism": parallelism,
        "training": training,
        "lr_scheduler": lr_scheduler,
        "compile": {"enable": knobs.compile},
        "debug": {"seed": options.seed},
        AC_SUBCOMMAND: AC_MODES[knobs.activation_checkpointing],
    }
    return Rendered(config=config, notes=tuple(_notes(plan, options)))


def _notes(plan: PlanFile, options: TrainingOptions) -> list[str]:
    knobs = plan.knobs
    notes = [
        f"run with the config function of the model the plan was made for ({plan.model.name}): "
        "torchrun ... -m torchtitan.train --module MODULE --config FUNCTION $(cat torchtitan.args)",
        f"the optimizer is the config function's (its param_groups are no command-line values): the plan's is "
        f"{knobs.optimizer}, lr {options.lr}, weight decay {options.weight_decay}",
    ]
    if not options.total_steps:
        notes.append("no --train-steps: the learning rate decays over the config function's training.steps")
    if knobs.offload == "optimizer":
        notes.append("training.enable_cpu_offload offloads parameters and gradients with the optimizer states "
                     "(FSDP2's CPUOffloadPolicy)")
    if knobs.strategy == "ddp" and knobs.precision == "bf16":
        notes.append("ddp bf16: without sharding torchtitan runs mixed_precision_param as torch.autocast over "
                     "fp32 parameters")
    if knobs.precision == "bf16-pure":
        notes.append("bf16-pure: training.dtype bfloat16 holds parameters and optimizer states in bf16; torchtitan "
                     "reduces gradients in float32 (fsdp.yaml in bf16)")
    if knobs.framework != "torchtitan":
        notes.append(f"the plan was made for --framework {knobs.framework}; `fstrain plan --framework torchtitan` "
                     "counts what torchtitan keeps")
    if knobs.fp8:
        notes.append("fp8: add torchtitan's float8 converter to the config function (torchao Float8Linear, "
                     "tensorwise, the output layer left out)")
    return notes


def format_torchtitan_args(config: dict[str, Any]) -> tuple[str, ...]:
    """The overrides as command-line arguments, one ``--section.field=value`` each, the
    activation checkpointing subcommand last (tyro reads a subcommand's own options after it)."""
    args: list[str] = []
    for section, fields in config.items():
        if section == AC_SUBCOMMAND:
            continue
        for name, value in fields.items():
            args.append(_argument(f"{section}.{name}", value))
    args.append(f"{AC_SUBCOMMAND}:{config[AC_SUBCOMMAND]}")
    return tuple(args)


def _argument(name: str, value: object) -> str:
    if isinstance(value, bool):
        # tyro's booleans are flags: --x sets True, --no-x ... is spelled on the last part.
        section, _, field = name.rpartition(".")
        return f"--{name}" if value else f"--{section}.no-{field}"
    return f"--{name}={value}"
