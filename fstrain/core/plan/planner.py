"""The search: from a model, a training setup and a cluster to ranked, explained plans.

Enumerates strategy x (dp, tp, pp) x hybrid shard group x micro-batch (which fixes gradient
accumulation for a given global batch) x activation checkpointing x offload. Tensor parallelism
stays inside an NVLink domain; ``dp * cp * tp * pp`` is the world size (context parallelism ``cp``
only when pinned: it trades throughput for a longer sequence, which the search does not choose).
Every configuration gets a memory breakdown; those that fit get a step time and are ranked by
throughput, the rest carry the reason. Any knob can be pinned (:class:`Pins`); with all of them pinned exactly one
configuration is evaluated. Pure and deterministic: same input, same output, no globals.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fstrain.core.plan.acpolicy import AC_SEARCHED, every_k
from fstrain.core.plan.adafactor import adafactor_problem, check_adafactor
from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.blocktime import KernelModel
from fstrain.core.plan.contextparallel import CP_STRATEGIES, cp_problem
from fstrain.core.plan.errorband import plan_error_band
from fstrain.core.plan.frameworks import framework_assumptions, profile
from fstrain.core.plan.fsdp2habits import no_sync_problem, replicated_logits_problem
from fstrain.core.plan.kernelcost import GpuRates
from fstrain.core.plan.kernels import EAGER_BLOCK, check_fused_block
from fstrain.core.plan.losses import has_vocab_head, parse_loss
from fstrain.core.plan.megatron import MEGATRON_STRATEGIES, megatron_strategy_problem, runnable_schedules
from fstrain.core.plan.memory import (
    GIB,
    OFFLOAD_ALLOWED,
    STRATEGY_LABELS,
    ZERO_STAGE,
    MemoryBreakdown,
    StageShape,
    block_kernels,
    memory_breakdown,
    stage_shapes,
    with_replicated_embedding,
)
from fstrain.core.plan.modelsize import ParamCount, count_parameters
from fstrain.core.plan.pipeline import schedule_label, schedule_problem
from fstrain.core.plan.plancluster import PlanCluster
from fstrain.core.plan.planfile import PlanFile
from fstrain.core.plan.precision import check_strategy, compute_dtype, strategy_runs
from fstrain.core.plan.schema import OFFLOAD, PP_SCHEDULES, STRATEGIES, ModelSpec, PlanKnobs
from fstrain.core.plan.timemodel import Fp8Rates, StepTime, step_time
from fstrain.errors import ConfigError

MAX_MICRO_BATCH = 64
CLOSEST_TIMED = 10  # when nothing fits, the closest configurations get a step time (had they fitted)
_NO_PIPELINE = ("zero2", "zero3")  # DeepSpeed's pipeline engine supports ZeRO-1 only
_ORDER = {name: index for index, name in enumerate((*STRATEGIES, *OFFLOAD))}
_SCHEDULE_ORDER = {"1f1b": 0, "zero-bubble": 1, "interleaved": 2}  # on a tie, the simpler schedule


def _ac_order(ac: str) -> float:
    """Less recompute first: none, megatron-selective, every-k:N (larger N first), selective-op, full."""
    fixed = {"none": 0.0, "megatron-selective": 1.0, "selective-op": 3.0, "full": 4.0}
    return fixed[ac] if ac in fixed else 3.0 - 1.0 / every_k(ac)


@dataclass(frozen=True)
class PlanModel:
    """What is planned: an architecture, or only a parameter count (model states only)."""

    num_params: int
    spec: ModelSpec | None = None
    params: ParamCount | None = None

    @classmethod
    def from_spec(cls, spec: ModelSpec, loss: str = "full") -> PlanModel:
        params = count_parameters(spec, vocab_head=has_vocab_head(loss))
        return cls(params.total, spec, params)

    def for_loss(self, loss: str) -> PlanModel:
        """The model as ``loss`` trains it: without a vocabulary head for ``none``."""
        if self.spec is None or self.params is None or self.params.vocab_head == has_vocab_head(loss):
            return self
        return PlanModel.from_spec(self.spec, loss)

    @property
    def name(self) -> str:
        return self.spec.name if self.spec else f"{self.num_params / 1e9:.3g}B parameters"


@dataclass(frozen=True)
class TrainingSpec:
    """Training settings that are inputs, not searched."""

    seq_len: int
    global_batch_size: int | None  # sequences; None: micro-batch x grad-accum x dp (both pinned)
    precision: str = "bf16"
    optimizer: str = "adamw"
    flash_attention: bool = True
    train_tokens: int | None = None
    loss: str = "full"  # losses.parse_loss's canonical name: what the loss holds per logit (losses.loss_peaks)
    compile: bool = False  # torch.compile of each block (fstrain.core.plan.kernels)
    fused_rmsnorm: bool = False  # a fused RMSNorm kernel in an otherwise eager model
    fp8: bool = False  # the blocks' linears compute in fp8 (PlanKnobs.fp8)
    fp8_all_gather: bool = False  # FSDP gathers their weights in fp8 (PlanKnobs.fp8_all_gather)
    fsdp2_no_sync: bool = False  # FSDP2 accumulates unsharded gradients (PlanKnobs.fsdp2_no_sync)
    tp_replicated_logits: bool = False  # logits gathered to every TP rank (PlanKnobs.tp_replicated_logits)
    framework: str = "fstrain"  # fstrain.core.plan.frameworks: what the training code keeps (PlanKnobs.framework)


@dataclass(frozen=True)
class Pins:
    """Knobs fixed by the user; ``None`` lets the planner choose."""

    strategy: str | None = None
    tp: int | None = None
    pp: int | None = None
    shard_group_size: int | None = None
    micro_batch_size: int | None = None
    grad_accum_steps: int | None = None
    activation_checkpointing: str | None = None
    offload: str | None = None
    pp_schedule: str | None = None  # schema.PP_SCHEDULES
    pp_virtual_stages: int | None = None  # model chunks per rank, with pp_schedule "interleaved"
    ep: int | None = None  # expert-parallel degree (MoE models only)
    cp: int | None = None  # context-parallel degree (ring attention); None: 1, never searched

    def pinned(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class Plan:
    """One evaluated configuration."""

    knobs: PlanKnobs
    memory: MemoryBreakdown
    usable_bytes: int
    time: StepTime | None
    rejected_because: str = ""
    overshoot: float = 0.0  # need / have for the tightest limit (GPU or host memory)
    moe: bool = False  # the model has experts: its plans show their expert-parallel degree

    @property
    def fits(self) -> bool:
        return not self.rejected_because

    @property
    def tight(self) -> bool:
        """Fits only if the allocator gives up its cache margin (``MemoryBreakdown.required``):
        ranked after every plan that fits with it, and never a reason to stop searching."""
        return self.fits and self.memory.peak > self.usable_bytes

    def describe(self) -> str:
        return describe_knobs(self.knobs)

    def to_dict(self, train_tokens: int | None = None) -> dict[str, Any]:
        k = self.knobs
        data: dict[str, Any] = {
            "strategy": k.strategy,
            "zero_stage": k.zero_stage,
            "dp": k.dp,
            "tp": k.tp,
            "pp": k.pp,
            "shard_group_size": k.shard_group_size,
            "micro_batch_size": k.micro_batch_size,
            "grad_accum_steps": k.grad_accum_steps,
            "global_batch_size": k.global_batch_size,
            "activation_checkpointing": k.activation_checkpointing,
            "offload": k.offload,
            "pp_schedule": k.pp_schedule,
            "pp_virtual_stages": k.pp_virtual_stages,
            **({"ep": k.ep} if self.moe else {}),
            "cp": k.cp,
            "fp8": k.fp8,
            "fp8_all_gather": k.fp8_all_gather,
            "fsdp2_no_sync": k.fsdp2_no_sync,
            "tp_replicated_logits": k.tp_replicated_logits,
            "framework": k.framework,
            "memory": self.memory.to_dict(),
            "usable_bytes": self.usable_bytes,
            "fits": self.fits,
            "tight": self.tight,
            "step_time_s": self.time.step_time_s if self.time else None,
            "tokens_per_s": self.time.tokens_per_s if self.time else None,
            "mfu": self.time.mfu if self.time else None,
            "time_breakdown": self.time.to_dict() if self.time else None,
            "time_to_train_s": self.time.seconds_for(train_tokens) if self.time and train_tokens else None,
            "rejected_because": self.rejected_because or None,
        }
        return data


@dataclass(frozen=True)
class PlanResult:
    plans: tuple[Plan, ...]  # fitting plans, fastest first
    rejected: tuple[Plan, ...]  # non-fitting plans, closest to fitting first
    suggestions: tuple[str, ...]  # what would fit, when nothing does
    bounded_by: str
    considered: int

    @property
    def best(self) -> Plan | None:
        return self.plans[0] if self.plans else None


def describe_knobs(k: PlanKnobs) -> str:
    """'ZeRO-2, tp=1, pp=1, dp=64, mbs=4, gas=2, AC none' (+ offload, hybrid group)."""
    text = f"{STRATEGY_LABELS[k.strategy]}, tp={k.tp}, pp={k.pp}, dp={k.dp}"
    if k.ep > 1:
        text += f", ep={k.ep}"
    if k.cp > 1:
        text += f", cp={k.cp}"
    if k.strategy == "fsdp-hybrid":
        text += f", group={k.shard_group_size}"
    text += f", mbs={k.micro_batch_size}, gas={k.grad_accum_steps}, AC {k.activation_checkpointing}"
    if k.offload != "none":
        text += f", offload {k.offload}"
    if k.pp > 1 and k.pp_schedule != "1f1b":
        text += f", {schedule_label(k.pp_schedule, k.pp_virtual_stages)}"
    if k.fp8:
        text += ", fp8 linears" + (" (fp8 all-gather)" if k.fp8_all_gather else "")
    if k.fsdp2_no_sync:
        text += ", FSDP2 no-sync accumulation"
    if k.tp_replicated_logits and k.tp > 1:
        text += ", logits gathered over TP"
    return text


def plan(
    model: PlanModel,
    training: TrainingSpec,
    cluster: PlanCluster,
    pins: Pins = Pins(),
    assumptions: Assumptions = Assumptions(),
    *,
    suggest: bool = True,
) -> PlanResult:
    """Search every configuration the pins allow; rank those that fit by throughput.

    ``assumptions.gemm_curve`` (``plan --calibrate`` with a bench of ``--suite compute``) replaces
    the published curve the kernel model prices GEMMs on, for the dtypes it measured."""
    _check_inputs(model, training, cluster, pins)
    training = dataclasses.replace(training, loss=parse_loss(training.loss, "--loss"))  # chunked: chunked:8
    assumptions = _framework_assumptions(model, training, pins, assumptions)
    model = model.for_loss(training.loss)
    plans, rejected, considered = _search(model, training, cluster, pins, assumptions, first_fit=False)
    plans.sort(key=_rank_key)
    rejected.sort(key=lambda p: (round(p.overshoot, 2), p.memory.peak, *_tie_key(p)))
    suggestions: tuple[str, ...] = ()
    if not plans and model.spec is not None:  # what the closest would run at, had they fitted
        timer = _Evaluator(model, training, cluster, assumptions)
        closest = rejected[:CLOSEST_TIMED]
        rejected[:CLOSEST_TIMED] = [dataclasses.replace(p, time=timer.timing(p.knobs)) for p in closest]
    if not plans and suggest:
        suggestions = tuple(_suggest(model, training, cluster, pins, assumptions))
    bounded = cluster.bounded_by(training.precision, assumptions.mfu)
    return PlanResult(tuple(plans), tuple(rejected), suggestions, bounded, considered)


def _framework_assumptions(model: PlanModel, training: TrainingSpec, pins: Pins,
                           assumptions: Assumptions) -> Assumptions:
    """The assumptions with the framework profile's in the fields ``--assume`` left alone; fused
    kernels the model cannot run are refused. Op-level selective AC is torchtitan's policy over
    eager matmuls, which flash-attention's fused autograd functions are not, so it is not planned
    with them."""
    assumptions = framework_assumptions(profile(training.framework), assumptions, model.spec)
    if model.spec is not None:
        check_fused_block(model.spec, assumptions.fused_mlp, assumptions.mlp_checkpoint_lvl)
    if block_kernels(assumptions) != EAGER_BLOCK and pins.activation_checkpointing == "selective-op":
        raise ConfigError(
            "--ac selective-op saves torchtitan's choice of eager matmul outputs, which flash-attention's fused "
            "MLP and dropout-add-norm kernels do not produce (not modelled)",
            "use --ac none, full or every-k:N", "--ac",
        )
    return assumptions


def plan_file(result: PlanResult, model: PlanModel, cluster: PlanCluster, train_tokens: int | None = None) -> PlanFile:
    """The chosen plan as the ``plan.yaml`` content that render and launch read."""
    best = result.best
    if best is None:
        raise ConfigError("no plan fits, so there is nothing to save", "see the suggestions above", "--out")
    if model.spec is None:
        raise ConfigError(
            "a plan file needs the model architecture",
            "use --model NAME or --recipe PATH instead of --model-params",
            "--out",
        )
    predicted = {**best.to_dict(train_tokens), "bounded_by": result.bounded_by, "num_params": model.num_params,
                 "error_band": plan_error_band(best.knobs, cluster.num_nodes, best.memory.peak,
                                               best.time.tokens_per_s if best.time else None)}
    return PlanFile(model=model.spec, knobs=best.knobs, cluster=cluster.summary(), predicted=predicted)


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _check_fp8(training: TrainingSpec, cluster: PlanCluster) -> None:
    """fp8 linears need fp8 tensor cores on every GPU (Ada, Hopper, Blackwell, MI300: the GPU
    table's fp8 peak) and a 16-bit compute dtype to cast from and to."""
    from fstrain.core.plan.gpus import known_gpu_names

    for node in cluster.nodes:
        if node.gpu.fp8_flops > 0:
            continue
        if node.gpu.name not in known_gpu_names():  # described by --gpu-memory and --gpu-tflops
            raise ConfigError(
                f"the fp8 peak of {node.gpu.label} is unknown (a GPU outside fstrain's table)",
                "name the table GPU of the same architecture with --gpu (its fp8 peak scales with --gpu-tflops "
                "at the table's fp8/bf16 ratio), or drop --fp8",
                "--fp8",
            )
        raise ConfigError(
            f"{node.gpu.label} has no fp8 tensor cores (fp8 needs Ada, Hopper, Blackwell or MI300)",
            "drop --fp8, or plan for a GPU with fp8 (H100, H200, B200, L40S, MI300X...)",
            "--fp8",
        )
    if compute_dtype(training.precision) == "fp32":
        raise ConfigError(
            f"fp8 linears cast from a 16-bit compute dtype, but --precision {training.precision} computes in fp32",
            "use --precision bf16 (or amp-bf16, bf16-pure) with --fp8",
            "--fp8",
        )


def _check_fp8_all_gather(training: TrainingSpec, pins: Pins) -> None:
    """FSDP's float8 all-gather casts the fp8 linears' weight shards (torchao's FSDP2 extension):
    it needs --fp8 and plans fsdp-* strategies only."""
    if not training.fp8:
        raise ConfigError("--fp8-all-gather gathers the weights of fp8 linears, but --fp8 is not given",
                          "add --fp8, or drop --fp8-all-gather", "--fp8-all-gather")
    if pins.strategy is not None and not pins.strategy.startswith("fsdp"):
        raise ConfigError(
            f"--fp8-all-gather is FSDP's float8 all-gather; {STRATEGY_LABELS[pins.strategy]} gathers no fp8 weights",
            "use --strategy fsdp-full, fsdp-hybrid or fsdp-grad-op, or drop --fp8-all-gather",
            "--fp8-all-gather",
        )


def _check_fsdp2_habits(training: TrainingSpec, pins: Pins) -> None:
    """Refuse --fsdp2-no-sync and --tp-replicated-logits where a pin rules out every plan they
    describe (fstrain.core.plan.fsdp2habits); the search skips the other layouts."""
    pp = pins.pp or 1
    if training.fsdp2_no_sync:
        strategy = pins.strategy or "fsdp-full"
        problem = no_sync_problem(strategy, pp, training.framework)
        if problem:
            raise ConfigError(problem[0], f"{problem[1]}, or drop --fsdp2-no-sync",
                              "--fsdp2-no-sync")
    if training.tp_replicated_logits:
        problem = replicated_logits_problem(pp, training.loss)
        if problem:
            raise ConfigError(problem[0], f"{problem[1]}, or drop --tp-replicated-logits",
                              "--tp-replicated-logits")


def _check_inputs(model: PlanModel, training: TrainingSpec, cluster: PlanCluster, pins: Pins) -> None:
    """Refuse, with the reason, what no configuration could satisfy."""
    gpu = cluster.speed_node(training.precision).gpu
    for node in cluster.nodes:
        if node.gpu.peak_flops(training.precision) <= 0:
            raise ConfigError(
                f"{node.gpu.label} has no {training.precision} support",
                "use --precision amp-fp16" if training.precision == "amp-bf16" else "use --precision fp16 (or fp32)",
                "--precision",
            )
    parse_loss(training.loss, "--loss")
    profile(training.framework)
    if training.fp8:
        _check_fp8(training, cluster)
    if training.fp8_all_gather:
        _check_fp8_all_gather(training, pins)
    _check_fsdp2_habits(training, pins)
    if training.flash_attention and training.precision == "fp32":
        raise ConfigError(
            "FlashAttention needs fp16 or bf16", "use --no-flash-attention with fp32", "--flash-attention"
        )
    world, domain = cluster.world_size, cluster.nvlink_domain_size
    _check_cp_pin(model, training, cluster, pins)
    if pins.tp is not None:
        if world % pins.tp:
            raise ConfigError(f"tp={pins.tp} does not divide the world size {world}", "pick a divisor", "--tp")
        if domain % pins.tp:
            raise ConfigError(
                f"tp={pins.tp} would cross an NVLink domain ({domain} GPU(s) per domain on {gpu.label})",
                f"tensor parallelism stays inside a domain: use a divisor of {domain}",
                "--tp",
            )
        if model.spec and (model.spec.num_heads % pins.tp or model.spec.num_kv_heads % pins.tp):
            raise ConfigError(
                f"tp={pins.tp} does not divide the heads ({model.spec.num_heads} query, {model.spec.num_kv_heads} KV)",
                "each TP rank needs whole attention heads",
                "--tp",
            )
    if pins.pp is not None:
        if world % (pins.pp * (pins.tp or 1) * (pins.cp or 1)):
            raise ConfigError(f"pp={pins.pp} (x tp={pins.tp or 1} x cp={pins.cp or 1}) does not divide the world "
                              f"size {world}", "", "--pp")
        if model.spec and pins.pp > model.spec.num_layers:
            raise ConfigError(f"pp={pins.pp} is more than the {model.spec.num_layers} layers", "", "--pp")
    if pins.strategy in _NO_PIPELINE and pins.pp is not None and pins.pp > 1:
        raise ConfigError(
            f"{STRATEGY_LABELS[pins.strategy]} cannot run with pipeline parallelism (pp={pins.pp})",
            "DeepSpeed's pipeline engine supports ZeRO-1 only: use --strategy zero1 or fsdp-*, or --pp 1",
            "--pp",
        )
    _check_schedule_pins(model, pins, training.framework)
    _check_megatron_strategy(pins, training.framework)
    _check_ep_pin(model, pins)
    if pins.shard_group_size is not None and pins.strategy not in (None, "fsdp-hybrid"):
        raise ConfigError(
            f"--shard-group-size applies to fsdp-hybrid, not {pins.strategy}",
            "drop it, or use --strategy fsdp-hybrid",
            "--shard-group-size",
        )
    if pins.strategy:
        check_strategy(training.precision, pins.strategy, "--strategy")
        check_adafactor(training.optimizer, pins.strategy, pins.offload or "none", "--optimizer")
    if training.optimizer == "adafactor" and pins.offload not in (None, "none"):
        check_adafactor(training.optimizer, "ddp", pins.offload, "--offload")
    if pins.strategy and pins.offload and pins.offload not in OFFLOAD_ALLOWED[pins.strategy]:
        raise ConfigError(
            f"{STRATEGY_LABELS[pins.strategy]} cannot offload {pins.offload!r}",
            f"it supports: {', '.join(OFFLOAD_ALLOWED[pins.strategy])}",
            "--offload",
        )


def _check_cp_pin(model: PlanModel, training: TrainingSpec, cluster: PlanCluster, pins: Pins) -> None:
    """A pinned context-parallel degree must divide the GPUs with the other pinned degrees, cut
    the sequence into 2 x cp chunks, and run under FSDP2 without pipeline or expert parallelism
    (fstrain.core.plan.contextparallel)."""
    cp = pins.cp
    if cp is None or cp == 1:
        return
    if cp < 1:
        raise ConfigError(f"cp={cp} is not a positive integer", "use 1 for no context parallelism", "--cp")
    if model.spec is None:
        raise ConfigError("context parallelism needs the model's layers (it splits the activations)",
                          "use --model or --recipe instead of --model-params", "--cp")
    world = cluster.world_size
    others = cp * (pins.tp or 1) * (pins.pp or 1)
    if world % others:
        raise ConfigError(f"cp={cp} (x tp={pins.tp or 1} x pp={pins.pp or 1}) does not divide the {world} GPUs",
                          "dp x cp x tp x pp must equal the GPU count: pick a divisor", "--cp")
    problem = cp_problem(cp, pins.strategy, pins.pp, pins.ep, training.flash_attention, training.seq_len)
    if problem:
        what, hint = problem
        raise ConfigError(f"cp={cp}: {what}", hint, "--cp")


def _check_ep_pin(model: PlanModel, pins: Pins) -> None:
    """A pinned expert-parallel degree needs experts to split and a data-parallel degree it divides."""
    ep = pins.ep
    if ep is not None and ep < 1:
        raise ConfigError(f"ep={ep} is not a positive integer", "use 1 for no expert parallelism", "--ep")
    if ep is None or ep == 1:
        return
    moe = model.spec.moe if model.spec is not None else None
    if moe is None:
        raise ConfigError(f"ep={ep} but {model.name} has no experts",
                          "expert parallelism is for mixture-of-experts models: drop --ep", "--ep")
    if moe.num_experts % ep:
        raise ConfigError(f"ep={ep} does not divide the {moe.num_experts} experts",
                          f"use a divisor of {moe.num_experts}", "--ep")


def _check_megatron_strategy(pins: Pins, framework: str) -> None:
    """Under a Megatron-LM profile, a pinned strategy Megatron does not run is one line."""
    if not pins.strategy or not profile(framework).megatron_ddp:
        return
    problem = megatron_strategy_problem(pins.strategy, pins.pp or 1, pins.ep or 1)
    if problem:
        raise ConfigError(f"--framework {framework}: {problem}",
                          "use --strategy zero1 (--use-distributed-optimizer), ddp, or fsdp-full without --pp/--ep",
                          "--strategy")


def _check_schedule_pins(model: PlanModel, pins: Pins, framework: str = "fstrain") -> None:
    """A pinned pipeline schedule must have a pipeline, a runtime that runs it and enough layers."""
    schedule, chunks = pins.pp_schedule, pins.pp_virtual_stages
    if schedule is not None and schedule not in PP_SCHEDULES:
        raise ConfigError(f"unknown pipeline schedule {schedule!r}", f"use one of {', '.join(PP_SCHEDULES)}",
                          "--pp-schedule")
    if chunks is not None and schedule != "interleaved":
        raise ConfigError(f"--pp-virtual-stages {chunks} without the interleaved schedule",
                          "add --pp-schedule interleaved, or drop --pp-virtual-stages", "--pp-virtual-stages")
    if chunks is not None and chunks < 2:
        raise ConfigError(f"--pp-virtual-stages {chunks}: interleaving needs at least 2 model chunks per rank",
                          "give 2 or more", "--pp-virtual-stages")
    if schedule in (None, "1f1b"):
        return
    if pins.pp == 1:
        raise ConfigError(f"the {schedule} schedule needs a pipeline, and --pp is 1",
                          "give --pp 2 or more, or drop --pp-schedule", "--pp-schedule")
    if pins.strategy and schedule not in runnable_schedules(pins.strategy, framework):
        if profile(framework).megatron_ddp and pins.strategy in MEGATRON_STRATEGIES:
            raise ConfigError(
                f"Megatron-LM runs {STRATEGY_LABELS[pins.strategy]} with its own schedules, 1F1B and interleaved "
                f"(megatron/core/pipeline_parallel/schedules.py), not {schedule}",
                "use --pp-schedule 1f1b or interleaved",
                "--pp-schedule",
            )
        raise ConfigError(
            f"{STRATEGY_LABELS[pins.strategy]} runs on DeepSpeed's pipeline engine, which has its own 1F1B "
            f"schedule only, not {schedule}",
            "use --pp-schedule 1f1b, or an fsdp-* strategy (torch.distributed.pipelining runs all three)",
            "--pp-schedule",
        )
    if model.spec is None:
        raise ConfigError(f"the {schedule} schedule needs the model's layers",
                          "use --model or --recipe instead of --model-params", "--pp-schedule")
    if schedule == "interleaved" and pins.pp and pins.pp * (chunks or 2) > model.spec.num_layers:
        raise ConfigError(
            f"pp={pins.pp} x {chunks or 2} virtual stages is more than the {model.spec.num_layers} layers",
            "use fewer virtual stages or a smaller --pp", "--pp-virtual-stages")


def _schedules(pins: Pins, strategy: str, pp: int, micro_batches: int, num_layers: int,
               framework: str = "fstrain") -> list[tuple[str, int]]:
    """(schedule, virtual stages) to evaluate: the pinned one, else the fastest that can run.

    Unpinned, a pipeline that torch.distributed.pipelining runs (ddp, fsdp-*) gets ZB-H1: it keeps
    1F1B's activations and a third of its bubble, so it dominates 1F1B, and it dominates
    interleaved x2 too (more activations, more traffic, a bubble of a half). Larger interleavings
    and 1F1B itself are evaluated when pinned. DeepSpeed's engine runs 1F1B only; Megatron's DDP
    and distributed optimizer 1F1B, or interleaved when pinned (:func:`runnable_schedules`).
    """
    if pp == 1:
        return [("1f1b", 1)] if pins.pp_schedule in (None, "1f1b") else []
    runnable = runnable_schedules(strategy, framework)
    if pins.pp_schedule is not None:
        if pins.pp_schedule not in runnable:
            return []
        chunks = pins.pp_virtual_stages or (2 if pins.pp_schedule == "interleaved" else 1)
        megatron = strategy in MEGATRON_STRATEGIES and profile(framework).megatron_ddp  # Megatron's own rule
        pinned = not schedule_problem(pins.pp_schedule, pp, micro_batches, num_layers, chunks, megatron)
        return [(pins.pp_schedule, chunks)] if pinned else []
    if "zero-bubble" in runnable and not schedule_problem("zero-bubble", pp, micro_batches, num_layers):
        return [("zero-bubble", 1)]
    return [("1f1b", 1)]


def _layouts(model: PlanModel, cluster: PlanCluster, pins: Pins) -> Iterator[tuple[int, int, int]]:
    """(tp, pp, dp) with tp inside an NVLink domain and tp * pp * dp * cp = world size (cp pinned,
    1 by default; with cp > 1 no pipeline)."""
    cp = pins.cp or 1
    world, domain = cluster.world_size // cp, cluster.nvlink_domain_size
    spec = model.spec
    for tp in [pins.tp] if pins.tp else divisors(domain):
        if world % tp or (spec and (spec.num_heads % tp or spec.num_kv_heads % tp)):
            continue
        if spec is None and pins.tp is None and tp > 1:
            continue  # without an architecture, TP/PP only when asked for
        for pp in [pins.pp] if pins.pp else divisors(world // tp):
            if (world // tp) % pp or (spec and pp > spec.num_layers) or (spec is None and pins.pp is None and pp > 1):
                continue
            if cp > 1 and pp > 1:
                continue
            yield tp, pp, world // (tp * pp)


def _batches(training: TrainingSpec, dp: int, pins: Pins) -> list[tuple[int, int]]:
    """(micro-batch, grad-accum) pairs that make the global batch on ``dp`` replicas."""
    mbs, gas = pins.micro_batch_size, pins.grad_accum_steps
    if training.global_batch_size is None:
        return [(mbs, gas)] if mbs and gas else []
    if training.global_batch_size % dp:
        return []
    local = training.global_batch_size // dp
    if mbs and gas:
        return [(mbs, gas)] if mbs * gas == local else []
    if mbs:
        return [(mbs, local // mbs)] if local % mbs == 0 else []
    if gas:
        return [(local // gas, gas)] if local % gas == 0 else []
    return [(d, local // d) for d in divisors(local) if d <= MAX_MICRO_BATCH]


def _strategies(pins: Pins, pp: int, precision: str = "bf16", optimizer: str = "adamw",
                framework: str = "fstrain") -> Iterator[str]:
    # A pinned shard group only means something for hybrid sharding.
    chosen = pins.strategy or ("fsdp-hybrid" if pins.shard_group_size else None)
    megatron = profile(framework).megatron_ddp
    for strategy in [chosen] if chosen else STRATEGIES:
        if megatron and megatron_strategy_problem(strategy, pp, pins.ep or 1):
            continue  # Megatron-LM's own data parallelism (fstrain.core.plan.megatron)
        if pp > 1 and strategy in _NO_PIPELINE:
            continue
        if (pins.cp or 1) > 1 and strategy not in CP_STRATEGIES:
            continue  # ring attention runs under FSDP2 only
        if not chosen and not strategy_runs(precision, strategy):
            continue  # e.g. pure bf16 under DeepSpeed's ZeRO (fstrain.core.plan.precision)
        if not chosen and optimizer == "adafactor" and adafactor_problem(strategy, "none"):
            continue  # Adafactor is not modelled under FSDP (fstrain.core.plan.adafactor)
        yield strategy


def _shard_groups(strategy: str, dp: int, tp: int, cluster: PlanCluster, pins: Pins) -> list[int]:
    if strategy == "ddp":
        return [1]
    if strategy != "fsdp-hybrid":
        return [dp]
    if pins.shard_group_size:
        return [pins.shard_group_size] if dp % pins.shard_group_size == 0 else []
    # Align the shard group (times cp: FSDP shards over dp x cp) with an NVLink domain or whole nodes.
    aligned = {cluster.nvlink_domain_size} | {cluster.gpus_per_node * k for k in divisors(cluster.num_nodes)}
    return [g for g in divisors(dp) if 1 < g < dp and g * tp * (pins.cp or 1) in aligned]


def _groups_and_eps(
    model: PlanModel, strategy: str, dp: int, tp: int, cluster: PlanCluster, pins: Pins
) -> Iterator[tuple[int, int]]:
    """(shard group, expert-parallel degree) pairs: the pinned ``ep``, else every divisor of the
    number of experts that divides dp (and the hybrid shard group), for MoE models only."""
    experts = model.spec.moe.num_experts if model.spec is not None and model.spec.moe is not None else 1
    for group in _shard_groups(strategy, dp, tp, cluster, pins):
        shard = group if strategy == "fsdp-hybrid" else dp
        for ep in [pins.ep] if pins.ep else divisors(experts):
            if experts % ep == 0 and dp % ep == 0 and shard % ep == 0:
                yield group, ep


class _Evaluator:
    """Evaluates one configuration; holds what every evaluation of a search shares."""

    def __init__(
        self, model: PlanModel, training: TrainingSpec, cluster: PlanCluster, assumptions: Assumptions,
    ) -> None:
        self.model, self.training, self.cluster, self.assumptions = model, training, cluster, assumptions
        self.usable = cluster.usable_memory_bytes
        self.gpu_label = cluster.memory_node.gpu.label
        limits = [n.host_memory_bytes or assumptions.host_memory_bytes for n in cluster.nodes]
        self.host_limit = min(limits) if all(limits) else None
        self.effective = cluster.effective_flops(training.precision, assumptions.mfu)
        self.cluster_peak = cluster.peak_flops(training.precision)
        self.links = cluster.links()
        gpu = cluster.speed_node(training.precision, assumptions.mfu).gpu
        peak = gpu.peak_flops(training.precision)
        self.fp8 = Fp8Rates(peak, gpu.fp8_flops, gpu.hbm_bandwidth_bytes_per_s,
                            assumptions.mfu or gpu.achievable_mfu) if training.fp8 else None
        rates = GpuRates(gpu.name, tuple((d, gpu.peak_flops(d)) for d in ("bf16", "fp16", "fp8", "fp32")),
                         gpu.hbm_bandwidth_bytes_per_s)
        self.kernels = KernelModel(rates, assumptions)
        self.cache: dict[Any, Any] = {}
        self.considered = 0

    def __call__(
        self,
        strategy: str,
        dp: int,
        tp: int,
        pp: int,
        group: int,
        mbs: int,
        gas: int,
        ac: str,
        offload: str,
        schedule: tuple[str, int] = ("1f1b", 1),
        ep: int = 1,
        cp: int = 1,
    ) -> Plan:
        t = self.training
        knobs = PlanKnobs(
            strategy,
            ZERO_STAGE[strategy],
            dp,
            tp,
            pp,
            group,
            mbs,
            gas,
            ac,
            offload,
            t.precision,
            t.optimizer,
            t.seq_len,
            t.flash_attention,
            t.loss,
            *schedule,
            ep,
            cp,
            compile=t.compile,
            fused_rmsnorm=t.fused_rmsnorm,
            fp8=t.fp8,
            fp8_all_gather=t.fp8_all_gather,
            fsdp2_no_sync=t.fsdp2_no_sync,
            tp_replicated_logits=t.tp_replicated_logits,
            framework=t.framework,
        )
        self.considered += 1
        m = self.model
        memory = memory_breakdown(
            m.spec, m.params, m.num_params, knobs, self.cluster.gpus_per_node, self.assumptions, self.cache
        )
        reason = _rejection(knobs, memory, self.usable, self.gpu_label, self.host_limit)
        overshoot = memory.required / self.usable
        if self.host_limit:
            overshoot = max(overshoot, memory.host_bytes_per_node / self.host_limit)
        moe = m.spec is not None and m.spec.moe is not None
        if reason or m.spec is None:
            return Plan(knobs, memory, self.usable, None, reason, overshoot, moe)
        return Plan(knobs, memory, self.usable, self.timing(knobs), "", overshoot, moe)

    def timing(self, knobs: PlanKnobs) -> StepTime:
        """The step time of ``knobs`` (the model's architecture must be known)."""
        m = self.model
        assert m.spec is not None
        return step_time(
            m.spec, rank_params(m, knobs), knobs, self.effective, self.cluster_peak, self.links, self.assumptions,
            rank_expert_params(m, knobs), self.fp8, self.kernels,
        )


def _search(
    model: PlanModel,
    training: TrainingSpec,
    cluster: PlanCluster,
    pins: Pins,
    assumptions: Assumptions,
    first_fit: bool,
) -> tuple[list[Plan], list[Plan], int]:
    """Evaluate the configurations the pins allow, skipping the ones that cannot matter.

    Two prunings keep this fast without changing the answer: memory grows with the micro-batch,
    so once a (checkpointing, offload) pair fails at some micro-batch the larger ones are only
    recorded through that first failure; and a configuration that fits makes its slower
    variants (more recompute, more offload, same everything else) dominated, so they are not
    evaluated.
    """
    plans: list[Plan] = []
    rejected: list[Plan] = []
    evaluate = _Evaluator(model, training, cluster, assumptions)
    fused = block_kernels(assumptions) != EAGER_BLOCK
    cp = pins.cp or 1
    acs = [pins.activation_checkpointing] if pins.activation_checkpointing else list(AC_SEARCHED)
    if model.spec is None:
        acs = acs[:1]  # activations are not modelled without an architecture
    elif not training.flash_attention and not pins.activation_checkpointing:
        # Without FlashAttention, Megatron's selective recompute drops the s^2 attention scores;
        # with it, it stores what none stores (Megatron #464, #1225).
        acs.insert(1, "megatron-selective")
    if profile(training.framework).megatron_ddp and not pins.activation_checkpointing:
        # Megatron recomputes whole layers or its selective modules (--recompute-granularity full |
        # selective, transformer_config.py @d98e8a6 L532), not torchtitan's op-level policy.
        acs = [ac for ac in acs if ac != "selective-op"]
    for tp, pp, dp in _layouts(model, cluster, pins):
        batches = (
            _batches(training, dp, pins) if model.spec else [(pins.micro_batch_size or 1, pins.grad_accum_steps or 1)]
        )
        for strategy in _strategies(pins, pp, training.precision, training.optimizer, training.framework):
            if training.fp8_all_gather and not strategy.startswith("fsdp"):
                continue  # FSDP's float8 all-gather: FSDP strategies only
            if training.fsdp2_no_sync and no_sync_problem(strategy, pp, training.framework):
                continue  # FSDP2's gradient sync: FSDP strategies without PP only
            if training.tp_replicated_logits and pp > 1:
                continue
            # With dp = 1 (and no CP ranks to shard over) sharding is DDP, unless it is there to offload.
            offloads = [
                o
                for o in ([pins.offload] if pins.offload else OFFLOAD_ALLOWED[strategy])
                if o in OFFLOAD_ALLOWED[strategy]
            ]
            if dp * cp == 1 and strategy != "ddp" and not pins.strategy:
                offloads = [o for o in offloads if o != "none"]
            if training.optimizer == "adafactor":
                offloads = [o for o in offloads if not adafactor_problem(strategy, o)]
            for group, ep in _groups_and_eps(model, strategy, dp, tp, cluster, pins):
                failed: set[tuple[str, str, tuple[str, int]]] = set()
                for mbs, gas in batches:
                    # Without an architecture there is no step time for a schedule to change.
                    schedules = _schedules(pins, strategy, pp, gas, model.spec.num_layers,
                                           training.framework) if model.spec else [
                        ("1f1b", 1)]
                    for schedule in schedules:
                        for ac in acs:
                            if ac == "selective-op" and strategy == "zero3":
                                continue  # DeepSpeed ZeRO-3 cannot replay op-level checkpointing
                            if ac == "selective-op" and fused:
                                continue  # not modelled with flash-attention's kernels (see plan())
                            for offload in offloads:
                                if (ac, offload, schedule) in failed:
                                    continue
                                result = evaluate(strategy, dp, tp, pp, group, mbs, gas, ac, offload, schedule, ep,
                                                  cp)
                                if not result.fits:
                                    failed.add((ac, offload, schedule))
                                    rejected.append(result)
                                    continue
                                plans.append(result)
                                if first_fit:
                                    return plans, rejected, evaluate.considered
                                if result.tight:
                                    continue  # more offload may fit with the margin
                                break  # more offload at this AC would only be slower
                            else:
                                continue
                            if offload == offloads[0]:
                                break  # fits without offload: more recompute would only be slower
    if evaluate.considered == 0:
        raise ConfigError(_nothing_matches(model, training, cluster, pins), "relax a pinned knob", "fstrain plan")
    return plans, rejected, evaluate.considered


def rank_params(model: PlanModel, knobs: PlanKnobs) -> int:
    """Parameters on the rank with the most (what data-parallel traffic moves)."""
    if model.params is None or model.spec is None:
        return model.num_params // (knobs.tp * knobs.pp)
    return max(shape.params for shape in _shapes(model, knobs))


def rank_expert_params(model: PlanModel, knobs: PlanKnobs) -> int:
    """Of :func:`rank_params`, the experts' parameters under expert parallelism (0 without EP):
    what is reduced over the dp/ep expert-data-parallel ranks instead of dp."""
    if model.params is None or model.spec is None or knobs.ep == 1:
        return 0
    return max(_shapes(model, knobs), key=lambda shape: shape.params).experts


def _shapes(model: PlanModel, knobs: PlanKnobs) -> list[StageShape]:
    assert model.params is not None and model.spec is not None
    shapes = stage_shapes(model.params, knobs.tp, knobs.pp, knobs.grad_accum_steps, model.spec.tied_embeddings,
                          knobs.pp_schedule, knobs.pp_virtual_stages, knobs.ep)
    embedding = model.params.embedding + model.params.position_embedding
    return [with_replicated_embedding(shape, embedding, knobs) for shape in shapes]


def _rejection(knobs: PlanKnobs, memory: MemoryBreakdown, usable: int, gpu_label: str, host_limit: int | None) -> str:
    if memory.required > usable:  # the allocator's cache margin can shrink (MemoryBreakdown.required)
        name, value = memory.largest_item()
        return (
            f"{describe_knobs(knobs)}: needs {memory.required / GIB:.1f} GiB of {usable / GIB:.1f} GiB usable on "
            f"{gpu_label} (peak {memory.peak / GIB:.1f} with the allocator's margin): {name} {value / GIB:.1f} GiB"
        )
    if host_limit is not None and memory.host_bytes_per_node > host_limit:
        return (
            f"{describe_knobs(knobs)}: needs {memory.host_bytes_per_node / GIB:.1f} GiB of host memory per node, "
            f"a node has {host_limit / GIB:.1f} GiB"
        )
    return ""


def _nothing_matches(model: PlanModel, training: TrainingSpec, cluster: PlanCluster, pins: Pins) -> str:
    pinned = ", ".join(f"{k}={v}" for k, v in pins.pinned().items()) or "no pins"
    world = cluster.world_size
    if training.global_batch_size is not None:
        return (
            f"no configuration of {world} GPUs makes a global batch of {training.global_batch_size} sequences "
            f"with {pinned} (dp x micro-batch x grad-accum must equal the global batch{_schedule_note(pins)})"
        )
    fix = "give --global-batch, or both --micro-batch and --grad-accum"
    return f"no configuration of {world} GPUs matches {pinned}{_schedule_note(pins)}: {fix}"


def _schedule_note(pins: Pins) -> str:
    if pins.pp_schedule in (None, "1f1b"):
        return ""
    return (f"; the {pins.pp_schedule} schedule needs pp > 1, at least pp micro-batches (--grad-accum) and, "
            "interleaved, pp x virtual stages <= layers; under Megatron, micro-batches in whole groups of pp")


def _rank_key(p: Plan) -> tuple[Any, ...]:
    speed = p.time.tokens_per_s if p.time else 0.0
    # Plans that fit with the allocator's margin first; then four significant digits of speed:
    # near-equal throughput falls to the simpler, smaller plan.
    return (p.tight, -float(f"{speed:.4g}"), *_tie_key(p))


def _tie_key(p: Plan) -> tuple[Any, ...]:
    k = p.knobs
    return (
        _ORDER[k.strategy],
        k.tp,
        k.pp,
        k.ep,
        k.cp,
        _SCHEDULE_ORDER[k.pp_schedule],
        k.pp_virtual_stages,
        _ac_order(k.activation_checkpointing),
        _ORDER[k.offload],
        p.memory.peak,
        k.micro_batch_size,
        k.shard_group_size,
    )


def _suggest(
    model: PlanModel, training: TrainingSpec, cluster: PlanCluster, pins: Pins, assumptions: Assumptions
) -> Iterator[str]:
    """What would fit: more nodes, a pin released, a shorter sequence, a smaller optimizer."""

    def first_fit(t: TrainingSpec, c: PlanCluster, p: Pins) -> Plan | None:
        try:
            found, _, _ = _search(model, t, c, p, assumptions, first_fit=True)
        except ConfigError:
            return None
        return found[0] if found else None

    for factor in (2, 4, 8, 16, 32, 64):
        bigger = cluster.scaled(factor)
        hit = first_fit(training, bigger, pins)
        if hit:
            speed = f" ({hit.time.tokens_per_s:,.0f} tokens/s)" if hit.time else ""
            yield f"on {bigger.num_nodes} nodes ({bigger.world_size} GPUs), e.g. {hit.describe()}{speed}"
            break
    flags = {
        "strategy": "--strategy",
        "tp": "--tp",
        "pp": "--pp",
        "shard_group_size": "--shard-group-size",
        "micro_batch_size": "--micro-batch",
        "grad_accum_steps": "--grad-accum",
        "activation_checkpointing": "--ac",
        "offload": "--offload",
        "pp_schedule": "--pp-schedule",
        "pp_virtual_stages": "--pp-virtual-stages",
        "ep": "--ep",
        "cp": "--cp",
    }
    released = False
    for key, value in pins.pinned().items():
        hit = first_fit(training, cluster, dataclasses.replace(pins, **{key: None}))
        if hit:
            released = True
            yield f"without {flags[key]} {value}, e.g. {hit.describe()}"
    if pins.pinned() and not released:
        hit = first_fit(training, cluster, Pins())
        if hit:
            yield f"without any pin, e.g. {hit.describe()}"
    if model.spec is not None:
        seq = training.seq_len // 2
        while seq >= 128:
            if seq % (2 * (pins.cp or 1)):
                break  # no shorter sequence splits into the 2 x cp chunks
            shorter = dataclasses.replace(training, seq_len=seq)
            hit = first_fit(shorter, cluster, pins)
            if hit:
                yield f"with --seq-len {seq}, e.g. {hit.describe()}"
                break
            seq //= 2
    if training.optimizer != "adam8bit":
        hit = first_fit(dataclasses.replace(training, optimizer="adam8bit"), cluster, pins)
        if hit:
            yield f"with --optimizer adam8bit, e.g. {hit.describe()}"
