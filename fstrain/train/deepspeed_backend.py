"""DeepSpeed from the rendered ``ds_config.json``: ``deepspeed.initialize`` builds the optimizer,
scheduler, ZeRO partitioning and loss scaling from the file; checkpoints are DeepSpeed's own,
resumed at another world size through its universal checkpoint (fstrain/train/ds_universal.py)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from fstrain import __version__
from fstrain.core.formats import check_format, stamped
from fstrain.core.render.options import TrainingOptions
from fstrain.train.checkpointing import torch_checkpoint
from fstrain.train.ds_universal import Reshard, convert_once, plan_reshard
from fstrain.train.model import GPT, CheckpointFn, compiled_blocks
from fstrain.train.runtime import Runtime
from fstrain.train.settings import TrainSettings
from fstrain.train.steps import adamw8bit, lm_loss, save_staged, step_tag


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
        self.reshard: Reshard | None = None
        if settings.resume and settings.checkpoint_dir is not None:
            # Decided before the engine is built: load_universal is a setting of its config.
            self.reshard = plan_reshard(settings.checkpoint_dir, runtime.world_size, config)
        if self.reshard is not None:
            assert settings.checkpoint_dir is not None
            made = convert_once(settings.checkpoint_dir, self.reshard, runtime.is_main)
            config = {**config, "checkpoint": {**config.get("checkpoint", {}), "load_universal": True}}
            if runtime.is_main:
                print(f"[fstrain.train] {self.reshard.tag} was written by {self.reshard.written_by} ranks: "
                      f"{'converted' if made else 'its conversion'} to a universal checkpoint in "
                      f"{self.reshard.load_dir / self.reshard.tag}, resharded for {runtime.world_size}", flush=True)
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
        """Staged and renamed (fstrain.train.steps.save_staged): DeepSpeed's own ``latest`` is
        written by rank 0 as soon as its own files are, before the other ranks' are complete."""
        save_staged(directory, step_tag(step), self.runtime.is_main,
                    lambda staging: self.engine.save_checkpoint(str(staging.parent), tag=staging.name,
                                                                client_state=stamped({"step": step}, "trainer_state",
                                                                                     __version__),
                                                                save_latest=False))

    def load(self, directory: Path) -> int | None:
        if not (directory / "latest").is_file():
            return None
        if self.reshard is not None:
            path, client_state = self.engine.load_checkpoint(str(self.reshard.load_dir), tag=self.reshard.tag)
        else:
            path, client_state = self.engine.load_checkpoint(str(directory))
        if path is None:
            return None
        state: dict[str, Any] = client_state or {}
        check_format(state, "trainer_state", f"{path}: client_state")
        return int(state["step"])

