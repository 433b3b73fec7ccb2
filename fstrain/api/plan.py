"""``plan``: from a model and a cluster to ranked sharding plans, with typed requests.

The pure planner (fstrain/core/plan) takes values; this resolves what a user asks for (a recipe
by name, the training settings with the recipe's defaults, the pins, the cluster) into them,
with one clear error for bad input, and runs the search. `fstrain plan` is a thin client of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fstrain.core.plan.assumptions import Assumptions
    from fstrain.core.plan.plancluster import NodeGpus, PlanCluster
    from fstrain.core.plan.planfile import PlanFile
    from fstrain.core.plan.planner import Pins, PlanModel, PlanResult, TrainingSpec
    from fstrain.core.plan.recipe import Recipe

DEFAULT_BATCH_TOKENS = 4 * 1024 * 1024  # Llama 2 / GPT-3 scale: 4M tokens per optimizer step


@dataclass(frozen=True)
class ModelRequest:
    """Exactly one: a shipped recipe or Hugging Face id, a recipe file, or a parameter count."""

    model: str | None = None
    recipe: str | None = None
    model_params: str | None = None  # '7e9', '70B': model states only


@dataclass(frozen=True)
class ClusterRequest:
    """A uniform cluster (nodes x GPUs of one type), or kinds of nodes ('h100-sxm:8x4')."""

    num_nodes: int | None = None  # default 1
    gpus_per_node: int | None = None  # default 8
    gpu: str | None = None  # h100-sxm, a100-80gb, ... or an NVML name
    nodes: tuple[str, ...] = ()
    gpu_memory_gib: float | None = None  # replaces the table's (with gpu_tflops: any GPU)
    gpu_tflops: float | None = None
    nvlink_domain_size: int | None = None
    inter_node_gbps: float | None = None


@dataclass(frozen=True)
class TrainingRequest:
    """Training settings: given ones first, then the recipe's, then fstrain's defaults."""

    seq_len: int | None = None
    global_batch: int | None = None  # sequences per optimizer step
    global_batch_tokens: int | None = None
    micro_batch: int | None = None  # pins it too
    grad_accum: int | None = None  # pins it too
    precision: str | None = None
    optimizer: str | None = None
    flash_attention: bool | None = None
    train_tokens: str | None = None  # '2e12', '15T'
    loss: str | None = None  # None: the framework's loss kernel (fstrain.core.plan.frameworks)
    compile: bool = False
    fused_rmsnorm: bool = False
    fp8: bool = False
    fp8_all_gather: bool = False
    framework: str = "fstrain"  # fstrain.core.plan.frameworks.FRAMEWORKS
    fsdp2_no_sync: bool = False  # fstrain.core.plan.fsdp2habits
    tp_replicated_logits: bool = False


@dataclass(frozen=True)
class PinRequest:
    """Knobs fixed by the user (None: the planner chooses)."""

    strategy: str | None = None
    zero_stage: int | None = None
    tp: int | None = None
    pp: int | None = None
    shard_group_size: int | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    ac: str | None = None
    offload: str | None = None
    pp_schedule: str | None = None
    pp_virtual_stages: int | None = None
    ep: int | None = None
    cp: int | None = None


@dataclass(frozen=True)
class PlanRequest:
    model: ModelRequest = field(default_factory=ModelRequest)
    cluster: ClusterRequest = field(default_factory=ClusterRequest)
    training: TrainingRequest = field(default_factory=TrainingRequest)
    pins: PinRequest = field(default_factory=PinRequest)
    assume: tuple[str, ...] = ()  # KEY=VALUE overrides of the planner's assumptions
    mfu: float | None = None


@dataclass(frozen=True)
class Planned:
    """The search's result and everything it was computed from."""

    result: PlanResult
    model: PlanModel
    training: TrainingSpec
    cluster: PlanCluster
    assumptions: Assumptions
    batch_note: str  # where the global batch came from
    hf_config: str = ""  # the model's Hugging Face config.json text, when it came from one

    def plan_file(self) -> PlanFile:
        """The best plan as ``plan.yaml`` content for render and launch."""
        from fstrain.core.plan.planner import plan_file

        return plan_file(self.result, self.model, self.cluster, self.training.train_tokens)


