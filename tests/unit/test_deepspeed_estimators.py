"""The memory model against DeepSpeed's own estimators, called from the installed package.

DeepSpeed is imported once for this module (it takes seconds and logs an accelerator line);
nothing else in the unit tests imports it.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.memory import host_bytes_per_node, model_states, zero3_gathered_layer_bytes

# (total params, largest layer params): t5-3b and T0_3B from DeepSpeed's and HF's docs, t5-large,
# Llama 3.1 8B/70B/405B, and an odd count so integer truncation shows.
MODELS = [
    (2_851_000_000, 32_000_000),
    (2_783_000_000, 65_000_000),
    (737_670_000, 32_900_000),
    (8_030_261_248, 525_336_576),
    (70_553_706_496, 1_050_673_152),
    (405_853_388_800, 2_101_346_304),
    (1_234_567_891, 7_777_777),
]
LAYOUTS = [(1, 1), (2, 1), (8, 1), (8, 4), (4, 16)]  # (GPUs per node, nodes)


@pytest.fixture(scope="module")
def deepspeed_zero() -> SimpleNamespace:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    return SimpleNamespace(zero2=estimate_zero2_model_states_mem_needs, zero3=estimate_zero3_model_states_mem_needs)


@pytest.mark.parametrize(("model", "layout", "offload"), list(itertools.product(MODELS, LAYOUTS, (False, True))))
def test_zero2_matches_deepspeed(
    deepspeed_zero: SimpleNamespace, model: tuple[int, int], layout: tuple[int, int], offload: bool
) -> None:
    psi, _ = model
    per_node, nodes = layout
    cpu, gpu = deepspeed_zero.zero2(psi, per_node, nodes, cpu_offload=offload)
    states = model_states(psi, "zero2", per_node * nodes, offload="optimizer" if offload else "none")
    assert abs(states.total - gpu) <= 2  # DeepSpeed truncates once, we truncate per component
    host = host_bytes_per_node(states, "zero2", psi, psi, per_node)
    if not offload or nodes == 1:
        # With offload on several nodes DeepSpeed sizes every node's host memory by the total GPU
        # count (max(4 x all GPUs, 16) x params); a node only holds its own ranks' partitions.
        assert host == pytest.approx(cpu, rel=1e-8)  # per-rank truncation x ranks per node


@pytest.mark.parametrize(
    ("model", "layout", "offload", "zero_init"),
    list(itertools.product(MODELS, LAYOUTS, ("none", "optimizer", "optimizer+params"), (True, False))),
)
def test_zero3_matches_deepspeed(
    deepspeed_zero: SimpleNamespace, model: tuple[int, int], layout: tuple[int, int], offload: str, zero_init: bool
) -> None:
    psi, largest = model
    per_node, nodes = layout
    cpu, gpu, largest_memory = deepspeed_zero.zero3(
        psi,
        largest,
        per_node,
        nodes,
        cpu_offload=offload != "none",
        cpu_offload_params=offload == "optimizer+params",
        zero_init=zero_init,
    )
    states = model_states(psi, "zero3", per_node * nodes, offload=offload)
    assert zero3_gathered_layer_bytes(largest) == largest_memory
    assert abs(states.total + largest_memory - gpu) <= 2
    host = host_bytes_per_node(states, "zero3", psi, largest, per_node, Assumptions(sharded_init=zero_init))
    # Host memory is the larger of start-up and offloaded state. DeepSpeed leaves start-up out
    # under zero.Init (one fp32 layer per process); we keep it, which only shows when a node's
    # share of the offloaded state is smaller than that (many nodes, few GPUs each).
    startup = 4 * largest * per_node * 1.5 if zero_init else 0
    assert host == pytest.approx(max(cpu, startup), rel=1e-8)  # per-rank truncation x ranks per node


def test_published_t5_3b_numbers_come_out_of_the_installed_functions(deepspeed_zero: SimpleNamespace) -> None:
    """Guards the vectors in test_memory.py: the installed code still gives the published GiB."""
    gib = 2**30
    _, gpu = deepspeed_zero.zero2(2_851_000_000, 8, 1, cpu_offload=False)
    assert round(gpu / gib, 2) == 11.28
    _, gpu, _ = deepspeed_zero.zero3(2_851_000_000, 32_000_000, 8, 1, cpu_offload=False, cpu_offload_params=False)
    assert round(gpu / gib, 2) == 6.09
