"""Expert parallelism (--ep) in the planner: model states, all-to-all, search, plan files, refusals."""

from __future__ import annotations

import dataclasses

import pytest

from fstrain.core.job.plan import check_trainer_ep
from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.memory import EP_ALL_TO_ALL_ITEM, memory_breakdown, stage_model_states, stage_shapes
from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.plan.plancluster import uniform_cluster
from fstrain.core.plan.planfile import PlanFile, validate_ep
from fstrain.core.plan.planner import Pins, PlanModel, TrainingSpec, plan, plan_file
from fstrain.core.plan.schema import ModelSpec, PlanKnobs
from fstrain.core.plan.timemodel import moe_all_to_all_time, step_time
from fstrain.core.render.deepspeed import render_deepspeed
from fstrain.core.render.fsdp import render_fsdp
from fstrain.errors import ConfigError, InputError
from fstrain.io.recipes import load_shipped_recipe
from fstrain.train.trace import check_traceable
from tests.plans import make_plan

from .test_timemodel import LINKS, NO_OVERLAP

MIXTRAL = load_shipped_recipe("mixtral-8x7b").model
TINY_MOE = load_shipped_recipe("tiny-moe").model
PARAMS = count_parameters(MIXTRAL)
# Mixtral 8x7B by hand: one expert is 3 x 4096 x 14336 = 176,160,768 parameters, 8 per block, 32
# blocks: 45,097,156,608 expert parameters of the 46,702,792,704; the other 1,605,636,096 are
# attention, routers, norms, embedding and head.
EXPERTS = 32 * 8 * 3 * 4096 * 14336
DENSE = 46_702_792_704 - EXPERTS


def knobs(**changes: object) -> PlanKnobs:
    """Mixtral on 64 GPUs: ZeRO-2, dp 64, one 4096-token sequence per micro-batch, ep 8."""
    base = PlanKnobs("zero2", 2, 64, 1, 1, 64, 1, 2, "full", "none", "bf16", "adamw", 4096, ep=8)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_the_hand_counts_are_the_models() -> None:
    assert PARAMS.total == 46_702_792_704 and PARAMS.ffn_per_layer * 32 == EXPERTS == 45_097_156_608
    assert DENSE == 1_605_636_096


