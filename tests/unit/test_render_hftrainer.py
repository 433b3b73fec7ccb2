"""hf_training_args.json and hf_ds_config.json read back by transformers' own code.

``HfArgumentParser(TrainingArguments).parse_json_file`` builds the arguments as a user's script
does; for a ZeRO plan that runs ``HfTrainerDeepSpeedConfig.trainer_config_process`` (the "auto"
values filled from the arguments, mismatches collected), then the test runs
``trainer_config_finalize`` as the Trainer does once it has the model, and hands the finished
config to DeepSpeed's own ``DeepSpeedConfig``. For an FSDP plan it builds Accelerate's
``FullyShardedDataParallelPlugin`` from the arguments' ``fsdp_plugin_args``, as the Trainer does.

Three seams, each standing in for the GPU job the file is written for: bf16 is declared
available (the test machine has no GPU), the world size is the plan's data-parallel size (the
processes the job is launched with), and the device set-up is the CPU's (DeepSpeed's
``init_distributed`` needs the launched processes).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fstrain.core.plan.planfile import PlanFile
from fstrain.core.render import TrainingOptions
from fstrain.io.render_files import render_and_write
from tests.plans import make_plan
from tests.unit.test_render_deepspeed import DataParallelOnly

OPTIONS = TrainingOptions(lr=2e-4, warmup_steps=10, total_steps=200, min_lr_ratio=0.1, gradient_clipping=0.5)

PLANS = {
    "zero2": make_plan("zero2", dp=4, micro_batch_size=2, grad_accum_steps=3, activation_checkpointing="full"),
    "zero3-offload": make_plan("zero3", dp=8, num_nodes=2, micro_batch_size=1, grad_accum_steps=4,
                               offload="optimizer+params", precision="fp16", framework="hf-trainer"),
    "fsdp-full": make_plan("fsdp-full", dp=4, micro_batch_size=4, grad_accum_steps=2, offload="optimizer",
                           activation_checkpointing="full"),
    "fsdp-grad-op": make_plan("fsdp-grad-op", dp=2, activation_checkpointing="every-k:2", precision="fp32"),
    "ddp": make_plan("ddp", dp=2, precision="amp-bf16"),
}


@pytest.fixture
def hf_world(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    import torch
    import transformers.training_args
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
    monkeypatch.setattr(TrainingArguments, "_setup_devices", property(lambda self: torch.device("cpu")))
    yield TrainingArguments
    # A DeepSpeed config makes transformers' is_deepspeed_zero3_enabled() true for the process while
    # it lives; no later test in this worker may see it.
    unset_hf_deepspeed_config()


def parse(path: Path, dp: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    from transformers import HfArgumentParser, TrainingArguments

    monkeypatch.setattr(TrainingArguments, "world_size", property(lambda self: dp))
    (args,) = HfArgumentParser(TrainingArguments).parse_json_file(path)
    return args


@pytest.mark.parametrize("name", list(PLANS))
def test_transformers_reads_the_arguments_as_the_plan(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hf_world: Any
) -> None:
    plan = PLANS[name]
    knobs = plan.knobs
    render_and_write(plan, tmp_path / "out", force=False, options=OPTIONS, trainers=("hf-trainer",))
    args = parse(tmp_path / "out" / "hf_training_args.json", knobs.dp, monkeypatch)

    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (
        knobs.micro_batch_size, knobs.grad_accum_steps)
    assert (args.learning_rate, args.max_grad_norm, args.max_steps, args.warmup_steps) == (2e-4, 0.5, 200, 10)
    assert (args.lr_scheduler_type.value, args.lr_scheduler_kwargs) == ("cosine_with_min_lr", {"min_lr_rate": 0.1})
    assert (args.adam_beta1, args.adam_beta2, args.optim.value) == (0.9, 0.95, "adamw_torch_fused")
    deepspeed = knobs.strategy.startswith("zero")
    expected_bf16 = knobs.precision in ("bf16", "amp-bf16") and not (deepspeed and knobs.precision == "amp-bf16")
    assert (args.bf16, args.fp16) == (expected_bf16, knobs.precision in ("fp16", "amp-fp16"))
    checks = {"zero2": zero2, "zero3-offload": zero3_offload, "fsdp-full": fsdp_full, "fsdp-grad-op": fsdp_grad_op,
              "ddp": ddp}
    checks[name](plan, args)


def finished_deepspeed_config(plan: PlanFile, args: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The DeepSpeed config as the Trainer hands it to deepspeed.initialize, checked by DeepSpeed."""
    import deepspeed.comm
    import deepspeed.runtime.config

    hf_config = args.hf_deepspeed_config
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=plan.model.hidden_size))
    hf_config.trainer_config_finalize(args, model, num_training_steps=200)  # raises on any mismatch
    monkeypatch.setattr(deepspeed.comm, "get_rank", lambda group=None: 0)
    # DeepSpeed asserts train_batch_size == micro x accumulation x data-parallel size.
    deepspeed.runtime.config.DeepSpeedConfig(hf_config.config, mpu=DataParallelOnly(plan.knobs.dp))
    config: dict[str, Any] = hf_config.config
    return config


