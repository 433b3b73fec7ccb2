"""The memory model against the ZeRO paper, DeepSpeed's published numbers and Korthikanti et al."""

from __future__ import annotations

import dataclasses

import pytest

from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.memory import (
    GIB,
    block_backward_extra_bytes,
    communicator_count,
    host_bytes_per_node,
    layer_activation_bytes,
    memory_breakdown,
    model_states,
    zero3_gathered_layer_bytes,
)
from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.plan.schema import ModelSpec, PlanKnobs

PAPER = Assumptions(deepspeed_fp32_grad_partition=False)  # the ZeRO paper's K = 12 accounting

# ZeRO (Rajbhandari et al., SC'20) Table 1: per-device model-state GB, columns P_os, P_os+g, P_os+g+p.
ZERO_TABLE_1 = {
    7.5e9: {
        1: ("120", "120", "120"),
        4: ("52.5", "41.3", "30"),
        16: ("35.6", "21.6", "7.5"),
        64: ("31.4", "16.6", "1.88"),
        256: ("30.4", "15.4", "0.47"),
        1024: ("30.1", "15.1", "0.12"),
    },
    128e9: {
        1: ("2048", "2048", "2048"),
        4: ("896", "704", "512"),
        16: ("608", "368", "128"),
        64: ("536", "284", "32"),
        256: ("518", "263", "8"),
        1024: ("513", "257", "2"),
    },
    1e12: {
        1: ("16000", "16000", "16000"),
        4: ("7000", "5500", "4000"),
        16: ("4750", "2875", "1000"),
        64: ("4187", "2218", "250"),
        256: ("4046", "2054", "62.5"),
        1024: ("4011", "2013", "15.6"),
    },
}
TABLE_1_CELLS = [
    (psi, dp, stage, shown)
    for psi, rows in ZERO_TABLE_1.items()
    for dp, cells in rows.items()
    for stage, shown in zip(("zero1", "zero2", "zero3"), cells, strict=True)
]


@pytest.mark.parametrize(("psi", "dp", "strategy", "shown"), TABLE_1_CELLS)
def test_zero_paper_table_1(psi: float, dp: int, strategy: str, shown: str) -> None:
    states = model_states(int(psi), strategy, dp, assumptions=PAPER)
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    # The paper prints each cell to the precision shown (sometimes truncated, sometimes rounded).
    assert abs(states.total / 1e9 - float(shown)) < 10**-decimals


def test_zero_figure_1_and_baseline() -> None:
    psi = 7_500_000_000
    assert model_states(psi, "ddp", 64, assumptions=PAPER).total == 120_000_000_000  # 16 psi
    assert model_states(psi, "ddp", 64).total == 120_000_000_000  # DDP has no fp32 gradient partition
    assert round(model_states(psi, "zero1", 64, assumptions=PAPER).total / 1e9, 1) == 31.4
    assert round(model_states(psi, "zero2", 64, assumptions=PAPER).total / 1e9, 1) == 16.6
    assert round(model_states(psi, "zero3", 64, assumptions=PAPER).total / 1e9, 1) == 1.9


def test_gpt2_and_the_deepspeed_tutorial() -> None:
    psi = 1_500_000_000
    ddp = model_states(psi, "ddp", 1)
    assert ddp.total == 24_000_000_000 and ddp.parameters == 3_000_000_000  # ZeRO section 3.1
    # DeepSpeed ZeRO tutorial: Adam states (fp32 params, m, v) 18 GB, 2.25 GB per device with ZeRO-1 on 8.
    assert model_states(psi, "ddp", 1).optimizer_states == 18_000_000_000
    assert model_states(psi, "zero1", 8, assumptions=PAPER).optimizer_states == 2_250_000_000


