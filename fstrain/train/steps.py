"""Pieces both backends share: the loss and the checkpoint folder layout."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from fstrain.errors import ConfigError

LATEST = "latest"  # DeepSpeed's own name for the file holding the newest tag


IGNORE_INDEX = -100  # F.cross_entropy's default: a label that predicts nothing


def lm_loss(output: torch.Tensor | list[torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, computed in fp32 whatever the compute dtype.

    ``output`` is the model's: the logits (the plan's ``--loss full``: one fp32 copy of them), or
    a list of per-chunk logits (``--loss chunked:N``: torchtune's ``CEWithChunkedOutputLoss``, one
    chunk upcast at a time). Their memory is :func:`fstrain.core.plan.losses.loss_peaks`.
    """
    if isinstance(output, list):
        return chunked_lm_loss(output, tokens)
    vocab = output.shape[-1]
    return F.cross_entropy(output[:, :-1].float().reshape(-1, vocab), tokens[:, 1:].reshape(-1))


def chunked_lm_loss(chunks: list[torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    """The mean cross entropy over chunks of tokens, each chunk's logits upcast on its own (as
    torchtune's ``CEWithChunkedOutputLoss``); the last position has no next token, so its label is
    ignored, and the chunks split the labels as :meth:`GPT.forward` split the tokens."""
    labels = F.pad(tokens[:, 1:], (0, 1), value=IGNORE_INDEX)
    total = torch.zeros((), dtype=torch.float32, device=tokens.device)
    for logits, target in zip(chunks, labels.tensor_split(len(chunks), dim=1), strict=True):
        flat = logits.reshape(-1, logits.shape[-1]).float()
        total = total + F.cross_entropy(flat, target.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum")
    return total / (labels != IGNORE_INDEX).sum()


def step_tag(step: int) -> str:
    return f"step_{step:07d}"


def write_latest(directory: Path, tag: str) -> None:
    # Replace atomically: a crash mid-write must not leave a torn pointer to the checkpoint.
    tmp = directory / f".{LATEST}.tmp"
    tmp.write_text(tag + "\n")
    os.replace(tmp, directory / LATEST)


def save_staged(directory: Path, tag: str, is_main: bool, write: Callable[[Path], None]) -> None:
    """Every rank ``write``s its files into ``directory/<tag>.tmp``; once all have, rank 0 renames
    it to ``<tag>`` and points ``latest`` at it: a rank lost mid-save never leaves ``latest``
    naming a torn checkpoint. For several nodes ``directory`` must be shared storage."""
    staging = directory / f"{tag}.tmp"
    if is_main and staging.exists():
        shutil.rmtree(staging)
    dist.barrier()
    write(staging)
    dist.barrier()  # every rank's files are written
    if is_main:
        final = directory / tag
        if final.exists():  # the same step saved again by a resumed run
            shutil.rmtree(final)
        os.rename(staging, final)
        write_latest(directory, tag)
    dist.barrier()


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
