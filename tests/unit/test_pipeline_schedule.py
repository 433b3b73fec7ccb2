"""Pipeline schedules on values: 1F1B, interleaved 1F1B and ZB-H1, against their papers and
Megatron-LM's memory estimate; the knob in the search, the plan file and the rendered files."""

from __future__ import annotations

import dataclasses

import pytest

from fstrain.core.plan.memory import (
    block_backward_extra_bytes,
    layer_activation_bytes,
    memory_breakdown,
    stage_activation_bytes,
    stage_shapes,
)
from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.plan.pipeline import (
    boundary_crossings,
    bubble_slots,
    in_flight_chunks,
    layers_per_rank,
    schedule_problem,
)
from fstrain.core.plan.plancluster import uniform_cluster
from fstrain.core.plan.planfile import PlanFile
from fstrain.core.plan.planner import Pins, PlanModel, TrainingSpec, plan
from fstrain.core.plan.schema import PlanKnobs
from fstrain.core.plan.timemodel import step_time
from fstrain.core.render.deepspeed import render_deepspeed
from fstrain.core.render.fsdp import render_fsdp
from fstrain.errors import ConfigError, InputError
from fstrain.io.recipes import load_shipped_recipe
from tests.plans import make_plan

from .test_timemodel import LINKS, LLAMA, NO_OVERLAP


@pytest.mark.parametrize(("pp", "v"), [(2, 2), (4, 2), (4, 4), (8, 2), (8, 3), (16, 4)])
def test_interleaving_divides_the_bubble_and_multiplies_the_traffic_by_v(pp: int, v: int) -> None:
    """Narayanan et al. 2021 (SC21), section 2.2.2: bubble (p - 1)/(v m) against 1F1B's (p - 1)/m,
    and v times the point-to-point communication."""
    assert bubble_slots("1f1b", pp) == pp - 1
    assert bubble_slots("interleaved", pp, v) == pytest.approx((pp - 1) / v)
    assert boundary_crossings("interleaved", v) == v and boundary_crossings("1f1b") == 1
    # Qi et al. 2023 (arXiv 2401.10241) section 2.1 with T_F = T_B = T_W: 1F1B idles
    # (p - 1)(T_F + T_B + T_W) = 3(p - 1)T, ZB-H1 (p - 1)(T_F + T_B - T_W) = (p - 1)T.
    assert bubble_slots("zero-bubble", pp) == pytest.approx((pp - 1) * (1 + 1 - 1) / (1 + 1 + 1))
    assert bubble_slots("zero-bubble", 1) == bubble_slots("interleaved", 1, v) == 0.0


@pytest.mark.parametrize(("pp", "v", "m"), [(2, 2, 4), (4, 2, 8), (4, 4, 16), (8, 2, 32), (8, 4, 16)])
def test_first_rank_holds_megatrons_interleaved_memory_penalty(pp: int, v: int, m: int) -> None:
    """Megatron-LM (megatron/training/theoretical_memory_usage.py): with v virtual stages the first
    rank holds p micro-batches x (1 + (p - 1)/(p v)); counted from its warm-up chunks."""
    chunks = in_flight_chunks("interleaved", pp, m, 0, v)
    assert chunks / v == pytest.approx(pp * (1 + (pp - 1) / (pp * v)))
    # The last rank warms up (v - 1) p chunks, then holds one more.
    assert in_flight_chunks("interleaved", pp, m, pp - 1, v) == (v - 1) * pp + 1
    # m == p: every chunk of every micro-batch is in flight (Megatron runs it all warm-up).
    assert in_flight_chunks("interleaved", pp, pp, 0, v) == pp * v
    # Never more than all of them: 8 stages x 4 chunks warm up 39 chunks, 9 micro-batches have 36.
    assert in_flight_chunks("interleaved", 8, 9, 0, 4) == 36
    # 1F1B and ZB-H1 (whose peak is 1F1B's): min(p - r, m) micro-batches.
    for schedule in ("1f1b", "zero-bubble"):
        assert in_flight_chunks(schedule, pp, m, 0) == min(pp, m)
        assert in_flight_chunks(schedule, pp, m, pp - 1) == 1


def test_layers_per_rank_and_what_a_schedule_needs() -> None:
    assert layers_per_rank(126, 8) == 16 and layers_per_rank(126, 8, 2) == 16 and layers_per_rank(80, 8, 4) == 12
    assert schedule_problem("1f1b", 8, 2, 126) == ""  # DeepSpeed's 1F1B runs fewer micro-batches than stages
    assert "at least pp" in schedule_problem("zero-bubble", 8, 4, 126)
    assert "more than the 32 layers" in schedule_problem("interleaved", 8, 16, 32, 8)
    # torch's ScheduleInterleaved1F1B: micro-batches a multiple of max(1, m // p) rounds.
    assert schedule_problem("interleaved", 4, 12, 32, 2) == ""
    assert "not a multiple of 2 rounds" in schedule_problem("interleaved", 4, 9, 32, 2)
    assert "not a multiple of 2 rounds" in schedule_problem("zero-bubble", 4, 9, 32)  # ScheduleInterleavedZeroBubble
    assert schedule_problem("1f1b", 4, 9, 32) == ""
    assert "needs a pipeline" in schedule_problem("interleaved", 1, 8, 32, 2)


