"""The plan file: what crosses from the planner to the renderers, the launcher and the trainer.

``plan.yaml`` (written by ``fstrain plan --out``) holds one :class:`PlanFile`: the model
architecture, the chosen parallel configuration and a summary of the cluster it was planned
for (the values of :mod:`.schema`). Everything is plain data with ``to_dict``/``from_dict`` so
the file can be diffed and committed, and every field is validated when read back, with the key
named in the error: the model section as strictly as a recipe's (:mod:`.recipe`), the knobs by
the rules of each feature (:mod:`.precision`, :mod:`.adafactor`, :mod:`.contextparallel`, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from fstrain.core.formats import KINDS, check_format
from fstrain.core.plan.acpolicy import parse_ac
from fstrain.core.plan.adafactor import check_adafactor
from fstrain.core.plan.contextparallel import cp_problem
from fstrain.core.plan.frameworks import FRAMEWORKS, profile
from fstrain.core.plan.fsdp2habits import no_sync_problem, replicated_logits_problem
from fstrain.core.plan.losses import parse_loss
from fstrain.core.plan.megatron import MEGATRON_STRATEGIES, runnable_schedules
from fstrain.core.plan.precision import PRECISIONS, check_strategy
from fstrain.core.plan.recipe import check_plan_name, parse_model_section
from fstrain.core.plan.schema import (
    DEEPSPEED_STRATEGIES,
    LOSSES,
    OFFLOAD,
    OPTIMIZERS,
    PP_SCHEDULES,
    STRATEGIES,
    ClusterSummary,
    ModelSpec,
    PlanKnobs,
)
from fstrain.errors import InputError

_PLAN_HINT = "fix the value, or write the plan again with `fstrain plan --out plan.yaml`"


@dataclass(frozen=True)
class PlanFile:
    """The content of ``plan.yaml``."""

    model: ModelSpec
    knobs: PlanKnobs
    cluster: ClusterSummary
    predicted: Mapping[str, Any] = field(default_factory=dict)  # memory bytes, step time, ...

    def to_dict(self) -> dict[str, Any]:
        return {
            KINDS["plan"].key: KINDS["plan"].current,  # the plan's format version (fstrain/core/formats.py)
            "model": asdict(self.model),
            "plan": asdict(self.knobs),
            "cluster": {**asdict(self.cluster), "hosts": list(self.cluster.hosts)},
            "predicted": dict(self.predicted),
        }

    @classmethod
    def from_dict(cls, data: Any, where: str) -> PlanFile:
        if not isinstance(data, Mapping) or "fstrain_plan" not in data:
            raise InputError(
                "not an fstrain plan (no 'fstrain_plan' key)", "write one with `fstrain plan --out plan.yaml`", where
            )
        check_format(data, "plan", where)  # every version up to this fstrain's
        model_data = dict(_section(data, "model", where))
        name = check_plan_name(model_data.pop("name", ""), f"{where}: model.name")
        # As strict as a recipe: `launch --plan` must refuse what `plan` would never write.
        model = parse_model_section(model_data, where, name)
        knobs = _build(PlanKnobs, _section(data, "plan", where), f"{where}: plan")
        # Plans written before the policies had their own names say `selective` (Megatron's).
        ac = parse_ac(knobs.activation_checkpointing, f"{where}: plan.activation_checkpointing")
        knobs = replace(knobs, activation_checkpointing=ac)
        cluster_data = dict(_section(data, "cluster", where))
        hosts = cluster_data.get("hosts") or ()
        if not isinstance(hosts, list | tuple):
            raise InputError(f"cluster.hosts must be a list, got {type(hosts).__name__}", _PLAN_HINT, where)
        cluster_data["hosts"] = tuple(hosts)
        cluster = _build(ClusterSummary, cluster_data, f"{where}: cluster")
        predicted = data.get("predicted") or {}
        plan = cls(model=model, knobs=knobs, cluster=cluster, predicted=_as_mapping(predicted, f"{where}: predicted"))
        validate_knobs(plan.knobs, where)
        validate_ep(plan.knobs, plan.model, where)
        validate_cp(plan.knobs, plan.model, where)
        validate_cluster(plan.cluster, where)
        return plan


def validate_knobs(knobs: PlanKnobs, where: str) -> None:
    """Refuse a configuration no renderer could honour, naming the key."""
    choices = {
        "strategy": STRATEGIES,
        "offload": OFFLOAD,
        "precision": PRECISIONS,
        "optimizer": OPTIMIZERS,
    }
    for key, allowed in choices.items():
        value = getattr(knobs, key)
        if value not in allowed:
            raise InputError(f"plan.{key} is {value!r}", f"use one of {', '.join(allowed)}", where)
    check_strategy(knobs.precision, knobs.strategy, f"{where}: plan.precision")
    check_adafactor(knobs.optimizer, knobs.strategy, knobs.offload, f"{where}: plan.optimizer")
    try:
        loss = parse_loss(knobs.loss, where)
    except InputError:
        raise InputError(f"plan.loss is {knobs.loss!r}", f"use one of {', '.join(LOSSES)} (chunked:N)", where) from None
    if loss != knobs.loss:
        raise InputError(f"plan.loss is {knobs.loss!r}", f"write it as {loss!r}", where)
    if knobs.framework not in FRAMEWORKS:
        raise InputError(f"plan.framework is {knobs.framework!r}", f"use one of {', '.join(FRAMEWORKS)}", where)
    if parse_ac(knobs.activation_checkpointing, where) != knobs.activation_checkpointing:
        raise InputError(
            f"plan.activation_checkpointing is {knobs.activation_checkpointing!r}",
            f"write it as {parse_ac(knobs.activation_checkpointing, where)!r}",
            where,
        )
    if knobs.zero_stage not in (0, 1, 2, 3):
        raise InputError(f"plan.zero_stage is {knobs.zero_stage!r}", "DeepSpeed has ZeRO stages 0, 1, 2 and 3", where)
    for key in ("dp", "tp", "pp", "shard_group_size", "micro_batch_size", "grad_accum_steps"):
        value = getattr(knobs, key)
        if not _is_int(value) or value < 1:
            raise InputError(f"plan.{key} must be a positive integer, got {value!r}", _PLAN_HINT, where)
    if not _is_int(knobs.seq_len) or knobs.seq_len < 0:
        raise InputError(f"plan.seq_len must be 0 (the model's) or a positive integer, got {knobs.seq_len!r}",
                         _PLAN_HINT, where)
    for key in ("flash_attention", "compile", "fused_rmsnorm", "fp8", "fp8_all_gather", "fsdp2_no_sync",
                "tp_replicated_logits"):
        if not isinstance(getattr(knobs, key), bool):
            raise InputError(f"plan.{key} must be true or false, got {getattr(knobs, key)!r}", _PLAN_HINT, where)
    if knobs.fp8_all_gather and not (knobs.fp8 and knobs.strategy.startswith("fsdp")):
        raise InputError(
            f"plan.fp8_all_gather is true with fp8 {str(knobs.fp8).lower()} and strategy {knobs.strategy}",
            "FSDP's float8 all-gather needs fp8 linears and an fsdp-* strategy: set it false",
            where,
        )
    validate_fsdp2_habits(knobs, where)
    validate_pp_schedule(knobs, where)
    if knobs.dp % knobs.shard_group_size != 0:
        raise InputError(
            f"plan.shard_group_size({knobs.shard_group_size}) does not divide dp({knobs.dp})",
            "hybrid shard groups must tile the data-parallel ranks",
            where,
        )


def validate_fsdp2_habits(knobs: PlanKnobs, where: str) -> None:
    """Refuse fsdp2_no_sync or tp_replicated_logits with knobs they cannot describe
    (fstrain.core.plan.fsdp2habits), naming the key."""
    checks = (("fsdp2_no_sync", no_sync_problem(knobs.strategy, knobs.pp, knobs.framework)),
              ("tp_replicated_logits", replicated_logits_problem(knobs.pp, knobs.loss)))
    for key, problem in checks:
        if getattr(knobs, key) and problem:
            raise InputError(f"plan.{key} is true: {problem[0]}", f"{problem[1]}, or set {key} false", where)


def validate_ep(knobs: PlanKnobs, model: ModelSpec | None, where: str) -> None:
    """Refuse an expert-parallel degree the model or the data-parallel ranks cannot take.

    ``model`` None (only a parameter count is known) allows ep 1 only. The EP group is carved
    out of the data-parallel ranks (torchtitan parallel_dims.py: EP borrows from dp_shard), so
    ``ep`` divides ``dp``, the hybrid shard group (experts are sharded over group/ep ranks) and
    the number of experts (each rank holds num_experts/ep whole experts).
    """
    ep = knobs.ep
    if not _is_int(ep) or ep < 1:
        raise InputError(f"plan.ep must be a positive integer, got {ep!r}", "use 1 for no expert parallelism", where)
    if ep == 1:
        return
    if model is None or model.moe is None:
        name = model.name if model is not None else "a model given by its parameter count"
        raise InputError(f"plan.ep is {ep} but {name} has no experts", "use ep 1 (expert parallelism is for MoE "
                         "models)", where)
    experts = model.moe.num_experts
    if experts % ep:
        raise InputError(f"plan.ep({ep}) does not divide num_experts({experts})",
                         f"use a divisor of {experts} that divides dp({knobs.dp})", where)
    if knobs.dp % ep:
        raise InputError(f"plan.ep({ep}) does not divide dp({knobs.dp})",
                         "the expert-parallel group is carved out of the data-parallel ranks: use a divisor of dp",
                         where)
    if knobs.strategy == "fsdp-hybrid" and knobs.shard_group_size % ep:
        raise InputError(f"plan.ep({ep}) does not divide shard_group_size({knobs.shard_group_size})",
                         "with hybrid sharding experts are sharded over group/ep ranks: use a divisor of the group",
                         where)


def validate_cp(knobs: PlanKnobs, model: ModelSpec | None, where: str) -> None:
    """Refuse a context-parallel degree the plan cannot run (fstrain/core/plan/contextparallel.py):
    torchtitan's ring attention runs under FSDP2 only, without pipeline or expert parallelism in
    the configurations fstrain models, with FlashAttention-style SDPA, and its load-balanced
    causal sharding cuts each sequence into 2 x cp equal chunks."""
    cp = knobs.cp
    if not _is_int(cp) or cp < 1:
        raise InputError(f"plan.cp must be a positive integer, got {cp!r}", "use 1 for no context parallelism", where)
    seq_len = knobs.seq_len or (model.seq_len if model is not None else 0)
    problem = cp_problem(cp, knobs.strategy, knobs.pp, knobs.ep, knobs.flash_attention, seq_len)
    if problem:
        what, hint = problem
        raise InputError(f"plan.cp is {cp}: {what}", hint, where)


def validate_pp_schedule(knobs: PlanKnobs, where: str) -> None:
    """Refuse a pipeline schedule the plan's pipeline cannot run, naming the key."""
    schedule, chunks = knobs.pp_schedule, knobs.pp_virtual_stages
    if schedule not in PP_SCHEDULES:
        raise InputError(f"plan.pp_schedule is {schedule!r}", f"use one of {', '.join(PP_SCHEDULES)}", where)
    if not _is_int(chunks) or chunks < 1:
        raise InputError(f"plan.pp_virtual_stages must be a positive integer, got {chunks!r}", _PLAN_HINT, where)
    if schedule == "interleaved" and chunks < 2:
        raise InputError(f"plan.pp_virtual_stages is {chunks} with the interleaved schedule",
                         "interleaving needs at least 2 model chunks per pipeline rank", where)
    if schedule != "interleaved" and chunks != 1:
        raise InputError(f"plan.pp_virtual_stages is {chunks} with the {schedule} schedule",
                         "virtual stages belong to pp_schedule interleaved; use 1 otherwise", where)
    if schedule != "1f1b" and knobs.pp == 1:
        raise InputError(f"plan.pp_schedule is {schedule!r} without a pipeline (pp=1)", "use 1f1b with pp=1",
                         where)
    if schedule in runnable_schedules(knobs.strategy, knobs.framework):
        return
    if knobs.strategy in MEGATRON_STRATEGIES and profile(knobs.framework).megatron_ddp:
        raise InputError(f"plan.pp_schedule is {schedule!r} with {knobs.strategy} under Megatron-LM",
                         "Megatron runs 1F1B and interleaved (megatron/core/pipeline_parallel/schedules.py)", where)
    if knobs.strategy in DEEPSPEED_STRATEGIES:
        raise InputError(
            f"plan.pp_schedule is {schedule!r} with {knobs.strategy}",
            "DeepSpeed's pipeline engine runs its own 1F1B schedule only: use pp_schedule 1f1b, or an fsdp-* "
            "strategy (torch.distributed.pipelining)",
            where,
        )


