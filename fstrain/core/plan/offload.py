"""Step time of CPU offload: the PCIe traffic of the offloaded state and the optimizer step on
the host's CPUs, neither overlapped with the GPU's work.

- **PCIe**: at half the bidirectional host link (one direction at a time). DeepSpeed
  ZeRO-Offload (stage 1/2, ``offload_optimizer``) sends each rank's gradient shard down and the
  updated 16-bit parameters up once a step; with ``offload_param`` (ZeRO-3) the parameters also
  come up for forward and backward every micro-batch. FSDP's CPU offload (FSDP1 ``CPUOffload(
  offload_params=True)``, FSDP2 ``CPUOffloadPolicy``) keeps the fp32 shards on the host: they go
  up before each all-gather (forward and backward) and the fp32 gradient shard comes down after
  each reduce-scatter, every micro-batch.
- **CPU optimizer**: the node's CPUs update every shard of its ranks (``shard x GPUs per node``
  parameters) at a per-node rate. DeepSpeed runs its AVX-vectorised ``DeepSpeedCPUAdam``
  (``cpu_adam_params_per_s_per_node``); FSDP leaves the optimizer to the user's
  ``torch.optim.AdamW`` on CPU tensors, which DeepSpeed measures 5-7x slower than its own
  ("DeepSpeedCPUAdam is 5X-7X faster than the standard PyTorch implementation",
  https://www.deepspeed.ai/tutorials/zero-offload/): ``torch_cpu_adamw_params_per_s_per_node``,
  1/6 of it by default.
"""

from __future__ import annotations

from dataclasses import dataclass

from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.memory import param_bytes
from fstrain.core.plan.schema import PlanKnobs

FP32 = 4


@dataclass(frozen=True)
class OffloadTime:
    """Seconds a step spends on CPU offload, by part."""

    pcie_s: float = 0.0  # the offloaded state's transfers between GPU and host
    cpu_optimizer_s: float = 0.0  # the optimizer step on the host's CPUs

    @property
    def total_s(self) -> float:
        return self.pcie_s + self.cpu_optimizer_s


def cpu_optimizer_rate(strategy: str, assumptions: Assumptions) -> float:
    """Parameters per second a node's CPUs update: DeepSpeed's CPU Adam, or torch's AdamW under FSDP."""
    if strategy.startswith("fsdp"):
        return assumptions.torch_cpu_adamw_params_per_s_per_node
    return assumptions.cpu_adam_params_per_s_per_node


def offload_time(
    knobs: PlanKnobs, params: float, host_link_bytes_per_s: float, gpus_per_node: int, assumptions: Assumptions,
    expert_params: float = 0.0,
) -> OffloadTime:
    """The offload time of one step of ``knobs`` for a rank holding ``params`` parameters before
    sharding (``expert_params`` of them experts, sharded over ``shard/ep`` ranks)."""
    if knobs.offload == "none":
        return OffloadTime()
    expert_shard = max(1, knobs.shard_group_size // knobs.ep)
    shard = (params - expert_params) / knobs.shard_group_size + expert_params / expert_shard
    one_way = host_link_bytes_per_s / 2
    cpu_step = shard * gpus_per_node / cpu_optimizer_rate(knobs.strategy, assumptions)
    if knobs.strategy.startswith("fsdp"):
        # fp32 shards up for forward and backward, fp32 gradients down, every micro-batch
        return OffloadTime(knobs.grad_accum_steps * 3 * FP32 * shard / one_way, cpu_step)
    w = param_bytes(knobs.precision)
    transfers = 2 * w * shard  # gradients down, updated parameters up, once a step
    if knobs.offload == "optimizer+params":
        transfers += knobs.grad_accum_steps * 2 * w * shard  # parameters up for forward and backward
    return OffloadTime(transfers / one_way, cpu_step)
