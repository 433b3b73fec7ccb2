"""Entry point of the reference trainer: settings first (fast, torch-free), then training."""

from __future__ import annotations

import os
import sys
from typing import Any

from fstrain.errors import FstrainError


def main(argv: list[str] | None = None) -> None:
    """Known errors print one line per rank and exit 2; FSTRAIN_DEBUG=1 shows the traceback."""
    try:
        summary = run(argv)
    except FstrainError as exc:
        if os.environ.get("FSTRAIN_DEBUG"):
            raise
        rank = os.environ.get("RANK", "0")
        sys.stderr.write(f"error: [rank {rank}] {exc.one_line()}\n")
        sys.exit(exc.exit_code)
    if summary is not None:
        first, last = summary["first_loss"], summary["last_loss"]
        if first is not None:
            sys.stdout.write(f"[fstrain.train] done: loss {first:.4f} -> {last:.4f} over "
                             f"{len(summary['losses'])} steps\n")
        else:
            sys.stdout.write("[fstrain.train] done: nothing to do, the checkpoint is at step "
                             f"{summary['start_step']}\n")


def run(argv: list[str] | None) -> dict[str, Any] | None:
    """Train; returns the summary on rank 0, None elsewhere."""
    from fstrain.train.runtime_env import world_size_from_env
    from fstrain.train.settings import load_settings

    # Every file is read and checked before torch is imported: a bad input costs milliseconds.
    settings = load_settings(argv, world_size_from_env())
    import torch.distributed as dist

    from fstrain.train.loop import train
    from fstrain.train.runtime import init_runtime

    runtime = init_runtime()
    try:
        summary = train(settings, runtime)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return summary if runtime.is_main else None