def zero2(plan: PlanFile, args: Any) -> None:
    assert args.activation_checkpointing is True and not args.fsdp
    config = args.hf_deepspeed_config.config
    assert config["zero_optimization"]["stage"] == 2 and not args.hf_deepspeed_config.is_offload()
    assert config["train_batch_size"] == plan.knobs.global_batch_size == 24
    assert config["optimizer"]["params"]["lr"] == 2e-4 and config["bf16"]["enabled"] is True
    assert "scheduler" not in config  # the Trainer's cosine_with_min_lr drives DeepSpeed's optimizer
    # not an hf-trainer plan: the rendered bucket sizes the plan counted, not "auto"
    assert isinstance(config["zero_optimization"]["reduce_bucket_size"], int)


def zero3_offload(plan: PlanFile, args: Any) -> None:
    hf_config = args.hf_deepspeed_config
    assert hf_config.is_zero3() and hf_config.is_offload() and args.activation_checkpointing is False
    zero = hf_config.config["zero_optimization"]
    assert zero["offload_param"]["device"] == zero["offload_optimizer"]["device"] == "cpu"
    assert hf_config.config["fp16"]["enabled"] is True and hf_config.config["fp16"]["loss_scale"] == 0
    assert zero["reduce_bucket_size"] == "auto"  # an hf-trainer plan: filled from the hidden size at finalize


def fsdp_full(plan: PlanFile, args: Any) -> None:
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import CPUOffloadPolicy

    assert args.deepspeed is None and args.activation_checkpointing is False  # FSDP's own checkpointing instead
    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert isinstance(plugin.cpu_offload, CPUOffloadPolicy) and plugin.activation_checkpointing is True
    assert plugin.state_dict_type.name == "SHARDED_STATE_DICT"


def fsdp_grad_op(plan: PlanFile, args: Any) -> None:
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import CPUOffloadPolicy

    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is False
    assert plugin.activation_checkpointing is False and not isinstance(plugin.cpu_offload, CPUOffloadPolicy)
    assert args.activation_checkpointing is True and args.activation_checkpointing_kwargs == {"every_n_layers": 2}


def ddp(plan: PlanFile, args: Any) -> None:
    assert not args.fsdp and args.deepspeed is None and args.activation_checkpointing is False


def test_the_trainer_fills_deepspeeds_auto_values_consistently(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hf_world: Any
) -> None:
    for name in ("zero2", "zero3-offload"):
        plan = PLANS[name]
        render_and_write(plan, tmp_path / name, force=False, options=OPTIONS, trainers=("hf-trainer",))
        args = parse(tmp_path / name / "hf_training_args.json", plan.knobs.dp, monkeypatch)
        config = finished_deepspeed_config(plan, args, monkeypatch)
        assert config["train_batch_size"] == plan.knobs.global_batch_size
        assert config["train_micro_batch_size_per_gpu"] == plan.knobs.micro_batch_size
        assert config["gradient_accumulation_steps"] == plan.knobs.grad_accum_steps
        assert config["gradient_clipping"] == 0.5
        assert config["optimizer"]["params"]["betas"] == [0.9, 0.95]
        assert "auto" not in str(config)
    hidden = PLANS["zero3-offload"].model.hidden_size
    assert config["zero_optimization"]["reduce_bucket_size"] == hidden * hidden
