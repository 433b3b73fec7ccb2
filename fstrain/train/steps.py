"""Pieces both backends share: the loss and the checkpoint folder layout."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F

from fstrain.errors import ConfigError

LATEST = "latest"  # DeepSpeed's own name for the file holding the newest tag


def lm_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, computed in fp32 whatever the compute dtype."""
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, vocab), tokens[:, 1:].reshape(-1))


def step_tag(step: int) -> str:
    return f"step_{step:07d}"


def write_latest(directory: Path, tag: str) -> None:
    # Replace atomically: a crash mid-write must not leave a torn pointer to the checkpoint.
    tmp = directory / f".{LATEST}.tmp"
    tmp.write_text(tag + "\n")
    os.replace(tmp, directory / LATEST)


def read_latest(directory: Path) -> str | None:
    path = directory / LATEST
    if not path.is_file():
        return None
    tag = path.read_text().strip()
    return tag or None


def adamw8bit(params: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """bitsandbytes' 8-bit AdamW (the plan's ``adam8bit``); neither torch nor DeepSpeed has one."""
    try:
        import bitsandbytes as bnb  # type: ignore[import-not-found]
    except ImportError:
        raise ConfigError(
            "optimizer adam8bit needs bitsandbytes, which is not installed",
            "pip install bitsandbytes, or plan with --optimizer adamw",
            "optimizer",
        ) from None
    optimizer: torch.optim.Optimizer = bnb.optim.AdamW8bit(params, lr=lr)
    return optimizer
