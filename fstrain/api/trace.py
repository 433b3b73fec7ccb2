"""``fstrain plan --trace``: the chosen plan's memory traced by PyTorch (fake tensors), beside the
planner's analytic numbers. torch is imported (through fstrain/train/trace.py) here only, and only
when a trace is asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from fstrain.core.plan.plancluster import PlanCluster
    from fstrain.core.plan.planner import Plan, PlanModel, PlanResult

GIB = 1 << 30
ROWS = ("parameters", "gradients", "optimizer_states", "activations", "buffers")


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


def trace(result: PlanResult, plan_model: PlanModel, cluster: PlanCluster,
          progress: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """Trace the chosen plan (each stage said to ``progress``); the comparison as a JSON-ready dict."""
    from fstrain.core.plan.memory import AUTOCAST_CACHE_ITEM
    from fstrain.core.plan.planfile import PlanFile
    from fstrain.core.render.fsdp import render_fsdp
    from fstrain.errors import ConfigError

    if plan_model.spec is None:
        raise ConfigError("the trace builds the model", "use --model NAME or --recipe PATH", "--trace")
    chosen = traced_plan(result)
    plan = PlanFile(model=plan_model.spec, knobs=chosen.knobs, cluster=cluster.summary())
    from fstrain.train.trace import check_traceable

    check_traceable(plan)  # before torch is imported
    progress("importing torch")
    from fstrain.train.trace import trace_plan

    traced = trace_plan(plan, render_fsdp(plan).config, progress=progress)
    analytic = analytic_categories(chosen)
    analytic_total = sum(analytic.values())
    notes = []
    cached = dict(chosen.memory.details).get(AUTOCAST_CACHE_ITEM, 0)
    if cached and chosen.memory.phase == "loss":
        # Checked by counting the live casts in the same fake-tensor setup: they are there at the
        # end of forward, but FSDPMemTracker's snapshots do not count them.
        notes.append(f"the analytic activations include autocast's cached weight casts ({cached / GIB:.2f} GiB), "
                     "which torch's FSDPMemTracker does not count")
    return {
        "notes": notes,
        "plan": chosen.describe(),
        "analytic": {**analytic, "total": analytic_total},
        "traced": traced.to_dict(),
        "error_pct": {
            key: _error(analytic[key], traced.categories[key]) for key in ROWS
        } | {"total": _error(analytic_total, traced.total)},
    }


def _error(analytic: int, traced: int) -> float | None:
    """Percent off the trace; None when the trace holds (almost) nothing there (under 64 MiB)."""
    return None if traced < 64 << 20 else round(100.0 * (analytic - traced) / traced, 1)