def validate_cluster(cluster: ClusterSummary, where: str) -> None:
    """Refuse a cluster summary of the wrong types or signs, naming the key."""
    for key in ("num_nodes", "gpus_per_node"):
        value = getattr(cluster, key)
        if not _is_int(value) or value < 1:
            raise InputError(f"cluster.{key} must be a positive integer, got {value!r}", _PLAN_HINT, where)
    for key in ("gpu_memory_bytes", "nvlink_domain_size"):
        value = getattr(cluster, key)
        if not _is_int(value) or value < 0:
            raise InputError(f"cluster.{key} must be an integer >= 0, got {value!r}", _PLAN_HINT, where)
    if isinstance(cluster.inter_node_gbps, bool) or not isinstance(cluster.inter_node_gbps, int | float) \
            or not cluster.inter_node_gbps >= 0:
        raise InputError(f"cluster.inter_node_gbps must be a number >= 0, got {cluster.inter_node_gbps!r}",
                         _PLAN_HINT, where)
    if not isinstance(cluster.gpu, str):
        raise InputError(f"cluster.gpu must be text, got {cluster.gpu!r}", _PLAN_HINT, where)
    if not all(isinstance(host, str) for host in cluster.hosts):
        raise InputError("cluster.hosts must be a list of host names", _PLAN_HINT, where)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _section(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    if key not in data:
        raise InputError(f"missing section {key!r}", "write the plan with `fstrain plan --out`", where)
    return _as_mapping(data[key], f"{where}: {key}")


def _as_mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InputError(f"expected a mapping, got {type(value).__name__}", _PLAN_HINT, where)
    return value


def _build(cls: Any, data: Mapping[str, Any], where: str) -> Any:
    names = {f.name for f in fields(cls)}
    unknown = sorted(str(key) for key in set(data) - names)
    if unknown:
        raise InputError(f"unknown key(s) {', '.join(unknown)}", f"known keys: {', '.join(sorted(names))}", where)
    try:
        return cls(**data)
    except TypeError as exc:  # a missing required key
        raise InputError(str(exc).replace("__init__() ", ""), _PLAN_HINT, where) from None
