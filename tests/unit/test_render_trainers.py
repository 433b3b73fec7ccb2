"""The trainers' renderers on values: what each plan becomes, and the plans each refuses in one line.

The consumers' own parsers read these files in test_render_hftrainer.py,
test_render_torchtitan.py and test_render_lightning.py.
"""

from __future__ import annotations

import pytest

from fstrain.core.render import TrainingOptions, format_torchtitan_args, render_bundle, render_torchtitan
from fstrain.core.render.trainers import check_trainers
from fstrain.errors import ConfigError, InputError
from tests.plans import make_plan

# (trainer, plan knobs, the refusal's words, the hint's words)
REFUSED = [
    ("hf-trainer", {"strategy": "fsdp-hybrid", "dp": 4, "shard_group_size": 2}, "plan.strategy is fsdp-hybrid",
     "--strategy fsdp-full"),
    ("hf-trainer", {"tp": 2}, "plan.tp is 2", "--tp 1"),
    ("hf-trainer", {"activation_checkpointing": "selective-op"}, "whole decoder layers", "--ac full"),
    ("lightning", {"pp": 2}, "plan.pp is 2", "--trainer torchtitan"),
    ("lightning", {"strategy": "fsdp-full", "activation_checkpointing": "every-k:2"}, "whole blocks", "--ac full"),
    ("lightning", {"strategy": "fsdp-full", "precision": "bf16-pure"}, "full-precision copy", "--precision bf16"),
    ("torchtitan", {"strategy": "zero1"}, "no optimizer-only sharding", "--strategy zero2"),
    ("torchtitan", {"precision": "fp16"}, "bfloat16 or float32 only", "--precision bf16"),
    ("torchtitan", {"strategy": "fsdp-full", "precision": "amp-bf16"}, "autocasts only without sharding",
     "--precision bf16"),
    ("torchtitan", {"activation_checkpointing": "every-k:2"}, "checkpoints none, full, selective", "--ac full"),
]


@pytest.mark.parametrize(("trainer", "knobs", "message", "hint"), REFUSED)
def test_a_plan_the_trainer_cannot_run_is_refused_naming_what_to_pick(
    trainer: str, knobs: dict[str, object], message: str, hint: str
) -> None:
    knobs = {"strategy": "zero3", **knobs}
    plan = make_plan(**knobs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as caught:
        render_bundle(plan, out_dir="/render", trainers=[trainer])
    assert caught.value.where == f"--trainer {trainer}"
    assert message in caught.value.message and hint in caught.value.hint
    render_bundle(plan, out_dir="/render")  # the other files do not depend on the trainer


def test_trainer_names_are_checked_and_ordered() -> None:
    assert check_trainers(["torchtitan", "hf-trainer", "torchtitan"]) == ("hf-trainer", "torchtitan")
    with pytest.raises(InputError, match="unknown trainer 'megatron'") as caught:
        check_trainers(["megatron"])
    assert "hf-trainer, lightning, torchtitan" in caught.value.hint


def test_the_bundle_holds_each_asked_trainers_files() -> None:
    zero3 = render_bundle(make_plan("zero3"), out_dir="/render/", trainers=["hf-trainer", "lightning", "torchtitan"])
    assert zero3.hf_training_args is not None and zero3.hf_training_args["deepspeed"] == "/render/hf_ds_config.json"
    assert zero3.hf_deepspeed is not None and zero3.lightning is not None and zero3.torchtitan_args is not None
    assert {"hf_training_args.json", "hf_ds_config.json", "lightning.yaml", "torchtitan.args"} <= set(zero3.notes)
    assert "torchtitan.args" in zero3.readme and "hf_training_args.json" in zero3.readme
    fsdp = render_bundle(make_plan("fsdp-full"), out_dir="/render", trainers=["hf-trainer"])
    assert fsdp.hf_deepspeed is None and fsdp.lightning is None and fsdp.torchtitan_args is None
    assert fsdp.hf_training_args is not None and fsdp.hf_training_args["fsdp"] is True
    plain = render_bundle(make_plan("zero3"), out_dir="/render")
    assert plain.hf_training_args is None and "hf_training_args.json" not in plain.readme


def test_torchtitan_arguments_are_flags_and_the_subcommand_comes_last() -> None:
    options = TrainingOptions(total_steps=500, warmup_steps=50, min_lr_ratio=0.2)
    plan = make_plan("fsdp-grad-op", dp=2, tp=2, pp=2, grad_accum_steps=8, micro_batch_size=1,
                     activation_checkpointing="selective-op", offload="optimizer")
    args = format_torchtitan_args(render_torchtitan(plan, options).config)
    assert args[-1] == "activation_checkpoint:selective"
    assert "--training.enable_cpu_offload" in args and "--compile.no-enable" in args
    expected = {
        "--parallelism.data_parallel_shard_degree=2", "--parallelism.tensor_parallel_degree=2",
        "--parallelism.pipeline_parallel_degree=2", "--parallelism.pipeline_parallel_schedule=1F1B",
        "--parallelism.pipeline_parallel_microbatch_size=1", "--parallelism.fsdp_reshard_after_forward=never",
        # the plan's 8 micro-batches are the pipeline's microbatches of one torchtitan step
        "--training.local_batch_size=8", "--training.global_batch_size=16", "--training.steps=500",
        "--lr_scheduler.warmup_steps=50", "--lr_scheduler.decay_type=cosine", "--lr_scheduler.min_lr_factor=0.2",
    }
    assert expected <= set(args)


def test_lightning_names_the_optimizer_for_configure_optimizers_unless_deepspeed_builds_it() -> None:
    from fstrain.core.render import render_lightning

    adamw = render_lightning(make_plan("zero2")).config
    assert "optimizer" in adamw["strategy"]["init_args"]["config"] and "optimizer" not in adamw
    adam8bit = render_lightning(make_plan("zero2", optimizer="adam8bit")).config
    assert "optimizer" not in adam8bit["strategy"]["init_args"]["config"]
    assert adam8bit["optimizer"]["name"] == "adam8bit" and adam8bit["scheduler"]["warmup_steps"] == 100
    assert render_lightning(make_plan("fsdp-full")).config["optimizer"]["name"] == "adamw"
