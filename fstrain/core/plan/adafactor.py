"""Adafactor's memory: its states per parameter tensor and the temporaries of its update.

The optimizer is Hugging Face's ``transformers.optimization.Adafactor`` as the Trainer's
``optim="adafactor"`` builds it (``scale_parameter=False, relative_step=False``, everything else
default; transformers ``src/transformers/optimization.py`` at 005edacb, class ``Adafactor``;
Shazeer and Stern 2018, arXiv 1804.04235, sec. 3):

- ``beta1=None``: no first moment.
- A tensor of two or more dimensions (``len(grad.shape) >= 2``) keeps a *factored* second
  moment: ``exp_avg_sq_row`` of shape ``shape[:-1]`` and ``exp_avg_sq_col`` of shape
  ``shape[:-2] + shape[-1:]``, so an (out, in) matrix keeps ``out + in`` values. A 1-D tensor
  (biases, norm weights) keeps a full ``exp_avg_sq``. The states take the gradient's dtype after
  ``grad.float()``: fp32 whatever the parameters' dtype.
- ``step`` works on one parameter at a time: ``update = grad**2 + eps`` (a new tensor), then the
  factored estimate ``r_factor * c_factor`` (another, made while the first is held) or
  ``exp_avg_sq.rsqrt()``, and ``p.add_(-update)`` (``-update`` is a third, made while ``update``
  is held): at most two fp32 tensors of the parameter's size at once. A 16-bit parameter adds its
  fp32 copies ``grad.float()`` and ``p.float()``.

What the optimizer is handed decides the factoring. DeepSpeed gives a client optimizer flat 1-D
fp32 tensors: ZeRO-1/2 the rank's partition of each parameter group
(``single_partition_of_fp32_groups``, deepspeed/runtime/zero/stage_1_and_2.py), ZeRO-3
``fp32_partitioned_groups_flat`` (stage3.py), and at stage 0 its fp16/bf16 optimizers a flat fp32
master (``fp32_groups_flat``, runtime/fp16/fused_optimizer.py; ``BF16_Optimizer``). Adafactor then
keeps a full second moment, 4 bytes per parameter of the partition, and its temporaries are the
size of a whole group's partition (the Trainer's largest group holds every weight matrix: counted
as the rank's whole partition). Only where it updates the model's own tensors (stage 0 in fp32,
amp-* or bf16-pure) does it factor.

FSDP is refused: FSDP2's parameters are DTensors whose ``shape`` is the global one, and
Adafactor's factored states are plain tensors built from it (``torch.zeros(grad_shape[:-1])``),
which DTensor operations refuse to mix with the sharded gradient; FSDP1's flat parameters would
lose the factoring as DeepSpeed's do. Neither is a configuration this model can vouch for. CPU
offload is refused too: DeepSpeed's offloaded step runs its own CPU Adam.
"""

from __future__ import annotations

from math import prod

from fstrain.core.plan.precision import mode
from fstrain.errors import InputError

FP32 = 4
# Strategies and offloads Adafactor is planned for; the rest are refused (see the module docstring).
ADAFACTOR_STRATEGIES = ("ddp", "zero1", "zero2", "zero3")


def state_elements(shapes: list[tuple[int, ...]]) -> int:
    """Values of the second moment for these tensors: rows + columns of each tensor of two or more
    dimensions (``shape[:-1]`` and ``shape[:-2] + shape[-1:]``), every element of a 1-D one."""
    total = 0
    for shape in shapes:
        if len(shape) >= 2:
            total += prod(shape[:-1]) + prod(shape[:-2]) * shape[-1]
        else:
            total += prod(shape)
    return total


def factored(strategy: str, precision: str) -> bool:
    """Whether Adafactor sees the model's own tensors (factored states) rather than DeepSpeed's
    flat fp32 partitions: stage 0 (``ddp``) without a separate fp32 master copy."""
    return strategy == "ddp" and mode(precision).master_bytes == 0


