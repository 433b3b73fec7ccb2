"""lightning.yaml read back by Lightning's own classes.

The file is loaded with the lines docs/configs.md gives a user's script (``build_strategy``
below is those lines), the strategy class it names is constructed from it, and a
``lightning.pytorch.Trainer`` is built with it; the test then asks Lightning's objects (not the
file) for sharding, offload, mixed precision, checkpointing, accumulation and devices. Lightning
would refuse ``accelerator: gpu`` on this CPU-only machine, so the Trainer is built with
``accelerator: cpu``, the one value the test changes; and as it refuses FSDPStrategy without a
GPU, an FSDP plan's strategy is checked beside the Trainer (with the precision plugin the Trainer
would give it) rather than inside it.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from fstrain.core.render import TrainingOptions
from fstrain.io.render_files import render_and_write
from tests.plans import make_plan
from tests.unit.test_render_deepspeed import DataParallelOnly

OPTIONS = TrainingOptions(lr=1e-3, warmup_steps=5, total_steps=100, gradient_clipping=0.5)


def build_strategy(config: dict[str, Any], block: type) -> Any:
    """docs/configs.md's loader: the strategy lightning.yaml names, the block class given by the script."""
    import torch
    from torch.distributed.fsdp import MixedPrecision

    module, _, name = config["strategy"]["class_path"].rpartition(".")
    kwargs = dict(config["strategy"]["init_args"])
    fsdp = config.get("fsdp")
    if fsdp:
        kwargs["auto_wrap_policy"] = {block}
        if fsdp["activation_checkpointing"]:
            kwargs["activation_checkpointing_policy"] = {block}
        if fsdp["mixed_precision"]:
            kwargs["mixed_precision"] = MixedPrecision(
                **{key: getattr(torch, dtype) for key, dtype in fsdp["mixed_precision"].items()})
        if fsdp["device_mesh"]:
            kwargs["device_mesh"] = tuple(fsdp["device_mesh"])
    return getattr(importlib.import_module(module), name)(**kwargs)


def load(tmp_path: Path, **plan_knobs: Any) -> tuple[dict[str, Any], Any, Any]:
    """Render lightning.yaml for the plan; (the file, the strategy, the Trainer) as a script builds them."""
    import lightning.pytorch as pl
    from lightning.pytorch.plugins import FSDPPrecision
    from lightning.pytorch.plugins.environments import LightningEnvironment
    from lightning.pytorch.strategies import FSDPStrategy
    from torch import nn

    plan = make_plan(**plan_knobs)
    out = tmp_path / plan.knobs.strategy
    render_and_write(plan, out, force=False, options=OPTIONS, trainers=("lightning",))
    config = yaml.safe_load((out / "lightning.yaml").read_text())
    assert config["fstrain_lightning"] == 1

    class Block(nn.Module):
        pass

    strategy = build_strategy(config, Block)
    # Lightning's Trainer refuses FSDPStrategy without CUDA, so for an FSDP plan it parses the
    # file's Trainer arguments with its CPU default strategy, and the strategy gets the precision
    # plugin the Trainer would give it (FSDPPrecision of the same precision).
    fsdp = isinstance(strategy, FSDPStrategy)
    # LightningEnvironment: the processes' ranks from the launcher's variables, as under torchrun or
    # fstrain launch (this machine has Slurm's srun, which Lightning would otherwise warn about).
    trainer = pl.Trainer(strategy="auto" if fsdp else strategy, **{**config["trainer"], "accelerator": "cpu"},
                         plugins=[LightningEnvironment()], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    if fsdp:
        strategy.precision_plugin = FSDPPrecision(trainer.precision)
    assert trainer.accumulate_grad_batches == plan.knobs.grad_accum_steps
    assert trainer.num_nodes * trainer.num_devices == plan.knobs.dp
    assert trainer.max_steps == 100
    return config, strategy, trainer


def test_fsdp_strategies_mean_the_plan(tmp_path: Path) -> None:
    import torch
    from torch.distributed.fsdp import ShardingStrategy

    config, strategy, trainer = load(tmp_path, strategy="fsdp-full", dp=4, num_nodes=2, offload="optimizer",
                                     activation_checkpointing="full")
    assert strategy.sharding_strategy == ShardingStrategy.FULL_SHARD and strategy.cpu_offload.offload_params
    mixed = strategy.mixed_precision_config
    assert (mixed.param_dtype, mixed.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert trainer.precision == "bf16-mixed" and trainer.gradient_clip_val == 0.5
    assert strategy._activation_checkpointing_kwargs  # the block class, as the policy
    assert config["batch"]["micro_batch_size"] == 4 and config["optimizer"]["lr"] == 1e-3

    _, strategy, trainer = load(tmp_path, strategy="fsdp-grad-op", dp=2, precision="fp32")
    assert strategy.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP and not strategy.cpu_offload.offload_params
    assert strategy.mixed_precision_config.param_dtype == torch.float32 and trainer.precision == "32-true"
    assert not strategy._activation_checkpointing_kwargs

    _, strategy, _ = load(tmp_path, strategy="fsdp-hybrid", dp=4, shard_group_size=2, num_nodes=2)
    assert strategy.sharding_strategy == ShardingStrategy.HYBRID_SHARD
    assert strategy.kwargs["device_mesh"] == (2, 2)


def test_deepspeed_and_ddp_strategies_mean_the_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import deepspeed.comm
    import deepspeed.runtime.config
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy

    for strategy_name, offload, stage in (("zero2", "none", 2), ("zero3", "optimizer+params", 3)):
        _, strategy, trainer = load(tmp_path, strategy=strategy_name, dp=4, num_nodes=2, offload=offload,
                                    micro_batch_size=2, grad_accum_steps=3)
        assert isinstance(strategy, DeepSpeedStrategy) and trainer.precision == "bf16-mixed"
        zero = strategy.config["zero_optimization"]
        assert zero["stage"] == stage and ("offload_param" in zero) == (offload == "optimizer+params")
        # What Lightning adds before deepspeed.initialize (DeepSpeedStrategy._format_batch_size_and_grad_accum_config
        # refuses a config that already has gradient_accumulation_steps), then DeepSpeed's own batch check.
        assert "gradient_accumulation_steps" not in strategy.config
        finished = {**strategy.config, "gradient_accumulation_steps": trainer.accumulate_grad_batches}
        monkeypatch.setattr(deepspeed.comm, "get_rank", lambda group=None: 0)
        loaded = deepspeed.runtime.config.DeepSpeedConfig(finished, mpu=DataParallelOnly(4))
        assert loaded.train_batch_size == 2 * 3 * 4 and loaded.gradient_clipping == 0.5

    _, strategy, trainer = load(tmp_path, strategy="ddp", dp=2, precision="bf16-pure")
    assert isinstance(strategy, DDPStrategy) and trainer.precision == "bf16-true"
