"""Values shared by the renderers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fstrain.core.plan.planfile import PlanFile, validate_knobs
from fstrain.errors import ConfigError


@dataclass(frozen=True)
class Rendered:
    """A rendered configuration and the notes a human should read with it."""

    config: dict[str, Any]
    notes: tuple[str, ...] = field(default=())


def check_plan(plan: PlanFile, where: str = "plan") -> None:
    """Refuse a plan no renderer can honour: bad knobs, or offload the strategy cannot do."""
    validate_knobs(plan.knobs, where)
    knobs = plan.knobs
    if knobs.offload != "none" and knobs.zero_stage == 0 and not knobs.strategy.startswith("fsdp"):
        raise ConfigError(
            f"offload {knobs.offload!r} with ZeRO stage 0",
            "CPU offload needs ZeRO stage 1 or more (DeepSpeed) or an fsdp-* strategy",
            f"{where}: plan.offload",
        )
    if knobs.offload == "optimizer+params" and knobs.zero_stage != 3:
        raise ConfigError(
            f"offload 'optimizer+params' with ZeRO stage {knobs.zero_stage}",
            "parameter offload exists in ZeRO stage 3 only; use zero_stage 3 or offload 'optimizer'",
            f"{where}: plan.offload",
        )
    if plan.model.hidden_size < 1:
        raise ConfigError(f"model.hidden_size is {plan.model.hidden_size}", "", f"{where}: model.hidden_size")
