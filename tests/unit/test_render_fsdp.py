"""The FSDP2 file and the Accelerate config: values, and Accelerate's own loader and launcher reading it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from fstrain.core.render import TrainingOptions, render_accelerate, render_fsdp
from fstrain.core.render.fsdp import fsdp_mesh
from fstrain.io.render_files import to_yaml
from tests.plans import make_plan

ALL_STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp-full", "fsdp-grad-op", "fsdp-hybrid")


@pytest.mark.parametrize(
    ("strategy", "dp", "group", "mesh", "reshard"),
    [
        ("fsdp-full", 8, 8, {"dim_names": ["shard"], "shape": [8]}, True),
        ("zero3", 8, 8, {"dim_names": ["shard"], "shape": [8]}, True),
        ("fsdp-grad-op", 8, 8, {"dim_names": ["shard"], "shape": [8]}, False),
        ("zero2", 4, 4, {"dim_names": ["shard"], "shape": [4]}, False),
        ("fsdp-hybrid", 4, 2, {"dim_names": ["replicate", "shard"], "shape": [2, 2]}, True),
        ("fsdp-hybrid", 64, 8, {"dim_names": ["replicate", "shard"], "shape": [8, 8]}, True),
        ("fsdp-hybrid", 8, 8, {"dim_names": ["shard"], "shape": [8]}, True),  # one group: plain full shard
        ("ddp", 4, 1, {"dim_names": ["replicate", "shard"], "shape": [4, 1]}, False),
    ],
)
def test_mesh_and_resharding(strategy: str, dp: int, group: int, mesh: dict[str, Any], reshard: bool) -> None:
    plan = make_plan(strategy, dp=dp, shard_group_size=group)
    config = render_fsdp(plan).config
    assert config["mesh"] == mesh == fsdp_mesh(plan)
    assert config["reshard_after_forward"] is reshard
    assert config["world_size"] == dp


@pytest.mark.parametrize(
    ("precision", "model_dtype", "param_dtype", "reduce_dtype", "autocast", "loss_scaling"),
    [
        ("bf16", "float32", "bfloat16", "float32", None, "none"),
        ("fp16", "float32", "float16", "float32", None, "dynamic"),
        ("fp32", "float32", "float32", "float32", None, "none"),
        # torchtune's pure bf16: a bf16 model, nothing cast, gradients reduced in bf16
        ("bf16-pure", "bfloat16", "bfloat16", "bfloat16", None, "none"),
        # autocast over fp32 weights: no MixedPrecisionPolicy cast
        ("amp-bf16", "float32", "float32", "float32", "bfloat16", "none"),
        ("amp-fp16", "float32", "float32", "float32", "float16", "dynamic"),
    ],
)
def test_mixed_precision_policy(
    precision: str, model_dtype: str, param_dtype: str, reduce_dtype: str, autocast: str | None, loss_scaling: str
) -> None:
    rendered = render_fsdp(make_plan("fsdp-full", precision=precision))
    config = rendered.config
    assert config["model_dtype"] == model_dtype
    assert config["mixed_precision"] == {"param_dtype": param_dtype, "reduce_dtype": reduce_dtype}
    assert config["autocast"] == autocast
    assert config["loss_scaling"] == loss_scaling
    if autocast:
        assert any(f"torch.autocast(dtype=torch.{autocast})" in note for note in rendered.notes)
    accelerate = render_accelerate(make_plan("fsdp-full", precision=precision)).config["mixed_precision"]
    assert accelerate == {"bf16": "bf16", "fp16": "fp16", "fp32": "no", "bf16-pure": "no", "amp-bf16": "bf16",
                          "amp-fp16": "fp16"}[precision]


def test_offload_wrap_batch_optimizer_and_notes() -> None:
    options = TrainingOptions(lr=2e-3, warmup_steps=5, total_steps=50, gradient_clipping=0.5, seed=7)
    rendered = render_fsdp(make_plan("fsdp-full", offload="optimizer", activation_checkpointing="megatron-selective",
                                     micro_batch_size=3, grad_accum_steps=4, dp=2), options)
    config = rendered.config
    assert config["cpu_offload"] == {"enabled": True, "pin_memory": True}
    assert config["wrap"] == {"module_classes": ["TransformerBlock"], "root": True}
    assert config["activation_checkpointing"] == "megatron-selective"
    assert config["batch"] == {"micro_batch_size": 3, "grad_accum_steps": 4, "global_batch_size": 24}
    assert config["optimizer"] == {"name": "adamw", "lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                   "weight_decay": 0.1}
    assert config["scheduler"] == {"warmup_steps": 5, "total_steps": 50, "min_lr_ratio": 0.1}
    assert (config["gradient_clipping"], config["seed"]) == (0.5, 7)
    assert any("parameters and gradients" in note for note in rendered.notes)


def test_the_trainer_class_names_exist() -> None:
    # The wrap list names classes of fstrain.train.model; a rename there must fail here.
    from fstrain.train import model

    for name in render_fsdp(make_plan("fsdp-full")).config["wrap"]["module_classes"]:
        assert isinstance(getattr(model, name), type)


# --- Accelerate: its config loader, then its launcher's mapping to the FSDP plugin ----------------


def launch_env(config_file: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[argparse.Namespace, dict[str, str]]:
    """What `accelerate launch --config_file F train.py` would set up, without starting processes."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    parser = launch_command_parser()
    args = parser.parse_args(["--config_file", str(config_file), "--main_process_port", "0", "train.py"])
    args, _, _ = _validate_launch_command(args)
    monkeypatch.setattr("accelerate.utils.launch.is_port_in_use", lambda port: False)
    return args, prepare_multi_gpu_env(args)


