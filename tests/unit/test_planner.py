"""The search: invariants over real recipes and clusters, pins, explanations, determinism."""

from __future__ import annotations

import dataclasses
import re

import pytest

from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.memory import model_states
from fstrain.core.plan.plancluster import NodeGpus, PlanCluster, build_cluster, uniform_cluster
from fstrain.core.plan.planfile import PlanFile
from fstrain.core.plan.planner import CLOSEST_TIMED, Pins, PlanModel, PlanResult, TrainingSpec, plan, plan_file
from fstrain.errors import ConfigError
from fstrain.io.recipes import load_shipped_recipe


def model(name: str) -> PlanModel:
    return PlanModel.from_spec(load_shipped_recipe(name).model)


def training(name: str, batch: int | None = None, **changes: object) -> TrainingSpec:
    spec = load_shipped_recipe(name).model
    return dataclasses.replace(TrainingSpec(spec.seq_len, batch or 4 * 1024 * 1024 // spec.seq_len), **changes)


SCENARIOS = [
    ("llama3.1-8b", uniform_cluster(1, 8, "h100-sxm")),
    ("llama3.1-70b", uniform_cluster(8, 8, "h100-sxm")),
    ("llama2-13b", uniform_cluster(4, 8, "a100-40gb")),
    ("mixtral-8x7b", uniform_cluster(4, 8, "h200")),
    ("gpt2-1.5b", uniform_cluster(2, 4, "l40s")),
    ("llama2-7b", build_cluster([NodeGpus("a100-40gb", 8), NodeGpus("h100-sxm", 8)])),
]


@pytest.fixture(scope="module", params=SCENARIOS, ids=[name for name, _ in SCENARIOS])
def scenario(request: pytest.FixtureRequest) -> tuple[PlanCluster, PlanResult]:
    name, cluster = request.param
    return cluster, plan(model(name), training(name, 256), cluster)


def test_degrees_multiply_to_the_world_size(scenario: tuple[PlanCluster, PlanResult]) -> None:
    cluster, result = scenario
    assert result.plans, "every scenario has a plan that fits"
    for p in (*result.plans, *result.rejected):
        k = p.knobs
        assert k.dp * k.tp * k.pp == cluster.world_size
        assert k.micro_batch_size * k.grad_accum_steps * k.dp == 256
        assert k.dp % k.shard_group_size == 0


def test_tensor_parallel_never_crosses_an_nvlink_domain(scenario: tuple[PlanCluster, PlanResult]) -> None:
    cluster, result = scenario
    for p in (*result.plans, *result.rejected):
        assert cluster.nvlink_domain_size % p.knobs.tp == 0
        for node in cluster.nodes:
            assert node.nvlink_domain_size % p.knobs.tp == 0


def test_fitting_plans_fit_and_rejected_ones_say_why(scenario: tuple[PlanCluster, PlanResult]) -> None:
    cluster, result = scenario
    for p in result.plans:
        assert p.fits and p.memory.required <= cluster.usable_memory_bytes and p.time is not None
    for p in result.rejected:
        assert not p.fits and p.time is None
        assert (
            re.match(
                r".+, tp=\d+, pp=\d+, dp=\d+, .*mbs=\d+.*: "
                r"needs [\d.]+ GiB of [\d.]+ GiB usable on \S+ "
                r"\(peak [\d.]+ with the allocator's margin\): .+ [\d.]+ GiB$",
                p.rejected_because,
            )
            or "host memory" in p.rejected_because
        )
        assert p.memory.required > cluster.usable_memory_bytes or "host memory" in p.rejected_because


def test_plans_are_ranked_by_throughput(scenario: tuple[PlanCluster, PlanResult]) -> None:
    _, result = scenario
    for tight in (False, True):  # the tight plans after the others, each by throughput
        speeds = [float(f"{p.time.tokens_per_s:.4g}") for p in result.plans if p.time and p.tight == tight]
        assert speeds == sorted(speeds, reverse=True)
    assert [p.tight for p in result.plans] == sorted(p.tight for p in result.plans)


def test_search_is_deterministic() -> None:
    name, cluster = SCENARIOS[1]
    first = plan(model(name), training(name), cluster)
    second = plan(model(name), training(name), uniform_cluster(8, 8, "NVIDIA H100 80GB HBM3"))
    assert [p.to_dict() for p in first.plans] == [p.to_dict() for p in second.plans]
    assert [p.rejected_because for p in first.rejected] == [p.rejected_because for p in second.rejected]


def test_more_gpus_never_make_model_states_per_gpu_larger() -> None:
    spec = model("llama3.1-70b")
    previous: dict[str, int] = {}
    for nodes in (4, 8, 16, 32):
        result = plan(spec, training("llama3.1-70b", 512), uniform_cluster(nodes, 8, "h100-sxm"))
        smallest: dict[str, int] = {}
        for p in (*result.plans, *result.rejected):
            key = p.knobs.strategy
            smallest[key] = min(smallest.get(key, p.memory.model_states), p.memory.model_states)
        for key, value in smallest.items():
            assert value <= previous.get(key, value), (nodes, key)
        previous = smallest


def test_the_reason_reads_like_the_issue() -> None:
    name = "llama3.1-70b"
    pins = Pins(strategy="zero2", tp=1, pp=1, micro_batch_size=4, activation_checkpointing="none", offload="none")
    result = plan(model(name), training(name, 512), uniform_cluster(8, 8, "h100-sxm"), pins)
    assert result.considered == 1 and not result.plans
    reason = result.rejected[0].rejected_because
    assert reason.startswith("ZeRO-2, tp=1, pp=1, dp=64, mbs=4, gas=2, AC none: needs ")
    assert " GiB of 79.6 GiB usable on H100-SXM (peak " in reason
    assert result.suggestions  # what would fit instead


def test_deepspeed_zero2_and_zero3_never_get_a_pipeline() -> None:
    result = plan(
        model("llama3.1-70b"), training("llama3.1-70b", 512), uniform_cluster(8, 8, "h100-sxm"), Pins(strategy="zero2")
    )
    assert {p.knobs.pp for p in (*result.plans, *result.rejected)} == {1}


def test_all_knobs_pinned_evaluates_exactly_that_configuration() -> None:
    pins = Pins(
        strategy="fsdp-full",
        tp=2,
        pp=1,
        shard_group_size=None,
        micro_batch_size=2,
        grad_accum_steps=8,
        activation_checkpointing="full",
        offload="none",
    )
    result = plan(model("llama3.1-8b"), training("llama3.1-8b", 64), uniform_cluster(1, 8, "h100-sxm"), pins)
    assert result.considered == 1
    (only,) = result.plans
    assert (only.knobs.strategy, only.knobs.tp, only.knobs.dp, only.knobs.micro_batch_size) == ("fsdp-full", 2, 4, 2)


def test_a_pinned_shard_group_means_hybrid_sharding() -> None:
    result = plan(
        model("llama3.1-8b"), training("llama3.1-8b", 512), uniform_cluster(4, 8, "h100-sxm"), Pins(shard_group_size=8)
    )
    assert {(p.knobs.strategy, p.knobs.shard_group_size) for p in result.plans} == {("fsdp-hybrid", 8)}


def test_hybrid_shard_groups_align_with_domains_or_nodes() -> None:
    result = plan(
        model("llama3.1-8b"),
        training("llama3.1-8b", 512),
        uniform_cluster(8, 8, "h100-sxm"),
        Pins(strategy="fsdp-hybrid"),
    )
    groups = {(p.knobs.tp, p.knobs.shard_group_size) for p in (*result.plans, *result.rejected)}
    assert groups
    for tp, group in groups:
        assert (tp * group) % 8 == 0


def test_heterogeneous_cluster_is_bounded_by_its_smallest_and_slowest_node() -> None:
    cluster = build_cluster([NodeGpus("h100-sxm", 8, host="h1"), NodeGpus("a100-40gb", 8, host="a1")])
    result = plan(model("llama2-7b"), training("llama2-7b", 256), cluster)
    assert result.bounded_by == (
        "memory bounded by a1 8x A100-SXM4-40GB (39.6 GiB); speed bounded by a1 8x A100-SXM4-40GB (39.6 GiB)"
    )
    assert all(p.memory.required <= 40536 * 2**20 for p in result.plans)
    uniform_a100 = plan(model("llama2-7b"), training("llama2-7b", 256), uniform_cluster(2, 8, "a100-40gb"))
    assert result.plans[0].knobs == uniform_a100.plans[0].knobs  # the fast nodes cannot help


def test_nothing_fits_says_what_would() -> None:
    name = "llama3.1-405b"
    result = plan(model(name), training(name, 1024), uniform_cluster(1, 8, "a100-40gb"))
    assert not result.plans and result.rejected
    assert any(re.match(r"on \d+ nodes \(\d+ GPUs\), e.g. .* \([\d,]+ tokens/s\)$", s) for s in result.suggestions)
    # The closest still get a speed, had they fitted; they stay rejected.
    closest = result.rejected[:CLOSEST_TIMED]
    assert all(p.time is not None and p.time.tokens_per_s > 0 and not p.fits for p in closest)
    assert all(p.time is None for p in result.rejected[CLOSEST_TIMED:])


def test_params_only_plans_model_states() -> None:
    result = plan(
        PlanModel(7_500_000_000),
        TrainingSpec(0, None, precision="fp16"),
        uniform_cluster(8, 8, "v100-32gb"),
        Pins(),
        Assumptions(),
    )
    for p in result.plans:
        assert p.time is None and p.memory.activations == 0 and p.knobs.tp == p.knobs.pp == 1
    zero3 = next(p for p in result.plans if p.knobs.strategy == "zero3" and p.knobs.offload == "none")
    assert zero3.memory.model_states == model_states(7_500_000_000, "zero3", 64).total


@pytest.mark.parametrize(
    ("pins", "cluster", "message"),
    [
        (Pins(tp=3), uniform_cluster(1, 8, "h100-sxm"), "tp=3 does not divide the world size 8"),
        (Pins(tp=16), uniform_cluster(2, 8, "h100-sxm"), "tp=16 would cross an NVLink domain (8 GPU(s) per domain"),
        (Pins(tp=2), uniform_cluster(1, 8, "l40s"), "tp=2 would cross an NVLink domain (1 GPU(s) per domain"),
        (Pins(pp=64), uniform_cluster(8, 8, "h100-sxm"), "pp=64 is more than the 32 layers"),
        (
            Pins(strategy="zero2", offload="optimizer+params"),
            uniform_cluster(1, 8, "h100-sxm"),
            "ZeRO-2 cannot offload 'optimizer+params'",
        ),
        (
            Pins(micro_batch_size=3),
            uniform_cluster(1, 8, "h100-sxm"),
            "no configuration of 8 GPUs makes a global batch",
        ),
        (
            Pins(strategy="zero3", pp=2),
            uniform_cluster(1, 8, "h100-sxm"),
            "ZeRO-3 cannot run with pipeline parallelism",
        ),
        (Pins(strategy="zero3", shard_group_size=8), uniform_cluster(2, 8, "h100-sxm"), "applies to fsdp-hybrid"),
    ],
)
def test_impossible_pins_are_errors(pins: Pins, cluster: PlanCluster, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        plan(model("llama3.1-8b"), training("llama3.1-8b", 512), cluster, pins)
    assert message in caught.value.message


def test_v100_has_no_bf16() -> None:
    with pytest.raises(ConfigError, match="V100-SXM2-32GB has no bf16 support"):
        plan(model("gpt2-1.5b"), training("gpt2-1.5b"), uniform_cluster(1, 8, "v100-32gb"))
    fp16 = plan(model("gpt2-1.5b"), training("gpt2-1.5b", precision="fp16"), uniform_cluster(1, 8, "v100-32gb"))
    assert fp16.plans


def test_tiny_fits_one_gpu_and_the_plan_file_round_trips() -> None:
    tiny = model("tiny")
    train = TrainingSpec(128, 32, precision="fp32", flash_attention=False)
    cluster = uniform_cluster(1, 1, "l4")
    result = plan(tiny, train, cluster)
    best = result.best
    assert best is not None and best.knobs.strategy == "ddp" and best.knobs.world_size == 1
    document = plan_file(result, tiny, cluster).to_dict()
    restored = PlanFile.from_dict(document, "plan.yaml")
    assert restored.knobs == best.knobs
    assert restored.model == tiny.spec
    assert restored.cluster.gpu == "l4" and restored.cluster.gpu_memory_bytes == 23034 * 2**20
    assert restored.predicted["memory"]["peak"] == best.memory.peak


def test_tight_plans_rank_after_the_ones_that_fit_with_the_allocator_margin() -> None:
    # A plan whose peak overflows the GPU only by the allocator's cache margin still trains (the
    # allocator frees its cache and retries before it fails), but it is never preferred.
    result = plan(model("llama3.1-70b"), training("llama3.1-70b", 512), uniform_cluster(8, 8, "h100-sxm"))
    tight = [p.tight for p in result.plans]
    assert any(tight) and not tight[0] and tight == sorted(tight)
    for p in result.plans:
        assert p.memory.required <= p.usable_bytes and p.tight == (p.memory.peak > p.usable_bytes)
