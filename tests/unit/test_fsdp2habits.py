"""fsdp2_no_sync and tp_replicated_logits (fstrain/core/plan/fsdp2habits.py): values by hand."""

from __future__ import annotations

import dataclasses

import pytest

from fstrain.core.formats import KINDS
from fstrain.core.job.plan import check_plan_fits_launch
from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.fsdp2habits import (
    NO_SYNC_ITEM,
    logits_gather_bytes,
    no_sync_gradient_bytes,
)
from fstrain.core.plan.memory import StageShape, loss_bytes, memory_breakdown, with_replicated_embedding
from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.plan.plancluster import uniform_cluster
from fstrain.core.plan.planfile import PlanFile
from fstrain.core.plan.planner import Pins, PlanModel, TrainingSpec, plan, plan_file
from fstrain.core.plan.schema import PlanKnobs
from fstrain.core.plan.timemodel import step_time
from fstrain.core.render.torchtitan import check_torchtitan
from fstrain.errors import ConfigError, InputError
from tests.plans import TINY_MODEL, make_plan

from .test_timemodel import LINKS, NO_OVERLAP


def tiny_knobs(**changes: object) -> PlanKnobs:
    """TINY_MODEL on 8 GPUs, FSDP full shard, 4 x 64 tokens a micro-batch, 2 micro-batches."""
    base = PlanKnobs("fsdp-full", 3, 8, 1, 1, 8, 4, 2, "none", "none", "bf16", "adamw", 64)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_no_sync_holds_every_gradient_unsharded_in_the_reduce_dtype() -> None:
    on = tiny_knobs(fsdp2_no_sync=True)
    assert no_sync_gradient_bytes(1000, on) == 4000  # fp32 reduce_dtype: 4 bytes a parameter
    assert no_sync_gradient_bytes(1000, on, Assumptions(fsdp_reduce_bytes_per_element=2)) == 2000
    assert no_sync_gradient_bytes(1000, dataclasses.replace(on, precision="fp32"),
                                  Assumptions(fsdp_reduce_bytes_per_element=2)) == 4000  # fp32 gradients
    assert no_sync_gradient_bytes(1000, dataclasses.replace(on, grad_accum_steps=1)) == 0
    assert no_sync_gradient_bytes(1000, tiny_knobs()) == 0


def test_no_sync_replaces_the_sharded_gradients_until_the_step() -> None:
    params = count_parameters(TINY_MODEL)
    off = memory_breakdown(TINY_MODEL, params, params.total, tiny_knobs(precision="bf16-pure"), 8)
    on = memory_breakdown(TINY_MODEL, params, params.total, tiny_knobs(precision="bf16-pure", fsdp2_no_sync=True), 8)
    assert dict(on.details)[NO_SYNC_ITEM] == 4 * params.total
    assert NO_SYNC_ITEM not in dict(off.details)
    assert on.phase != "optimizer step" and on.gradients == 0
    # bf16-pure FSDP shards keep 2-byte gradients: 2 x params / 8 while accumulating, without the knob.
    assert off.gradients == 2 * params.total // 8
    assert dict(on.moments)["optimizer step"] == dict(off.moments)["optimizer step"]


def test_no_sync_reduce_scatters_once_a_step() -> None:
    params = count_parameters(TINY_MODEL).total
    k = tiny_knobs(grad_accum_steps=4)
    off = step_time(TINY_MODEL, params, k, 400e12, 8e15, LINKS, NO_OVERLAP)
    on = step_time(TINY_MODEL, params, dataclasses.replace(k, fsdp2_no_sync=True), 400e12, 8e15, LINKS, NO_OVERLAP)
    # Per micro-batch: two all-gathers of 2 bytes and a reduce-scatter of 4 (bf16 under a policy);
    # with the knob the 4 reduce-scatters become one.
    assert on.dp_comm_s / off.dp_comm_s == pytest.approx((4 * 2 * 2 + 4) / (4 * (2 * 2 + 4)))


def test_replicated_logits_count_the_whole_vocabulary_on_every_tp_rank() -> None:
    split = tiny_knobs(tp=2, dp=4, shard_group_size=4)
    gathered = dataclasses.replace(split, tp_replicated_logits=True)
    assert loss_bytes(TINY_MODEL, gathered).peak == 2 * loss_bytes(TINY_MODEL, split).peak
    assert logits_gather_bytes(TINY_MODEL, gathered) == 64 * 4 * 256 * 2  # s x b x V, bf16
    assert logits_gather_bytes(TINY_MODEL, split) == 0
    assert logits_gather_bytes(TINY_MODEL, dataclasses.replace(gathered, tp=1)) == 0


