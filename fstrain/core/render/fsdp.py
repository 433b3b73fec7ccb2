"""PlanFile -> the FSDP2 file the bundled trainer reads (``fsdp.yaml``) and an Accelerate config.

``fsdp.yaml`` maps one to one onto ``torch.distributed.fsdp.fully_shard`` arguments:

- ``mesh``: ``init_device_mesh`` shape and dimension names. One ``shard`` dimension for full
  sharding; ``(replicate, shard)`` for hybrid sharding, where the shard dimension is the plan's
  ``shard_group_size`` (an NVLink domain or a node) so all-gathers stay on the fast links.
- ``reshard_after_forward``: ``True`` frees gathered parameters after forward (ZeRO-3 /
  FULL_SHARD); ``False`` keeps them until backward (ZeRO-2 / SHARD_GRAD_OP).
- ``model_dtype``: the dtype the model is built in (``bfloat16`` for pure bf16, else ``float32``).
- ``mixed_precision``: ``MixedPrecisionPolicy(param_dtype, reduce_dtype)`` (the model's own dtype
  for pure bf16 and autocast: no casting by FSDP).
- ``autocast``: ``torch.autocast(dtype)`` around forward and loss (``amp-*``), or ``null``.
- ``cpu_offload``: ``CPUOffloadPolicy(pin_memory)``.
- ``wrap``: the module classes each given their own ``fully_shard`` call, then the root.
- ``activation_checkpointing``: the policy (:mod:`fstrain.core.plan.acpolicy`) the trainer applies to
  each wrapped block before sharding it.
- ``pipeline`` (only with pp > 1): the schedule, torch.distributed.pipelining's class for it,
  stages per rank and micro-batches; ``reshard_after_forward`` is then ``False`` for every
  strategy, as torchtitan shards pipeline stages.

``accelerate.yaml`` is the same layout in Accelerate's FSDP version 2 keys (the names
``accelerate config`` writes and ``accelerate launch`` maps to ``FSDP_*`` variables).
"""

from __future__ import annotations

from typing import Any

from fstrain.core.plan.planfile import PlanFile
from fstrain.core.plan.schema import PlanKnobs
from fstrain.core.render.common import Rendered, check_plan
from fstrain.core.render.options import TrainingOptions

FSDP_FILE_VERSION = 1
# The block class of fstrain.train.model; a user's own model names its own block class here.
WRAP_MODULE_CLASSES = ("TransformerBlock",)

# How each plan strategy lays out on FSDP2: (hybrid mesh?, reshard_after_forward).
_LAYOUT = {
    "fsdp-full": (False, True),
    "zero3": (False, True),
    "fsdp-grad-op": (False, False),
    "zero2": (False, False),
    "zero1": (False, False),
    "fsdp-hybrid": (True, True),
    "ddp": (True, False),  # replicate over every rank, shard over a group of 1
}
# precision mode -> (model dtype, FSDP param dtype, FSDP reduce dtype, autocast dtype)
_PRECISION_LAYOUT: dict[str, tuple[str, str, str, str | None]] = {
    # Reduce gradients in fp32: bf16/fp16 sums over many ranks lose precision.
    "bf16": ("float32", "bfloat16", "float32", None),
    "fp16": ("float32", "float16", "float32", None),
    "fp32": ("float32", "float32", "float32", None),
    # torchtune: the model is bf16 and FSDP casts nothing (gradients reduce in bf16).
    "bf16-pure": ("bfloat16", "bfloat16", "bfloat16", None),
    # autocast over fp32 weights: FSDP gathers and reduces fp32.
    "amp-bf16": ("float32", "float32", "float32", "bfloat16"),
    "amp-fp16": ("float32", "float32", "float32", "float16"),
}
# Accelerate's mixed_precision: "bf16"/"fp16" is autocast (plus a GradScaler for fp16).
_ACCELERATE_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no", "bf16-pure": "no", "amp-bf16": "bf16",
                         "amp-fp16": "fp16"}


