"""The host's time issuing a step, by hand: eager forward and backward ops, recompute, compile,
CUDA graphs, FSDP's unit collectives and the optimizer's loop, foreach and fused forms."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.blocktime import KernelModel
from fstrain.core.plan.hostlaunch import (
    HostCosts,
    kernels_host_s,
    optimizer_host_s,
    parameter_tensors,
    sharding_host_s,
)
from fstrain.core.plan.kernelcost import GpuRates
from fstrain.core.plan.schema import ModelSpec, PlanKnobs

EAGER = HostCosts(launch_s=4e-6, python_op_s=8e-6, eager_forward_op_s=40e-6)
LLAMA = ModelSpec("l", 32, 4096, 32, 8, 14336, "swiglu", 128256, 8192)


def test_eager_forward_kernels_cost_ten_times_backward_ones() -> None:
    # 100 forward kernels at 40 us, 200 backward kernels at 4 us
    assert kernels_host_s(100, 200, EAGER, 3) == pytest.approx(100 * 40e-6 + 200 * 4e-6)
    # a recomputed forward is eager forward again: +100 kernels at 40 us
    assert kernels_host_s(200, 200, EAGER, 3) - kernels_host_s(100, 200, EAGER, 3) == pytest.approx(4e-3)


def test_compile_drops_the_python_and_cuda_graphs_replay_one_launch_a_block_and_pass() -> None:
    compiled = HostCosts(4e-6, 8e-6, 40e-6, compiled=True)
    assert kernels_host_s(100, 200, compiled, 3) == pytest.approx(300 * 4e-6)
    graphs = HostCosts(4e-6, 8e-6, 40e-6, compiled=True, cuda_graphs=True)
    assert kernels_host_s(100, 200, graphs, 64) == pytest.approx(64 * 4e-6)
    # CUDA graphs need torch.compile here: eager ignores the flag
    eager_with_flag = HostCosts(4e-6, 8e-6, 40e-6, cuda_graphs=True)
    assert kernels_host_s(100, 200, eager_with_flag, 64) == kernels_host_s(100, 200, EAGER, 3)


def test_fsdp_units_and_the_optimizer_add_python_ops() -> None:
    # FSDP2: 2 all-gathers of 3 kernels and a reduce-scatter of 5, per unit, torch calls at 12 us each
    assert sharding_host_s("fsdp-full", 32, EAGER) == pytest.approx(32 * 11 * 12e-6)
    assert sharding_host_s("ddp", 32, EAGER) == 0.0
    # Llama: 7 linears and 2 RMSNorm weights a block, + embedding, final norm, output
    tensors = parameter_tensors(LLAMA, 32)
    assert tensors == 32 * 9 + 3
    assert optimizer_host_s(tensors, "loop", EAGER) == pytest.approx(291 * 8 * 12e-6)  # 28 ms
    assert optimizer_host_s(tensors, "foreach", EAGER) == pytest.approx(8 * (8e-6 + 9 * 4e-6))  # 9 chunks of 36
    assert optimizer_host_s(tensors, "fused", EAGER) == pytest.approx(8e-6 + 9 * 4e-6)


def test_a_small_micro_batch_is_host_bound_and_a_large_one_is_not() -> None:
    h200 = GpuRates("h200", (("bf16", 989e12),), 4.8e12)
    kernels = KernelModel(h200, Assumptions())
    small_model = ModelSpec("s", 24, 1024, 16, 16, 4096, "swiglu", 32000, 2048)
    one = PlanKnobs("fsdp-full", 0, 1, 1, 1, 1, 1, 1, seq_len=256)
    terms = kernels.micro_batch(small_model, one, 24)
    gpu = terms.gemm_s + terms.attention_s + terms.memory_s
    assert terms.host_s > gpu and terms.launch_s == pytest.approx(terms.host_s - gpu)
    big = kernels.micro_batch(LLAMA, PlanKnobs("fsdp-full", 0, 1, 1, 1, 1, 8, 1, seq_len=8192), 32)
    assert big.launch_s == 0.0 and big.host_s > 0


def test_fsdp_units_show_in_the_step_as_host_time() -> None:
    from fstrain.core.plan.plancluster import uniform_cluster
    from fstrain.core.plan.timemodel import step_time

    links = uniform_cluster(1, 8, "h200").links()
    h200 = GpuRates("h200", (("bf16", 989e12),), 4.8e12)
    kernels = KernelModel(h200, Assumptions())
    small_model = ModelSpec("s", 24, 1024, 16, 16, 4096, "swiglu", 32000, 2048)
    ddp = PlanKnobs("ddp", 0, 8, 1, 1, 1, 1, 1, seq_len=256)
    fsdp = PlanKnobs("fsdp-full", 0, 8, 1, 1, 8, 1, 1, seq_len=256)
    args = (400_000_000, 400e12, 8 * 989e12, links, Assumptions())
    t_ddp = step_time(small_model, args[0], ddp, *args[1:], kernels=kernels)
    t_fsdp = step_time(small_model, args[0], fsdp, *args[1:], kernels=kernels)
    units = 24 * 11 * 12e-6  # FSDP2's unit collectives, torch calls from the same host thread
    assert t_fsdp.host_s - t_ddp.host_s == pytest.approx(units)  # the same foreach AdamW over the same tensors
    assert t_fsdp.launch_s - t_ddp.launch_s == pytest.approx(units)
    assert t_fsdp.to_dict()["host_s"] == t_fsdp.host_s


def test_the_human_breakdown_shows_host_time_and_offloads_two_parts() -> None:
    from fstrain.cli.plan_output import _time_lines
    from fstrain.core.plan.timemodel import StepTime

    t = StepTime(0.2, 0.15, 0, 0, 0, 0, 0, 0.05, 1000, 1e12, 0.1, gemm_s=0.05, attention_s=0.02,
                 elementwise_s=0.01, launch_s=0.07, host_s=0.17, offload_pcie_s=0.02, cpu_optimizer_s=0.03)
    lines = _time_lines(t)
    assert "host time not hidden (of 0.170 s)" in lines and " 0.070 s  35.0 %" in lines
    assert "PCIe transfers" in lines and "CPU optimizer step" in lines and " 0.030 s  15.0 %" in lines
    assert "autocast" not in lines and "gradient accumulation" not in lines  # shown only when not 0
    amp = _time_lines(replace(t, autocast_s=0.004, grad_accumulation_s=0.006))
    assert "autocast casts (HBM)" in amp and " 0.004 s   2.0 %" in amp
    assert "gradient accumulation" in amp and " 0.006 s   3.0 %" in amp


def test_a_4b_model_on_one_h200_is_host_bound_at_micro_batch_1_and_2() -> None:
    """Qwen3-4B's shape under FSDP on one H200 at 256 tokens: published runs took 128 and 141 ms a
    micro-batch; the host's time sets the step at both micro-batches, as there."""
    from fstrain.core.plan.plancluster import uniform_cluster
    from fstrain.core.plan.timemodel import step_time

    qwen = ModelSpec("qwen3-4b", 36, 2560, 32, 8, 9728, "swiglu", 151936, 40960, qk_norm="rmsnorm")
    h200 = GpuRates("h200", (("bf16", 989e12),), 4.8e12)
    kernels = KernelModel(h200, Assumptions())
    links = uniform_cluster(1, 1, "h200").links()
    steps = [step_time(qwen, 4_000_000_000, PlanKnobs("fsdp-full", 0, 1, 1, 1, 1, mb, 1, seq_len=256), 400e12,
                       989e12, links, Assumptions(), kernels=kernels) for mb in (1, 2)]
    assert all(t.launch_s > 0 for t in steps)
    assert steps[1].step_time_s == pytest.approx(steps[0].step_time_s)  # the host's, not the GPU's
    assert 0.100 < steps[0].step_time_s < 0.128
