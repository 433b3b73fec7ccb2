"""Activation checkpointing policies: one spelling for the planner, the renderers and the trainer.

``none``
    Every block keeps what its backward needs.
``selective-op``
    torchtitan's op-level selective AC (``activation_checkpoint.mode = "selective"``,
    ``selective_ac_option = "op"``; torchtitan/distributed/activation_checkpoint.py): each block
    runs under ``torch.utils.checkpoint`` with ``create_selective_checkpoint_contexts``; the
    outputs of the attention kernels (SDPA flash / efficient / cuDNN) and of every other matrix
    multiply (the 1st, 3rd, 5th ``aten.mm`` of the block's forward) are saved, everything else
    is recomputed in backward. fstrain counts ``aten.addmm`` (a biased linear) as a matmul too,
    so GPT-2 layouts alternate the same way; torchtitan's models have no biases.
``every-k:N``
    torchtitan's layer-level selective AC (``selective_ac_option = "N"``): every N-th block
    (blocks N, 2N, ... counting from 1) is checkpointed whole, the others keep everything.
    ``every-k:1`` is ``full``.
``full``
    Every block is checkpointed whole: only its input is kept; its forward runs again in backward.
``megatron-selective``
    Megatron-LM's ``--recompute-granularity selective`` (Korthikanti et al. 2022): only the
    attention core (softmax(QK^T)V) is recomputed, whatever its kernel (Megatron-LM@d98e8a6
    megatron/core/transformer/attention.py L392-395, L1555-1556). With FlashAttention this stores
    what ``none`` stores less the kernel's log-sum-exp (it keeps no s x s matrix) and still runs
    the attention forward again, so the planner only searches it without.
    ``selective``, this option's name before fstrain knew the others, is read as an alias.
"""

from __future__ import annotations

from fstrain.errors import InputError

AC_NAMES = ("none", "selective-op", "every-k:N", "full", "megatron-selective")
# Searched when --ac is not pinned (megatron-selective only without FlashAttention).
AC_SEARCHED = ("none", "selective-op", "full")
AC_ALIASES = {"selective": "megatron-selective", "op": "selective-op", "every-k:1": "full"}
_EVERY_K = "every-k:"


def parse_ac(value: object, where: str) -> str:
    """The canonical policy name for ``value``, or one clear error naming ``where``."""
    text = str(value).strip().lower() if isinstance(value, str) else ""
    text = AC_ALIASES.get(text, text)
    if text.startswith(_EVERY_K):
        digits = text[len(_EVERY_K) :]
        if not digits.isdigit() or int(digits) < 1:
            raise InputError(
                f"activation checkpointing {value!r}: N must be a positive integer",
                "write every-k:2 to checkpoint every second block",
                where,
            )
        n = int(digits)
        return "full" if n == 1 else f"{_EVERY_K}{n}"
    if text in AC_NAMES:
        return text
    raise InputError(
        f"activation checkpointing {value!r} is not known",
        f"use one of {', '.join(AC_NAMES)} (N a positive integer); `selective` means megatron-selective",
        where,
    )


def every_k(ac: str) -> int:
    """N of ``every-k:N``; 1 for ``full``; 0 for policies that checkpoint no whole block."""
    if ac == "full":
        return 1
    if ac.startswith(_EVERY_K):
        return int(ac[len(_EVERY_K) :])
    return 0


def block_is_checkpointed(ac: str, index: int) -> bool:
    """Whether block ``index`` (0-based) is checkpointed whole (full, or every-k's N-th blocks)."""
    k = every_k(ac)
    return k > 0 and (index + 1) % k == 0


def checkpointed_blocks(ac: str, num_layers: int) -> int:
    """How many of ``num_layers`` blocks are checkpointed whole."""
    k = every_k(ac)
    return num_layers // k if k else 0


def recomputes(ac: str) -> bool:
    """Whether the policy runs any part of the forward again in backward."""
    return ac != "none"