# Measured numbers in place of assumptions (`plan --calibrate`): (base, cluster, training,
# model) -> (assumptions, cluster).
Calibrate = Callable[["Assumptions", "PlanCluster", "TrainingSpec", "PlanModel"], "tuple[Assumptions, PlanCluster]"]


def plan(request: PlanRequest, *, probed: Sequence[NodeGpus] | None = None,
         calibrate: Calibrate | None = None) -> Planned:
    """Rank every configuration the pins allow on the cluster (``probed``: nodes found by probing
    hosts, in place of the described cluster)."""
    from fstrain.core.plan.assumptions import Assumptions, with_overrides
    from fstrain.core.plan.planner import plan as search

    plan_model, recipe = resolve_model(request.model)
    training, batch_note = resolve_training(plan_model, recipe, request.training)
    plan_model = plan_model.for_loss(training.loss)  # --loss none: no vocabulary head
    pins = resolve_pins(request.pins)
    cluster = resolve_cluster(request.cluster, probed)
    base = Assumptions()
    if calibrate is not None:  # measured numbers first; explicit --assume, --mfu and --inter-node-gbps still win
        base, cluster = calibrate(base, cluster, training, plan_model)
    assumptions = with_overrides(base, list(request.assume))
    if request.mfu is not None:
        assumptions = with_overrides(assumptions, [f"mfu={request.mfu}"], "--mfu")
    result = search(plan_model, training, cluster, pins, assumptions)
    return Planned(result, plan_model, training, cluster, assumptions, batch_note, recipe.hf_config if recipe else "")


def resolve_model(request: ModelRequest) -> tuple[PlanModel, Recipe | None]:
    """Exactly one of --model, --recipe, --model-params."""
    model, recipe, model_params = request.model, request.recipe, request.model_params
    from fstrain.core.plan.planner import PlanModel
    from fstrain.core.plan.recipe import parse_count
    from fstrain.errors import InputError

    given = [
        flag for flag, value in (("--model", model), ("--recipe", recipe), ("--model-params", model_params)) if value
    ]
    if len(given) != 1:
        raise InputError(
            "give exactly one of --model, --recipe and --model-params"
            + (f" (got {', '.join(given)})" if given else ""),
            "e.g. --model llama3.1-8b",
            "fstrain plan",
        )
    if model_params:
        return PlanModel(parse_count(model_params, "--model-params")), None
    from fstrain.io.recipes import load_model, load_recipe_file

    loaded = load_model(model) if model else load_recipe_file(str(recipe))
    return PlanModel.from_spec(loaded.model), loaded