def fsdp_mesh(plan: PlanFile) -> dict[str, Any]:
    """The data-parallel device mesh: ``{"dim_names": [...], "shape": [...]}``. With context
    parallelism FSDP shards over ``dp x cp`` ranks (torchtitan's flattened dp_shard_cp mesh)."""
    knobs = plan.knobs
    hybrid, _ = _LAYOUT[knobs.strategy]
    cp = knobs.cp
    shard = 1 if knobs.strategy == "ddp" else knobs.shard_group_size if hybrid else knobs.dp
    replicate = knobs.dp // shard
    if hybrid and replicate > 1:
        return {"dim_names": ["replicate", "shard"], "shape": [replicate, shard * cp]}
    return {"dim_names": ["shard"], "shape": [knobs.dp * cp]}


def render_fsdp(plan: PlanFile, options: TrainingOptions | None = None) -> Rendered:
    """The content of ``fsdp.yaml`` for ``plan``."""
    options = options or TrainingOptions()
    check_plan(plan)
    options.validate()
    knobs = plan.knobs
    _, reshard = _LAYOUT[knobs.strategy]
    notes: list[str] = []
    mesh = fsdp_mesh(plan)
    if knobs.strategy == "ddp":
        notes.append("ddp: every rank holds a full replica (FSDP2 hybrid mesh with a shard group of 1)")
    elif knobs.strategy == "zero1":
        notes.append("zero1: FSDP2 has no optimizer-only sharding; this is the SHARD_GRAD_OP (ZeRO-2) layout")
    if knobs.offload == "optimizer":
        notes.append("FSDP2's CPUOffloadPolicy offloads parameters and gradients with the optimizer states")
    model_dtype, param_dtype, reduce_dtype, autocast = _PRECISION_LAYOUT[knobs.precision]
    if autocast:
        notes.append(f"{knobs.precision}: fp32 parameters without a MixedPrecisionPolicy cast; forward and loss run "
                     f"under torch.autocast(dtype=torch.{autocast})")
    elif knobs.precision == "bf16-pure":
        notes.append("bf16-pure: the model is built in bf16 and AdamW keeps its states in bf16; no fp32 copy")
    if knobs.tp > 1 or knobs.pp > 1:
        notes.append(
            f"tp={knobs.tp} pp={knobs.pp}: this file describes the data-parallel mesh (and the pipeline schedule) "
            "only; the bundled trainer runs tp=1 pp=1 plans"
        )
    if knobs.optimizer == "adafactor":  # ddp only: FSDP with Adafactor is refused (fstrain.core.plan.adafactor)
        notes.append(
            "adafactor: Hugging Face's transformers.optimization.Adafactor with scale_parameter and relative_step "
            "off, as the Trainer's optim='adafactor' builds it; the training script builds it (the bundled trainer "
            "does not)"
        )
    if knobs.ep > 1:
        notes.append(
            f"ep={knobs.ep}: expert parallelism is for the training program to set up (torchtitan: "
            f"parallelism.expert_parallel_degree = {knobs.ep}); the bundled trainer does not run it"
        )
    if knobs.compile:
        notes.append(
            "compile: each block runs under torch.compile (torchtitan: training.compile = true; the bundled "
            "trainer compiles each block too)"
        )
    if knobs.fused_rmsnorm:
        notes.append("fused_rmsnorm: the norms run as one fused kernel each (the bundled trainer's FusedRMSNorm; "
                     "torchtitan 2024: model.norm_type = \"fused_rmsnorm\")")
    if knobs.cp > 1:
        notes.append(
            f"cp={knobs.cp}: the mesh shards over dp x cp = {knobs.dp * knobs.cp} ranks (torchtitan's dp_shard_cp); "
            "ring attention is for the training program to set up (torchtitan: parallelism.context_parallel_degree "
            f"= {knobs.cp}, torch.distributed.tensor.experimental.context_parallel); the bundled trainer does not "
            "run it"
        )
    if knobs.fp8:
        notes.append(
            "fp8: this file has no fp8 key (the bundled trainer computes its linears in bf16); torchtitan: "
            "--model.converters float8 --float8.filter_fqns output (torchao Float8Linear, tensorwise)"
            + (" --float8.enable_fsdp_float8_all_gather" if knobs.fp8_all_gather else "")
        )
    if knobs.fsdp2_no_sync or (knobs.tp_replicated_logits and knobs.tp > 1):
        notes.append(
            "fsdp2_no_sync / tp_replicated_logits: this file has no key for them (the bundled trainer reduce-scatters "
            "every micro-batch and keeps the logits vocab-parallel, so `launch --plan` refuses this plan); the "
            "training program sets them (model.set_requires_gradient_sync(False) on all but the last micro-batch; "
            "ColwiseParallel(output_layouts=Replicate()) on the head, no TP plan for the embedding)"
        )
    if knobs.pp > 1:
        # torchtitan shards each pipeline stage with reshard_after_forward=False (its default with PP),
        # which is what the planner's memory model counts.
        reshard = False
        notes.append(
            f"pp={knobs.pp}: reshard_after_forward false, as torchtitan does under pipeline parallelism (each "
            "stage stays gathered across micro-batches, and fstrain plan counts it so)"
        )
    config: dict[str, Any] = {
        "fstrain_fsdp": FSDP_FILE_VERSION,
        "strategy": knobs.strategy,
        "world_size": knobs.world_size,
        "mesh": mesh,
        "reshard_after_forward": reshard,
        "model_dtype": model_dtype,
        "mixed_precision": {"param_dtype": param_dtype, "reduce_dtype": reduce_dtype},
        "autocast": autocast,
        # fp16's narrow exponent needs a gradient scaler; bf16 and fp32 do not.
        "loss_scaling": "dynamic" if knobs.precision in ("fp16", "amp-fp16") else "none",
        "cpu_offload": {"enabled": knobs.offload != "none", "pin_memory": True},
        "wrap": {"module_classes": list(WRAP_MODULE_CLASSES), "root": True},
        # none | selective-op | every-k:N | full | megatron-selective (fstrain.core.plan.acpolicy)
        "activation_checkpointing": knobs.activation_checkpointing,
        "batch": {
            "micro_batch_size": knobs.micro_batch_size,
            "grad_accum_steps": knobs.grad_accum_steps,
            "global_batch_size": knobs.global_batch_size,
        },
        "optimizer": optimizer_section(knobs.optimizer, options),
        "scheduler": scheduler_section(options),
        "gradient_clipping": options.gradient_clipping,
        "seed": options.seed,
    }
    if knobs.pp > 1:
        config["pipeline"] = pipeline_section(knobs)
    if knobs.cp > 1:
        # What fstrain plan modelled: torch's ring attention, load-balanced causal sharding, K/V
        # all-gathered (torchtitan's default rotate method); fstrain.core.plan.contextparallel.
        config["context_parallel"] = {"degree": knobs.cp, "rotate_method": "allgather", "load_balance": True}
    return Rendered(config=config, notes=tuple(notes))


