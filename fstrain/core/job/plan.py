"""The plan a launch trains with, and the bundled trainer's command line for it.

``fstrain launch --plan plan.yaml`` takes a plan from ``fstrain plan --out``; ``--model NAME`` or
``--recipe FILE`` builds a data-parallel plan pinned from the flags (strategy, micro-batch,
precision) for the hosts actually launched on: what a CPU run or a quick test needs. For a
searched, GPU-aware plan, run ``fstrain plan --out`` first.
"""

from __future__ import annotations

from fstrain.core.plan.frameworks import DEFAULT_FRAMEWORK
from fstrain.core.plan.losses import TRAINER_LOSSES
from fstrain.core.plan.planfile import PlanFile, validate_knobs
from fstrain.core.plan.schema import ACTIVATIONS, ClusterSummary, ModelSpec, PlanKnobs
from fstrain.errors import ConfigError

# What the bundled trainer builds (fstrain/train/fsdp_backend.py build_optimizer, deepspeed_backend.py).
TRAINER_OPTIMIZERS = ("adamw", "sgd", "adam8bit")
ZERO_STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3,
              "fsdp-full": 3, "fsdp-grad-op": 2, "fsdp-hybrid": 3}
DEFAULT_STRATEGY = {"torchrun": "fsdp-full", "deepspeed": "zero3", "direct": "fsdp-full"}
# What the trainer's --tensorboard writer (torch.utils.tensorboard's SummaryWriter) imports: the
# trainer checks it on rank 0, and a launch's preflight on every host before anything starts.
TENSORBOARD_PACKAGE = "tensorboard"


def data_parallel_plan(
    model: ModelSpec, cluster: ClusterSummary, *, strategy: str, micro_batch_size: int, grad_accum_steps: int = 1,
    precision: str = "bf16", seq_len: int | None = None,
) -> PlanFile:
    """Every process of ``cluster`` (a process per "GPU") a data-parallel rank (tp = pp = 1);
    hybrid shards within a node."""
    procs_per_node = cluster.gpus_per_node
    world = cluster.num_nodes * procs_per_node
    group = procs_per_node if strategy == "fsdp-hybrid" else (1 if strategy == "ddp" else world)
    knobs = PlanKnobs(
        strategy=strategy, zero_stage=ZERO_STAGE.get(strategy, -1), dp=world, tp=1, pp=1,
        shard_group_size=group, micro_batch_size=micro_batch_size, grad_accum_steps=grad_accum_steps,
        precision=precision, seq_len=seq_len or model.seq_len,
    )
    validate_knobs(knobs, "--strategy/--micro-batch")
    return PlanFile(model=model, knobs=knobs, cluster=cluster)


def check_plan_fits_launch(plan: PlanFile, world_size: int, where: str) -> None:
    """A plan made for another world size would train with the wrong sharding: refuse it."""
    if plan.knobs.world_size != world_size:
        k = plan.knobs
        raise ConfigError(
            f"the plan is for dp({k.dp}){f' * cp({k.cp})' if k.cp > 1 else ''} * tp({k.tp}) * pp({k.pp}) = "
            f"{k.world_size} processes, "
            f"but this launch starts {world_size}",
            "re-plan for these hosts (fstrain plan --out), or change --nproc-per-node or the hosts",
            where,
        )
    if plan.knobs.tp != 1 or plan.knobs.pp != 1:
        raise ConfigError(f"the bundled trainer runs tp=1, pp=1 only; the plan has tp={plan.knobs.tp}, "
                          f"pp={plan.knobs.pp}", "plan with --tp 1 --pp 1", where)
    check_trainer_runs(plan, where)


def check_trainer_runs(plan: PlanFile, where: str) -> None:
    """Refuse a plan counting what the bundled trainer does not run: expert parallelism, fp8
    linears, context parallelism, another program's loss, an optimizer it does not step."""
    check_trainer_ep(plan, where)
    check_trainer_fp8(plan, where)
    check_trainer_cp(plan, where)
    check_trainer_loss(plan, where)
    check_trainer_optimizer(plan, where)
    check_trainer_fsdp2_habits(plan, where)


def check_trainer_fsdp2_habits(plan: PlanFile, where: str) -> None:
    """The bundled trainer reduce-scatters every micro-batch's gradients and runs a vocab-parallel
    head over a TP-sharded embedding: a plan counting FSDP2 no-sync accumulation or logits gathered
    to every TP rank (fstrain.core.plan.fsdp2habits) would not hold or take what it predicts."""
    k = plan.knobs
    for key, on, flag in (("fsdp2_no_sync", k.fsdp2_no_sync, "--fsdp2-no-sync"),
                          ("tp_replicated_logits", k.tp_replicated_logits and k.tp > 1, "--tp-replicated-logits")):
        if on:
            raise ConfigError(f"the plan has {key}, which the bundled trainer does not run",
                              f"re-plan without {flag} to train the bundled model", where)


