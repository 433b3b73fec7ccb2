"""What ``torch.autocast`` (``--precision amp-bf16`` / ``amp-fp16``) costs a micro-batch in casts.

Autocast keeps the parameters in fp32 and casts the inputs of each op on its lower-precision
list (``linear``, ``matmul``...) per call: aten/src/ATen/autocast_mode.h ``cached_cast``. Two kinds
of cast are HBM traffic that training in the compute dtype does not move (the step-time term
``autocast_s``):

- **weights**: every matmul weight (and its bias, ``addmm``'s input) is read in fp32 and written
  in the compute dtype once per autocast region: the cache keeps the cast of a leaf that requires
  grad only until the outermost region exits (``torch.autocast.__exit__`` calls
  ``torch.clear_autocast_cache()``), and a training loop enters one region per micro-batch
  (transformers' Trainer ``autocast_smart_context_manager`` around ``compute_loss``), a
  recomputed block a fresh one (torch/utils/checkpoint.py re-enters autocast). Backward turns
  each weight's compute-dtype gradient back into fp32 (the cast's ``ToCopyBackward``): ``a + 4``
  bytes per parameter, per micro-batch.
- **activations**: only leaves are cached, so every linear casts its input itself; the input of
  a block's first linears is a norm's output, fp32 under autocast (``layer_norm`` is on the fp32
  list, and an RMSNorm of the fp32 residual computes in fp32), so q, k and v (one cast with a
  packed projection) and the FFN's input projections (gate and up, or fc1) each read ``4`` and
  write ``a`` bytes per hidden element, and backward casts each gradient back (``a + 4``).
  The other linears' inputs (the attention output, the activation) are already in the compute
  dtype.

The residual stream, the norms and eager attention's softmax in fp32 are elementwise and attention
traffic (:func:`fstrain.core.plan.kernels.elementwise_bytes_per_token` with ``residual=4``,
:func:`fstrain.core.plan.kernelcost.eager_score_bytes`); they are not casts.
"""

from __future__ import annotations

from dataclasses import dataclass

from fstrain.core.plan.kernels import FusedBlock
from fstrain.core.plan.schema import ModelSpec

FP32 = 4


@dataclass(frozen=True)
class CastTraffic:
    """HBM bytes and kernels of autocast's casts for one micro-batch of one block on one rank."""

    bytes: float
    kernels: float  # issued by autocast's C++ wrapper (the dispatcher), not by Python


def cast_inputs(model: ModelSpec, fused: FusedBlock) -> int:
    """Linears of one block whose input is a norm's fp32 output, each casting it (see the module
    doc): q, k and v (one with ``packed_qkv``) and the FFN's input projections (two when gated)."""
    return (1 if fused.packed_qkv else 3) + (2 if model.gated else 1)


def weight_casts(weight_elements: float, tensors: int, a: int, forward_passes: float) -> CastTraffic:
    """Casting ``weight_elements`` fp32 parameters (``tensors`` tensors: weights and biases) to
    ``a`` bytes in each of ``forward_passes`` forwards (1, plus the recomputed share), and their
    gradients back to fp32 once in backward."""
    per_element = forward_passes * (FP32 + a) + (a + FP32)
    return CastTraffic(weight_elements * per_element, tensors * (forward_passes + 1))


def activation_casts(model: ModelSpec, fused: FusedBlock, tokens: float, a: int, forward_passes: float,
                     split: int = 1) -> CastTraffic:
    """Casting the norm outputs that feed a block's first linears for ``tokens`` tokens (``split``:
    how many ranks share a hidden-wide tensor, tensor parallel with sequence parallelism), in each
    forward and back in backward."""
    inputs = cast_inputs(model, fused)
    elements = inputs * tokens * model.hidden_size / split
    return CastTraffic(elements * (forward_passes + 1) * (FP32 + a), inputs * (forward_passes + 1))