def test_deepspeed_published_estimates_for_t5_3b() -> None:
    """memory.rst examples (t5-3b, 2851M params, largest layer 32M, 1 node x 8 GPUs), in GiB."""
    psi, largest, gpus = 2_851_000_000, 32_000_000, 8
    gib = lambda value: round(value / GIB, 2)  # noqa: E731 - DeepSpeed prints GiB as "GB"
    assert gib(model_states(psi, "zero2", gpus, offload="optimizer").total) == 5.31
    assert gib(model_states(psi, "zero2", gpus).total) == 11.28  # the current 2 + 18/N formula
    assert (
        gib(model_states(psi, "zero3", gpus, offload="optimizer+params").total + zero3_gathered_layer_bytes(largest))
        == 0.12
    )
    assert (
        gib(model_states(psi, "zero3", gpus, offload="optimizer").total + zero3_gathered_layer_bytes(largest)) == 0.78
    )
    assert gib(model_states(psi, "zero3", gpus).total + zero3_gathered_layer_bytes(largest)) == 6.09
    offloaded = model_states(psi, "zero3", gpus, offload="optimizer+params")
    assert gib(host_bytes_per_node(offloaded, "zero3", psi, largest, gpus)) == 71.69  # zero_init=1
    cold = Assumptions(sharded_init=False)
    assert gib(host_bytes_per_node(offloaded, "zero3", psi, largest, gpus, cold)) == 127.45  # zero_init=0
    optimizer_only = model_states(psi, "zero3", gpus, offload="optimizer")
    assert gib(host_bytes_per_node(optimizer_only, "zero3", psi, largest, gpus)) == 63.72
    assert gib(host_bytes_per_node(model_states(psi, "zero3", gpus), "zero3", psi, largest, gpus)) == 1.43


def test_t0_3b_from_the_hugging_face_docs() -> None:
    """T0_3B as DeepSpeed printed it: 2783M params, largest layer 65M (both rounded in the printout,
    hence the 0.02 GiB tolerance)."""
    psi, largest = 2_783_000_000, 65_000_000

    def on_gpu(offload: str, gpus: int = 1) -> float:
        return (model_states(psi, "zero3", gpus, offload=offload).total + zero3_gathered_layer_bytes(largest)) / GIB

    for offload, gpus, published in [
        ("optimizer+params", 1, 0.25),
        ("optimizer", 1, 5.43),
        ("none", 1, 46.91),
        ("optimizer+params", 2, 0.25),
        ("optimizer", 2, 2.84),
        ("none", 2, 23.58),
    ]:
        assert on_gpu(offload, gpus) == pytest.approx(published, abs=0.02), (offload, gpus)


@pytest.mark.parametrize(
    ("strategy", "shard", "expected_bytes_per_param"),
    [("fsdp-full", 8, 16 / 8), ("fsdp-hybrid", 8, 16 / 8), ("fsdp-grad-op", 8, 2 + 16 / 8), ("ddp", 8, 16)],
)
def test_fsdp_strategies_map_to_zero(strategy: str, shard: int, expected_bytes_per_param: float) -> None:
    psi = 8_000_000_000
    assert model_states(psi, strategy, shard).total == psi * expected_bytes_per_param


def test_offload_moves_state_to_the_host() -> None:
    psi = 8_000_000_000
    zero2 = model_states(psi, "zero2", 8, offload="optimizer")
    assert (zero2.parameters, zero2.gradients, zero2.optimizer_states) == (2 * psi, 0, 0)
    assert zero2.host_bytes == 16 * psi // 8  # fp32 params, m, v and gradients per rank
    zero1 = model_states(psi, "zero1", 8, offload="optimizer")
    assert zero1.gradients == 2 * psi  # ZeRO-1 accumulates full gradients on the GPU
    fsdp = model_states(psi, "fsdp-full", 8, offload="optimizer+params")
    assert fsdp.total == 0 and fsdp.host_bytes == 16 * psi // 8


@pytest.mark.parametrize(
    ("optimizer", "precision", "per_param"),
    [
        ("adamw", "bf16", 16),
        ("sgd", "bf16", 12),
        ("adam8bit", "bf16", 10),
        ("adamw", "fp32", 16),
        ("sgd", "fp32", 12),
    ],
)
def test_optimizer_and_precision_bytes(optimizer: str, precision: str, per_param: int) -> None:
    # mixed: 2 weights + 2 grads + 4 master + state; fp32: 4 + 4 + state (no separate master)
    assert model_states(1000, "ddp", 1, precision, optimizer).total == per_param * 1000


