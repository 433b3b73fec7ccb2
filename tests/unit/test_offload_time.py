"""CPU offload's step time by hand: PCIe traffic and the CPU optimizer step, by framework."""

from __future__ import annotations

import dataclasses

import pytest

from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.offload import OffloadTime, offload_time
from fstrain.core.plan.schema import PlanKnobs

ZERO2 = PlanKnobs("zero2", 2, 8, 1, 1, 8, 1, 4, offload="optimizer")
HOST_LINK = 64e9  # bidirectional: 32 GB/s one way


def test_zero_offload_moves_the_shard_once_a_step_and_runs_deepspeed_cpu_adam() -> None:
    shard = 8e9 / 8
    got = offload_time(ZERO2, 8e9, HOST_LINK, 8, Assumptions())
    # bf16 gradients down, bf16 parameters up, once a step; the node's CPUs update 8 shards at 2e9/s
    assert got.pcie_s == pytest.approx(2 * 2 * shard / 32e9)
    assert got.cpu_optimizer_s == pytest.approx(8 * shard / 2e9)
    params_too = offload_time(dataclasses.replace(ZERO2, strategy="zero3", zero_stage=3, offload="optimizer+params"),
                              8e9, HOST_LINK, 8, Assumptions())
    assert params_too.pcie_s == pytest.approx((2 * 2 + 4 * 2 * 2) * shard / 32e9)  # + params up every micro-batch


def test_fsdp_offload_moves_fp32_every_micro_batch_and_runs_torch_adamw_on_the_host() -> None:
    fsdp = dataclasses.replace(ZERO2, strategy="fsdp-full", zero_stage=0)
    shard = 8e9 / 8
    got = offload_time(fsdp, 8e9, HOST_LINK, 8, Assumptions())
    assert got.pcie_s == pytest.approx(4 * 3 * 4 * shard / 32e9)
    # torch's AdamW on the host: 6x slower than DeepSpeed's CPU Adam by default
    assert got.cpu_optimizer_s == pytest.approx(8 * shard / (2e9 / 6))
    assert got.total_s == pytest.approx(got.pcie_s + got.cpu_optimizer_s)
    measured = Assumptions(torch_cpu_adamw_params_per_s_per_node=1e9)
    assert offload_time(fsdp, 8e9, HOST_LINK, 8, measured).cpu_optimizer_s == pytest.approx(8.0)


def test_no_offload_costs_nothing() -> None:
    assert offload_time(dataclasses.replace(ZERO2, offload="none"), 8e9, HOST_LINK, 8, Assumptions()) == OffloadTime()
