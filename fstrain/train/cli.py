"""Entry point of the reference trainer: settings first (fast, torch-free), then training."""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

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
        _end(exc.exit_code)
    if summary is not None:
        first, last = summary["first_loss"], summary["last_loss"]
        if first is not None:
            sys.stdout.write(f"[fstrain.train] done: loss {first:.4f} -> {last:.4f} over "
                             f"{len(summary['losses'])} steps\n")
        else:
            sys.stdout.write("[fstrain.train] done: nothing to do, the checkpoint is at step "
                             f"{summary['start_step']}\n")
    _end(0)


def _end(code: int) -> NoReturn:
    """Exit (see fstrain.train.runtime.end_process); torch is only loaded once training began."""
    if "fstrain.train.runtime" in sys.modules:
        from fstrain.train.runtime import end_process

        end_process(code)
    sys.exit(code)


def run(argv: list[str] | None) -> dict[str, Any] | None:
    """Train; returns the summary on rank 0, None elsewhere."""
    from fstrain.train.runtime_env import world_size_from_env
    from fstrain.train.settings import load_settings

    # Every file is read and checked before torch is imported: a bad input costs milliseconds.
    settings = load_settings(argv, world_size_from_env())
    from fstrain.train.loop import train
    from fstrain.train.runtime import init_runtime, shutdown_distributed

    runtime = init_runtime()
    finished = False
    try:
        summary = train(settings, runtime)
        finished = True
    finally:
        shutdown_distributed(finished)
    return summary if runtime.is_main else None
