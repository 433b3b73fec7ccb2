"""Grouped matrix multiply for the mixture-of-experts block: rows of ``x`` sorted by group, each
group's rows times its own matrix.

bf16 runs ``torch._grouped_mm`` (torchtitan's MoE kernel; CPU and CUDA). That op only takes bf16
under ``FakeTensorMode`` (its meta function checks the CUDA kernel's dtypes), so other dtypes run
this module's ``fstrain::grouped_mm``, a custom op with the same signature and the same saved
tensors for backward (``x``, the weights, the offsets): a loop over the groups on real tensors,
a shape-only fake implementation for the memory trace.
"""

from __future__ import annotations

import torch
from torch import Tensor


def grouped_mm(x: Tensor, weights: Tensor, offsets: Tensor) -> Tensor:
    """``x`` (rows, in) with rows of group g in ``offsets[g-1]:offsets[g]``, ``weights`` (groups,
    in, out), ``offsets`` (groups,) int32 cumulative ends -> (rows, out)."""
    if x.dtype == torch.bfloat16:
        return torch._grouped_mm(x, weights, offs=offsets)
    out: Tensor = _grouped_mm(x, weights, offsets)
    return out


def _slices(offsets: Tensor) -> list[tuple[int, int]]:
    ends = [int(e) for e in offsets.tolist()]
    return list(zip([0, *ends[:-1]], ends, strict=True))


@torch.library.custom_op("fstrain::grouped_mm", mutates_args=())
def _grouped_mm(x: Tensor, weights: Tensor, offsets: Tensor) -> Tensor:
    parts = [x[start:end] @ weights[g] for g, (start, end) in enumerate(_slices(offsets))]
    return torch.cat(parts) if parts else x.new_empty(0, weights.shape[-1])


@_grouped_mm.register_fake
def _(x: Tensor, weights: Tensor, offsets: Tensor) -> Tensor:
    return x.new_empty(x.shape[0], weights.shape[-1])


@torch.library.custom_op("fstrain::grouped_mm_weight_grad", mutates_args=())
def _weight_grad(x: Tensor, grad: Tensor, offsets: Tensor) -> Tensor:
    parts = [x[start:end].T @ grad[start:end] for start, end in _slices(offsets)]
    return torch.stack(parts)


@_weight_grad.register_fake
def _(x: Tensor, grad: Tensor, offsets: Tensor) -> Tensor:
    return x.new_empty(offsets.shape[0], x.shape[1], grad.shape[1])


def _setup(ctx: torch.autograd.function.FunctionCtx, inputs: tuple[Tensor, ...], output: Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor, Tensor, None]:
    x, weights, offsets = ctx.saved_tensors  # type: ignore[attr-defined]
    grad_x = _grouped_mm(grad, weights.transpose(-2, -1), offsets)
    return grad_x, _weight_grad(x, grad, offsets), None


_grouped_mm.register_autograd(_backward, setup_context=_setup)
