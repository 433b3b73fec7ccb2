"""Re-planning for the ranks that are left (fstrain/core/plan/replan.py): the same model and
global batch, new dp and grad-accum (tp/pp only when the world no longer divides), one line."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fstrain.core.plan.planfile import PlanFile
from fstrain.core.plan.replan import replan, replan_file
from fstrain.core.plan.schema import ClusterSummary, ModelSpec, MoESpec, PlanKnobs
from fstrain.errors import ConfigError

LLAMA_8B = ModelSpec("llama3.1-8b", 32, 4096, 32, 8, 14336, "swiglu", 128256, 8192)


def knobs(dp: int, accum: int, micro: int = 2, tp: int = 1, pp: int = 1, strategy: str = "fsdp-full",
          **more: object) -> PlanKnobs:
    group = {"ddp": 1}.get(strategy, dp)
    return replace(PlanKnobs(strategy, 3 if strategy.startswith("zero3") else 0, dp, tp, pp, group, micro, accum),
                   **more)  # type: ignore[arg-type]


def test_four_nodes_to_three_keeps_the_global_batch() -> None:
    result = replan(knobs(8, 3), LLAMA_8B, 8, 6, 2)
    assert (result.knobs.dp, result.knobs.grad_accum_steps, result.knobs.micro_batch_size) == (6, 4, 2)
    assert result.knobs.global_batch_size == 48 and result.global_batch_kept
    assert result.knobs.shard_group_size == 6
    assert result.message == "4 nodes -> 3: dp 8 -> 6, grad-accum 3 -> 4; the global batch of 48 sequences is kept"


def test_the_issues_example_eight_nodes_to_seven() -> None:
    # 8 nodes of 8: dp 64, micro 4, grad-accum 2 = 512 sequences. 56 ranks: 512 / 56 is not whole,
    # nor with a smaller micro-batch: the nearest global batch is said.
    result = replan(knobs(64, 2, micro=4), LLAMA_8B, 64, 56, 8)
    assert result.knobs.dp == 56 and not result.global_batch_kept
    assert result.message == ("8 nodes -> 7: dp 64 -> 56; the global batch becomes 448 sequences (was 512): no "
                              "micro-batch x grad-accum of dp 56 makes 512")
    with pytest.raises(ConfigError, match="no layout of 56 ranks keeps the global batch of 512 sequences"):
        replan(knobs(64, 2, micro=4), LLAMA_8B, 64, 56, 8, exact=True)


def test_a_smaller_micro_batch_keeps_the_batch_when_grad_accum_alone_cannot() -> None:
    result = replan(knobs(4, 1, micro=6), LLAMA_8B, 4, 3, 1)  # 24 sequences: 3 x 8 x 1
    assert (result.knobs.micro_batch_size, result.knobs.grad_accum_steps) == (4, 2)
    assert "micro-batch 6 -> 4" in result.message and "grad-accum 1 -> 2" in result.message
    assert result.knobs.global_batch_size == 24


def test_model_parallel_ranks_stay_when_the_world_divides() -> None:
    result = replan(knobs(4, 4, tp=8, pp=2), LLAMA_8B, 64, 48, 8)  # 4 nodes of 8 -> 3
    assert (result.knobs.tp, result.knobs.pp, result.knobs.dp, result.knobs.grad_accum_steps) == (8, 2, 3, 5)
    # 32 sequences on dp 3: no layout of 48 ranks has a dp dividing 32 (tp | 8, pp | 32 layers)
    assert (result.knobs.micro_batch_size, result.knobs.grad_accum_steps) == (2, 5)
    assert not result.global_batch_kept and "the global batch becomes 30 sequences (was 32)" in result.message


def test_tp_or_pp_change_when_the_world_no_longer_divides() -> None:
    # tp 8 x pp 4 = 32 ranks a replica on 4 nodes of 8 (dp 1); 3 nodes (24 ranks) take no replica
    # of 32: the layout nearest to 32 that tiles 24 ranks, the larger first.
    result = replan(knobs(1, 16, tp=8, pp=4, micro=1), LLAMA_8B, 32, 24, 8)
    assert result.knobs.tp * result.knobs.pp * result.knobs.dp == 24
    assert (result.knobs.tp, result.knobs.pp) == (8, 1) or result.knobs.tp * result.knobs.pp >= 24
    assert "pp 4 -> " in result.message or "tp 8 -> " in result.message
    assert result.knobs.global_batch_size == 15 and "becomes 15 sequences (was 16)" in result.message


def test_a_layout_that_keeps_the_batch_comes_first() -> None:
    # pp 3 x dp 3 on 9 one-rank nodes, 3 sequences; 8 left: pp 4 (dp 2) and pp 2 (dp 4) are
    # closer to pp 3 but no dp of theirs divides 3 sequences; pp 8 (dp 1) keeps them.
    model = replace(LLAMA_8B, num_layers=48)
    result = replan(knobs(3, 1, micro=1, pp=3), model, 9, 8, 1)
    assert (result.knobs.pp, result.knobs.dp, result.knobs.grad_accum_steps) == (8, 1, 3)
    assert result.message == ("9 nodes -> 8: pp 3 -> 8, dp 3 -> 1, grad-accum 1 -> 3; the global batch "
                              "of 3 sequences is kept")


def test_a_world_no_layout_fits_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="no layout of 5 ranks keeps cp=2") as raised:
        replan(knobs(1, 4, micro=1, cp=2), LLAMA_8B, 2, 5, 1)
    assert "\n" not in str(raised.value)


def test_expert_parallel_shrinks_to_divide_the_new_dp() -> None:
    moe = replace(LLAMA_8B, moe=MoESpec(8, 2, 14336))
    result = replan(knobs(8, 1, ep=4), moe, 8, 6, 2)
    assert (result.knobs.dp, result.knobs.ep) == (6, 2) and "ep 4 -> 2" in result.message


def test_a_hybrid_shard_group_divides_the_new_dp() -> None:
    hybrid = replace(knobs(8, 3, strategy="fsdp-hybrid"), shard_group_size=4)
    result = replan(hybrid, LLAMA_8B, 8, 6, 2)
    assert result.knobs.shard_group_size == 2 and "shard group 4 -> 2" in result.message


def test_a_plan_for_another_world_is_refused() -> None:
    with pytest.raises(ConfigError, match="= 8 ranks, not the 16 it ran on"):
        replan(knobs(8, 1), LLAMA_8B, 16, 8, 8)


def test_ranks_that_are_not_whole_nodes_are_counted_as_ranks() -> None:
    result = replan(knobs(4, 3), LLAMA_8B, 4, 3, 2)
    assert result.message.startswith("4 ranks -> 3: dp 4 -> 3, grad-accum 3 -> 4")


def test_replan_file_names_the_new_hosts() -> None:
    plan = PlanFile(LLAMA_8B, knobs(8, 3), ClusterSummary(4, 2, "cpu", 0, ("n1", "n2", "n3", "n4")))
    replanned, message = replan_file(plan, ("n1", "n2", "n4"), 2)
    assert replanned.cluster.hosts == ("n1", "n2", "n4") and replanned.cluster.num_nodes == 3
    assert replanned.knobs.dp == 6 and replanned.model == LLAMA_8B
    assert message.startswith("4 nodes -> 3")
