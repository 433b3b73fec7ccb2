"""Megatron-LM's data parallelism: the contiguous gradient buffer and the distributed optimizer.

Under ``--framework megatron`` the strategies ``ddp`` and ``zero1`` are Megatron-core's
``DistributedDataParallel`` with its plain optimizer (``Float16OptimizerWithFloat16Params``) and
with ``--use-distributed-optimizer`` (``DistributedOptimizer``), not torch's DDP and DeepSpeed's
ZeRO-1. They keep their memory differently (NVIDIA/Megatron-LM @d98e8a6):

- the parameters live in one contiguous buffer of the parameter dtype
  (megatron/core/distributed/param_and_grad_buffer.py L1181-1188, ``param_data``);
- the gradients accumulate into one contiguous ``grad_data`` buffer over every parameter of the
  rank, allocated once and never freed (L1190-1195), in fp32 for ``--bf16`` by default:
  ``--main-grads-dtype`` defaults to fp32 (megatron/training/arguments.py L3671), which turns on
  ``accumulate_allreduce_grads_in_fp32`` (L1213-1216); ``--grad-reduce-in-bf16`` keeps it bf16;
  ``--fp16`` keeps fp16 gradients. The buffer is the reduction's bucket too: the reduce-scatter
  (distributed optimizer) or all-reduce runs in place on its views (L710-732), and the all-gather
  of the updated parameters writes into ``param_data`` (L506-520), so neither allocates a bucket
  of its own;
- the distributed optimizer keeps fp32 main parameters for its shard only
  (megatron/core/optimizer/distrib_optimizer.py L445 ``shard_model_param.clone().float()``) and
  Adam's two fp32 states for them; the plain optimizer keeps them for every parameter;
- a gradient buffer that is not fp32 (fp16, or bf16 with ``--grad-reduce-in-bf16``) is cast to an
  fp32 main gradient at the step (distrib_optimizer.py L2792 ``shard_model_grad.float()``), which
  ``zero_grad`` frees again (L2568-2598) before the next forward.

So for ``d`` data-parallel ranks the bytes per parameter are those of Megatron's own table
(docs/user-guide/features/dist_optimizer.md L16-20): fp16 parameters and gradients 20 / 4 + 16/d,
bf16 parameters with fp32 gradients 18 / 6 + 12/d, fp32 16 / 8 + 8/d, for the plain and the
distributed optimizer. Bucket padding (each parameter's start at a multiple of 64 elements, each
bucket's end at one of lcm(d, 128): megatron/core/optimizer/param_layout.py L19-42) adds well
under 0.1 % and is not counted.

Megatron runs its pipelines with its own schedules, 1F1B or interleaved 1F1B (``--num-layers-per-
virtual-pipeline-stage``: megatron/core/pipeline_parallel/schedules.py L161-168), whichever
optimizer it uses: :data:`MEGATRON_SCHEDULES`.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from fstrain.core.plan.frameworks import profile
from fstrain.core.plan.precision import mode
from fstrain.core.plan.schema import DEEPSPEED_STRATEGIES, PP_SCHEDULES

MEGATRON_STRATEGIES = ("ddp", "zero1")  # Megatron's DDP with its plain or its distributed optimizer
MEGATRON_SCHEDULES = ("1f1b", "interleaved")  # schedules.py L161-168


@dataclass(frozen=True)
class MegatronBytes:
    """Bytes per parameter Megatron's DDP and optimizer keep, by what holds them."""

    parameters: int  # the contiguous parameter buffer (param dtype)
    grad_buffer: int  # the contiguous gradient buffer (main-grads dtype), unsharded
    optimizer: float  # fp32 main parameter and Adam's m, v: sharded by the distributed optimizer
    step_grad_copy: int  # the fp32 main gradient cast at the step (0 when the buffer is fp32)

    def at_step(self, shard: int) -> float:
        """Bytes per parameter at the optimizer step with the optimizer's states over ``shard``
        ranks (1: the plain optimizer): Megatron's table's figure."""
        return self.parameters + self.grad_buffer + (self.optimizer + self.step_grad_copy) / shard


def megatron_bytes(precision: str, state_bytes: float = 8, fp32_main_grads: bool = True) -> MegatronBytes:
    """Bytes per parameter under ``precision`` (bf16, fp16 or fp32; the autocast and pure-bf16
    modes are not Megatron's and are counted as their parameter dtype says), with the optimizer
    keeping ``state_bytes`` per parameter (Adam's fp32 m and v: 8) beside the fp32 main parameter
    of a 16-bit model.

    ``fp32_main_grads``: the gradient buffer of a bf16 model is fp32 (Megatron's default), else
    bf16 (``--grad-reduce-in-bf16``). fp16 models keep fp16 gradients, fp32 models fp32 ones."""
    m = mode(precision)
    mixed = m.master_bytes > 0
    grad = 4 if precision == "bf16" and fp32_main_grads else m.grad_bytes
    master = 4 if mixed else 0
    step_copy = 4 if mixed and grad < 4 else 0
    return MegatronBytes(m.param_bytes, grad, master + state_bytes, step_copy)


def megatron_reduce_bytes(precision: str, fp32_main_grads: bool = True) -> int:
    """Bytes per element of Megatron's gradient reduction: the gradient buffer's dtype, reduced
    in place (param_and_grad_buffer.py ``start_grad_sync`` on ``bucket.grad_data``)."""
    return megatron_bytes(precision, fp32_main_grads=fp32_main_grads).grad_buffer


def runnable_schedules(strategy: str, framework: str) -> tuple[str, ...]:
    """The pipeline schedules the runtime of ``strategy`` under ``framework`` runs: Megatron's
    1F1B and interleaved for its DDP and distributed optimizer, DeepSpeed's pipeline engine's
    1F1B for ZeRO (deepspeed/runtime/pipe/schedule.py TrainSchedule), torch.distributed.pipelining's
    three otherwise."""
    if strategy in MEGATRON_STRATEGIES and profile(framework).megatron_ddp:
        return MEGATRON_SCHEDULES
    if strategy in DEEPSPEED_STRATEGIES:
        return ("1f1b",)
    return PP_SCHEDULES


def megatron_strategy_problem(strategy: str, pp: int, ep: int = 1) -> str:
    """Why Megatron-LM does not run ``strategy`` as fstrain models it ('' where it does): its
    data parallelism is its DDP (``ddp``), its distributed optimizer (``zero1``) or torch's FSDP2
    (``--use-torch-fsdp2``, ``fsdp-full``), which it refuses with pipeline or expert parallelism
    (megatron/training/arguments.py @d98e8a6 L1031-1045). DeepSpeed's ZeRO-2/3, FSDP's grad-op
    and hybrid sharding are not Megatron's (Megatron-FSDP's ``--data-parallel-sharding-strategy``
    keeps its own buffers, not modelled)."""
    if strategy in MEGATRON_STRATEGIES:
        return ""
    if strategy == "fsdp-full":
        if pp > 1 or ep > 1:
            return "Megatron's --use-torch-fsdp2 runs without pipeline and expert parallelism"
        return ""
    return f"Megatron-LM does not run {strategy} (its data parallelism is ddp, zero1 or fsdp-full)"
