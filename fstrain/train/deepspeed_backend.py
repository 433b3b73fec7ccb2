"""DeepSpeed from the rendered ``ds_config.json``: ``deepspeed.initialize`` builds the optimizer,
scheduler, ZeRO partitioning and loss scaling from the file; checkpoints are DeepSpeed's own."""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from fstrain.core.render.options import TrainingOptions
from fstrain.errors import ConfigError
from fstrain.train.checkpointing import torch_checkpoint
from fstrain.train.model import GPT, CheckpointFn, compiled_blocks
from fstrain.train.runtime import Runtime
from fstrain.train.settings import TrainSettings
from fstrain.train.steps import adamw8bit, lm_loss, read_latest, step_tag

# One file per data-parallel rank in a ZeRO checkpoint (DeepSpeed's own names).
_ZERO_FILE_RE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")


class DeepSpeedEngine:
    def __init__(self, settings: TrainSettings, runtime: Runtime) -> None:
        import deepspeed

        # DeepSpeed 0.19 still calls the collectives torch 2.13 renamed, once per bucket; the
        # warning is not the user's to act on and would flood the log.
        warnings.filterwarnings(
            "ignore",
            message=r"`torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated",
            category=FutureWarning,
        )
        assert settings.deepspeed is not None
        config = settings.deepspeed
        self.runtime = runtime
        torch.manual_seed(settings.seed)  # the same initial weights on every rank
        # Join DeepSpeed's communication layer to the process group we created: its config
        # class reads the data-parallel world size from it.
        deepspeed.init_distributed()
        checkpoint_fn: CheckpointFn = torch_checkpoint
        if "activation_checkpointing" in config:
            # The config's activation_checkpointing section configures DeepSpeed's own
            # checkpoint function (partitioning, CPU checkpoints, profiling) for whole blocks
            # and Megatron's attention core; selective-op stays torch's (no section rendered).
            deepspeed.checkpointing.configure(None, deepspeed_config=config)
            checkpoint_fn = deepspeed.checkpointing.checkpoint
        model = GPT(settings.plan.model, settings.activation_checkpointing, checkpoint_fn, settings.loss_chunks,
                    settings.plan.knobs.fused_rmsnorm, settings.plan.knobs.compile)
        self.compiled_blocks = compiled_blocks(model)
        client_optimizer = None
        if "optimizer" not in config:
            # The renderer leaves the optimizer block out for adam8bit: DeepSpeed has none.
            client_optimizer = adamw8bit(list(model.parameters()), TrainingOptions().lr)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model,
            model_parameters=model.parameters() if client_optimizer is None else None,
            optimizer=client_optimizer,
            config=config,
        )
        self.grad_accum_steps = settings.grad_accum_steps

    def train_step(self, micro_batches: Sequence[torch.Tensor]) -> tuple[float, float]:
        lrs = self.engine.get_lr()
        lr = float(lrs[0]) if lrs else 0.0
        total = 0.0
        for tokens in micro_batches:
            tokens = tokens.to(self.engine.device)
            loss = lm_loss(self.engine(tokens), tokens)
            # DeepSpeed divides by gradient_accumulation_steps and steps the optimizer only
            # at the accumulation boundary.
            self.engine.backward(loss)
            self.engine.step()
            total += float(loss.detach())
        return total / len(micro_batches), lr

    def save(self, directory: Path, step: int) -> None:
        self.engine.save_checkpoint(str(directory), tag=step_tag(step), client_state={"step": step})

    def load(self, directory: Path) -> int | None:
        if not (directory / "latest").is_file():
            return None
        check_same_world(directory, self.runtime.world_size)
        path, client_state = self.engine.load_checkpoint(str(directory))
        if path is None:
            return None
        state: dict[str, Any] = client_state or {}
        return int(state["step"])


def checkpoint_world(tag_dir: Path) -> int | None:
    """The data-parallel ranks that wrote a ZeRO checkpoint (its per-rank optimizer files)."""
    if not tag_dir.is_dir():
        return None
    ranks = {int(m.group(1)) for p in tag_dir.iterdir() if (m := _ZERO_FILE_RE.match(p.name))}
    return len(ranks) or None


def check_same_world(directory: Path, world_size: int) -> None:
    """DeepSpeed reloads a ZeRO checkpoint at the world size that wrote it only: each rank's
    optimizer partition is a file of its own, and fstrain does not convert them (DeepSpeed's
    universal checkpoint, ds_to_universal.py, is an offline step of its own). Refused in one
    line rather than failing inside DeepSpeed."""
    tag = read_latest(directory)
    written_by = checkpoint_world(directory / tag) if tag else None
    if written_by is not None and written_by != world_size:
        raise ConfigError(f"{tag} in {directory} was written by {written_by} ranks and this run has {world_size}: "
                          "DeepSpeed's ZeRO checkpoints reload at the same world size only",
                          f"resume with {written_by} ranks, or use the fsdp backend, whose checkpoints reshard",
                          str(directory))
