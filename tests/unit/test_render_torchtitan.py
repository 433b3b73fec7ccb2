"""torchtitan.args parsed by torchtitan's own ConfigManager, as its CLI (`-m torchtitan.train`) does.

The file's lines follow ``--module tests.torchtitan_sections --config trainer_sections`` (the
sections of ``Trainer.Config`` the file sets, from torchtitan's own classes: torchtitan's model
packages need triton, which the CPU build of torch lacks; tests/torchtitan_sections.py says
more); what ConfigManager builds, validated by torchtitan's dataclasses, must mean the plan: the parallel degrees (and
torchtitan's ``ParallelDims`` accepting them for the plan's world size), resharding, batch and
the gradient accumulation torchtitan derives from it, activation checkpointing, precision and
CPU offload.
"""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path
from typing import Any

import pytest

from fstrain.core.plan.planfile import PlanFile
from fstrain.core.render import TrainingOptions
from fstrain.io.render_files import render_and_write
from tests.plans import make_plan

OPTIONS = TrainingOptions(warmup_steps=20, total_steps=300, min_lr_ratio=0.1, gradient_clipping=0.5, seed=7)


@pytest.fixture(scope="module")
def sections() -> None:
    """Import torchtitan's section classes ahead, with the one warning torch 2.13 gives on the way
    (torch._inductor's use of the deprecated torch.jit.script_method, reached from
    torchtitan.distributed.activation_checkpoint)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script_method` is deprecated",
                                category=DeprecationWarning)
        importlib.import_module("tests.torchtitan_sections")


def parse(plan: PlanFile, out: Path) -> Any:
    from torchtitan.config import ConfigManager

    render_and_write(plan, out, force=False, options=OPTIONS, trainers=("torchtitan",))
    args = (out / "torchtitan.args").read_text().split()
    return ConfigManager().parse_args(["--module", "tests.torchtitan_sections", "--config", "trainer_sections", *args])


def accumulation_steps(config: Any) -> int:
    """torchtitan's own arithmetic (trainer.py: global // (local x dp_replicate x dp_shard))."""
    parallelism = config.parallelism
    batch_degree = parallelism.data_parallel_replicate_degree * parallelism.data_parallel_shard_degree
    steps: int = config.training.global_batch_size // (config.training.local_batch_size * batch_degree)
    return steps


def test_the_sections_are_declared_as_in_torchtitans_trainer_config(sections: None) -> None:
    import torchtitan

    from tests.torchtitan_sections import TrainerSections

    source = (Path(torchtitan.__file__).parent / "trainer.py").read_text()
    trainer = next(node for node in ast.parse(source).body if isinstance(node, ast.ClassDef) and node.name == "Trainer")
    config = next(node for node in trainer.body if isinstance(node, ast.ClassDef) and node.name == "Config")
    declared = {node.target.id: ast.unparse(node.annotation) for node in config.body
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
    ours = {name: annotation for name, annotation in TrainerSections.__annotations__.items()}
    assert {name: declared[name] for name in ours} == ours


def test_torchtitan_parses_the_plan(tmp_path: Path, sections: None) -> None:
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    cases = {
        "tp-dp": make_plan("fsdp-full", dp=4, tp=2, num_nodes=2, micro_batch_size=2, grad_accum_steps=4,
                           activation_checkpointing="selective-op"),
        "zero2-offload": make_plan("zero2", dp=4, offload="optimizer", activation_checkpointing="full"),
        "hybrid-pp": make_plan("fsdp-hybrid", dp=4, shard_group_size=2, pp=2, micro_batch_size=1,
                               grad_accum_steps=8, precision="bf16-pure"),
        "ddp": make_plan("ddp", dp=2, precision="fp32"),
    }
    for name, plan in cases.items():
        knobs = plan.knobs
        config = parse(plan, tmp_path / name)
        parallelism, training = config.parallelism, config.training
        dims = ParallelDims(dp_replicate=parallelism.data_parallel_replicate_degree,
                            dp_shard=parallelism.data_parallel_shard_degree, cp=parallelism.context_parallel_degree,
                            tp=parallelism.tensor_parallel_degree, pp=parallelism.pipeline_parallel_degree,
                            ep=parallelism.expert_parallel_degree, world_size=knobs.world_size)
        assert (dims.tp, dims.pp, dims.cp) == (knobs.tp, knobs.pp, knobs.cp), name
        assert parallelism.data_parallel_replicate_degree * parallelism.data_parallel_shard_degree == knobs.dp, name
        # a torchtitan step is the plan's optimizer step: the same sequences, split the same way
        sequences_per_rank = training.local_batch_size * accumulation_steps(config)
        assert sequences_per_rank * knobs.dp == knobs.global_batch_size, name
        assert (training.max_norm, training.steps, config.debug.seed) == (0.5, 300, 7), name
        assert (config.lr_scheduler.warmup_steps, config.lr_scheduler.decay_type) == (20, "cosine"), name
        assert training.enable_cpu_offload is (knobs.offload != "none"), name
        ac = config.activation_checkpoint
        if name == "tp-dp":
            assert isinstance(ac, SelectiveAC.Config) and parallelism.fsdp_reshard_after_forward == "always"
            assert (training.local_batch_size, accumulation_steps(config)) == (2, 4)
            assert (training.dtype, training.mixed_precision_param) == ("float32", "bfloat16")
        elif name == "zero2-offload":
            assert isinstance(ac, FullAC.Config) and parallelism.fsdp_reshard_after_forward == "never"
        elif name == "hybrid-pp":
            assert (parallelism.data_parallel_replicate_degree, parallelism.data_parallel_shard_degree) == (2, 2)
            assert parallelism.pipeline_parallel_schedule == "1F1B"
            # the plan's 8 micro-batches of 1 are one step's pipeline microbatches
            assert (training.local_batch_size, parallelism.pipeline_parallel_microbatch_size) == (8, 1)
            assert accumulation_steps(config) == 1 and training.dtype == "bfloat16"
            assert parallelism.fsdp_reshard_after_forward == "never"
        else:
            assert ac is None and parallelism.data_parallel_shard_degree == 1
            assert training.mixed_precision_param == "float32"
