"""A DeepSpeed ZeRO checkpoint resumed at another data-parallel world size, through DeepSpeed's
universal checkpoint.

A ZeRO checkpoint holds one optimizer file per data-parallel rank (each rank's flat partition of
the fp32 weights and Adam's moments), so it reloads at the world size that wrote it only.
DeepSpeed's ``ds_to_universal`` rewrites it as one folder per parameter with the whole tensor of
each state (``zero/<name>/fp32.pt``, ``exp_avg.pt``, ``exp_avg_sq.pt``), and an engine built with
``"checkpoint": {"load_universal": true}`` cuts its own partition out of those at any world
size. The trainer converts on rank 0 into ``<checkpoint-dir>/universal/<tag>`` (staged in
``<tag>.tmp`` and renamed when complete, so a conversion cut short is made again and a finished
one is reused by the next resume), while the other ranks wait.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from fstrain.errors import ConfigError
from fstrain.train.steps import read_latest

UNIVERSAL = "universal"  # the folder of converted checkpoints, inside the checkpoint directory
LATEST_UNIVERSAL = "latest_universal"  # DeepSpeed's name for the newest converted tag
# ds_to_universal carries Adam's state only (exp_avg, exp_avg_sq next to the fp32 weights).
ADAM_TYPES = ("adam", "adamw")
# One file per data-parallel rank in a ZeRO checkpoint (DeepSpeed's own names).
_ZERO_FILE_RE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")


@dataclass(frozen=True)
class Reshard:
    """A checkpoint to load from its universal conversion: where, and who wrote it."""

    tag: str
    load_dir: Path  # holds <tag>/ converted; DeepSpeed's load_checkpoint(load_dir, tag)
    written_by: int


def checkpoint_world(tag_dir: Path) -> int | None:
    """The data-parallel ranks that wrote a ZeRO checkpoint (its per-rank optimizer files)."""
    if not tag_dir.is_dir():
        return None
    ranks = {int(m.group(1)) for p in tag_dir.iterdir() if (m := _ZERO_FILE_RE.match(p.name))}
    return len(ranks) or None


def plan_reshard(directory: Path, world_size: int, config: Mapping[str, Any]) -> Reshard | None:
    """The reshard a resume at ``world_size`` with the DeepSpeed ``config`` needs (None: the
    newest checkpoint loads as it is). What the conversion cannot carry is refused in one line."""
    tag = read_latest(directory)
    written_by = checkpoint_world(directory / tag) if tag else None
    if tag is None or written_by is None or written_by == world_size:
        return None
    why = universal_obstacle(config)
    if why:
        raise ConfigError(f"{tag} was written by {written_by} ranks and this run has {world_size}, "
                          f"and DeepSpeed's universal checkpoint cannot reshard it: {why}",
                          f"resume with {written_by} ranks, or train with AdamW (ZeRO 1-3, CPU offload) or the "
                          "fsdp backend, whose checkpoints reshard", str(directory))
    return Reshard(tag, directory / UNIVERSAL, written_by)


def universal_obstacle(config: Mapping[str, Any]) -> str:
    """Why a ZeRO checkpoint of this config does not convert to a universal one ('' if it does)."""
    optimizer = config.get("optimizer")
    if not isinstance(optimizer, Mapping):
        return ("the optimizer is the trainer's own (adam8bit, adafactor), whose state ds_to_universal does not "
                "know")
    kind = str(optimizer.get("type", ""))
    if kind.lower() not in ADAM_TYPES:
        return f"ds_to_universal carries Adam's state only (exp_avg, exp_avg_sq), and the optimizer is {kind}"
    zero = config.get("zero_optimization", {})
    if str(zero.get("offload_optimizer", {}).get("device", "none")).lower() == "nvme":
        return "the optimizer state is offloaded to NVMe, in per-rank swap files that ds_to_universal does not read"
    return ""


def convert_once(directory: Path, reshard: Reshard, is_main: bool) -> bool:
    """Convert the checkpoint on rank 0 unless a finished conversion of its tag is there; every
    rank returns once it is (True: made now, False: reused). A failure ends every rank in one line."""
    final = reshard.load_dir / reshard.tag
    made, error = False, None
    if is_main and not final.is_dir():
        try:
            _convert(directory / reshard.tag, final)
            made = True
        except ConfigError as exc:
            error = exc
    failed = torch.tensor([0.0 if error is None else 1.0])
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)  # also the barrier the other ranks wait on
    if error is not None:
        raise error
    if failed.item():
        raise ConfigError(f"rank 0 could not convert {reshard.tag} to a universal checkpoint", "see rank 0's error",
                          str(directory))
    return made


def _convert(source: Path, final: Path) -> None:
    """ds_to_universal in a process of its own: its progress bars and worker pool stay out of the
    trainer's, and a crash in it is one line here."""
    staging = final.with_name(final.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    workers = str(min(4, os.cpu_count() or 1))
    command = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(source),
               "--output_folder", str(staging), "--num_extract_workers", workers, "--num_merge_workers", workers,
               "--inject_missing_state"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        last = next((line for line in reversed(result.stderr.splitlines()) if line.strip()), "no output")
        raise ConfigError(f"DeepSpeed's ds_to_universal could not convert it (exit {result.returncode}): "
                          f"{last.strip()}", "resume with the world size that wrote it, or run "
                          f"`python {' '.join(command[1:])}` to see why", str(source))
    os.rename(staging, final)
    # ds_to_universal names the staging folder in latest_universal; name the finished one.
    (final.parent / LATEST_UNIVERSAL).write_text(final.name + "\n")
