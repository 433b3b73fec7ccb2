"""FSDP's all-gather inputs (fstrain/core/plan/memory.py fsdp_all_gather_staging_bytes) on values:
the shards cast to the compute dtype, or copied from the host under CPU offload, that live beside
the gathered unit while its all-gather is issued."""

from __future__ import annotations

import dataclasses

import pytest

from fstrain.api.plan import ClusterRequest, resolve_cluster
from fstrain.core.plan.memory import FSDP_STAGING_ITEM, StageShape, fsdp_all_gather_staging_bytes
from fstrain.core.plan.planner import Pins, PlanModel, TrainingSpec, plan
from fstrain.core.plan.schema import PlanKnobs
from fstrain.io.recipes import load_shipped_recipe

ROOT, BLOCK = 1_050_677_248, 218_112_000  # Llama 3.1 8B: embeddings + norm + head, one block
STAGE = StageShape(8_030_261_248, 32, 525_336_576, BLOCK, True, 1, ROOT, BLOCK)


def knobs(precision: str, offload: str, shard: int) -> PlanKnobs:
    return PlanKnobs("fsdp-full", 3, shard, 1, 1, shard, 1, 1, "full", offload, precision, seq_len=4096)


@pytest.mark.parametrize(
    ("precision", "offload", "shard", "bytes_per_param"),
    [
        ("bf16", "optimizer+params", 1, 2),  # one GPU: the casts are as large as the gathered unit
        ("bf16", "optimizer+params", 8, 2),
        ("bf16", "none", 8, 0),  # the policy's casts on the GPU are freed before the peak (trace)
        ("bf16-pure", "none", 8, 0),  # the bf16 shards are the inputs
        ("bf16-pure", "optimizer+params", 8, 2),  # copied from the host
        ("amp-bf16", "optimizer+params", 8, 4),  # fp32 units, no policy
        ("amp-bf16", "none", 8, 0),
    ],
)
def test_all_gather_inputs_per_precision_and_offload(precision: str, offload: str, shard: int,
                                                     bytes_per_param: int) -> None:
    k = knobs(precision, offload, shard)
    assert fsdp_all_gather_staging_bytes(STAGE, k) == bytes_per_param * ROOT // shard
    no_root = dataclasses.replace(STAGE, outside_blocks=0)  # a later pipeline stage: blocks only
    assert fsdp_all_gather_staging_bytes(no_root, k) == bytes_per_param * BLOCK // shard


def test_fsdp_offload_on_one_gpu_peaks_in_backward_with_the_root_casts() -> None:
    """Llama 3.1 8B on one H100, FSDP with CPU offload, AC full, 4096 tokens: the root unit's
    casts (1.96 GiB) join its gathered copy when backward gathers it again; before they were
    counted, the loss moment (9.6 GiB) was the peak."""
    model = PlanModel.from_spec(load_shipped_recipe("llama3.1-8b").model)
    cluster = resolve_cluster(ClusterRequest(num_nodes=1, gpus_per_node=1, gpu="h100-sxm"))
    pins = Pins(strategy="fsdp-full", tp=1, pp=1, micro_batch_size=1, grad_accum_steps=1,
                activation_checkpointing="full", offload="optimizer+params")
    result = plan(model, TrainingSpec(4096, None), cluster, pins, suggest=False)
    (only,) = [*result.plans, *result.rejected]
    memory = only.memory
    items = dict(memory.details)
    assert memory.phase == "backward"
    assert items[FSDP_STAGING_ITEM] == items["FSDP root unit, gathered (embeddings, final norm, head)"] == 2 * ROOT
    moments = dict(memory.moments)
    assert moments["backward"] > moments["loss"]