def test_the_replicated_embedding_is_whole_on_the_stage() -> None:
    stage = StageShape(params=1000, layers=2, largest_layer=300, fsdp_unit=300, has_head=True, in_flight=1,
                       outside_blocks=400, block=300)
    on = tiny_knobs(tp=4, dp=2, shard_group_size=2, tp_replicated_logits=True)
    # An embedding of 800 parameters is 200 a rank when vocab-parallel; replicated, 600 more.
    assert with_replicated_embedding(stage, 800, on) == dataclasses.replace(
        stage, params=1600, outside_blocks=1000, fsdp_unit=800, largest_layer=800)
    assert with_replicated_embedding(stage, 800, dataclasses.replace(on, tp_replicated_logits=False)) == stage
    assert with_replicated_embedding(stage, 800, dataclasses.replace(on, tp=1)) == stage


def test_replicated_logits_are_gathered_once_a_micro_batch() -> None:
    params = count_parameters(TINY_MODEL).total
    k = tiny_knobs(tp=2, dp=4, shard_group_size=4)
    off = step_time(TINY_MODEL, params, k, 400e12, 8e15, LINKS, NO_OVERLAP)
    on = step_time(TINY_MODEL, params, dataclasses.replace(k, tp_replicated_logits=True), 400e12, 8e15, LINKS,
                   NO_OVERLAP)
    # 2 micro-batches x half of 64 x 4 x 256 bf16 logits over NVLink at 450 GB/s.
    assert on.tp_comm_s - off.tp_comm_s == pytest.approx(2 * 0.5 * 64 * 4 * 256 * 2 / 450e9)


def test_the_planner_refuses_what_the_knobs_cannot_describe_and_plans_the_rest() -> None:
    model = PlanModel.from_spec(TINY_MODEL)
    cluster = uniform_cluster(1, 8, "h100-sxm")
    with pytest.raises(ConfigError, match="gradient sync is skipped, but the strategy is zero2") as caught:
        plan(model, TrainingSpec(64, 16, fsdp2_no_sync=True), cluster, Pins(strategy="zero2"))
    assert caught.value.hint == "use an fsdp-* strategy, or drop --fsdp2-no-sync"
    with pytest.raises(ConfigError, match="framework lightning wraps the model in FSDP1"):
        plan(model, TrainingSpec(64, 16, fsdp2_no_sync=True, framework="lightning"), cluster)
    with pytest.raises(ConfigError, match="pp is 2: the modelled code gathers the logits only"):
        plan(model, TrainingSpec(64, 16, tp_replicated_logits=True), cluster, Pins(pp=2))
    result = plan(model, TrainingSpec(64, 16, fsdp2_no_sync=True, tp_replicated_logits=True), cluster)
    assert result.plans and all(p.knobs.strategy.startswith("fsdp") and p.knobs.pp == 1 for p in result.plans)
    document = plan_file(result, model, cluster).to_dict()
    assert document["fstrain_plan"] == KINDS["plan"].current == 2
    loaded = PlanFile.from_dict(document, "plan.yaml").knobs
    assert loaded.fsdp2_no_sync and loaded.tp_replicated_logits


def test_plan_files_load_without_the_knobs_and_refuse_them_where_they_cannot_hold() -> None:
    document = make_plan("fsdp-full", dp=2).to_dict()
    document["fstrain_plan"] = 1
    for key in ("fsdp2_no_sync", "tp_replicated_logits"):
        del document["plan"][key]
    old = PlanFile.from_dict(document, "plan.yaml").knobs
    assert not old.fsdp2_no_sync and not old.tp_replicated_logits
    refused = make_plan("zero2", dp=2).to_dict()
    refused["plan"]["fsdp2_no_sync"] = True
    with pytest.raises(InputError, match=r"plan\.fsdp2_no_sync is true: FSDP2's gradient sync is skipped") as caught:
        PlanFile.from_dict(refused, "plan.yaml")
    assert caught.value.hint == "use an fsdp-* strategy, or set fsdp2_no_sync false"


def test_the_bundled_trainer_and_torchtitan_refuse_the_knobs() -> None:
    no_sync = make_plan("fsdp-full", dp=2, fsdp2_no_sync=True)
    with pytest.raises(ConfigError, match="the plan has fsdp2_no_sync, which the bundled trainer does not run"):
        check_plan_fits_launch(no_sync, 2, "plan.yaml")
    with pytest.raises(ConfigError, match=r"plan\.fsdp2_no_sync is true: torchtitan has no setting"):
        check_torchtitan(no_sync)
    gathered = make_plan("fsdp-full", dp=1, tp=2, tp_replicated_logits=True)
    with pytest.raises(ConfigError, match=r"plan\.tp_replicated_logits is true: torchtitan has no setting"):
        check_torchtitan(gathered)