def check_trainer_ep(plan: PlanFile, where: str) -> None:
    """The bundled trainer keeps every expert on every rank (sharded by FSDP): it has no
    expert-parallel all-to-all, so a plan whose memory counts num_experts/ep experts per rank
    would not fit as predicted."""
    if plan.knobs.ep != 1:
        raise ConfigError(
            f"the plan has ep={plan.knobs.ep}, but the bundled trainer does not run expert parallelism",
            "plan with --ep 1 (every rank holds its shard of every expert), or train with a program that runs "
            "expert parallelism (torchtitan, DeepSpeed-MoE, Megatron-LM)",
            where,
        )


def check_trainer_fp8(plan: PlanFile, where: str) -> None:
    """The bundled trainer's linears are torch's ``nn.Linear`` in the compute dtype: it has no fp8
    conversion, so a plan timed with fp8 linears would run slower than predicted."""
    if plan.knobs.fp8:
        raise ConfigError(
            "the plan has fp8 linears, but the bundled trainer computes them in bf16",
            "plan without --fp8 to train the bundled model, or train with a program that runs fp8 linears "
            "(torchtitan --model.converters float8, llm-foundry precision amp_fp8)",
            where,
        )


def check_trace_eager(plan: PlanFile, where: str) -> None:
    """The memory trace runs the model eagerly under fake tensors: a plan made for
    ``torch.compile`` counts what a compiled block keeps (fstrain.core.plan.kernels), which the
    eager trace does not show."""
    if plan.knobs.compile:
        raise ConfigError(
            "the plan is for torch.compile (--compile), but the trace runs the model eagerly, which keeps "
            "more activations than a compiled block",
            "re-plan without --compile to trace (what a compiled block keeps: docs/planner.md, Kernel fusion)",
            where,
        )


# Activation checkpointing a Hugging Face model's trace runs: transformers checkpoints whole
# decoder layers (activation_checkpointing_enable), nothing inside one.
HF_TRACE_AC = ("none", "full", "every-k:N")


def check_trace_hf(plan: PlanFile, where: str) -> None:
    """The trace of a Hugging Face model runs transformers' own layers and loss: whole-layer
    checkpointing only, its own RMSNorm (unfused) and its own loss (the logits upcast whole)."""
    k = plan.knobs
    ac = k.activation_checkpointing
    if ac not in ("none", "full") and not ac.startswith("every-k:"):
        raise ConfigError(
            f"--ac {ac} checkpoints part of a layer, but transformers checkpoints whole decoder layers",
            f"pin --ac {', --ac '.join(HF_TRACE_AC)} to trace the Hugging Face model",
            where,
        )
    if k.loss != "full":
        raise ConfigError(
            f"the plan is for --loss {k.loss}, but the Hugging Face model's own loss upcasts the whole logits",
            "re-plan with --loss full (the default) to trace the Hugging Face model",
            where,
        )
    if k.fused_rmsnorm:
        raise ConfigError(
            "the plan is for --fused-rmsnorm, but the Hugging Face model runs its own (unfused) RMSNorm",
            "re-plan without --fused-rmsnorm to trace the Hugging Face model",
            where,
        )


def check_trace_framework(plan: PlanFile, where: str) -> None:
    """The memory trace runs the bundled trainer's model: a plan made for another framework
    (``--framework``) counts what that framework's training code keeps (FSDP1's unsharded
    accumulation, TP buffers, its DeepSpeed buckets: fstrain.core.plan.frameworks), which the
    trace does not hold."""
    if plan.knobs.framework != DEFAULT_FRAMEWORK:
        raise ConfigError(
            f"the plan is for --framework {plan.knobs.framework}, but the trace runs the bundled trainer, whose "
            "training code keeps other memory",
            "re-plan with --framework fstrain (the default) to trace",
            where,
        )


def check_trainer_cp(plan: PlanFile, where: str) -> None:
    """The bundled trainer gives every rank whole sequences: it has no ring attention, so a plan
    whose memory counts seq_len/cp tokens per rank would not fit as predicted."""
    if plan.knobs.cp != 1:
        raise ConfigError(
            f"the plan has cp={plan.knobs.cp}, but the bundled trainer does not run context parallelism",
            "plan with --cp 1, or train with a program that runs ring attention (torchtitan: "
            f"parallelism.context_parallel_degree = {plan.knobs.cp})",
            where,
        )


def check_trainer_loss(plan: PlanFile, where: str) -> None:
    """The bundled trainer computes ``full`` (cross-entropy on an fp32 copy of the logits) or
    ``chunked:N``; a plan made for another loss counts the logits' memory of another program."""
    kind = plan.knobs.loss.partition(":")[0]
    if kind not in TRAINER_LOSSES:
        raise ConfigError(
            f"the plan is for --loss {plan.knobs.loss}, but the bundled trainer computes "
            f"{' or '.join(TRAINER_LOSSES)} (an fp32 copy of the logits, whole or a chunk at a time), "
            "whose logits take other memory than the plan counts",
            "re-plan with --loss full (the default) or --loss chunked:N to train the bundled model",
            where,
        )