@pytest.mark.parametrize(
    ("strategy", "offload"),
    [(s, o) for s in ALL_STRATEGIES for o in ("none", "optimizer") if not (s == "ddp" and o != "none")],
)
def test_accelerate_loads_and_launches_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str, offload: str
) -> None:
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils import DistributedType

    plan = make_plan(strategy, dp=4, shard_group_size=1 if strategy == "ddp" else 2 if strategy == "fsdp-hybrid" else 4,
                     num_nodes=2, precision="bf16", offload=offload, activation_checkpointing="full")
    rendered = render_accelerate(plan).config
    path = tmp_path / "accelerate.yaml"
    path.write_text(to_yaml(rendered))

    loaded = load_config_from_file(str(path))  # refuses unknown top-level keys
    assert loaded.distributed_type == DistributedType.FSDP
    assert (loaded.num_processes, loaded.num_machines, loaded.mixed_precision) == (4, 2, "bf16")
    assert loaded.main_process_ip == "node1"
    # Every fsdp_config key is a flag `accelerate launch` knows (unknown ones would be dropped).
    known = set(vars(launch_command_parser().parse_args(["train.py"])))
    assert set(loaded.fsdp_config) <= known
    assert set(loaded.parallelism_config) <= known

    _, env = launch_env(path, monkeypatch)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert env["FSDP_RESHARD_AFTER_FORWARD"] == str(rendered["fsdp_config"]["fsdp_reshard_after_forward"]).lower()
    assert env["FSDP_OFFLOAD_PARAMS"] == ("true" if offload != "none" else "false")
    assert env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "TransformerBlock"
    assert env["FSDP_ACTIVATION_CHECKPOINTING"] == "true"
    mesh = fsdp_mesh(plan)["shape"]
    if len(mesh) == 2:
        assert (env["PARALLELISM_CONFIG_DP_REPLICATE_SIZE"], env["PARALLELISM_CONFIG_DP_SHARD_SIZE"]) == tuple(
            str(n) for n in mesh)
    else:
        assert "PARALLELISM_CONFIG_DP_REPLICATE_SIZE" not in env

    # The training process builds its FSDP plugin from exactly these variables.
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import CPUOffloadPolicy

    for name, value in env.items():
        if name.startswith(("FSDP_", "ACCELERATE_", "PARALLELISM_CONFIG_")):
            monkeypatch.setenv(name, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is rendered["fsdp_config"]["fsdp_reshard_after_forward"]
    assert isinstance(plugin.cpu_offload, CPUOffloadPolicy) == (offload != "none")
    assert plugin.transformer_cls_names_to_wrap == ["TransformerBlock"]
    assert plugin.activation_checkpointing is True
    assert plugin.state_dict_type.name == "SHARDED_STATE_DICT"
