"""plan --calibrate: which measured number replaces which assumption, on values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fstrain.core.calibrate.calibrate import calibrate
from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.gpus import lookup_gpu
from fstrain.core.plan.kernelcost import GpuRates
from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.plan.plancluster import uniform_cluster
from fstrain.core.plan.timemodel import flops_per_token
from fstrain.errors import InputError
from fstrain.io.recipes import load_shipped_recipe
from tests.helpers import run_fstrain

H100 = uniform_cluster(2, 8, "h100-sxm")  # NVLink 450 GB/s one way per GPU, 3200 Gb/s per node, MFU 0.45
TINY = load_shipped_recipe("tiny").model


def _scope(scope: str, groups: list[list[int]], busbw: float, collective: str = "all_reduce") -> dict[str, Any]:
    n = len(groups[0])
    factor = 2 * (n - 1) / n
    return {"scope": scope, "groups": groups, "results": [
        {"collective": collective, "size_bytes": 1 << 30, "group": g, "time_us": {"median": 1.0},
         "algbw_gbps": busbw / factor, "busbw_gbps": busbw} for g in range(len(groups))]}


def _gpu(rank: int, tflops: float) -> dict[str, Any]:
    return {"rank": rank, "device": f"cuda:{rank}", "device_name": "NVIDIA H100 80GB HBM3",
            "matmul": {"dtype": "bfloat16", "size": 8192, "tflops": {"median": tflops}},
            "memory": {"gbps": {"median": 3000.0}}}


def h200_rates() -> GpuRates:
    gpu = lookup_gpu("h200")
    return GpuRates(gpu.name, tuple((d, gpu.peak_flops(d)) for d in ("bf16", "fp16", "fp8", "fp32")),
                    gpu.hbm_bandwidth_bytes_per_s)


def bench(**parts: Any) -> dict[str, Any]:
    return {"schema": "fstrain.bench/1", "backend": "nccl", "device_type": "cuda", "ranks": [], **parts}


def test_one_gpu_node_sets_efficiency_and_the_slowest_gpus_gemm_rate() -> None:
    doc = bench(world_size=8, num_nodes=1,
                collectives={"scopes": [_scope("world", [list(range(8))], 360.0)]},
                compute={"per_rank": [_gpu(r, 600.0 if r == 3 else 700.0) for r in range(8)]})
    result = calibrate(doc, "b.json", assumptions=Assumptions(), cluster=H100, precision="bf16", model=None)
    names = {r.name: r for r in result.replaced}
    assert set(names) == {"collective_efficiency"}
    assert result.assumptions.collective_efficiency == pytest.approx(360 / 450)
    # The matmul rate prices GEMMs at the slowest GPU's rate; no mfu, which would turn off the kernel model.
    assert result.assumptions.mfu == 0.0
    curve = result.assumptions.gemm_curve
    assert curve is not None and [p.tflops for p in curve.points] == [600.0]
    assert result.cluster is H100 and result.kind == "bench"


def test_inter_node_groups_count_what_one_node_carries() -> None:
    doc = bench(world_size=16, num_nodes=2, collectives={"scopes": [
        _scope("intra_node", [list(range(8)), list(range(8, 16))], 405.0),
        _scope("inter_node", [[k, k + 8] for k in range(8)], 40.0)]})
    result = calibrate(doc, "b.json", assumptions=Assumptions(), cluster=H100, precision="bf16", model=None)
    eff = 405 / 450
    assert result.assumptions.collective_efficiency == pytest.approx(eff)
    # 40 GB/s per rank x 8 ranks of a node at once x 8 bits, over the efficiency the model applies again.
    assert [n.inter_node_gbps for n in result.cluster.nodes] == pytest.approx([40 * 8 * 8 / eff] * 2)
    assert {n.inter_node_source for n in result.cluster.nodes} == {"fstrain bench"}
    # The model's effective inter-node bandwidth per GPU is the measured bus bandwidth.
    links = result.cluster.links()
    assert links.inter_node_bytes_per_s * result.assumptions.collective_efficiency == pytest.approx(40e9)


def test_cpu_bench_calibrates_only_the_network() -> None:
    doc = bench(backend="gloo", device_type="cpu", world_size=3, num_nodes=3,
                collectives={"scopes": [_scope("world", [[0, 1, 2]], 0.5)]},
                compute={"per_rank": [{**_gpu(0, 0.05), "device": "cpu", "device_name": "x86_64"}]},
                pairs={"links": [{"src": "a", "dst": "b", "samples_gbps": [1.0]}]})
    result = calibrate(doc, "b.json", assumptions=Assumptions(), cluster=H100, precision="bf16", model=None)
    assert [r.name for r in result.replaced] == ["inter_node_gbps"]  # world with one rank per node first
    assert result.cluster.nodes[0].inter_node_gbps == pytest.approx(0.5 * 8 / 0.8)
    assert result.assumptions == Assumptions()
    assert any("CPUs" in reason for reason in result.ignored)


def summary(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"device": "cuda", "world_size": 16, "model": "tiny", "micro_batch_size": 2,
                           "grad_accum_steps": 4, "tokens_per_step": 2 * 4 * 16 * 128, "tokens_per_s": 2.0e6,
                           "peak_memory_max_over_ranks": {"max_allocated_bytes": 40 << 30,
                                                          "max_reserved_bytes": 46 << 30}}
    return {**doc, **changes}


def test_trainer_summary_sets_mfu_and_fragmentation() -> None:
    result = calibrate(summary(), "s.json", assumptions=Assumptions(), cluster=H100, precision="bf16", model=TINY)
    expected_mfu = 2.0e6 * flops_per_token(TINY, 128).training / (16 * 989.4e12)
    assert result.assumptions.mfu == pytest.approx(expected_mfu)
    # The allocator's cache over what a step frees: 16-way sharded parameters and AdamW states
    # are allocated once (bf16 mixed precision: a 4-byte master and 8 bytes of states a parameter).
    once = 12 * count_parameters(TINY).total / 16
    assert result.assumptions.fragmentation_fraction == pytest.approx((46 - 40) * 2**30 / (40 * 2**30 - once))
    assert result.kind == "trainer summary"
    no_model = calibrate(summary(), "s.json", assumptions=Assumptions(), cluster=H100, precision="bf16", model=None)
    assert no_model.assumptions.fragmentation_fraction == Assumptions().fragmentation_fraction
    assert any(r.startswith("fragmentation_fraction: the plan has no architecture") for r in no_model.ignored)


def test_trainer_summary_on_cpu_replaces_nothing() -> None:
    doc = summary(device="cpu", peak_memory_max_over_ranks={"max_rss_bytes": 1 << 30})
    result = calibrate(doc, "s.json", assumptions=Assumptions(), cluster=H100, precision="bf16", model=TINY)
    assert result.replaced == [] and result.assumptions == Assumptions()
    assert "cpu" in result.ignored[0]


def test_wrong_model_or_document_is_one_clear_error() -> None:
    with pytest.raises(InputError, match="the summary is of model 'tiny', the plan is for 'llama'") as caught:
        calibrate(summary(), "s.json", assumptions=Assumptions(), cluster=H100, precision="bf16",
                  model=load_shipped_recipe("tiny").model.__class__(**{**TINY.__dict__, "name": "llama"}))
    assert caught.value.where == "s.json"
    with pytest.raises(InputError, match="neither a bench document, a run's report nor a trainer summary"):
        calibrate({"x": 1}, "x.json", assumptions=Assumptions(), cluster=H100, precision="bf16", model=TINY)


def test_plan_cli_says_what_it_replaced_and_flags_win(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench(world_size=8, num_nodes=1,
                                     collectives={"scopes": [_scope("world", [list(range(8))], 315.0)]})))
    args = ["plan", "--model", "tiny", "--num-nodes", "1", "--gpu", "h100-sxm", "--calibrate", str(path)]
    shown = run_fstrain(*args)
    assert shown.returncode == 0, shown.stderr
    assert "calibrated collective_efficiency: 0.8 -> 0.7 (intra-node all_reduce" in shown.stderr
    as_json = run_fstrain(*args, "--json", "--assume", "collective_efficiency=0.5")
    document = json.loads(as_json.stdout)
    assert document["calibration"]["replaced"] == []
    assert json.loads(run_fstrain(*args, "--json").stdout)["calibration"]["replaced"][0]["new"] == pytest.approx(0.7)
    assert "collective_efficiency: --assume given, the flag wins" in document["calibration"]["ignored"]
    bad = run_fstrain("plan", "--model", "tiny", "--gpu", "h100-sxm", "--calibrate", str(tmp_path / "missing.json"))
    assert bad.returncode == 2
    assert bad.stderr.strip() == f"error: {tmp_path / 'missing.json'}: file not found (hint: check the path)"


GPU_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200-2026-11-30"


def test_a_real_h200_bench_document() -> None:
    """The compute suite as it ran on an H200 (tests/fixtures/gpu/h200-2026-11-30)."""
    from fstrain.core.bench.report import compute_rows

    doc = json.loads((GPU_RUN / "bench-compute.json").read_text())
    (row,) = compute_rows(doc)
    assert row.device_name == "NVIDIA H200" and row.peak_tflops == pytest.approx(989)
    assert row.tflops_fraction == pytest.approx(row.tflops / 989) and 0.5 < row.tflops_fraction < 0.9
    assert 0.8 < (row.memory_fraction or 0) < 1.0
    h200 = uniform_cluster(1, 1, "h200")
    result = calibrate(doc, "bench-compute.json", assumptions=Assumptions(), cluster=h200, precision="bf16",
                       model=None)
    assert result.replaced == [] and result.assumptions.mfu == 0.0
    # The capture predates the GEMM sweep: its curve is the one square bf16 matmul it timed.
    curve = result.assumptions.gemm_curve
    assert curve is not None and curve is result.gemm_curve and curve.device_name == "NVIDIA H200"
    assert [(p.m, p.n, p.k, p.dtype) for p in curve.points] == [(8192, 8192, 8192, "bf16")]
    assert curve.tflops(8192, 8192, 8192, "bf16") == pytest.approx(row.tflops)
    assert curve.tflops(8192, 1024, 4096, "bfloat16") == pytest.approx(row.tflops)  # one point: its rate everywhere
    # In the kernel model one point sets the level of the published curve, which keeps its shape:
    # a small GEMM is priced below the large one's rate, by the published curve's own ratio.
    from fstrain.core.plan.blocktime import KernelModel

    h200_kernels = KernelModel(h200_rates(), result.assumptions)
    published = KernelModel(h200_rates(), Assumptions())
    big, small = (8192, 8192, 8192), (512, 256, 512)
    assert h200_kernels.gemms.curve.tflops(*big, "bf16") == pytest.approx(row.tflops)
    ratio = row.tflops / published.gemms.curve.tflops(*big, "bf16")
    assert h200_kernels.gemms.curve.tflops(*small, "bf16") == pytest.approx(
        ratio * published.gemms.curve.tflops(*small, "bf16"))
    assert h200_kernels.gemms.curve.tflops(*small, "bf16") < 0.5 * row.tflops
    # Measured on an H200, it does not price an H100 plan.
    h100 = calibrate(doc, "bench-compute.json", assumptions=Assumptions(), cluster=H100, precision="bf16", model=None)
    assert h100.gemm_curve is None and h100.assumptions.gemm_curve is None
    assert "GEMM curve (1 GEMM from NVIDIA H200): measured on H200-SXM, and the plan is for H100-SXM: measure on " \
           "the plan's GPUs" in h100.ignored
    # One GPU has no link to measure: its collectives replace nothing.
    collectives = json.loads((GPU_RUN / "bench-collectives.json").read_text())
    assert calibrate(collectives, "c.json", assumptions=Assumptions(), cluster=h200, precision="bf16",
                     model=None).replaced == []


def _swept(device: str, device_name: str) -> dict[str, Any]:
    point = {"m": 256, "n": 128, "k": 128, "dtype": "float32", "label": "q fwd", "tflops": {"median": 0.05}}
    return bench(backend="gloo", device_type="cpu", world_size=1, num_nodes=1, compute={"per_rank": [], "gemm": {
        "per_rank": [{"rank": 0, "device": device, "device_name": device_name, "points": [point]}]}})


def test_a_curve_from_a_cpu_or_an_unknown_gpu_is_left_out_with_the_reason() -> None:
    cpu = calibrate(_swept("cpu", "x86_64"), "b.json", assumptions=Assumptions(), cluster=H100, precision="bf16",
                    model=None)
    assert cpu.gemm_curve is None and cpu.assumptions == Assumptions()
    assert cpu.ignored == ["GEMM curve (1 GEMM from x86_64): measured on a CPU, and the plan is for H100-SXM GPUs"]
    odd = calibrate(_swept("cuda:0", "Some GPU 9000"), "b.json", assumptions=Assumptions(), cluster=H100,
                    precision="bf16", model=None)
    assert odd.ignored == ["GEMM curve (1 GEMM from Some GPU 9000): Some GPU 9000 is not in the GPU table, so it "
                           "cannot be matched with the plan's H100-SXM"]
    mixed = _swept("cuda:0", "NVIDIA H100 80GB HBM3")
    mixed["compute"]["gemm"]["per_rank"].append({**mixed["compute"]["gemm"]["per_rank"][0], "rank": 1,
                                                 "device_name": "NVIDIA A100-SXM4-80GB"})
    assert calibrate(mixed, "b.json", assumptions=Assumptions(), cluster=H100, precision="bf16",
                     model=None).ignored[-1].endswith("measured on GPUs of several kinds: calibrate from a bench of "
                                                      "the plan's GPU kind alone")
    same = calibrate(_swept("cuda:0", "NVIDIA H100 80GB HBM3"), "b.json", assumptions=Assumptions(), cluster=H100,
                     precision="bf16", model=None)
    assert same.gemm_curve is not None and same.gemm_curve.tflops(256, 128, 128, "fp32") == 0.05
    assert same.gemm_curve.source == "b.json (GEMM-shape sweep)"


def test_the_curve_is_measured_not_assumed() -> None:
    from fstrain.core.plan.assumptions import with_overrides

    with pytest.raises(InputError, match="gemm_curve is measured, not a number to assume") as caught:
        with_overrides(Assumptions(), ["gemm_curve=600"])
    assert "--calibrate" in caught.value.hint


def test_plan_cli_says_where_the_gemm_curve_came_from() -> None:
    path = GPU_RUN / "bench-compute.json"
    shown = run_fstrain("plan", "--model", "llama3.1-8b", "--gpu", "h200", "--num-nodes", "1", "--calibrate", str(path))
    assert shown.returncode == 0, shown.stderr
    (line,) = [x for x in shown.stderr.splitlines() if x.startswith("calibrated gemm_curve")]
    assert line == (f"calibrated gemm_curve: 1 GEMM from NVIDIA H200 (bf16 best 687 TFLOP/s; {path} (square matmul))")
    document = json.loads(run_fstrain("plan", "--model", "llama3.1-8b", "--gpu", "h200", "--num-nodes", "1",
                                      "--calibrate", str(path), "--json").stdout)
    assert document["calibration"]["gemm_curve"]["device_name"] == "NVIDIA H200"
    assert document["calibration"]["gemm_curve"]["points"] == 1
    assert document["assumptions"]["gemm_curve"]["points"][0]["m"] == 8192


def test_host_adamw_is_summed_over_a_nodes_ranks_at_the_slowest_node() -> None:
    def rank(r: int, rate: float) -> dict[str, Any]:
        return {**_gpu(r, 700.0), "cpu_adamw": {"params_per_s": {"median": rate}}}

    doc = bench(world_size=4, num_nodes=2, ranks=[{"rank": r, "hostname": "ab"[r // 2]} for r in range(4)],
                compute={"per_rank": [rank(0, 1e8), rank(1, 1e8), rank(2, 2e8), rank(3, 2e8)]})
    result = calibrate(doc, "b.json", assumptions=Assumptions(), cluster=H100, precision="bf16", model=None)
    (host,) = [r for r in result.replaced if r.name == "torch_cpu_adamw_params_per_s_per_node"]
    assert host.new == pytest.approx(2e8) and "on a, 2 ranks" in host.source  # node a: 1e8 + 1e8
    assert result.assumptions.torch_cpu_adamw_params_per_s_per_node == pytest.approx(2e8)
    # a bench from before the measurement leaves the assumption alone
    older = bench(world_size=1, num_nodes=1, compute={"per_rank": [_gpu(0, 700.0)]})
    assert calibrate(older, "b.json", assumptions=Assumptions(), cluster=H100, precision="bf16",
                     model=None).assumptions.torch_cpu_adamw_params_per_s_per_node == pytest.approx(2e9 / 6)