def check_trainer_optimizer(plan: PlanFile, where: str) -> None:
    """The bundled trainer builds AdamW, SGD or bitsandbytes' 8-bit AdamW; a plan for Adafactor
    counts the states of an optimizer it does not run."""
    if plan.knobs.optimizer not in TRAINER_OPTIMIZERS:
        raise ConfigError(
            f"the plan is for --optimizer {plan.knobs.optimizer}, but the bundled trainer runs "
            f"{', '.join(TRAINER_OPTIMIZERS)}",
            "re-plan with --optimizer adamw (or sgd, adam8bit) to train the bundled model, or train with a program "
            "that builds it (the Hugging Face Trainer's optim='adafactor')",
            where,
        )


def trainer_backend(plan: PlanFile) -> str:
    """The bundled trainer's backend for a plan: FSDP2 for fsdp-*, DeepSpeed for ddp/ZeRO."""
    return "fsdp" if plan.knobs.strategy.startswith("fsdp") else "deepspeed"


def trainer_program(python: str, plan: PlanFile, *, steps: int, tensorboard: str | None = None) -> list[str]:
    """``python -m fstrain.train`` reading the files rendered into the run directory (each rank's
    metrics.jsonl goes to its metrics folder, FSTRAIN_RUN_DIR/metrics); rank 0's TensorBoard
    event files to ``tensorboard`` (on node 0, relative to the working directory)."""
    backend = trainer_backend(plan)
    config = ["--fsdp-config", "{run_dir}/fsdp.yaml"] if backend == "fsdp" else \
        ["--deepspeed-config", "{run_dir}/ds_config.json"]
    board = ["--tensorboard", tensorboard] if tensorboard else []
    return [python, "-m", "fstrain.train", "--plan", "{run_dir}/plan.yaml", "--backend", backend, *config,
            "--steps", str(steps), "--summary-json", "{run_dir}/summary.json", *board]


def check_strategy(strategy: str) -> None:
    if strategy not in ZERO_STAGE:
        raise ConfigError(f"unknown strategy {strategy!r}", f"use one of {', '.join(ZERO_STAGE)}", "--strategy")


def check_supported(spec: ModelSpec) -> None:
    """Refuse what this reference model does not build, before any process group exists: one line
    naming the recipe key, never a silently different model."""
    if spec.moe is not None and spec.ffn_bias:
        key = "linear_bias" if spec.linear_bias else "mlp_bias"
        raise ConfigError(
            f"model {spec.name!r}: the reference trainer's experts have no biases (Mixtral's layout)",
            f"set {key}: false for a mixture-of-experts recipe",
            f"model.{key}",
        )
    _check_unbuilt(spec)
    if not spec.head_dim and spec.hidden_size % spec.num_heads != 0:
        raise ConfigError(
            f"hidden_size({spec.hidden_size}) is not divisible by num_heads({spec.num_heads})", "", "model"
        )
    if spec.num_heads % spec.num_kv_heads != 0:
        raise ConfigError(
            f"num_heads({spec.num_heads}) is not divisible by num_kv_heads({spec.num_kv_heads})", "", "model"
        )
    if spec.activation not in ACTIVATIONS:
        raise ConfigError(f"activation {spec.activation!r}", f"use one of {', '.join(ACTIVATIONS)}", "model.activation")
    if spec.norm not in ("rmsnorm", "layernorm"):
        raise ConfigError(f"norm {spec.norm!r}", "use rmsnorm or layernorm", "model.norm")
    if spec.position_embedding not in ("rope", "learned"):
        raise ConfigError(f"position_embedding {spec.position_embedding!r}", "use rope or learned", "model")
    if spec.position_embedding == "rope" and spec.attn_head_dim % 2 != 0:
        raise ConfigError(f"head_dim({spec.attn_head_dim}) must be even for rotary positions", "", "model")


def _check_unbuilt(spec: ModelSpec) -> None:
    """Architecture the plan models but the reference trainer does not build."""
    unbuilt = []
    if spec.sliding_window:
        unbuilt.append(("sliding-window attention", "model.sliding_window", "set sliding_window: 0"))
    if spec.moe is not None and spec.moe.shared_ffn_hidden_size:
        unbuilt.append(("a shared expert", "model.moe.shared_ffn_hidden_size", "set shared_ffn_hidden_size: 0"))
    if spec.moe is not None and spec.moe.router_dtype != "compute":
        unbuilt.append((f"a {spec.moe.router_dtype} router", "model.moe.router_dtype", "set router_dtype: compute"))
    if unbuilt:
        what, where, how = unbuilt[0]
        raise ConfigError(
            f"model {spec.name!r} has {what}, which the reference trainer does not build",
            f"{how} to run the reference model without it (the plan itself models it), or train it with "
            "your own trainer",
            where,
        )
