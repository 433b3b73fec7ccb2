"""The kernel model: GEMMs by shape, attention by kernel, HBM traffic, launches (on values)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.blocktime import KernelModel
from fstrain.core.plan.fit import MemoryRun, TimeRun, fit_constants
from fstrain.core.plan.gemmcurve import GemmPoint, MeasuredGemmCurve
from fstrain.core.plan.kernelcost import (
    LARGE_GEMM_PEAK_FRACTION,
    GemmPricer,
    GpuRates,
    PublishedGemmCurve,
    eager_attention_s,
    flash_attention_s,
    generation,
)
from fstrain.core.plan.plancluster import uniform_cluster
from fstrain.core.plan.planner import Pins, PlanModel, TrainingSpec, plan
from fstrain.core.plan.schema import PlanKnobs
from fstrain.io.recipes import load_shipped_recipe

H100 = GpuRates("h100-sxm", (("bf16", 989.4e12), ("fp16", 989.4e12), ("fp8", 1978.9e12), ("fp32", 67e12)), 3350e9)


def test_a_large_square_gemm_reaches_the_measured_fraction_and_small_ones_far_less() -> None:
    curve = PublishedGemmCurve(H100)
    # 8192^3: 64 x 64 tiles = 4096 = 31.03 waves of 132 SMs -> 32 waves, 4096/4224 of them full.
    big = curve.tflops(8192, 8192, 8192, "bf16")
    assert big == pytest.approx(989.4 * LARGE_GEMM_PEAK_FRACTION * 4096 / (32 * 132))
    # One wave of 16 tiles on 132 SMs: an eighth of the GPU works.
    assert curve.tflops(512, 512, 8192, "bf16") == pytest.approx(989.4 * LARGE_GEMM_PEAK_FRACTION * 16 / 132)
    # A skinny GEMM (one token row) can at best read its weight once (2 bytes x K x N) at the HBM
    # rate, and its one row of 64 tiles is a single wave on 64 of the 132 SMs: it is the slower.
    skinny = curve.tflops(1, 8192, 8192, "bf16")
    weight_s = 2 * (8192 + 8192 * 8192 + 8192) / (3350e9 * 0.89)
    wave_s = 2 * 8192 * 132 * 128 * 128 / (989.4e12 * LARGE_GEMM_PEAK_FRACTION)
    assert wave_s > weight_s
    assert skinny == pytest.approx(2 * 8192 * 8192 / wave_s / 1e12)
    assert skinny < 0.01 * big
    assert curve.tflops(8192, 8192, 8192, "fp8") == pytest.approx(big * 1978.9 / 989.4)
    assert curve.tflops(0, 8, 8, "bf16") == 0.0


def test_a_linear_prices_its_three_gemms_and_caches_each_shape() -> None:
    calls: list[tuple[int, int, int, str]] = []

    class Flat:
        def tflops(self, m: int, n: int, k: int, dtype: str) -> float:
            calls.append((m, n, k, dtype))
            return 100.0

    pricer = GemmPricer(Flat())
    forward, backward = pricer.linear(4096, 1024, 2048, "bf16")
    assert forward == pytest.approx(2 * 4096 * 1024 * 2048 / 100e12)
    assert backward == pytest.approx(2 * forward)
    assert calls == [(4096, 2048, 1024, "bf16"), (4096, 1024, 2048, "bf16"), (1024, 2048, 4096, "bf16")]
    pricer.linear(4096, 1024, 2048, "bf16")
    assert len(calls) == 3


def test_attention_kernels() -> None:
    flops = 1e15
    forward, backward = flash_attention_s(H100, "bf16", flops, 8192, causal=False)
    assert forward == pytest.approx(flops / (989.4e12 * 0.33 * 8192 / (8192 + 512)))
    assert backward == pytest.approx(2.5 * forward)
    assert flash_attention_s(H100, "bf16", flops, 8192, causal=True)[0] == pytest.approx(forward / 2)
    a100 = replace(H100, name="a100-80gb")
    assert flash_attention_s(a100, "bf16", flops, 8192, causal=False)[0] == pytest.approx(forward * 0.33 / 0.60)
    # Eager: batched QK^T and AV on the curve, plus the s x s scores' traffic (bf16 without
    # dropout: scale, mask and softmax read and write 2 bytes each; backward softmax 6, scale 4).
    pricer = GemmPricer(PublishedGemmCurve(H100))
    eager_forward, eager_backward = eager_attention_s(pricer, 3e12, "bf16", 32, 2048, 128)
    elements = 32 * 2048 * 2048
    gemms = pricer.seconds(32 * 2048, 2048, 128, "bf16") + pricer.seconds(32 * 2048, 128, 2048, "bf16")
    assert eager_forward == pytest.approx(gemms + elements * 12 / 3e12)
    assert eager_backward == pytest.approx(2 * gemms + elements * 10 / 3e12)
    # Dropout and autocast's fp32 softmax add to both passes.
    amp_forward, amp_backward = eager_attention_s(pricer, 3e12, "bf16", 32, 2048, 128, autocast=True, dropout=True)
    assert amp_forward == pytest.approx(gemms + elements * 33 / 3e12)
    assert amp_backward == pytest.approx(2 * gemms + elements * 37 / 3e12)


def test_generations() -> None:
    assert [generation(n) for n in ("v100-32gb", "a100-80gb", "l40s", "h100-sxm", "h200", "b200")] == [
        "volta", "ampere", "ampere", "hopper", "hopper", "hopper"]


def test_small_models_are_bound_by_kernel_launches_and_large_ones_by_gemms() -> None:
    model = KernelModel(H100, replace(Assumptions(), compute_time_scale=1.0))
    tiny = load_shipped_recipe("tiny").model
    big = load_shipped_recipe("llama3.1-8b").model
    knobs = PlanKnobs("fsdp-full", 3, 8, 1, 1, 8, 1, 1, seq_len=128)
    small = model.micro_batch(tiny, knobs, tiny.num_layers)
    assert small.launch_s > small.gemm_s + small.attention_s + small.memory_s
    large = model.micro_batch(big, replace(knobs, seq_len=8192, micro_batch_size=2), big.num_layers)
    assert large.launch_s == 0.0 and large.gemm_s > large.attention_s > large.memory_s > 0
    # Full recompute runs every forward again: GEMM time grows by a third (forward = 1/3 of it).
    full = model.micro_batch(big, replace(knobs, seq_len=8192, micro_batch_size=2, activation_checkpointing="full"),
                             big.num_layers)
    assert 1.25 < full.gemm_s / large.gemm_s < 1.34


def test_a_measured_gemm_curve_replaces_the_published_one_for_the_dtypes_it_measured() -> None:
    spec = load_shipped_recipe("llama3.1-8b").model
    cluster = uniform_cluster(1, 8, "h100-sxm")
    training = TrainingSpec(8192, 16, "bf16")
    pins = Pins(strategy="fsdp-full", tp=1, pp=1, micro_batch_size=1, activation_checkpointing="full", offload="none")
    slow_bf16 = MeasuredGemmCurve((GemmPoint(4096, 4096, 4096, "bf16", 300.0),), "NVIDIA H100 80GB HBM3")
    only_fp32 = MeasuredGemmCurve((GemmPoint(4096, 4096, 4096, "fp32", 30.0),), "NVIDIA H100 80GB HBM3")
    published = plan(PlanModel.from_spec(spec), training, cluster, pins).best
    measured = plan(PlanModel.from_spec(spec), training, cluster, pins, Assumptions(gemm_curve=slow_bf16)).best
    other = plan(PlanModel.from_spec(spec), training, cluster, pins, Assumptions(gemm_curve=only_fp32)).best
    assert published and measured and other and published.time and measured.time and other.time
    assert measured.time.gemm_s > published.time.gemm_s
    assert measured.time.attention_s == published.time.attention_s
    assert other.time.gemm_s == published.time.gemm_s  # no bf16 points: the published curve prices bf16
    # --mfu prices compute from FLOPs instead: no kernel terms.
    by_mfu = plan(PlanModel.from_spec(spec), training, cluster, pins, replace(Assumptions(), mfu=0.4)).best
    assert by_mfu and by_mfu.time and by_mfu.time.gemm_s == 0.0 and by_mfu.time.compute_s > 0


def test_fit_takes_medians_by_generation_and_falls_back_to_all() -> None:
    times = [TimeRun("a", "hopper", 3.0, 1.0, 1.0), TimeRun("a", "hopper", 5.0, 1.0, 2.0),
             TimeRun("b", "ampere", 2.0, 0.0, 2.0), TimeRun("b", "ampere", 1.0, 2.0, 1.0)]  # last: no scale fits
    # (reserved - live) / (live - persistent): 2/5, 3/5, 1/5; the last run has nothing transient.
    memories = [MemoryRun("a", 12.0, 10.0, 5.0), MemoryRun("b", 13.0, 10.0, 5.0), MemoryRun("b", 11.0, 10.0, 5.0),
                MemoryRun("c", 11.0, 10.0, 10.0)]
    fitted = fit_constants(times, memories)
    assert fitted.compute_time_scale == {"all": 2.0, "hopper": 2.0, "ampere": 1.0}
    assert fitted.fragmentation_fraction == pytest.approx(0.4)
    assert fitted.scale_for("volta") == 2.0
    with pytest.raises(ValueError):
        fit_constants([], memories)
