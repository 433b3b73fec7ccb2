"""The compute suite on a real GPU, against the GPU table's datasheet numbers (the lent GPU machine)."""

from __future__ import annotations

import pytest
import torch

from fstrain.bench.compute import matmul_tflops, memory_bandwidth_gbps
from fstrain.core.bench.report import gpu_of

pytestmark = pytest.mark.gpu


def test_matmul_and_copy_are_plausible_fractions_of_the_datasheet(gpu: torch.device) -> None:
    device = gpu  # the last device, not only cuda:0: the device is honoured
    matmul = matmul_tflops(device, torch.bfloat16, seconds=1.0)
    copy = memory_bandwidth_gbps(device, seconds=1.0)
    assert matmul["size"] == 8192 and len(matmul["samples_tflops"]) >= 3
    spec = gpu_of(torch.cuda.get_device_name(device))
    if spec is None:
        pytest.skip(f"{torch.cuda.get_device_name(device)} is not in the GPU table")
    # Dense bf16 matmuls and a device copy reach a good share of the datasheet, never more than it.
    assert 0.3 < matmul["tflops"]["median"] * 1e12 / spec.bf16_flops <= 1.02
    assert 0.4 < copy["gbps"]["median"] * 1e9 / spec.hbm_bandwidth_bytes_per_s <= 1.02
