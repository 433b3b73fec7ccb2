"""The memory peak as the highest of three moments, and the loss's bytes per logit by variant."""

from __future__ import annotations

import dataclasses

import pytest

from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.losses import LossPeaks
from fstrain.core.plan.memory import (
    GIB,
    backward_buffer_items,
    buffer_items,
    layer_activation_bytes,
    loss_bytes,
    memory_breakdown,
    model_states,
    persistent_buffer_items,
    stage_shapes,
)
from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.plan.plancluster import uniform_cluster
from fstrain.core.plan.planfile import PlanFile
from fstrain.core.plan.planner import PlanModel, TrainingSpec, plan
from fstrain.core.plan.schema import ModelSpec, PlanKnobs
from fstrain.errors import InputError
from fstrain.io.recipes import load_shipped_recipe
from tests.plans import make_plan

# DeepSpeed's ZeRO-Offload tutorial: Megatron GPT-2 10B (50 layers, 4096 wide) on ONE V100 32GB,
# ZeRO-2 with the optimizer on the host, micro-batch 10, seq 1024, every layer checkpointed, fp16,
# DeepSpeed's default 5e8-element reduce bucket. It trains (docs/_tutorials/zero-offload.md).
GPT2_10B = ModelSpec("megatron-gpt2-10b", 50, 4096, 32, 32, 16384, "gelu", 50304, 1024, tied_embeddings=True,
                     norm="layernorm", linear_bias=True, position_embedding="learned", dropout=0.1)
TUTORIAL = PlanKnobs("zero2", 2, 1, 1, 1, 1, 10, 1, "full", "optimizer", "fp16", "adamw", 1024, False, loss="megatron")
DS_DEFAULT_BUCKETS = Assumptions(reduce_bucket_elements=500_000_000)
V100_32GB_USABLE = 31.7 * GIB


def test_zero2_offload_tutorial_charges_each_transient_at_its_own_moment() -> None:
    params = count_parameters(GPT2_10B)
    m = memory_breakdown(GPT2_10B, params, params.total, TUTORIAL, 1, DS_DEFAULT_BUCKETS)
    items = dict(m.details)
    stored = 50 * 1024 * 10 * 4096 * 2  # each block's fp16 input
    head = 1024 * 10 * (2 * 4096 + 4 + 2 * 4096)  # final LayerNorm's input and statistic, the head's input
    logits = 1024 * 10 * 50304 * 12  # Megatron's loss in forward: fp32 logits, their clone, exp of the clone
    working = layer_activation_bytes(GPT2_10B, 10, 1024, ac="none", flash_attention=False, precision="fp16")
    # The FFN's backward: the gradient from the next block, the gradient of the down projection's
    # input and that projection's weight gradient until its hook copies it to the bucket.
    in_flight = 10 * 1024 * 4096 * 2 + 10 * 1024 * 16384 * 2 + 4096 * 16384 * 2
    buckets = 2 * 2 * 500_000_000  # overlap_comm double-buffers the fp16 reduce bucket
    staging = 2 * params.largest_module  # temp_grad_buffer_for_gpu_offload
    weights = model_states(params.total, "zero2", 1, "fp16", "adamw", "optimizer").total
    assert weights == 2 * params.total  # gradients and optimizer states live on the host
    live = {
        "loss": weights + stored + head + logits + staging,
        "backward": weights + stored + working + in_flight + staging + buckets,
        "optimizer step": weights + staging,  # DeepSpeed's fused Adam runs on the host
    }
    overhead = 512 << 20  # CUDA context; one GPU: no NCCL communicator
    margin = Assumptions().fragmentation_fraction
    once = model_states(params.total, "zero2", 1, "fp16", "adamw", "optimizer")  # parameters: no margin
    allocated_once = once.parameters + once.optimizer_states
    expected = {name: value + overhead + int((value - allocated_once) * margin) for name, value in live.items()}
    assert dict(m.moments) == expected
    assert m.phase == "loss" and m.peak == expected["loss"] == max(expected.values())
    assert items["logits and loss"] == logits and "DeepSpeed reduce buckets (2, overlap_comm)" not in items
    assert dict(memory_breakdown(GPT2_10B, params, params.total, TUTORIAL, 1, DS_DEFAULT_BUCKETS).moments)[
        "backward"] == expected["backward"]
    # The run filled the GPU (nvidia-smi: 32,290 of 32,480 MiB): its live tensors and the CUDA
    # context fit, the allocator's 10 % margin on top of them does not (PyTorch's caching
    # allocator frees its cache and retries before it fails an allocation).
    assert live["loss"] + overhead < V100_32GB_USABLE < m.peak
    assert live["backward"] + overhead < V100_32GB_USABLE


