"""The measured GEMM curve and the GEMM shapes of a model, on values."""

from __future__ import annotations

import math

import pytest

from fstrain.core.plan.gemmcurve import GemmPoint, MeasuredGemmCurve, dtype_name
from fstrain.core.plan.gemmshapes import GemmShape, model_gemms
from fstrain.core.plan.memory import block_matmuls
from fstrain.errors import InputError
from fstrain.io.recipes import load_shipped_recipe

# A curve with the shape of a GPU's: small squares far below the plateau, a skinny shape below it.
POINTS = (
    GemmPoint(1024, 1024, 1024, "bf16", 200.0),
    GemmPoint(4096, 4096, 4096, "bf16", 600.0),
    GemmPoint(8192, 8192, 8192, "bf16", 700.0),
    GemmPoint(128, 8192, 8192, "bf16", 150.0),
    GemmPoint(4096, 4096, 4096, "fp32", 50.0),
)
CURVE = MeasuredGemmCurve(POINTS, device_name="NVIDIA H200")


def test_a_measured_shape_reads_back_its_rate() -> None:
    for p in POINTS:
        assert CURVE.tflops(p.m, p.n, p.k, p.dtype) == p.tflops
    # torch's dtype names are the same dtype.
    assert CURVE.tflops(8192, 8192, 8192, "bfloat16") == CURVE.tflops(8192, 8192, 8192, "torch.bfloat16") == 700.0


def test_between_measured_shapes_the_nearest_weigh_most() -> None:
    # 2048^3 lies one log2 step per side from both 1024^3 and 4096^3 (sqrt(3) each) and further
    # from the others: between their rates.
    middle = CURVE.tflops(2048, 2048, 2048, "bf16")
    assert 200.0 < middle < 600.0
    # Inverse distance squared over the four nearest, as a weighted geometric mean, by hand.
    here = (11.0, 11.0, 11.0)
    near = sorted((math.dist(here, (math.log2(p.m), math.log2(p.n), math.log2(p.k))), p.tflops)
                  for p in POINTS if p.dtype == "bf16")[:4]
    weights = [1 / d**2 for d, _ in near]
    expected = math.exp(sum(w * math.log(t) for w, (_, t) in zip(weights, near, strict=True)) / sum(weights))
    assert middle == pytest.approx(expected)
    # Closer to a point, closer to its rate.
    assert abs(CURVE.tflops(7000, 7000, 7000, "bf16") - 700) < abs(CURVE.tflops(5000, 5000, 5000, "bf16") - 700)
    # A skinny shape near the measured skinny one takes its low rate, not the plateau's.
    assert CURVE.tflops(160, 8192, 8192, "bf16") < 250.0


@pytest.mark.parametrize("shape", [(1, 1, 1), (16, 16, 16), (65536, 65536, 65536), (8192, 8192, 1 << 20),
                                   (3000, 17, 9000)])
def test_never_above_the_best_measured_rate_nor_below_the_worst(shape: tuple[int, int, int]) -> None:
    rate = CURVE.tflops(*shape, "bf16")
    assert 150.0 <= rate <= CURVE.best_tflops("bf16") == 700.0


def test_one_point_answers_its_rate_everywhere() -> None:
    one = MeasuredGemmCurve((GemmPoint(8192, 8192, 8192, "bfloat16", 687.0),))
    assert one.tflops(8192, 8192, 8192, "bf16") == 687.0
    assert one.tflops(512, 4096, 11008, "bf16") == pytest.approx(687.0)


def test_a_shape_measured_twice_keeps_its_slower_rate() -> None:
    twice = MeasuredGemmCurve((GemmPoint(64, 64, 64, "fp32", 2.0), GemmPoint(64, 64, 64, "float32", 1.5)))
    assert len(twice.points) == 1 and twice.tflops(64, 64, 64, "fp32") == 1.5