# torch.distributed.pipelining's class for each fstrain schedule (torchtitan names them without
# the "Schedule" prefix in `pipeline_parallel_schedule`). ScheduleInterleavedZeroBubble is torch's
# ZB-H1 ("the ZB1P schedule in the paper", arXiv 2401.10241); it also runs one stage per rank.
TORCH_SCHEDULES = {
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
    "zero-bubble": "ScheduleInterleavedZeroBubble",
}


def pipeline_section(knobs: PlanKnobs) -> dict[str, Any]:
    """The pipeline schedule of a pp > 1 plan, in fstrain's and torch's names."""
    return {
        "stages": knobs.pp,
        "schedule": knobs.pp_schedule,
        "torch_schedule": TORCH_SCHEDULES[knobs.pp_schedule],
        "stages_per_rank": knobs.pp_virtual_stages,
        "microbatches": knobs.grad_accum_steps,
    }


def scheduler_section(options: TrainingOptions) -> dict[str, Any]:
    """The schedule as fsdp.yaml (and lightning.yaml) name it (fstrain.core.render.options.lr_multiplier)."""
    return {"warmup_steps": options.warmup_steps, "total_steps": options.total_steps,
            "min_lr_ratio": options.min_lr_ratio}


def optimizer_section(name: str, options: TrainingOptions) -> dict[str, Any]:
    """The optimizer as fsdp.yaml (and lightning.yaml) name it: its name and hyperparameters."""
    if name == "sgd":
        return {"name": "sgd", "lr": options.lr, "momentum": options.momentum, "weight_decay": options.weight_decay}
    if name == "adafactor":  # no first moment (beta1 None), an external learning rate
        return {"name": "adafactor", "lr": options.lr, "scale_parameter": False, "relative_step": False,
                "weight_decay": options.weight_decay}
    return {
        "name": name,
        "lr": options.lr,
        "betas": list(options.betas),
        "eps": options.eps,
        "weight_decay": options.weight_decay,
    }