# Korthikanti et al. 2022 Table 2 with GPT-3 175B shapes: s=2048, b=1, h=12288, a=96, t=8.
GPT3 = ModelSpec(
    "gpt3",
    96,
    12288,
    96,
    96,
    4 * 12288,
    "gelu",
    51200,
    2048,
    norm="layernorm",
    linear_bias=True,
    position_embedding="learned",
    dropout=0.1,
)
S, B, H, A, T = 2048, 1, 12288, 96, 8
SBH = S * B * H


@pytest.mark.parametrize(
    ("tp", "ac", "sp", "expected"),
    [
        (1, "none", True, SBH * 34 + 5 * A * S * S * B),
        (T, "none", False, SBH * 10 + SBH * 24 // T + 5 * A * S * S * B // T),
        (T, "none", True, (SBH * 34 + 5 * A * S * S * B) // T),
        (T, "megatron-selective", False, SBH * 10 + SBH * 24 // T),
        (T, "megatron-selective", True, 34 * SBH // T),
        (1, "full", True, 2 * SBH),
    ],
)
def test_korthikanti_table_2(tp: int, ac: str, sp: bool, expected: int) -> None:
    got = layer_activation_bytes(GPT3, B, S, tp, ac, flash_attention=False, precision="bf16", sequence_parallel=sp)
    assert got == expected


def test_flash_attention_removes_the_quadratic_term() -> None:
    flash = layer_activation_bytes(GPT3, B, S, 1, "none", flash_attention=True)
    # PyTorch eager + SDPA for GPT-3 (LayerNorm, GeLU 4h, learned positions, dropout 0.1): 2 norms
    # (input + one fp32 statistic), QKV and FFN inputs, q, K, V, output and out-proj input (5 x
    # 2sbh... 4 without rotary), GeLU 2 x 2 x 4sbh, 2 dropout masks, the fp32 log-sum-exp; no s^2
    # term (flash-attention #899).
    expected = 2 * (2 * SBH + 4 * S * B) + 4 * SBH + 8 * SBH + 16 * SBH + 2 * SBH + 4 * A * S * B
    assert flash == expected
    longer = layer_activation_bytes(GPT3, B, 2 * S, 1, "none", flash_attention=True)
    assert longer == 2 * flash  # linear in s


def test_llama_layer_without_dropout() -> None:
    llama = ModelSpec("l", 32, 4096, 32, 8, 14336, "swiglu", 128256, 8192)
    s, h = 8192, 4096
    got = layer_activation_bytes(llama, 1, s, 1, "none", flash_attention=True)
    # 2 RMSNorms (fp32 input 4sh, 1/rms 4s, output 2sh) + QKV/FFN inputs (4sh) + rotated q, q, K and
    # V repeated to 32 heads, SDPA output, out-proj input (5 x 2sh) + SwiGLU 4 x 2sf + fp32 LSE;
    # 221,320 bytes per token, what torch's fake-tensor trace of the bundled model shows.
    assert got == 2 * (6 * s * h + 4 * s) + 4 * s * h + 10 * s * h + 8 * s * 14336 + 4 * 32 * s
    assert got // s == 221_320


def tiny_knobs(**changes: object) -> PlanKnobs:
    base = {
        "strategy": "zero2",
        "zero_stage": 2,
        "dp": 8,
        "tp": 1,
        "pp": 1,
        "shard_group_size": 8,
        "micro_batch_size": 2,
        "grad_accum_steps": 4,
        "seq_len": 8192,
    }
    return PlanKnobs(**{**base, **changes})  # type: ignore[arg-type]


LLAMA_8B = ModelSpec("llama3.1-8b", 32, 4096, 32, 8, 14336, "swiglu", 128256, 8192)


def test_breakdown_adds_up_and_names_its_parts() -> None:
    params = count_parameters(LLAMA_8B)
    memory = memory_breakdown(LLAMA_8B, params, params.total, tiny_knobs(), 8)
    assert memory.peak == sum(value for _, value in memory.details)
    assert memory.model_states == model_states(params.total, "zero2", 8).total
    assert dict(memory.details)["logits and loss"] == 2 * 8192 * 128256 * 12  # full: in backward
    expected_layers = 32 * layer_activation_bytes(LLAMA_8B, 2, 8192)
    assert dict(memory.details)["activations (32 layers x 1 micro-batch, AC none)"] == expected_layers
    as_dict = memory.to_dict()
    for key in (
        "parameters",
        "gradients",
        "optimizer_states",
        "model_states",
        "activations",
        "buffers",
        "overhead",
        "peak",
    ):
        assert isinstance(as_dict[key], int)
    assert as_dict["peak"] == memory.peak


def test_pipeline_first_stage_holds_in_flight_micro_batches() -> None:
    params = count_parameters(LLAMA_8B)
    knobs = tiny_knobs(strategy="zero1", zero_stage=1, dp=2, pp=4, shard_group_size=2, grad_accum_steps=16)
    memory = memory_breakdown(LLAMA_8B, params, params.total, knobs, 8)
    per_layer = layer_activation_bytes(LLAMA_8B, 2, 8192)
    # The first stage's backward: 4 micro-batches of 8 layers and one block's backward
    # temporaries (ZeRO-1's gradients are a buffer that stays: no weight gradients in flight).
    in_flight = block_backward_extra_bytes(LLAMA_8B, 2, 8192, weight_grads="none")
    first, last = 8 * 4 * per_layer + in_flight, 8 * per_layer + 2 * 8192 * 128256 * 10
    assert memory.activations == max(first, last)
    fewer = tiny_knobs(strategy="zero1", zero_stage=1, dp=2, pp=4, shard_group_size=2, grad_accum_steps=2)
    assert memory_breakdown(LLAMA_8B, params, params.total, fewer, 8).activations < memory.activations


def test_overheads_are_the_stated_assumptions() -> None:
    params = count_parameters(LLAMA_8B)
    knobs = tiny_knobs(tp=2, dp=4, shard_group_size=4)
    assert communicator_count(knobs) == 3  # world, TP, DP
    generous = Assumptions(cuda_context_bytes=0, nccl_bytes_per_communicator=0, fragmentation_fraction=0.0)
    memory = memory_breakdown(LLAMA_8B, params, params.total, knobs, 8, generous)
    assert memory.overhead == 0
    default = memory_breakdown(LLAMA_8B, params, params.total, knobs, 8)
    live = default.model_states + default.activations + default.buffers
    # The allocator's margin is a share of what a step allocates and frees: not of the parameters
    # and optimizer states, allocated once.
    freed = live - default.parameters - default.optimizer_states
    assert default.overhead == (512 << 20) + 3 * (600 << 20) + int(freed * Assumptions().fragmentation_fraction)


def test_model_states_per_gpu_never_grow_with_more_gpus() -> None:
    psi = 70_000_000_000
    for strategy in ("ddp", "zero1", "zero2", "zero3", "fsdp-full", "fsdp-grad-op"):
        sizes = [model_states(psi, strategy, n).total for n in (1, 2, 4, 8, 64, 512, 4096)]
        assert sizes == sorted(sizes, reverse=True), strategy


@pytest.mark.parametrize(
    ("ac", "micro_batch", "measured_gib", "phase"),
    [
        # The bundled trainer on one H200, FSDP2 world 1, Llama 3.1 8B with 8 layers, seq 8192:
        # torch.cuda.max_memory_allocated (tests/fixtures/gpu/h200-2026-11-30, train-summary*.json).
        ("none", 1, 56.83, "loss"),
        ("selective-op", 1, 52.14, "optimizer step"),
        ("every-k:2", 1, 52.14, "optimizer step"),
        ("full", 2, 60461925888 / 2**30, "loss"),
    ],
)
def test_peak_moment_against_the_h200_runs(ac: str, micro_batch: int, measured_gib: float, phase: str) -> None:
    from tests.plans import make_plan

    spec = dataclasses.replace(LLAMA_8B, num_layers=8)
    params = count_parameters(spec)
    k = make_plan("fsdp-full", dp=1, model=spec, activation_checkpointing=ac, micro_batch_size=micro_batch,
                  grad_accum_steps=1, seq_len=8192).knobs
    m = memory_breakdown(spec, params, params.total, k, 1)
    assert m.phase == phase
    allocated = (m.peak - m.overhead) / 2**30  # the allocator's view: no context, NCCL or fragmentation
    assert allocated == pytest.approx(measured_gib, rel=0.05)