L8B = load_shipped_recipe("llama3.1-8b").model
P8B = count_parameters(L8B)


def knobs(**changes: object) -> PlanKnobs:
    base = PlanKnobs("fsdp-full", 3, 2, 1, 4, 2, 1, 16, "full", "none", "bf16", "adamw", 8192)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_interleaved_first_stage_activations_on_values() -> None:
    """Llama 3.1 8B, pp 4, 16 micro-batches, full AC: 1F1B's first stage keeps 4 micro-batches of 8
    block inputs; interleaved x2 keeps 11 chunks of 4 blocks = 4 x (1 + 3/8) micro-batches' worth."""
    per_layer = layer_activation_bytes(L8B, 1, 8192, ac="full")
    first, _ = stage_shapes(P8B, 1, 4, 16, False)
    assert dict(stage_activation_bytes(L8B, first, knobs())) == {
        "activations (8 layers x 4 micro-batches, AC full)": 8 * 4 * per_layer,
        "recompute working set (one layer)": layer_activation_bytes(L8B, 1, 8192),
        "backward temporaries (one block)": block_backward_extra_bytes(L8B, 1, 8192, grad_bytes=2),
    }
    chunked, last = stage_shapes(P8B, 1, 4, 16, False, "interleaved", 2)
    assert (chunked.chunks, chunked.in_flight, last.in_flight) == (2, 11, 5)
    interleaved = knobs(pp_schedule="interleaved", pp_virtual_stages=2)
    stored = dict(stage_activation_bytes(L8B, chunked, interleaved))[
        "activations (2 chunks of 4 layers, 11 chunk micro-batches in flight, AC full)"]
    assert stored == 11 * 4 * per_layer == 8 * 4 * per_layer * (1 + 3 / 8)
    one_f_one_b = dict(memory_breakdown(L8B, P8B, P8B.total, knobs(), 8).details)
    both = dict(memory_breakdown(L8B, P8B, P8B.total, interleaved, 8).details)
    assert both["pipeline send/recv"] == 2 * one_f_one_b["pipeline send/recv"]  # one pair per chunk
    zero_bubble = dict(memory_breakdown(L8B, P8B, P8B.total, knobs(pp_schedule="zero-bubble"), 8).details)
    assert zero_bubble == one_f_one_b  # ZB-H1 keeps 1F1B's peak


def test_step_time_per_schedule() -> None:
    base = PlanKnobs("fsdp-full", 3, 32, 1, 4, 32, 1, 16, "none", "none", "bf16", "adamw", 8192)
    times = {
        name: step_time(LLAMA, 2_000_000_000, dataclasses.replace(base, pp_schedule=name, pp_virtual_stages=v),
                        400e12, 128 * 989e12, LINKS, NO_OVERLAP)
        for name, v in (("1f1b", 1), ("interleaved", 2), ("zero-bubble", 1))
    }
    one = times["1f1b"]
    slot = (one.compute_s + one.tp_comm_s + one.pp_comm_s) / 16
    assert one.bubble_s == pytest.approx(3 * slot)  # (p - 1)/m of the work
    inter = times["interleaved"]
    assert inter.pp_comm_s == pytest.approx(2 * one.pp_comm_s)
    assert inter.compute_s == pytest.approx(one.compute_s)
    inter_slot = (inter.compute_s + inter.tp_comm_s + inter.pp_comm_s) / 16
    assert inter.bubble_s / (16 * inter_slot) == pytest.approx(3 / (2 * 16))
    zb = times["zero-bubble"]
    assert zb.bubble_s == pytest.approx(one.bubble_s / 3)
    assert zb.step_time_s == pytest.approx(one.step_time_s - 2 * slot)


def _70b() -> tuple[PlanModel, TrainingSpec]:
    return PlanModel.from_spec(load_shipped_recipe("llama3.1-70b").model), TrainingSpec(8192, 512)


