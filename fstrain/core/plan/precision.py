"""Precision modes: which dtype each part of training is held and computed in.

A mode fixes five things the memory and time models read (bytes per element):

=========  =======  =====  ====  ===========  =========  =====================================
mode       compute  param  grad  fp32 master  Adam m, v  where it is run
=========  =======  =====  ====  ===========  =========  =====================================
bf16       bf16     2      2     4            fp32       DeepSpeed bf16, FSDP2 MixedPrecisionPolicy
fp16       fp16     2      2     4            fp32       DeepSpeed fp16 (loss scaling)
fp32       fp32     4      4     none         fp32       plain fp32 training
bf16-pure  bf16     2      2     none         bf16       torchtune: model and optimizer in bf16
amp-bf16   bf16     4      4     none         fp32       torch.autocast(bfloat16), fp32 weights
amp-fp16   fp16     4      4     none         fp32       torch.autocast(float16) + GradScaler
=========  =======  =====  ====  ===========  =========  =====================================

Sources:

- ``bf16-pure``: torchtune's full-finetune recipes build the model in ``dtype: bf16`` and hand
  its parameters to ``torch.optim.AdamW``, whose ``exp_avg``/``exp_avg_sq`` are created with
  ``torch.zeros_like(p)`` (torch/optim/adam.py ``_init_group``): the states take the parameter's
  dtype, so AdamW keeps 2 + 2 bytes (SGD's momentum 2) and there is no fp32 copy anywhere.
- ``amp-*``: ``torch.autocast`` leaves the parameters, their gradients and the optimizer in
  fp32 and casts the inputs of the ops on its lower-precision list (matmuls, SDPA) per call;
  ops on its fp32 list (``layer_norm``, ``softmax``, ``log_softmax``, ``cross_entropy``...) run
  in fp32 (the "CUDA Ops that can autocast to float32" list of torch.amp's documentation).
  It caches the cast of a leaf tensor that requires grad (a weight) until the outermost
  autocast region exits (aten/src/ATen/autocast_mode.h ``cached_cast``, ``clear_cache``).
  ``torch.amp.GradScaler`` (fp16) keeps only a scale and a growth tracker, no per-parameter state.

Not every framework runs every mode (:func:`check_strategy`): DeepSpeed's ZeRO optimizers keep a
master copy of their own (fp32, or bf16 with ``bf16_master_weights_and_grads`` and
``bf16_optimizer_states``, a second bf16 copy this model does not count), so ``bf16-pure`` is
planned for DDP and FSDP only. DeepSpeed runs ``amp-*`` through its ``torch_autocast`` section, but
gives a loss scaler only to ZeRO stage 0 there, so ``amp-fp16`` under ZeRO-1/2/3 is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from fstrain.errors import InputError


@dataclass(frozen=True)
class PrecisionMode:
    """Bytes per element of each training tensor under one precision mode."""

    name: str
    compute: str  # the dtype of matmuls: the GPU peak that applies ("bf16", "fp16", "fp32")
    param_bytes: int  # the parameters the model holds (and DDP / ZeRO replicate or shard)
    grad_bytes: int  # their gradients: what a data-parallel reduction moves
    master_bytes: int  # a separate fp32 copy the optimizer updates (0: it updates the params)
    state_bytes: int  # one element of an optimizer state (Adam's m or v; SGD's momentum)
    autocast: bool  # torch.autocast casts matmul inputs per call (fp32 weights, fp32 norms)
    loss_scaling: bool  # fp16: a (dynamic) loss scaler

    @property
    def compute_bytes(self) -> int:
        """Bytes of an activation a matmul saves: the compute dtype's."""
        return 4 if self.compute == "fp32" else 2


MODES = {
    "bf16": PrecisionMode("bf16", "bf16", 2, 2, 4, 4, False, False),
    "fp16": PrecisionMode("fp16", "fp16", 2, 2, 4, 4, False, True),
    "fp32": PrecisionMode("fp32", "fp32", 4, 4, 0, 4, False, False),
    "bf16-pure": PrecisionMode("bf16-pure", "bf16", 2, 2, 0, 2, False, False),
    "amp-bf16": PrecisionMode("amp-bf16", "bf16", 4, 4, 0, 4, True, False),
    "amp-fp16": PrecisionMode("amp-fp16", "fp16", 4, 4, 0, 4, True, True),
}
PRECISIONS = tuple(MODES)

# Where each mode is refused: (why, what to use instead). The strategies are schema.STRATEGIES.
_PURE_UNDER_ZERO = (
    "DeepSpeed's ZeRO optimizers keep a master copy beside bf16 parameters",
    "use --strategy ddp or fsdp-full/fsdp-grad-op/fsdp-hybrid (torchtune's pure bf16), or --precision bf16 "
    "for DeepSpeed",
)
_AMP_FP16_UNDER_ZERO = (
    "DeepSpeed's torch_autocast has no loss scaler with ZeRO (engine.py gives its GradScaler to stage 0 only), "
    "and fp16 gradients underflow without one",
    "use --precision fp16 (DeepSpeed's fp16 optimizer scales the loss), amp-bf16, or --strategy ddp or fsdp-*",
)
_REFUSED = {
    **{("bf16-pure", zero): _PURE_UNDER_ZERO for zero in ("zero1", "zero2", "zero3")},
    **{("amp-fp16", zero): _AMP_FP16_UNDER_ZERO for zero in ("zero1", "zero2", "zero3")},
}


def mode(precision: str) -> PrecisionMode:
    """The mode named ``precision`` (one of :data:`PRECISIONS`)."""
    try:
        return MODES[precision]
    except KeyError:
        raise InputError(f"unknown precision {precision!r}", f"use one of {', '.join(PRECISIONS)}") from None


def compute_dtype(precision: str) -> str:
    """The dtype whose tensor-core peak applies: amp and bf16-pure compute like bf16/fp16."""
    return mode(precision).compute


def optimizer_state_bytes(precision: str, optimizer: str, fp32_state_bytes: int) -> int:
    """Bytes per parameter of the optimizer's states: ``fp32_state_bytes`` (adamw 8, sgd 4) in
    the state dtype; 8-bit Adam's quantised states and Adafactor's (fp32 after ``grad.float()``) do
    not follow the parameter dtype."""
    if optimizer in ("adam8bit", "adafactor"):
        return fp32_state_bytes
    return fp32_state_bytes * mode(precision).state_bytes // 4


def strategy_runs(precision: str, strategy: str) -> bool:
    """Whether :func:`check_strategy` accepts the pair."""
    return (precision, strategy) not in _REFUSED


def check_strategy(precision: str, strategy: str, where: str = "--precision") -> None:
    """Refuse a mode the strategy's framework does not run (or the planner does not model)."""
    refused = _REFUSED.get((precision, strategy))
    if refused:
        reason, hint = refused
        raise InputError(f"precision {precision} with strategy {strategy}: {reason}", hint, where)
