"""What a plan asks of the cluster: GPU memory per GPU, checkpoint size, world size."""

from __future__ import annotations

from fstrain.core.doctor.facts import PlanNeeds
from fstrain.core.plan.memory import OPTIMIZER_STATE_BYTES, param_bytes
from fstrain.core.plan.planfile import PlanFile
from fstrain.core.plan.precision import mode, optimizer_state_bytes


def checkpoint_bytes(num_params: int, precision: str, optimizer: str) -> int:
    """A full training checkpoint: the weights in their dtype, the fp32 master copy under mixed
    precision, and the optimizer states (Adam: m and v, in fp32 or, pure bf16, in bf16), summed
    over all ranks."""
    states = optimizer_state_bytes(precision, optimizer, OPTIMIZER_STATE_BYTES.get(optimizer, 8))
    return num_params * (param_bytes(precision) + mode(precision).master_bytes + states)


def plan_needs(plan: PlanFile, source: str) -> PlanNeeds:
    predicted = plan.predicted
    memory = predicted.get("memory")
    peak = memory.get("peak") if isinstance(memory, dict) else None
    params = predicted.get("num_params")
    knobs = plan.knobs
    return PlanNeeds(
        source=source,
        gpu_memory_bytes=int(peak) if isinstance(peak, (int, float)) and peak > 0 else None,
        checkpoint_bytes=checkpoint_bytes(int(params), knobs.precision, knobs.optimizer)
        if isinstance(params, (int, float)) and params > 0 else None,
        world_size=knobs.world_size,
        num_nodes=plan.cluster.num_nodes,
        gpus_per_node=plan.cluster.gpus_per_node,
        gpu=plan.cluster.gpu,
    )