def test_bad_input_is_one_clear_error() -> None:
    with pytest.raises(InputError, match="the GEMM curve has no measured points") as caught:
        MeasuredGemmCurve(())
    assert "fstrain bench --suite compute" in caught.value.hint
    with pytest.raises(InputError, match=r"the GEMM curve from NVIDIA H200 has no fp16 points \(measured: bf16, "
                                         r"fp32\)") as other:
        CURVE.tflops(4096, 4096, 4096, "float16")
    assert "--gemm-dtype fp16" in other.value.hint
    with pytest.raises(InputError, match="unknown GEMM dtype 'int8'"):
        CURVE.tflops(4096, 4096, 4096, "int8")
    with pytest.raises(InputError, match="a GEMM needs positive sizes, got 0x4096x4096"):
        CURVE.tflops(0, 4096, 4096, "bf16")
    for bad in (GemmPoint(0, 1, 1, "bf16", 1.0), GemmPoint(1, 1, 1, "bf16", 0.0),
                GemmPoint(1, 1, 1, "bf16", float("nan"))):
        with pytest.raises(InputError, match="a measured GEMM needs positive sizes and rate"):
            MeasuredGemmCurve((bad,), source="b.json")
    assert dtype_name("BFloat16") == "bf16"


def test_the_curve_is_plain_data_for_the_plan_document() -> None:
    from dataclasses import asdict

    data = asdict(CURVE)
    assert data["device_name"] == "NVIDIA H200" and len(data["points"]) == 5
    assert data["points"][0] == {"m": 1024, "n": 1024, "k": 1024, "dtype": "bf16", "tflops": 200.0}
    assert str(CURVE) == "5 GEMMs from NVIDIA H200"


def test_llama_block_shapes_forward_and_both_backward_gemms() -> None:
    llama = load_shipped_recipe("llama3.1-8b").model  # hidden 4096, 8 kv heads of 128, FFN 14336, vocab 128256
    shapes = model_gemms(llama, 8192)
    by_shape = {(s.m, s.n, s.k): s.label for s in shapes}
    assert by_shape[(8192, 4096, 4096)] == "q fwd, q dgrad, o fwd, o dgrad"
    assert by_shape[(8192, 1024, 4096)] == "k fwd, v fwd"
    assert by_shape[(1024, 4096, 8192)] == "k wgrad, v wgrad"  # dW = dy^T x: (out, in, tokens)
    assert by_shape[(8192, 14336, 4096)] == "gate fwd, up fwd, down dgrad"
    assert by_shape[(4096, 14336, 8192)] == "down wgrad"
    assert by_shape[(128256, 4096, 8192)] == "head wgrad"
    # Every linear of block_matmuls is there three times: one source of the shapes.
    labels = [label for s in shapes for label in s.label.split(", ") if not label.startswith("head")]
    assert len(labels) == 3 * len(block_matmuls(llama))
    # A block's GEMM FLOPs are 3 x 2 x tokens x its weights (forward + two backward GEMMs).
    weights = sum(n_in * n_out for n_in, n_out in block_matmuls(llama))
    flops = sum(s.flops * len(s.label.split(", ")) for s in shapes if "head" not in s.label)
    assert flops == 3 * 2 * 8192 * weights


def test_tensor_parallel_splits_columns_and_rows_and_moe_splits_tokens() -> None:
    llama = load_shipped_recipe("llama3.1-8b").model
    by_label = {label: (s.m, s.n, s.k) for s in model_gemms(llama, 4096, tp=4) for label in s.label.split(", ")}
    assert by_label["q fwd"] == (4096, 1024, 4096)  # column-parallel: out / tp
    assert by_label["o fwd"] == (4096, 4096, 1024)  # row-parallel: in / tp
    assert by_label["head fwd"] == (4096, 128256 // 4, 4096)
    mixtral = load_shipped_recipe("mixtral-8x7b").model  # 8 experts, top 2
    moe = {label: (s.m, s.n, s.k) for s in model_gemms(mixtral, 4096) for label in s.label.split(", ")}
    assert moe["expert gate fwd"][0] == 4096 * 2 // 8 and moe["q fwd"][0] == 4096
    with pytest.raises(InputError, match="3 does not divide the q projection's width 4096"):
        model_gemms(llama, 4096, tp=3)
    with pytest.raises(InputError, match="tokens and tp must be at least 1"):
        model_gemms(llama, 0)
    assert GemmShape(2, 3, 4).flops == 48