def resolve_training(plan_model: PlanModel, recipe: Recipe | None,
                     request: TrainingRequest) -> tuple[TrainingSpec, str]:
    """Flags first, then the recipe's training defaults, then fstrain's; the note says which."""
    from fstrain.core.plan.frameworks import profile
    from fstrain.core.plan.losses import parse_loss
    from fstrain.core.plan.planner import TrainingSpec
    from fstrain.core.plan.precision import PRECISIONS
    from fstrain.core.plan.recipe import TrainingDefaults, parse_count
    from fstrain.core.plan.schema import OPTIMIZERS
    from fstrain.errors import InputError

    r = request
    seq_len, global_batch, global_batch_tokens = r.seq_len, r.global_batch, r.global_batch_tokens
    micro_batch, grad_accum, precision, optimizer = r.micro_batch, r.grad_accum, r.precision, r.optimizer
    flash_attention, train_tokens, loss, fused_rmsnorm = r.flash_attention, r.train_tokens, r.loss, r.fused_rmsnorm
    defaults = recipe.training if recipe else TrainingDefaults()
    seq = seq_len or (plan_model.spec.seq_len if plan_model.spec else 0)
    chosen_precision = _choice(precision or defaults.precision or "bf16", PRECISIONS, "--precision")
    chosen_optimizer = _choice(optimizer or defaults.optimizer or "adamw", OPTIMIZERS, "--optimizer")
    flash = flash_attention
    if flash is None:  # FlashAttention has no fp32 kernels: fp32 turns the recipe's default off
        recipe_flash = defaults.flash_attention if defaults.flash_attention is not None else True
        flash = recipe_flash and chosen_precision != "fp32"
    if global_batch and global_batch_tokens:
        raise InputError("--global-batch and --global-batch-tokens both given", "give the batch once", "--global-batch")
    batch: int | None
    if global_batch or global_batch_tokens:
        batch, note = global_batch, "--global-batch"
        if global_batch_tokens:
            batch, note = _sequences(global_batch_tokens, seq, "--global-batch-tokens"), "--global-batch-tokens"
    elif defaults.global_batch_size or defaults.global_batch_tokens:
        batch = defaults.global_batch_size or _sequences(defaults.global_batch_tokens or 0, seq, "recipe")
        note = "the recipe"
    elif micro_batch and grad_accum:
        batch, note = None, "--micro-batch x --grad-accum x dp"
    else:
        batch = max(1, DEFAULT_BATCH_TOKENS // seq) if seq else 1
        note = "fstrain's default of 4M tokens (set --global-batch)"
    budget = parse_count(train_tokens, "--train-tokens") if train_tokens else defaults.train_tokens
    chosen_loss = parse_loss(loss or profile(r.framework).loss, "--loss")
    if fused_rmsnorm and plan_model.spec is not None and plan_model.spec.norm != "rmsnorm":
        raise InputError(f"{plan_model.spec.name} normalises with {plan_model.spec.norm}, not RMSNorm",
                         "leave --fused-rmsnorm out for this model", "--fused-rmsnorm")
    spec = TrainingSpec(seq, batch, chosen_precision, chosen_optimizer, flash, budget, chosen_loss,
                        compile=r.compile, fused_rmsnorm=fused_rmsnorm, fp8=r.fp8,
                        fp8_all_gather=r.fp8_all_gather, framework=r.framework, fsdp2_no_sync=r.fsdp2_no_sync,
                        tp_replicated_logits=r.tp_replicated_logits)
    return spec, note


def _sequences(tokens: int, seq: int, where: str) -> int:
    from fstrain.errors import InputError

    if seq <= 0 or tokens % seq or tokens < seq:
        raise InputError(
            f"{tokens} tokens is not a whole number of {seq}-token sequences",
            "give a multiple of the sequence length, or --global-batch in sequences",
            where,
        )
    return tokens // seq


def resolve_pins(request: PinRequest) -> Pins:
    """The knobs the user fixed; the planner searches the rest."""
    from fstrain.core.plan.acpolicy import parse_ac
    from fstrain.core.plan.planner import Pins
    from fstrain.core.plan.schema import OFFLOAD, STRATEGIES
    from fstrain.errors import InputError

    r = request
    strategy, zero_stage, ac, offload, pp_schedule = r.strategy, r.zero_stage, r.ac, r.offload, r.pp_schedule
    aliases = {"no-shard": "ddp", "fsdp-no-shard": "ddp", "zero0": "ddp"}
    chosen = aliases.get(strategy, strategy) if strategy else None
    if chosen is not None:
        chosen = _choice(chosen, STRATEGIES, "--strategy")
    if zero_stage is not None:
        from_stage = "ddp" if zero_stage == 0 else f"zero{zero_stage}"
        if chosen is not None and chosen != from_stage:
            raise InputError(
                f"--zero-stage {zero_stage} means {from_stage}, but --strategy is {strategy}",
                "give one of them",
                "--zero-stage",
            )
        chosen = from_stage
    return Pins(
        strategy=chosen,
        tp=r.tp,
        pp=r.pp,
        shard_group_size=r.shard_group_size,
        micro_batch_size=r.micro_batch,
        grad_accum_steps=r.grad_accum,
        activation_checkpointing=parse_ac(ac, "--ac") if ac else None,
        offload=_choice(offload, OFFLOAD, "--offload") if offload else None,
        pp_schedule=_pp_schedule(pp_schedule) if pp_schedule is not None else None,
        pp_virtual_stages=r.pp_virtual_stages,
        ep=r.ep,
        cp=r.cp,
    )


def _pp_schedule(value: str) -> str:
    """--pp-schedule, with the names torchtitan and the papers use for the same schedules."""
    from fstrain.core.plan.schema import PP_SCHEDULES
    from fstrain.errors import InputError

    aliases = {"interleaved-1f1b": "interleaved", "interleaved1f1b": "interleaved", "zb-h1": "zero-bubble",
               "zbh1": "zero-bubble", "zero-bubble-h1": "zero-bubble"}
    chosen = aliases.get(value.lower(), value.lower())
    if chosen not in PP_SCHEDULES:
        raise InputError(f"{value!r} is not a pipeline schedule",
                         f"use one of {', '.join(PP_SCHEDULES)} (interleaved takes --pp-virtual-stages V)",
                         "--pp-schedule")
    return chosen


def resolve_cluster(request: ClusterRequest, probed: Sequence[NodeGpus] | None = None) -> PlanCluster:
    """The cluster from probed nodes (``probed``), ``--node`` kinds, or --num-nodes x --gpus-per-node x --gpu."""
    from fstrain.core.plan.plancluster import NodeGpus, build_cluster
    from fstrain.errors import InputError

    r = request
    num_nodes, gpus_per_node, gpu, node_specs = r.num_nodes, r.gpus_per_node, r.gpu, list(r.nodes)
    nvlink_domain_size, inter_node_gbps, gpu_memory_gib, gpu_tflops = (r.nvlink_domain_size, r.inter_node_gbps,
                                                                        r.gpu_memory_gib, r.gpu_tflops)
    if (gpu_memory_gib or gpu_tflops) and (probed is not None or node_specs or not gpu):
        raise InputError("--gpu-memory and --gpu-tflops describe the --gpu of a uniform cluster",
                         "give --gpu NAME with them (any name, for a GPU outside the table)", "--gpu-memory")
    if probed is not None:
        return build_cluster(list(probed), inter_node_gbps, "probe")
    if node_specs:
        if gpu or num_nodes or gpus_per_node:
            raise InputError("--node cannot be combined with --gpu, --num-nodes or --gpus-per-node", "", "--node")
        nodes = [n for spec in node_specs for n in _parse_node(spec, nvlink_domain_size)]
        return build_cluster(nodes, inter_node_gbps, "--node")
    if not gpu:
        from fstrain.core.plan.gpus import known_gpu_names

        raise InputError("which GPU? give --gpu", f"one of {', '.join(known_gpu_names())}", "--gpu")
    memory = int(gpu_memory_gib * 2**30) if gpu_memory_gib else None
    node = NodeGpus(gpu, gpus_per_node or 8, memory_bytes=memory, nvlink_domain_size=nvlink_domain_size,
                    peak_tflops=gpu_tflops)
    return build_cluster([node] * (num_nodes or 1), inter_node_gbps, "--gpu")


def _parse_node(spec: str, nvlink_domain_size: int | None) -> list[NodeGpus]:
    """'h100-sxm:8x4' -> four nodes of 8 H100-SXM; 'a100-40gb:8' -> one node."""
    from fstrain.core.plan.plancluster import NodeGpus
    from fstrain.errors import InputError

    name, _, counts = spec.rpartition(":")
    gpus_text, _, nodes_text = counts.partition("x")
    if not name or not gpus_text.isdigit() or (nodes_text and not nodes_text.isdigit()):
        raise InputError(f"expected GPU:COUNT[xNODES], got {spec!r}", "e.g. --node h100-sxm:8x4", "--node")
    gpus, copies = int(gpus_text), int(nodes_text or 1)
    if gpus < 1 or copies < 1:
        raise InputError(f"counts must be positive, got {spec!r}", "e.g. --node h100-sxm:8x4", "--node")
    return [NodeGpus(name, gpus, nvlink_domain_size=nvlink_domain_size)] * copies


def _choice(value: str, allowed: tuple[str, ...], flag: str) -> str:
    from fstrain.errors import InputError

    if value not in allowed:
        raise InputError(f"{value!r} is not one of {', '.join(allowed)}", "", flag)
    return value


def measurements(path: str) -> Any:
    """What `plan --calibrate` reads: the JSON file at ``path`` (a bench result, a report, the
    trainer's summary.json), or for a run directory the run's report (`fstrain report --json`)."""
    from pathlib import Path

    if not Path(path).is_dir():
        from fstrain.io.bench import read_json

        return read_json(path)
    from fstrain.api.report import report
    from fstrain.core.report.numbers import as_document

    return as_document(report(path))