def test_backward_moment_carries_the_reduce_buckets() -> None:
    params = count_parameters(GPT2_10B)
    short = dataclasses.replace(TUTORIAL, micro_batch_size=1, offload="none")  # tiny logits: backward peaks
    m = memory_breakdown(GPT2_10B, params, params.total, short, 1, DS_DEFAULT_BUCKETS)
    assert m.phase == "backward"
    assert dict(m.details)["DeepSpeed reduce buckets (2, overlap_comm)"] == 2 * 2 * 500_000_000
    assert "logits and loss" not in dict(m.details)
    assert m.peak == max(dict(m.moments).values())


def test_deepspeed_buffers_by_moment() -> None:
    params = count_parameters(GPT2_10B)
    [stage] = stage_shapes(params, 1, 1, 1, True)
    for strategy in ("zero1", "zero2"):
        knobs = dataclasses.replace(TUTORIAL, strategy=strategy, offload="none")
        assert buffer_items(strategy, stage, knobs, 4096, DS_DEFAULT_BUCKETS) == []  # no all-gather bucket
        assert persistent_buffer_items(strategy, stage, knobs) == []
        assert backward_buffer_items(strategy, stage, knobs, DS_DEFAULT_BUCKETS) == [
            ("DeepSpeed reduce buckets (2, overlap_comm)", 2 * 2 * 500_000_000)
        ]
    piped = dataclasses.replace(TUTORIAL, pp=2, offload="none")  # the pipeline engine reduces into one
    assert backward_buffer_items("zero1", stage, piped, DS_DEFAULT_BUCKETS) == [
        ("DeepSpeed reduce bucket", 2 * 500_000_000)
    ]
    # Without an override the bucket is the rendered one, DeepSpeed's 5e8, capped at the rank's parameters.
    assert backward_buffer_items("zero2", stage, TUTORIAL)[0][1] == 2 * 2 * 500_000_000
    small = dataclasses.replace(stage, params=1_000_000)
    assert backward_buffer_items("zero2", small, TUTORIAL)[0][1] == 2 * 2 * 1_000_000
    stated = Assumptions(reduce_bucket_elements=4096 * 4096)
    assert backward_buffer_items("zero2", stage, TUTORIAL, stated)[0][1] == 2 * 2 * 4096 * 4096
    assert persistent_buffer_items("zero2", stage, TUTORIAL) == [
        ("DeepSpeed offload staging buffer", 2 * stage.largest_layer)
    ]
    for strategy in ("ddp", "zero3", "fsdp-full", "fsdp-grad-op"):
        assert backward_buffer_items(strategy, stage, TUTORIAL, DS_DEFAULT_BUCKETS) == []


def test_a_stated_bytes_per_logit_replaces_every_loss() -> None:
    model = load_shipped_recipe("llama3.1-8b").model
    knobs = dataclasses.replace(TUTORIAL, strategy="fsdp-full", precision="bf16", seq_len=8192, micro_batch_size=2)
    logits = 8192 * 2 * 128256
    assert loss_bytes(model, knobs).peak == 12 * logits  # full: in backward
    for loss in ("full", "fused", "megatron", "chunked:8"):
        stated = loss_bytes(model, dataclasses.replace(knobs, loss=loss), Assumptions(logits_bytes_per_element=7))
        assert stated == LossPeaks(7 * logits, 7 * logits)