def test_the_search_tries_schedules_only_with_a_pipeline() -> None:
    model, training = _70b()
    cluster = uniform_cluster(8, 8, "h100-sxm")
    pinned = Pins(strategy="fsdp-full", tp=8, pp=4, micro_batch_size=1, activation_checkpointing="full",
                  offload="none")
    result = plan(model, training, cluster, pinned)
    assert [p.knobs.pp_schedule for p in result.plans] == ["zero-bubble"]  # dominates 1F1B and interleaved x2
    deepspeed = plan(model, training, cluster, dataclasses.replace(pinned, strategy="zero1"))
    assert {p.knobs.pp_schedule for p in (*deepspeed.plans, *deepspeed.rejected)} == {"1f1b"}
    flat = plan(model, training, cluster, dataclasses.replace(pinned, pp=1))
    assert {p.knobs.pp_schedule for p in (*flat.plans, *flat.rejected)} == {"1f1b"}
    counted = plan(PlanModel(model.num_params), TrainingSpec(8192, None), cluster,
                   Pins(strategy="fsdp-full", pp=2, micro_batch_size=1, grad_accum_steps=8))
    # No architecture, no step time for a schedule to change.
    assert {p.knobs.pp_schedule for p in (*counted.plans, *counted.rejected)} == {"1f1b"}
    four = plan(model, training, cluster, dataclasses.replace(pinned, pp_schedule="interleaved", pp_virtual_stages=4))
    [chosen] = four.plans
    assert (chosen.knobs.pp_schedule, chosen.knobs.pp_virtual_stages) == ("interleaved", 4)
    assert chosen.describe().endswith("interleaved x4")
    data = chosen.to_dict()
    assert (data["pp_schedule"], data["pp_virtual_stages"]) == ("interleaved", 4)


@pytest.mark.parametrize(
    ("pins", "message"),
    [
        (Pins(strategy="zero1", pp=2, pp_schedule="interleaved"), "DeepSpeed's pipeline engine, which has its own"),
        (Pins(pp=1, pp_schedule="zero-bubble"), "the zero-bubble schedule needs a pipeline, and --pp is 1"),
        (Pins(pp_virtual_stages=2), "--pp-virtual-stages 2 without the interleaved schedule"),
        (Pins(pp_schedule="interleaved", pp_virtual_stages=1), "interleaving needs at least 2 model chunks"),
        (Pins(pp=16, pp_schedule="interleaved", pp_virtual_stages=8), "pp=16 x 8 virtual stages is more than"),
        (Pins(pp_schedule="gpipe"), "unknown pipeline schedule 'gpipe'"),
    ],
)
def test_impossible_schedule_pins_are_errors(pins: Pins, message: str) -> None:
    model, training = _70b()
    with pytest.raises(ConfigError, match=message):
        plan(model, training, uniform_cluster(8, 8, "h100-sxm"), pins)


def test_plan_files_carry_the_schedule_and_old_ones_still_load() -> None:
    chosen = make_plan("fsdp-full", dp=2, pp=2, grad_accum_steps=4, pp_schedule="interleaved", pp_virtual_stages=2)
    document = chosen.to_dict()
    assert document["plan"]["pp_schedule"] == "interleaved" and document["plan"]["pp_virtual_stages"] == 2
    assert PlanFile.from_dict(document, "plan.yaml").knobs == chosen.knobs
    old = make_plan("fsdp-full", dp=2).to_dict()
    del old["plan"]["pp_schedule"], old["plan"]["pp_virtual_stages"]  # written before the schedules existed
    restored = PlanFile.from_dict(old, "plan.yaml").knobs
    assert (restored.pp_schedule, restored.pp_virtual_stages) == ("1f1b", 1)
    bad = [
        ({"pp_schedule": "gpipe"}, "plan.pp_schedule is 'gpipe'"),
        ({"pp": 2, "pp_schedule": "interleaved", "pp_virtual_stages": 1}, "pp_virtual_stages is 1 with the inter"),
        ({"pp": 2, "pp_virtual_stages": 2}, "pp_virtual_stages is 2 with the 1f1b schedule"),
        ({"pp_schedule": "zero-bubble"}, "without a pipeline"),
        ({"pp_virtual_stages": "two"}, "pp_virtual_stages must be a positive integer"),
    ]
    for changes, message in bad:
        document = make_plan("fsdp-full", dp=2).to_dict()
        document["plan"].update(changes)
        with pytest.raises(InputError, match=message):
            PlanFile.from_dict(document, "plan.yaml")
    deepspeed = make_plan("zero1", dp=2).to_dict()
    deepspeed["plan"].update({"pp": 2, "pp_schedule": "zero-bubble"})
    with pytest.raises(InputError, match="DeepSpeed's pipeline engine runs its own 1F1B"):
        PlanFile.from_dict(deepspeed, "plan.yaml")


def test_the_rendered_files_name_the_schedule() -> None:
    chosen = make_plan("fsdp-full", dp=2, pp=2, grad_accum_steps=4, pp_schedule="interleaved", pp_virtual_stages=2)
    fsdp = render_fsdp(chosen)
    assert fsdp.config["pipeline"] == {"stages": 2, "schedule": "interleaved", "torch_schedule":
                                       "ScheduleInterleaved1F1B", "stages_per_rank": 2, "microbatches": 4}
    assert fsdp.config["reshard_after_forward"] is False  # stages stay gathered across micro-batches
    assert "pipeline" not in render_fsdp(make_plan("fsdp-full", dp=2)).config
    assert render_fsdp(make_plan("fsdp-full", dp=2)).config["reshard_after_forward"] is True
    notes = " ".join(render_deepspeed(chosen).notes)
    assert "runs its own 1F1B schedule" in notes
    one = make_plan("zero1", dp=2, pp=2, grad_accum_steps=4)
    assert "runs its own 1F1B" not in " ".join(render_deepspeed(one).notes)