def state_bytes_per_param(strategy: str, precision: str, shapes: list[tuple[int, ...]]) -> float:
    """Bytes of Adafactor's states per parameter: the factored count over the model's tensors
    (a pipeline or tensor-parallel rank is charged its share of it, in proportion to its
    parameters), or a full fp32 second moment (4) on DeepSpeed's flat partitions."""
    if not factored(strategy, precision) or not shapes:
        return float(FP32)
    return FP32 * state_elements(shapes) / sum(prod(shape) for shape in shapes)


def step_temporary_bytes(strategy: str, precision: str, largest_tensor: int, local_params: int) -> int:
    """The most Adafactor's update holds at once beyond its states: two fp32 tensors of the size
    of the tensor it updates (with 16-bit parameters, their fp32 copies of the gradient and the
    parameter too). Per parameter, the largest is ``largest_tensor``; on DeepSpeed's flat
    partitions it is the rank's whole partition, ``local_params``."""
    if not factored(strategy, precision):
        return 2 * FP32 * local_params
    copies = 2 + (2 if mode(precision).param_bytes < FP32 else 0)
    return copies * FP32 * largest_tensor


# Kernels ``Adafactor.step`` issues for one tensor, each a torch call from Python (transformers
# src/transformers/optimization.py at 005edacb; Trainer's scale_parameter=False,
# relative_step=False, beta1=None, weight_decay=0): ``_rms(p)`` (norm, divide: 2), ``grad**2 +
# eps`` (2), then factored the row and column moments (``mean``, ``mul_``, ``add_``: 3 each),
# ``_approx_sq_grad`` (row ``mean``, divide, ``rsqrt_``; column ``rsqrt``; their product: 5) and
# ``update.mul_(grad)`` (1), or on a 1-D tensor ``mul_``, ``add_``, ``rsqrt``, ``mul_`` (4);
# ``update.div_((_rms(update) / clip).clamp_(min=1.0))`` (norm, two divides, clamp, divide: 5),
# ``update.mul_(lr)`` (1) and ``p.add_(-update)`` (negate, add: 2).
FACTORED_STEP_KERNELS = 2 + 2 + 6 + 5 + 1 + 5 + 1 + 2
FULL_STEP_KERNELS = 2 + 2 + 4 + 5 + 1 + 2


def step_kernels(strategy: str, precision: str, matrices: int, vectors: int) -> int:
    """Kernels one Adafactor step issues over ``matrices`` tensors of two or more dimensions and
    ``vectors`` 1-D ones: each factored where it sees the model's tensors, else (DeepSpeed's flat
    fp32 partitions, one per parameter group) a full second moment on each of two groups."""
    if not factored(strategy, precision):
        return 2 * FULL_STEP_KERNELS
    return matrices * FACTORED_STEP_KERNELS + vectors * FULL_STEP_KERNELS


def adafactor_problem(strategy: str, offload: str) -> tuple[str, str] | None:
    """(what, hint) when Adafactor cannot be planned with ``strategy`` and ``offload``; else None."""
    if strategy not in ADAFACTOR_STRATEGIES:
        return (
            f"optimizer adafactor with strategy {strategy}: FSDP2 keeps DTensor shards whose global shapes "
            "Hugging Face's Adafactor builds plain factored states from, so its memory is not modelled",
            f"use --strategy {', '.join(ADAFACTOR_STRATEGIES)} (DeepSpeed hands it flat fp32 partitions), or "
            "--optimizer adamw",
        )
    if offload != "none":
        return (
            f"optimizer adafactor with offload {offload}: DeepSpeed's offloaded step runs its own CPU Adam",
            "use --offload none, or --optimizer adamw",
        )
    return None


def check_adafactor(optimizer: str, strategy: str, offload: str, where: str) -> None:
    """Refuse Adafactor where its memory is not modelled (see :func:`adafactor_problem`)."""
    problem = adafactor_problem(strategy, offload) if optimizer == "adafactor" else None
    if problem:
        raise InputError(problem[0], problem[1], where)