def test_fused_loss_shrinks_only_the_logits() -> None:
    # llm-foundry's MPT-760M on 8 H100 80GB, micro-batch 24, no AC: it ran (benchmarking README).
    mpt = ModelSpec("mpt-760m", 24, 1536, 12, 12, 6144, "gelu", 50368, 2048, tied_embeddings=True,
                    norm="layernorm", linear_bias=True, position_embedding="learned")
    params = count_parameters(mpt)
    knobs = PlanKnobs("fsdp-full", 3, 8, 1, 1, 8, 24, 2, "none", "none", "bf16", "adamw", 2048, True)
    full = memory_breakdown(mpt, params, params.total, knobs, 8)
    fused = memory_breakdown(mpt, params, params.total, dataclasses.replace(knobs, loss="fused"), 8)
    logits = 2048 * 24 * 50368
    assert dict(full.details)["logits and loss"] == 12 * logits
    assert dict(fused.details)["logits and loss"] == 4 * logits
    without = {k: v for k, v in full.details if k not in ("logits and loss", "allocator fragmentation")}
    assert without == {k: v for k, v in fused.details if k not in ("logits and loss", "allocator fragmentation")}
    usable = 79.6 * GIB  # 80 GB H100 after fstrain's reserve
    assert full.required > usable > fused.required  # fits without the allocator's margin, as it ran


def test_the_loss_travels_in_the_plan_file_and_unknown_ones_are_refused() -> None:
    data = make_plan("fsdp-full", loss="fused").to_dict()
    assert PlanFile.from_dict(data, "plan.yaml").knobs.loss == "fused"
    data["plan"]["loss"] = "chunked:4"
    assert PlanFile.from_dict(data, "plan.yaml").knobs.loss == "chunked:4"
    for bad in ("liger", "chunked:0", "full:2"):
        data["plan"]["loss"] = bad
        with pytest.raises(InputError, match=rf"plan\.loss is '{bad}'"):
            PlanFile.from_dict(data, "plan.yaml")
    data["plan"]["loss"] = "chunked"  # a plan file holds the canonical name
    with pytest.raises(InputError, match="write it as 'chunked:8'"):
        PlanFile.from_dict(data, "plan.yaml")
    del data["plan"]["loss"]  # plan files written before the knob: the bundled trainer's loss
    assert PlanFile.from_dict(data, "plan.yaml").knobs.loss == "full"
    gpt2 = PlanModel.from_spec(load_shipped_recipe("gpt2-1.5b").model)
    with pytest.raises(InputError, match="unknown loss 'liger'"):
        plan(gpt2, TrainingSpec(1024, 64, loss="liger"), uniform_cluster(1, 8, "h100-sxm"))


def test_fsdp2_keeps_the_root_unit_gathered_beside_two_blocks() -> None:
    """Llama 3.1 405B, full-shard over 512 ranks, full AC, 1 x 8192: PyTorch's fake-tensor trace
    of the bundled model (`fstrain plan --trace`) holds, at the backward peak, the root unit
    (embedding, final norm, head: 7.84 GiB in bf16) and the current block gathered, the prefetched
    block's all-gather buffer (5.94 GiB) and one block's fp32 gradient for the reduce-scatter
    (11.875 GiB): 31.594 GiB of buffers."""
    model = load_shipped_recipe("llama3.1-405b").model
    params = count_parameters(model)
    [stage] = stage_shapes(params, 1, 1, 1, model.tied_embeddings)
    block = params.per_layer
    root = params.embedding + params.head + params.final_norm
    assert (stage.block, stage.outside_blocks) == (block, root)
    knobs = dataclasses.replace(TUTORIAL, strategy="fsdp-full", dp=512, shard_group_size=512, micro_batch_size=1,
                                offload="none", precision="bf16", seq_len=8192)
    items = dict(buffer_items("fsdp-full", stage, knobs, model.hidden_size))
    assert items == {
        "FSDP gathered blocks (1 + 1 prefetched)": 2 * 2 * block,
        "FSDP root unit, gathered (embeddings, final norm, head)": 2 * root,
        "FSDP unsharded gradient (one block)": 4 * block,
    }
    assert sum(items.values()) / GIB == pytest.approx(31.594, abs=0.02)  # the trace, to within FSDP's padding