def test_each_rank_holds_its_experts_share_and_shards_it_over_dp_over_ep() -> None:
    (stage,) = stage_shapes(PARAMS, 1, 1, 2, False, ep=8)
    assert stage.experts == EXPERTS // 8 == 5_637_144_576  # one expert per block and rank
    assert stage.params == DENSE + EXPERTS // 8
    # ZeRO-2 (DeepSpeed's estimator: 2-byte parameters whole, 2 + 4 bytes of gradient partitions and
    # 4 + 8 of master and Adam states): the non-expert states over 64 ranks, the experts' over 64/8 = 8.
    states = stage_model_states(stage, knobs())
    assert states.parameters == 2 * (DENSE + EXPERTS // 8) == 14_485_561_344
    assert states.gradients == 6 * DENSE // 64 + 6 * (EXPERTS // 8) // 8 == 150_528_384 + 4_227_858_432
    assert states.optimizer_states == 12 * DENSE // 64 + 12 * (EXPERTS // 8) // 8 == 301_056_768 + 8_455_716_864
    # Fully sharded, EP moves nothing: E/ep experts over dp/ep ranks is E/dp per rank.
    full = stage_model_states(stage, knobs(strategy="fsdp-full", zero_stage=3))
    unsplit = stage_model_states(stage_shapes(PARAMS, 1, 1, 2, False)[0], knobs(strategy="fsdp-full", ep=1))
    assert full.total == pytest.approx(unsplit.total, abs=64)  # floor division per part
    # Without EP the experts are sharded like everything else (the planner's old numbers).
    (plain,) = stage_shapes(PARAMS, 1, 1, 2, False)
    assert plain.experts == 0 and plain.params == PARAMS.total


def test_the_all_to_all_buffers_are_one_layers_routed_copies_both_ways() -> None:
    memory = dict(memory_breakdown(MIXTRAL, PARAMS, PARAMS.total, knobs(), 8).details)
    # 4096 tokens x top-2 x hidden 4096 x 2 bytes, sent and received
    assert memory[EP_ALL_TO_ALL_ITEM] == 2 * 4096 * 2 * 4096 * 2 == 134_217_728
    without = dict(memory_breakdown(MIXTRAL, PARAMS, PARAMS.total, knobs(ep=1), 8).details)
    assert EP_ALL_TO_ALL_ITEM not in without
    assert memory["parameters"] == 14_485_561_344 and without["parameters"] == 2 * PARAMS.total
    # Dropless routing: each rank computes on as many routed copies as without EP.
    stored = [name for name in memory if name.startswith("activations (")]
    assert [memory[name] for name in stored] == [without[name] for name in stored]


def test_four_all_to_alls_per_moe_layer_over_the_ep_group() -> None:
    k = knobs()  # full AC: the recomputed forward dispatches and combines again
    # ep 8 with tp 1 is one NVLink domain: 450 GB/s; each all-to-all sends 7/8 of 4096 x 2 x 4096 x 2 bytes.
    one = 6 * (7 / 8 * 4096 * 2 * 4096 * 2) / 450e9
    assert moe_all_to_all_time(MIXTRAL, k, LINKS, NO_OVERLAP) == pytest.approx(one)
    for ac, count in (("none", 4), ("selective-op", 4), ("every-k:2", 5)):
        assert moe_all_to_all_time(MIXTRAL, knobs(activation_checkpointing=ac), LINKS, NO_OVERLAP) == \
            pytest.approx(one / 6 * count)
    assert moe_all_to_all_time(MIXTRAL, knobs(ep=1), LINKS, NO_OVERLAP) == 0.0
    # ep 8 with tp 2 spans two nodes of 8 GPUs: 4 members per node use 4 GPUs' shares of the NICs.
    crossing = moe_all_to_all_time(MIXTRAL, knobs(tp=2, dp=32, shard_group_size=32), LINKS, NO_OVERLAP)
    assert crossing == pytest.approx(6 * (7 / 8 * 2048 * 2 * 4096 * 2) / (4 * 50e9))
    timed = step_time(MIXTRAL, DENSE + EXPERTS // 8, k, 400e12, 64 * 989e12, LINKS, NO_OVERLAP, EXPERTS // 8)
    assert timed.ep_comm_s == pytest.approx(2 * 32 * one)  # 2 micro-batches x 32 layers, not overlapped
    slot_sum = timed.compute_s + timed.ep_comm_s + timed.dp_exposed_s
    assert timed.step_time_s == pytest.approx(slot_sum)
    assert timed.to_dict()["ep_comm_s"] == timed.ep_comm_s


def test_expert_gradients_are_reduced_over_dp_over_ep_ranks() -> None:
    # dp == ep: each rank is alone with its experts, so only the non-expert gradients are reduced.
    k = knobs(dp=8, shard_group_size=8, ep=8)
    with_experts = step_time(MIXTRAL, DENSE + EXPERTS // 8, k, 400e12, 8 * 989e12, LINKS, NO_OVERLAP, EXPERTS // 8)
    dense_only = step_time(MIXTRAL, DENSE, k, 400e12, 8 * 989e12, LINKS, NO_OVERLAP, 0)
    assert with_experts.dp_comm_s == pytest.approx(dense_only.dp_comm_s)
    # ep 2 of dp 8: the experts' ZeRO-2 reduce-scatter runs over 4 ranks 2 apart (inside the node).
    k = knobs(dp=8, shard_group_size=8, ep=2)
    half = step_time(MIXTRAL, DENSE + EXPERTS // 2, k, 400e12, 8 * 989e12, LINKS, NO_OVERLAP, EXPERTS // 2)
    # A reduce-scatter per micro-batch (2) and one all-gather a step, 3/4 of 2 bytes per parameter each.
    expected = dense_only.dp_comm_s + 3 * (3 / 4 * 2 * (EXPERTS // 2)) / 450e9
    assert half.dp_comm_s == pytest.approx(expected)


def test_the_search_picks_expert_parallelism_when_it_makes_zero2_fit() -> None:
    model = PlanModel.from_spec(MIXTRAL)
    training = TrainingSpec(4096, 128)
    cluster = uniform_cluster(8, 8, "h100-sxm")
    result = plan(model, training, cluster, Pins(strategy="zero2", tp=1, pp=1))
    assert result.best is not None and result.best.knobs.ep > 1  # 93 GB of bf16 parameters do not fit whole
    assert all(p.knobs.ep > 1 for p in result.plans)
    assert result.best.to_dict()["ep"] == result.best.knobs.ep
    pinned = plan(model, training, cluster, Pins(strategy="zero2", tp=1, pp=1, ep=1))
    assert not pinned.plans
    dense = plan(PlanModel.from_spec(load_shipped_recipe("llama3.1-8b").model), TrainingSpec(4096, 64),
                 uniform_cluster(1, 8, "h100-sxm"))
    assert dense.best is not None and "ep" not in dense.best.to_dict()
    assert {p.knobs.ep for p in (*dense.plans, *dense.rejected)} == {1}


@pytest.mark.parametrize(
    ("pins", "message"),
    [
        (Pins(ep=0), "ep=0 is not a positive integer"),
        (Pins(ep=3), "ep=3 does not divide the 8 experts"),
    ],
)
def test_impossible_ep_pins_are_errors(pins: Pins, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan(PlanModel.from_spec(MIXTRAL), TrainingSpec(4096, 128), uniform_cluster(8, 8, "h100-sxm"), pins)
    with pytest.raises(ConfigError, match="has no experts"):
        plan(PlanModel.from_spec(load_shipped_recipe("llama3.1-8b").model), TrainingSpec(4096, 64),
             uniform_cluster(1, 8, "h100-sxm"), Pins(ep=2))


def test_plan_files_carry_ep_and_old_ones_still_load() -> None:
    model = PlanModel.from_spec(MIXTRAL)
    cluster = uniform_cluster(8, 8, "h100-sxm")
    result = plan(model, TrainingSpec(4096, 128), cluster, Pins(strategy="zero2", tp=1, pp=1, ep=4))
    saved = plan_file(result, model, cluster)
    document = saved.to_dict()
    assert document["plan"]["ep"] == 4
    assert PlanFile.from_dict(document, "plan.yaml").knobs == saved.knobs
    del document["plan"]["ep"]  # written before expert parallelism
    assert PlanFile.from_dict(document, "plan.yaml").knobs.ep == 1


@pytest.mark.parametrize(
    ("changes", "model", "message"),
    [
        ({"ep": 0}, TINY_MOE, r"plan.ep must be a positive integer, got 0"),
        ({"ep": "two"}, TINY_MOE, r"plan.ep must be a positive integer, got 'two'"),
        ({"ep": 2}, None, "has no experts"),
        ({"ep": 8, "dp": 8, "shard_group_size": 8}, TINY_MOE, r"plan.ep\(8\) does not divide num_experts\(4\)"),
        ({"ep": 4, "dp": 2, "shard_group_size": 2}, TINY_MOE, r"plan.ep\(4\) does not divide dp\(2\)"),
        ({"ep": 4, "dp": 8, "strategy": "fsdp-hybrid", "shard_group_size": 2}, TINY_MOE,
         r"plan.ep\(4\) does not divide shard_group_size\(2\)"),
    ],
)
def test_plan_file_ep_errors_name_the_key(changes: dict[str, object], model: ModelSpec | None, message: str) -> None:
    document = make_plan("fsdp-full", dp=2, **({"model": model} if model else {})).to_dict()
    document["plan"].update(changes)
    with pytest.raises(InputError, match=message) as caught:
        PlanFile.from_dict(document, "plan.yaml")
    assert caught.value.hint
    validate_ep(make_plan("fsdp-full", dp=4, model=TINY_MOE, ep=4).knobs, TINY_MOE, "plan.yaml")  # fine


def test_the_trainer_trace_and_renderers_say_what_ep_means() -> None:
    chosen = make_plan("zero2", dp=4, model=TINY_MOE, ep=2)
    with pytest.raises(ConfigError, match="does not run expert parallelism"):
        check_trainer_ep(chosen, "plan.yaml")
    with pytest.raises(ConfigError, match="does not run expert parallelism"):
        check_traceable(dataclasses.replace(chosen, knobs=dataclasses.replace(chosen.knobs, strategy="fsdp-full")))
    check_trainer_ep(make_plan("zero2", dp=4, model=TINY_MOE), "plan.yaml")  # ep 1 trains
    assert "ep_size=2" in " ".join(render_deepspeed(chosen).notes)
    fsdp = make_plan("fsdp-full", dp=4, model=TINY_MOE, ep=2)
    assert "expert_parallel_degree = 2" in " ".join(render_fsdp(fsdp).notes)


def test_assumptions_are_what_the_time_model_divides_by() -> None:
    # collective_efficiency and the NVLink latencies enter the all-to-all like any other collective.
    assumptions = Assumptions()
    k = knobs(activation_checkpointing="none")
    volume = 7 / 8 * 4096 * 2 * 4096 * 2
    latency = assumptions.collective_base_latency_s + 7 * assumptions.nvlink_latency_s  # NCCL's ring over 8
    expected = 4 * (volume / (450e9 * assumptions.collective_efficiency) + latency)
    assert moe_all_to_all_time(MIXTRAL, k, LINKS, assumptions) == pytest.approx(expected)


def test_offloaded_expert_shards_are_of_dp_over_ep_ranks() -> None:
    k = knobs(offload="optimizer")
    timed = step_time(MIXTRAL, DENSE + EXPERTS // 8, k, 400e12, 64 * 989e12, LINKS, NO_OVERLAP, EXPERTS // 8)
    shard = DENSE / 64 + (EXPERTS // 8) / 8  # parameters whose update this rank's host runs
    pcie = 128e9 / 2
    expected = 2 * 2 * shard / pcie + shard * 8 / NO_OVERLAP.cpu_adam_params_per_s_per_node
    assert timed.offload_s == pytest.approx(expected)
