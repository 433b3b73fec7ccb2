"""The compute suite's GEMM-shape sweep, on values: the grid, the worker's argument, the document."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fstrain.core.bench.gemm import (
    CPU_GRID_TOP,
    default_grid,
    format_shapes,
    gemm_curve,
    gemm_lines,
    gemm_rows,
    parse_flops,
    parse_shapes,
)
from fstrain.core.bench.report import analysis
from fstrain.core.plan.gemmshapes import GemmShape, model_gemms
from fstrain.errors import InputError
from fstrain.io.recipes import load_shipped_recipe

H200_COMPUTE = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200-2026-11-30" / "bench-compute.json"


def test_default_grid_is_small_to_large_square_and_skinny() -> None:
    grid = default_grid(8192)
    squares = [s.m for s in grid if s.label == "square"]
    assert squares == [256, 512, 1024, 2048, 4096, 8192]
    assert {(s.m, s.n, s.k) for s in grid if s.label == "few rows"} == {(128, 8192, 8192), (512, 8192, 8192),
                                                                        (2048, 8192, 8192)}
    assert {(s.m, s.n, s.k) for s in grid if s.label == "narrow output"} == {(8192, 512, 8192), (8192, 1024, 8192)}
    assert [(s.m, s.n, s.k) for s in grid if s.label == "long inner"] == [(2048, 2048, 32768)]
    # On a CPU every shape is small enough to time in a fraction of a second.
    assert max(s.flops for s in default_grid(CPU_GRID_TOP)) <= 2 * 512**3


def test_shapes_travel_as_one_argument_and_back() -> None:
    shapes = model_gemms(load_shipped_recipe("llama3.1-8b").model, 4096, tp=2)
    text = format_shapes(shapes)
    assert parse_shapes(text) == shapes
    assert parse_shapes("8x16x32") == [GemmShape(8, 16, 32, "")]
    for bad, part in (("8x16", "8x16"), ("8x16x32;0x1x1", "0x1x1"), ("axbxc=q", "axbxc=q")):
        with pytest.raises(InputError, match=f"cannot read '{part}' as a GEMM shape") as caught:
            parse_shapes(bad)
        assert caught.value.where == "--gemm-shapes"
    with pytest.raises(InputError, match="no GEMM shapes given"):
        parse_shapes(" ; ")
    assert parse_flops("2e10") == 2e10
    with pytest.raises(InputError, match="cannot read 'lots' as a positive FLOP count"):
        parse_flops("lots")
    with pytest.raises(InputError, match="cannot read '-1' as a positive FLOP count"):
        parse_flops("-1")


def _point(m: int, n: int, k: int, tflops: float, label: str = "") -> dict[str, Any]:
    return {"m": m, "n": n, "k": k, "dtype": "bfloat16", "label": label, "tflops": {"median": tflops}}


def _swept(**gemm: Any) -> dict[str, Any]:
    per_rank = [
        {"rank": 0, "device": "cuda:0", "device_name": "NVIDIA H200",
         "points": [_point(4096, 4096, 4096, 600.0, "q fwd"), _point(128, 4096, 4096, 90.0, "few")]},
        {"rank": 1, "device": "cuda:1", "device_name": "NVIDIA H200",
         "points": [_point(4096, 4096, 4096, 550.0, "q fwd"), _point(128, 4096, 4096, 95.0, "few")]},
    ]
    return {"schema": "fstrain.bench/1", "ranks": [], "compute": {"per_rank": [], "gemm": {
        "grid": "model", "dtype": "bfloat16", "max_gemm_flops": None, "skipped": [],
        "model": {"name": "llama", "seq_len": 4096, "micro_batch": 1, "tp": 1}, "per_rank": per_rank, **gemm}}}


def test_each_shape_at_its_slowest_rank_and_its_share_of_the_best() -> None:
    doc = _swept()
    rows = gemm_rows(doc)
    assert [(r.m, r.tflops, r.rank) for r in rows] == [(4096, 550.0, 1), (128, 90.0, 0)]
    shapes = analysis(doc)["gemm"]["shapes"]
    assert [s["fraction_of_best"] for s in shapes] == pytest.approx([1.0, 90 / 550])
    curve = gemm_curve(doc, "b.json")
    assert curve is not None and curve.device_name == "NVIDIA H200" and curve.device_type == "cuda"
    assert curve.tflops(4096, 4096, 4096, "bf16") == 550.0 and curve.source == "b.json (GEMM-shape sweep)"
    lines = gemm_lines(doc)
    assert lines[0] == "compute: GEMM TFLOP/s, llama at 1 x 4096 tokens, tp 1, bfloat16 on NVIDIA H200, " \
                       "slowest rank per shape"
    assert lines[2].split() == ["4096x4096x4096", "q", "fwd", "550", "100", "%"]
    assert lines[3].split()[-3:] == ["90", "16", "%"]


def test_shapes_over_the_cap_or_out_of_memory_are_listed_as_not_timed() -> None:
    doc = _swept(max_gemm_flops=1e9, skipped=[{"m": 8192, "n": 8192, "k": 8192, "label": "square", "flops": 2**40}])
    doc["compute"]["gemm"]["per_rank"][1]["out_of_memory"] = [{"m": 65536, "n": 4096, "k": 8192, "label": "head"}]
    assert gemm_lines(doc)[-2:] == ["not timed (over 1e+09 FLOPs, --max-gemm-flops): 8192x8192x8192 square",
                                    "not timed (out of memory on rank 1): 65536x4096x8192 head"]
    assert analysis(doc)["gemm"]["out_of_memory"] == [{"m": 65536, "n": 4096, "k": 8192, "label": "head", "rank": 1}]


def test_a_document_without_the_sweep_gives_its_square_matmul_as_the_curve() -> None:
    """The H200 capture (tests/fixtures/gpu/h200-2026-11-30) predates the sweep: one 8192^3 bf16 point."""
    doc = json.loads(H200_COMPUTE.read_text())
    assert gemm_rows(doc) == [] and gemm_lines(doc) == [] and "gemm" not in analysis(doc)
    curve = gemm_curve(doc, "bench-compute.json")
    assert curve is not None and curve.device_name == "NVIDIA H200"
    (point,) = curve.points
    assert (point.m, point.n, point.k, point.dtype) == (8192, 8192, 8192, "bf16")
    assert point.tflops == doc["compute"]["per_rank"][0]["matmul"]["tflops"]["median"]
    assert curve.source == "bench-compute.json (square matmul)"
    assert gemm_curve({"schema": "fstrain.bench/1", "collectives": {}}, "c.json") is None


def test_over_several_hosts_the_table_names_the_slowest_host_per_shape() -> None:
    doc = _swept()
    doc.update(num_nodes=2, ranks=[{"rank": 0, "hostname": "node1"}, {"rank": 1, "hostname": "node2"}])
    lines = gemm_lines(doc)
    assert lines[1].split()[-1] == "slowest"
    assert lines[2].split()[-2:] == ["node2", "r1"] and lines[3].split()[-2:] == ["node1", "r0"]
    assert [s["host"] for s in analysis(doc)["gemm"]["shapes"]] == ["node2", "node1"]