def render_accelerate(plan: PlanFile) -> Rendered:
    """An ``accelerate launch --config_file`` YAML (FSDP version 2) for ``plan``."""
    check_plan(plan)
    knobs = plan.knobs
    _, reshard = _LAYOUT[knobs.strategy]
    mesh = fsdp_mesh(plan)
    num_machines = max(1, plan.cluster.num_nodes)
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "mixed_precision": _ACCELERATE_PRECISION[knobs.precision],
        "num_machines": num_machines,
        "num_processes": knobs.world_size,
        "machine_rank": 0,
        "main_training_function": "main",
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
        "fsdp_config": {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": reshard,
            "fsdp_offload_params": knobs.offload != "none",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": ",".join(WRAP_MODULE_CLASSES),
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_activation_checkpointing": knobs.activation_checkpointing != "none",
        },
    }
    notes = [
        "accelerate.yaml names fstrain's TransformerBlock as the wrap unit; set "
        "fsdp_transformer_layer_cls_to_wrap to your model's block class",
    ]
    if knobs.cp > 1:
        notes.append(f"cp={knobs.cp}: this file describes FSDP over dp x cp ranks only; set up context parallelism "
                     "in the training program")
    if knobs.precision == "bf16-pure":
        notes.append("bf16-pure: mixed_precision 'no'; load the model in bf16 (torch_dtype=torch.bfloat16)")
    if knobs.fp8:
        # Accelerate's fp8 with the torchao backend (AORecipeKwargs, accelerate/utils/ao.py) converts
        # nn.Linear layers to torchao's Float8Linear and runs the rest under bf16 autocast.
        config["mixed_precision"] = "fp8"
        config["fp8_config"] = {"backend": "AO"}
        notes.append(
            "fp8: mixed_precision fp8 with the torchao backend (Accelerate's AORecipeKwargs); its default filter "
            "skips the model's first and last linear layers (filter_first_and_last_linear_layers), the plan only "
            "the output layer"
        )
        if knobs.fp8_all_gather:
            notes.append("fp8_all_gather: accelerate.yaml has no key for it; pass "
                         "AORecipeKwargs(config=Float8LinearConfig(enable_fsdp_float8_all_gather=True))")
    if num_machines > 1:
        notes.append("multi-node: pass --machine_rank, --main_process_ip and --main_process_port on each node")
        if plan.cluster.hosts:
            config["main_process_ip"] = plan.cluster.hosts[0]
    if len(mesh["shape"]) == 2:
        # Hybrid sharding is expressed through Accelerate's ParallelismConfig.
        config["parallelism_config"] = {
            "parallelism_config_dp_replicate_size": mesh["shape"][0],
            "parallelism_config_dp_shard_size": mesh["shape"][1],
        }
    if knobs.activation_checkpointing not in ("none", "full"):
        notes.append(
            f"Accelerate checkpoints every block whole: activation checkpointing {knobs.activation_checkpointing} "
            "becomes full"
        )
    return Rendered(config=config, notes=tuple(notes))
