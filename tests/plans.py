"""PlanFile values built directly, so the render and trainer tests do not depend on the planner."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fstrain.core.plan.planfile import PlanFile
from fstrain.core.plan.schema import ClusterSummary, ModelSpec, PlanKnobs

# 2 layers, hidden 64, 4 heads (GQA: 2 kv heads), vocab 256, seq 64: trains on a CPU in seconds.
TINY_MODEL = ModelSpec(
    name="test-tiny",
    num_layers=2,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    ffn_hidden_size=256,
    activation="gelu",
    vocab_size=256,
    seq_len=64,
    tied_embeddings=True,
    norm="layernorm",
    linear_bias=True,
    position_embedding="learned",
)

# The ZeRO stage each strategy implies (what the planner writes).
STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp-full": 3, "fsdp-grad-op": 2, "fsdp-hybrid": 3}


def make_plan(
    strategy: str = "zero3",
    *,
    dp: int = 2,
    shard_group_size: int | None = None,
    model: ModelSpec = TINY_MODEL,
    num_nodes: int = 1,
    **knobs: Any,
) -> PlanFile:
    """A plan for ``strategy`` over ``dp`` ranks; ``knobs`` override PlanKnobs fields."""
    if shard_group_size is None:
        shard_group_size = 1 if strategy == "ddp" else dp
    fields: dict[str, Any] = {
        "strategy": strategy,
        "zero_stage": STAGE[strategy],
        "dp": dp,
        "tp": 1,
        "pp": 1,
        "shard_group_size": shard_group_size,
        "micro_batch_size": 4,
        "grad_accum_steps": 2,
    }
    fields.update(knobs)
    cluster = ClusterSummary(
        num_nodes=num_nodes,
        gpus_per_node=max(1, dp // num_nodes),
        gpu="h100-sxm",
        gpu_memory_bytes=80 * 2**30,
        hosts=tuple(f"node{i}" for i in range(1, num_nodes + 1)),
    )
    return PlanFile(model=model, knobs=PlanKnobs(**fields), cluster=cluster)


def with_model(plan: PlanFile, **changes: Any) -> PlanFile:
    return replace(plan, model=replace(plan.model, **changes))
