"""The activation checkpointing policies of :mod:`fstrain.core.plan.acpolicy`, in torch.

Whole-block policies (``full``, ``every-k:N``) and Megatron's attention-core recompute run
through a checkpoint function the backend picks (torch's non-reentrant checkpoint, or
DeepSpeed's). Op-level selective AC (``selective-op``) is always torch's
``create_selective_checkpoint_contexts``, with torchtitan's policy
(torchtitan/distributed/activation_checkpoint.py): save the attention kernels' outputs, the
reduce-scatters and ``max``, and every other matmul; recompute the rest. The matmul count
restarts for each checkpointed block (a new context per call) and is kept apart for the
forward and the recompute, so both pass the same ops through the same decisions. A mixture of
experts' router matmul (hidden x experts) is always recomputed and not counted, torchtitan's
``per_op_sac_force_recompute_mm_shapes_by_fqns = ["moe.router.gate"]``; the experts' grouped
matmuls (``aten._grouped_mm``) are not in the save list there either, so they are recomputed.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts


def _existing(namespace: Any, names: tuple[str, ...]) -> set[Any]:
    """The ``.default`` overloads of the ops this torch build has (kernels vary by version)."""
    return {getattr(namespace, name).default for name in names if hasattr(namespace, name)}


# fstrain counts addmm (a linear with a bias) as a matmul too: torchtitan's models have no
# biases, and without it GPT-2 layouts would save none of their projections.
MATMUL_OPS = _existing(torch.ops.aten, ("mm", "addmm"))
SAVE_OPS = (
    MATMUL_OPS
    | _existing(
        torch.ops.aten,
        (
            "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_cudnn_attention",
            "_scaled_dot_product_fused_attention_overrideable",
            "_scaled_dot_product_flash_attention_for_cpu",  # the CPU kernel (stores the log-sum-exp too)
            "max",  # float8 scales come from an absolute maximum
        ),
    )
    | _existing(torch.ops._c10d_functional, ("reduce_scatter_tensor",))
)


def _policy(
    counts: dict[str, int], recompute_shapes: frozenset[tuple[int, ...]] = frozenset()
) -> Callable[..., CheckpointPolicy]:
    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func in MATMUL_OPS and recompute_shapes and tuple(args[-1].shape) in recompute_shapes:
            return CheckpointPolicy.PREFER_RECOMPUTE  # (in, out) of a weight forced to recompute
        if func in MATMUL_OPS:
            mode = "recompute" if ctx.is_recompute else "forward"
            counts[mode] += 1
            if counts[mode] % 2 == 0:  # every second matmul is recomputed
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def selective_op_context(recompute_shapes: frozenset[tuple[int, ...]] = frozenset()) -> Any:
    """A fresh (forward, recompute) context pair for one checkpointed call."""
    return create_selective_checkpoint_contexts(_policy(defaultdict(int), recompute_shapes))


def selective_op_checkpoint(
    function: Callable[..., Any], *args: Any, recompute_shapes: frozenset[tuple[int, ...]] = frozenset()
) -> Any:
    """Run ``function`` under torchtitan's op-level selective activation checkpointing; matmuls
    whose second operand has a shape in ``recompute_shapes`` (a transposed weight: (in, out))
    are always recomputed and not counted."""
    return checkpoint(
        function, *args, use_reentrant=False, context_fn=functools.partial(selective_op_context, recompute_shapes)
    )  # a partial of a module-level function, not a lambda: torch.compile (dynamo) can trace only that


def torch_checkpoint(function: Callable[..., Any], *args: Any) -> Any:
    """torch's non-reentrant activation checkpointing (what the FSDP backend uses)."""
    return checkpoint(function, *args, use_reentrant=False)
