"""``fstrain plan --trace``: the chosen plan's memory traced by PyTorch (fake tensors), beside the
planner's analytic numbers. torch is imported (through fstrain/train/trace.py) here only, and only
when a trace is asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from fstrain.api.plan import Planned
    from fstrain.core.plan.hfdiff import HfDifference
    from fstrain.core.plan.planner import Plan, PlanResult
    from fstrain.core.plan.schema import PlanKnobs

GIB = 1 << 30
ROWS = ("parameters", "gradients", "optimizer_states", "activations", "buffers")
# What the trace runs for a strategy it cannot run itself. DeepSpeed's partitioning does not run
# on fake tensors; FSDP2's full sharding is ZeRO-3's equivalent: parameters, gradients and
# optimizer states each sharded over every data-parallel rank, and each block gathered for its
# forward and again for its backward. (ZeRO-1/2 and DDP keep whole parameters on every rank,
# which no FSDP2 layout does: they stay refused.)
STAND_INS = {"zero3": "fsdp-full"}


def traced_plan(result: PlanResult) -> Plan:
    """The plan to trace: the chosen one, or when nothing fits the closest one that does not."""
    from fstrain.errors import ConfigError

    shown = result.plans or result.rejected
    if not shown:
        raise ConfigError("no configuration to trace", "relax a pinned knob", "--trace")
    return shown[0]


def analytic_categories(chosen: Plan) -> dict[str, int]:
    """The planner's breakdown in the trace's categories (activations include logits and the
    recompute working set; overhead (context, NCCL, fragmentation) is not traced)."""
    m = chosen.memory
    return {
        "parameters": m.parameters,
        "gradients": m.gradients,
        "optimizer_states": m.optimizer_states,
        "activations": m.activations,
        "buffers": m.buffers,
    }


def stand_in_knobs(knobs: PlanKnobs) -> PlanKnobs:
    """What the trace runs for ``knobs``: themselves, or for ZeRO-3 its FSDP2 equivalent
    (:data:`STAND_INS`) with every other knob the same; the offload too where FSDP has that kind
    (its CPU offload moves parameters with the optimizer: ZeRO-3's optimizer-only offload becomes
    none, as the trace runs every plan without offload anyway)."""
    from dataclasses import replace

    from fstrain.core.plan.memory import OFFLOAD_ALLOWED, ZERO_STAGE

    strategy = STAND_INS.get(knobs.strategy)
    if strategy is None:
        return knobs
    offload = knobs.offload if knobs.offload in OFFLOAD_ALLOWED[strategy] else "none"
    return replace(knobs, strategy=strategy, zero_stage=ZERO_STAGE[strategy], offload=offload)


def evaluated(knobs: PlanKnobs, planned: Planned) -> Plan:
    """``knobs`` evaluated by the planner as it evaluates every configuration it searches (its
    memory model, with the run's assumptions), every knob pinned."""
    from dataclasses import replace

    from fstrain.core.plan.planner import Pins, plan

    pins = Pins(strategy=knobs.strategy, tp=knobs.tp, pp=knobs.pp, micro_batch_size=knobs.micro_batch_size,
                grad_accum_steps=knobs.grad_accum_steps, activation_checkpointing=knobs.activation_checkpointing,
                offload=knobs.offload, ep=knobs.ep if knobs.ep > 1 else None, cp=knobs.cp if knobs.cp > 1 else None)
    training = replace(planned.training, global_batch_size=knobs.global_batch_size)
    return traced_plan(plan(planned.model, training, planned.cluster, pins, planned.assumptions, suggest=False))


def stand_in_note(chosen: Plan, traced: Plan) -> str:
    """The one line that says the trace ran ``traced`` for ``chosen``, and why."""
    from fstrain.core.plan.memory import STRATEGY_LABELS

    was, runs = STRATEGY_LABELS[chosen.knobs.strategy], STRATEGY_LABELS[traced.knobs.strategy]
    own = sum(analytic_categories(chosen).values())
    return (f"traced as {traced.describe()}: {was}'s FSDP2 equivalent (the same states sharded over every "
            f"data-parallel rank; DeepSpeed's partitioning does not run on fake tensors); both columns are {runs}'s, "
            f"{was}'s own analytic total is {own / GIB:.2f} GiB")


def trace(planned: Planned, progress: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """Trace the chosen plan (each stage said to ``progress``); the comparison as a JSON-ready dict."""
    from fstrain.core.plan.memory import AUTOCAST_CACHE_ITEM
    from fstrain.core.plan.planfile import PlanFile
    from fstrain.core.render.fsdp import render_fsdp
    from fstrain.errors import ConfigError

    plan_model = planned.model
    if plan_model.spec is None:
        raise ConfigError("the trace builds the model", "use --model NAME or --recipe PATH", "--trace")
    chosen = traced_plan(planned.result)
    knobs = stand_in_knobs(chosen.knobs)
    from fstrain.train.trace import check_traceable

    hf = planned.hf_config
    check_traceable(PlanFile(model=plan_model.spec, knobs=knobs, cluster=planned.cluster.summary()), hf=bool(hf))
    traced_as = chosen if knobs == chosen.knobs else evaluated(knobs, planned)
    plan = PlanFile(model=plan_model.spec, knobs=traced_as.knobs, cluster=planned.cluster.summary())
    progress("importing torch")
    from fstrain.train.trace import trace_plan, traced_model

    traced = trace_plan(plan, render_fsdp(plan).config, progress=progress, hf_config=hf)  # checks transformers first
    analytic = analytic_categories(traced_as)
    analytic_total = sum(analytic.values())
    notes = []
    cached = dict(traced_as.memory.details).get(AUTOCAST_CACHE_ITEM, 0)
    if cached and traced_as.memory.phase == "loss":
        # Checked by counting the live casts in the same fake-tensor setup: they are there at the
        # end of forward, but FSDPMemTracker's snapshots do not count them.
        notes.append(f"the analytic activations include autocast's cached weight casts ({cached / GIB:.2f} GiB), "
                     "which torch's FSDPMemTracker does not count")
    differences = _hf_differences(planned, traced_as) if hf else []
    for item in differences:
        notes.append(f"{item.category}: transformers' model holds {item.bytes / GIB:+.2f} GiB beside the analytic "
                     f"count: {item.why}")
    return {
        "notes": notes,
        "plan": chosen.describe(),
        "model": traced_model(plan, hf),
        "traced_plan": traced_as.describe(),
        "stand_in": stand_in_note(chosen, traced_as) if traced_as is not chosen else None,
        "analytic": {**analytic, "total": analytic_total},
        "traced": traced.to_dict(),
        "hf_differences": [{"category": d.category, "bytes": d.bytes, "why": d.why} for d in differences],
        "error_pct": {
            key: _error(analytic[key], traced.categories[key]) for key in ROWS
        } | {"total": _error(analytic_total, traced.total)},
    }


def _hf_differences(planned: Planned, traced_as: Plan) -> list[HfDifference]:
    """What transformers' model holds beside the planner's count (:mod:`fstrain.core.plan.hfdiff`)."""
    import json

    from fstrain.core.plan.hfdiff import hf_differences

    model, params = planned.model.spec, planned.model.params
    assert model is not None and params is not None  # the trace refuses a model without an architecture
    model_type = str(json.loads(planned.hf_config).get("model_type", ""))
    return hf_differences(model, params, traced_as.knobs, traced_as.memory.phase, model_type)


def _error(analytic: int, traced: int) -> float | None:
    """Percent off the trace; None when the trace holds (almost) nothing there (under 64 MiB)."""
    return None if traced < 64 << 20 else round(100.0 * (analytic - traced) / traced, 1)
