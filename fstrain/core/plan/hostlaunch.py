"""Host (CPU) time of issuing a step in eager PyTorch, and what ``torch.compile`` and CUDA graphs
take off it.

One Python thread issues every kernel of a rank. When issuing them takes longer than the GPU
runs them, the GPU waits and the step is the host's: a micro-batch costs ``max(GPU time, host
time)`` (the overlap rule of :mod:`fstrain.core.plan.blocktime`), and small models and
micro-batches are host-bound.

- **A kernel of an eager forward** costs the host ``eager_forward_op_s``, 40 us: the model's
  Python (module calls, the functional code between them), the view, reshape and metadata ops
  between kernels, which dispatch too, the dispatcher, autograd recording its node and saved
  tensors, the allocator and ``cudaLaunchKernel``. PyTorch's own measurement: eager Llama-2-7B at
  batch 1 generates 25.5 tokens/s on an A100, "heavily CPU overhead bound"
  (https://pytorch.org/blog/accelerating-generative-ai-2/, the starting point of gpt-fast): 39 ms
  a token over 32 blocks of about 30 kernels (as :mod:`fstrain.core.plan.blocktime` counts a
  Llama block) is 40 us a kernel, without autograd.
- **A backward kernel** runs from autograd's C++ engine, no Python: ``kernel_launch_s`` (4 us:
  dispatcher, allocator, ``cudaLaunchKernel``).
- A recomputed forward (activation checkpointing) is eager forward again, at the forward's rate.
- **A torch call from Python** outside the model (an optimizer's loop, FSDP's hooks) costs
  ``kernel_launch_s + python_op_s``, 12 us (PyTorch's operator benchmark puts the bare
  Python-to-dispatcher path of a tiny CUDA op at 2.3-3.4 us: pytorch/pytorch#32194).
- With these, a 4B model (Qwen3-4B's shape) under FSDP on one H200 at 256 tokens is host-bound,
  about 115 ms a step at micro-batch 1 and 2 alike; published runs of a 4B model there took 128
  and 141 ms (a flat 4 us a kernel would price them 53-62 % too fast).
- **torch.compile**: Inductor's wrapper calls its fused kernels directly, without the
  dispatcher's per-op Python and autograd bookkeeping: every kernel at ``kernel_launch_s``, and
  fewer kernels (:func:`fstrain.core.plan.blocktime._elementwise_kernels`).
- **CUDA graphs** (``cuda_graphs``, with ``--compile``: ``mode="reduce-overhead"``): each compiled
  region replays as one graph launch: one launch per block and pass.
- **FSDP / ZeRO-3 units**: each unit's all-gather (forward, and again in backward) and
  reduce-scatter are ops of the same thread: FSDP2's ``foreach_all_gather`` (copy-in, the
  all-gather, then ``foreach_all_gather_copy_out``'s split copy: 3 kernels) and
  ``foreach_reduce`` (copy-in by ``chunk_cat``, pre-divide, reduce-scatter, post-divide, the fp32
  view into the sharded gradient: 5), torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py,
  issued from Python hooks: ``SHARDING_KERNELS`` torch calls a unit and micro-batch.
- **Optimizer**: torch's AdamW issues 8 kernels per parameter tensor in its per-parameter loop
  (``_single_tensor_adam``: ``mul_`` for weight decay, ``lerp_``, ``mul_``, ``addcmul_``,
  ``sqrt``, ``div``, ``add_``, ``addcdiv_``), each a Python op; its foreach form issues 8
  ``_foreach_*`` ops, each one kernel per ``FOREACH_TENSORS`` tensors (``multi_tensor_apply``'s
  tensor lists, depth 4); DeepSpeed's FusedAdam one ``multi_tensor_apply`` for all of them.
  The step's optimizer costs ``max(GPU time, host time)`` like a micro-batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fstrain.core.plan.memory import block_matmuls
from fstrain.core.plan.schema import ModelSpec

# FSDP2's kernels per unit and micro-batch: two all-gathers (forward, backward) of 3 kernels
# and one reduce-scatter of 5 (see the module doc); grad-op gathers once.
SHARDING_KERNELS = {"fsdp-full": 2 * 3 + 5, "fsdp-hybrid": 2 * 3 + 5 + 1, "zero3": 2 * 3 + 5, "fsdp-grad-op": 3 + 5}
ADAMW_KERNELS_PER_TENSOR = 8
FOREACH_TENSORS = 36  # multi_tensor_apply's depth-4 tensor list (csrc multi_tensor_apply.cuh: depth_to_max_tensors)


@dataclass(frozen=True)
class HostCosts:
    """Seconds the host spends per kernel it issues."""

    launch_s: float  # the C++ side: dispatcher, allocator, cudaLaunchKernel (kernel_launch_s)
    python_op_s: float  # a torch call from Python on top of that (python_op_s)
    eager_forward_op_s: float  # a kernel of an eager model's forward, all included (eager_forward_op_s)
    compiled: bool = False
    cuda_graphs: bool = False

    @property
    def forward_op_s(self) -> float:
        return self.launch_s if self.compiled else self.eager_forward_op_s

    @property
    def backward_op_s(self) -> float:
        return self.launch_s


def kernels_host_s(forward_kernels: float, backward_kernels: float, costs: HostCosts, graph_launches: float) -> float:
    """Host seconds to issue a micro-batch's ``forward_kernels`` (recomputed ones included) and
    ``backward_kernels``; under CUDA graphs, ``graph_launches`` replays instead."""
    if costs.compiled and costs.cuda_graphs:
        return graph_launches * costs.launch_s
    return forward_kernels * costs.forward_op_s + backward_kernels * costs.backward_op_s


def sharding_host_s(strategy: str, units: int, costs: HostCosts) -> float:
    """Host seconds of one micro-batch's FSDP / ZeRO-3 unit collectives on a rank (0 for others)."""
    return units * SHARDING_KERNELS.get(strategy, 0) * (costs.launch_s + costs.python_op_s)


def parameter_tensors(model: ModelSpec, layers: int) -> int:
    """Parameter tensors of ``layers`` blocks plus the embedding, final norm and output layer."""
    per_block = len(block_matmuls(model)) * (2 if model.linear_bias else 1)
    per_block += model.norms_per_block * (2 if model.norm == "layernorm" else 1)
    return layers * per_block + 3


def optimizer_host_s(tensors: int, implementation: str, costs: HostCosts) -> float:
    """Host seconds of one AdamW step over ``tensors`` parameter tensors: ``loop`` (per parameter),
    ``foreach`` (torch's default on CUDA) or ``fused`` (one multi-tensor kernel, DeepSpeed's
    FusedAdam). Python issues each op."""
    op_s = costs.launch_s + costs.python_op_s
    chunks = math.ceil(tensors / FOREACH_TENSORS)
    if implementation == "loop":
        return tensors * ADAMW_KERNELS_PER_TENSOR * op_s
    if implementation == "foreach":
        return ADAMW_KERNELS_PER_TENSOR * (costs.python_op_s + chunks * costs.launch_s)
    return costs.python_op_s + chunks * costs.launch_s
