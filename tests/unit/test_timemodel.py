"""FLOPs against Narayanan/Megatron/torchtitan, and the structure of the step-time model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.plan.schema import ModelSpec, MoESpec, PlanKnobs
from fstrain.core.plan.timemodel import (
    Links,
    StepTime,
    collective_latency,
    flops_per_token,
    group_bandwidth,
    layer_hardware_flops,
    step_time,
)

from .test_modelsize import NARAYANAN_TABLE_1, megatron_gpt


@pytest.mark.parametrize(("heads", "hidden", "layers", "published"), NARAYANAN_TABLE_1)
def test_narayanan_equation_3_with_full_recompute(heads: int, hidden: int, layers: int, published: str) -> None:
    spec = megatron_gpt(heads, hidden, layers)
    batch, s, v, h, nl = 1536, 2048, 51200, hidden, layers
    f = flops_per_token(spec, s)
    executed = batch * s * (nl * layer_hardware_flops(f, "full", flash_attention=False) + 3 * f.head)
    assert executed == pytest.approx(96 * batch * s * nl * h * h * (1 + s / (6 * h) + v / (16 * nl * h)), rel=1e-12)
    # Megatron's logged "model" FLOPs: the same without the recompute pass.
    assert batch * s * f.training == pytest.approx(
        72 * batch * s * nl * h * h * (1 + s / (6 * h) + v / (12 * nl * h)), rel=1e-12
    )


def test_megatron_flops_with_grouped_query_attention() -> None:
    # megatron/training.py: 60 B s L h^2 (1 + g/(5a) + s/(5h) + V/(10 L h)) for a GeLU-4h model with g KV groups.
    spec = dataclasses.replace(megatron_gpt(64, 8192, 80), num_kv_heads=8)
    s, h, nl, a, g, v = 4096, 8192, 80, 64, 8, 51200
    expected = 60 * s * nl * h * h * (1 + g / (5 * a) + s / (5 * h) + v / (10 * nl * h))
    assert s * flops_per_token(spec, s).training == pytest.approx(expected, rel=1e-12)


def test_torchtitan_flops_per_token_for_llama() -> None:
    # torchtitan get_num_flop_per_token: 6 N + 12 l h q t with N the parameters less the token embedding.
    spec = ModelSpec("llama3.1-8b", 32, 4096, 32, 8, 14336, "swiglu", 128256, 8192)
    count = count_parameters(spec)
    titan = 6 * (count.total - count.embedding) + 12 * 32 * 32 * 128 * 8192
    norms = count.norms_per_layer * 32 + count.final_norm  # counted by torchtitan, not matmuls here
    assert flops_per_token(spec, 8192).training == pytest.approx(titan - 6 * norms, rel=1e-12)


def test_moe_counts_only_the_routed_experts() -> None:
    mixtral = ModelSpec("m", 32, 4096, 32, 8, 14336, "swiglu", 32000, 4096, moe=MoESpec(8, 2, 14336))
    active = count_parameters(mixtral).active_per_token
    f = flops_per_token(mixtral, 4096)
    attention_scores = 32 * 4 * 4096 * 4096
    assert f.forward - attention_scores == pytest.approx(2 * (active - 32000 * 4096), rel=1e-4)
    # Op-level SAC recomputes k, o and the whole MoE layer (router and the top-2 experts' matmuls).
    moe_layer = 2 * (4096 * 8 + 2 * 3 * 4096 * 14336)
    assert f.selective_op_recompute == 2 * (4096 * 1024 + 4096 * 4096) + moe_layer


def test_narayanan_equation_4_training_time() -> None:
    """GPT-3 175B, 300B tokens, 1024 A100 at 140 TFLOP/s: about 34 days (8 T P / (n X))."""
    gpt3 = megatron_gpt(96, 12288, 96)
    f = flops_per_token(gpt3, 2048)
    executed_per_token = 96 * layer_hardware_flops(f, "full", flash_attention=False) + 3 * f.head
    days = 300e9 * executed_per_token / (1024 * 140e12) / 86400
    # Equation 4 drops the attention and logit terms (1 + s/6h + V/16lh = 1.031 here).
    assert days == pytest.approx(34, rel=0.04)
    assert days == pytest.approx(8 * 300e9 * 174.6e9 / (1024 * 140e12) / 86400 * 1.031, rel=0.005)


def test_recompute_costs() -> None:
    spec = ModelSpec("l", 32, 4096, 32, 8, 14336, "swiglu", 128256, 8192)
    f = flops_per_token(spec, 8192)
    assert layer_hardware_flops(f, "none", False) == 3 * f.layer
    assert layer_hardware_flops(f, "megatron-selective", False) == 3 * f.layer + f.attention_core
    assert layer_hardware_flops(f, "full", False) == 4 * f.layer
    assert layer_hardware_flops(f, "none", True) == 3 * f.layer + 0.5 * f.attention_core


LINKS = Links(
    nvlink_bytes_per_s=450e9,
    pcie_bytes_per_s=64e9,
    inter_node_bytes_per_s=50e9,
    host_link_bytes_per_s=128e9,
    nvlink_domain_size=8,
    gpus_per_node=8,
    num_nodes=16,
)
LLAMA = ModelSpec("l", 32, 4096, 32, 8, 14336, "swiglu", 128256, 8192)
NO_OVERLAP = Assumptions(dp_overlap=0.0, collective_efficiency=1.0, collective_latency_s=0.0, nvlink_latency_s=0.0,
                         collective_base_latency_s=0.0,
                         layer_overhead_s=0.0)


def knobs(**changes: object) -> PlanKnobs:
    base = {
        "strategy": "ddp",
        "zero_stage": 0,
        "dp": 128,
        "tp": 1,
        "pp": 1,
        "shard_group_size": 1,
        "micro_batch_size": 1,
        "grad_accum_steps": 1,
        "seq_len": 8192,
    }
    return PlanKnobs(**{**base, **changes})  # type: ignore[arg-type]


def run(k: PlanKnobs, assumptions: Assumptions = NO_OVERLAP, params: int = 8_000_000_000) -> StepTime:
    return step_time(LLAMA, params, k, 400e12, 128 * 989e12, LINKS, assumptions)


def test_group_bandwidth_follows_the_boundaries() -> None:
    assert group_bandwidth(8, 1, LINKS) == 450e9  # one NVLink domain
    assert group_bandwidth(4, 2, LINKS) == 450e9  # tp=2 x dp=4 still inside it
    # Across nodes a ring per NIC: 8 members per node use the node's 8 NICs (8 x 50e9, NVLink caps
    # at 450e9); one member per node (tp=8 fills it) gets one NIC; two per node two.
    assert group_bandwidth(16, 1, LINKS) == 400e9
    assert group_bandwidth(16, 8, LINKS) == 50e9
    assert group_bandwidth(16, 4, LINKS) == 100e9
    pcie_node = dataclasses.replace(LINKS, nvlink_domain_size=1, nvlink_bytes_per_s=0.0)
    assert group_bandwidth(8, 1, pcie_node) == 64e9


def test_data_parallel_volume_per_strategy() -> None:
    """ZeRO section 7: DDP and ZeRO-1/2 move 2 Psi, ZeRO-3 3 Psi (1.5x)."""
    ddp = run(knobs()).dp_comm_s
    ring = 127 / 128
    assert ddp == pytest.approx(2 * ring * 2 * 8e9 / 400e9)
    zero2 = run(knobs(strategy="zero2", zero_stage=2, shard_group_size=128)).dp_comm_s
    zero3 = run(knobs(strategy="zero3", zero_stage=3, shard_group_size=128)).dp_comm_s
    assert zero2 == pytest.approx(ddp)
    assert zero3 == pytest.approx(1.5 * ddp)
    # ZeRO-3 gathers and reduces every micro-batch; DDP syncs once a step.
    zero3_accum = run(knobs(strategy="zero3", zero_stage=3, shard_group_size=128, dp=32, grad_accum_steps=4))
    ddp_accum = run(knobs(dp=32, grad_accum_steps=4))
    assert zero3_accum.dp_comm_s / ddp_accum.dp_comm_s == pytest.approx(1.5 * 4)


def test_data_parallel_volume_per_precision_mode() -> None:
    """Gradients move in their dtype: fp32 under autocast (DDP, FSDP without a policy), bf16 in
    pure bf16; DeepSpeed's torch_autocast moves Linear parameters in the autocast dtype."""
    ring = 127 / 128
    assert run(knobs(precision="amp-bf16")).dp_comm_s == pytest.approx(2 * ring * 4 * 8e9 / 400e9)
    assert run(knobs(precision="bf16-pure")).dp_comm_s == pytest.approx(run(knobs()).dp_comm_s)
    fsdp = {"strategy": "fsdp-full", "zero_stage": 3, "shard_group_size": 128}
    bf16 = run(knobs(**fsdp)).dp_comm_s  # gather 2 + 2, reduce-scatter fp32 (4)
    amp = run(knobs(**fsdp, precision="amp-bf16")).dp_comm_s  # 4 + 4 + 4
    pure = run(knobs(**fsdp, precision="bf16-pure")).dp_comm_s  # 2 + 2 + 2
    assert (bf16, amp, pure) == pytest.approx((ring * 8 * 8e9 / 400e9, ring * 12 * 8e9 / 400e9, ring * 6 * 8e9 / 400e9))
    zero3 = {"strategy": "zero3", "zero_stage": 3, "shard_group_size": 128}
    assert run(knobs(**zero3, precision="amp-bf16")).dp_comm_s == pytest.approx(run(knobs(**zero3)).dp_comm_s)


def test_overlap_hides_data_parallel_time_behind_compute() -> None:
    k = knobs(strategy="zero3", zero_stage=3, shard_group_size=128)
    hidden = run(k, Assumptions(dp_overlap=1.0, collective_efficiency=1.0))
    exposed = run(k)
    assert exposed.dp_exposed_s == pytest.approx(exposed.dp_comm_s)
    assert hidden.dp_exposed_s == pytest.approx(max(0.0, hidden.dp_comm_s - hidden.compute_s))
    assert hidden.step_time_s < exposed.step_time_s


def test_fsdp_forward_gathers_hide_behind_the_forward_only() -> None:
    """Eight micro-batches under no_sync: each gathers its parameters in forward and again in
    backward (g seconds each), the gradients are reduced once (2g: fp32 against bf16). With
    g = c/2 (c: a micro-batch's compute, forward c/3) the forward gathers leave 8 (g - c/3)
    exposed while backward's 8g + 2g hide behind its 8 x 2c/3; one window over the whole step
    would hide all but 18g - 8c."""
    overlap = dataclasses.replace(NO_OVERLAP, dp_overlap=1.0)
    fsdp = knobs(strategy="fsdp-full", zero_stage=3, shard_group_size=128, grad_accum_steps=8, fsdp2_no_sync=True)
    c = run(fsdp, overlap).compute_s / 8
    ring = 127 / 128
    params = round(c / 2 * 400e9 / (2 * ring))  # one gather of bf16 parameters over 400 GB/s: c / 2
    t = run(fsdp, overlap, params)
    g = ring * 2 * params / 400e9
    assert t.dp_comm_s == pytest.approx(18 * g)
    assert t.dp_exposed_s == pytest.approx(8 * (g - c / 3)) and 8 * (g - c / 3) > 18 * g - 8 * c


def test_pipeline_bubble_is_p_minus_1_over_m() -> None:
    for pp, m in ((4, 4), (4, 16), (8, 64)):
        t = run(
            knobs(strategy="zero1", zero_stage=1, pp=pp, dp=128 // pp, shard_group_size=128 // pp, grad_accum_steps=m)
        )
        per_slot = (t.compute_s + t.tp_comm_s + t.pp_comm_s) / m
        assert t.bubble_s / (m * per_slot) == pytest.approx((pp - 1) / m)


def test_tensor_parallel_all_reduces_over_nvlink() -> None:
    t = run(knobs(tp=8, dp=16))
    volume = 2 * (7 / 8) * 1 * 8192 * 4096 * 2  # ring all-reduce of b s h bf16
    assert t.tp_comm_s == pytest.approx(32 * 4 * volume / 450e9)
    full = run(knobs(tp=8, dp=16, activation_checkpointing="full"))
    assert full.tp_comm_s == pytest.approx(1.5 * t.tp_comm_s)


def test_throughput_and_mfu_definitions() -> None:
    k = knobs(grad_accum_steps=2, micro_batch_size=2)
    t = run(k)
    tokens = k.global_batch_size * 8192
    assert t.tokens_per_s == pytest.approx(tokens / t.step_time_s)
    model_flops = flops_per_token(LLAMA, 8192).training * tokens
    assert t.mfu == pytest.approx(model_flops / (t.step_time_s * 128 * 989e12))
    assert t.seconds_for(10**12) == pytest.approx(10**12 / t.tokens_per_s)


def test_offload_adds_host_time() -> None:
    base = knobs(strategy="zero2", zero_stage=2, shard_group_size=128)
    with_offload = dataclasses.replace(base, offload="optimizer")
    shard = 8e9 / 128
    expected = 2 * 2 * shard / 64e9 + shard * 8 / 2e9  # gradients down + params up, then CPU Adam
    assert run(with_offload).offload_s == pytest.approx(expected)
    assert run(base).offload_s == 0


def test_collective_latency_ring_and_tree() -> None:
    # NCCL's Simple protocol (tuning.cc): 8.4 us base, 3.4 us a step over NVLink, 14 us across nodes.
    a = Assumptions()
    big = dataclasses.replace(LINKS, num_nodes=128)
    # all-gather over 1,024 ranks on 128 nodes: 127 network steps, 896 NVLink steps
    assert collective_latency(1024, 1, big, a) == pytest.approx(8.4e-6 + 896 * 3.4e-6 + 127 * 14e-6)
    # all-reduce: the tree, 2 x (7 NVLink hops at 4 us + log2(128) = 7 network hops at 14 us)
    assert collective_latency(1024, 1, big, a, tree=True) == pytest.approx(2 * (7 * 4e-6 + 7 * 14e-6))
    # one rank per node (stride 8): the tree has no NVLink hop; the ring's 2 x 127 steps cost far more
    assert collective_latency(128, 8, big, a, tree=True) == pytest.approx(2 * 7 * 14e-6)
    assert collective_latency(8, 1, LINKS, a) == pytest.approx(8.4e-6 + 7 * 3.4e-6)  # inside a node
    # two ranks in a node: the ring's 8.4 + 2 x 3.4 us beats nothing; the tree's 2 x 4 us is cheaper
    assert collective_latency(2, 1, LINKS, a, tree=True) == pytest.approx(8e-6)
    assert collective_latency(1, 1, LINKS, a) == 0.0


def test_zero1_sharded_within_a_node_beats_sharding_over_a_thousand_ranks() -> None:
    # 1,024 ranks on 128 nodes: sharding the optimizer over all of them pays two 1,023-step rings
    # per bucket (one per block); sharding within each node pays two 7-step rings and a tree
    # all-reduce of the shard across the nodes.
    big = dataclasses.replace(LINKS, num_nodes=128)
    timed = dataclasses.replace(NO_OVERLAP, collective_latency_s=14e-6, nvlink_latency_s=3.4e-6,
                                collective_base_latency_s=8.4e-6)
    flat = knobs(strategy="zero1", zero_stage=1, dp=1024, shard_group_size=1024)
    local = dataclasses.replace(flat, shard_group_size=8)
    ring_all = 8.4e-6 + 896 * 3.4e-6 + 127 * 14e-6
    ring_node = 8.4e-6 + 7 * 3.4e-6
    tree = 2 * 7 * 14e-6
    # latency alone (links too fast for the bytes to count): 32 blocks' collectives
    instant = dataclasses.replace(big, nvlink_bytes_per_s=1e30, inter_node_bytes_per_s=1e30)
    flat_s = step_time(LLAMA, 8e9, flat, 400e12, 1024 * 989e12, instant, timed).dp_comm_s
    local_s = step_time(LLAMA, 8e9, local, 400e12, 1024 * 989e12, instant, timed).dp_comm_s
    assert flat_s == pytest.approx(32 * 2 * ring_all)
    assert local_s == pytest.approx(32 * (2 * ring_node + tree))
    # with the bytes: the node-local shard all-reduces 2/8 of the fp32 gradients over one NIC,
    # more bytes than the flat ring's, and still wins by the latency
    t_flat = step_time(LLAMA, 8e9, flat, 400e12, 1024 * 989e12, big, timed)
    t_local = step_time(LLAMA, 8e9, local, 400e12, 1024 * 989e12, big, timed)
    assert t_flat.step_time_s - t_local.step_time_s > 0.1


def test_tiny_micro_batches_are_latency_bound() -> None:
    # seq 1: the FLOPs take nanoseconds, the per-block overhead and collectives do not.
    one = step_time(LLAMA, 8_000_000_000, knobs(seq_len=1, strategy="fsdp-full", zero_stage=3,
                                                  shard_group_size=128), 400e12, 128 * 989e12, LINKS, Assumptions())
    assert one.mfu < 0.001
    long = step_time(LLAMA, 8_000_000_000, knobs(seq_len=8192, strategy="fsdp-full", zero_stage=3,
                                                   shard_group_size=128), 400e12, 128 * 989e12, LINKS, Assumptions())
    assert long.mfu > 0.2


def test_nvls_all_reduce_follows_nccls_cost_model_inside_an_nvswitch_domain() -> None:
    from fstrain.core.plan.plancluster import NodeGpus, build_cluster, uniform_cluster
    from fstrain.core.plan.timemodel import all_reduce_bandwidth, group_bandwidth

    h100 = uniform_cluster(2, 8, "h100-sxm").links()
    assert h100.nvls_efficiency == 0.85 and h100.nvlink_bytes_per_s == 450e9
    # NVLink 450 GB/s one way x 0.85 x 15/16 channels x 2 (src/tuning/nvls.cc)
    assert all_reduce_bandwidth(8, 1, h100) == pytest.approx(450e9 * 0.85 * 15 / 16 * 2)
    assert all_reduce_bandwidth(16, 1, h100) == group_bandwidth(16, 1, h100)  # across nodes: the ring
    assert all_reduce_bandwidth(8, 1, uniform_cluster(1, 8, "b200").links()) == pytest.approx(900e9 * 0.74 * 15 / 8)
    for no_nvls in ("a100-80gb", "h200-nvl", "l40s"):  # Ampere, NVL bridge pairs, no NVLink
        links = uniform_cluster(1, 8, no_nvls).links()
        assert links.nvls_efficiency == 0.0 and all_reduce_bandwidth(8, 1, links) == group_bandwidth(8, 1, links)
    # a node whose NVLink domain the user says is 2 (bridged pairs) has no NVSwitch
    bridged = build_cluster([NodeGpus("h100-sxm", 8, nvlink_domain_size=2)], 400).links()
    assert bridged.nvls_efficiency == 0.0


def test_ddp_all_reduce_and_tp_without_sequence_parallelism_use_nvls() -> None:
    from fstrain.core.plan.plancluster import uniform_cluster

    links = uniform_cluster(1, 8, "h100-sxm").links()
    no_nvls = dataclasses.replace(links, nvls_efficiency=0.0)
    spec = ModelSpec("m", 8, 2048, 16, 16, 8192, "gelu", 32000, 2048)
    ddp = PlanKnobs("ddp", 0, 8, 1, 1, 1, 1, 1, seq_len=2048)
    bytes_only = Assumptions(collective_latency_s=0.0, nvlink_latency_s=0.0, collective_base_latency_s=0.0)
    with_nvls = step_time(spec, 400_000_000, ddp, 400e12, 8 * 989e12, links, bytes_only)
    without = step_time(spec, 400_000_000, ddp, 400e12, 8 * 989e12, no_nvls, bytes_only)
    assert with_nvls.dp_comm_s == pytest.approx(without.dp_comm_s * 450e9 / (450e9 * 0.85 * 15 / 8), rel=0.05)
    tp = PlanKnobs("ddp", 0, 1, 8, 1, 1, 1, 1, seq_len=2048)
    sp = step_time(spec, 50_000_000, tp, 400e12, 8 * 989e12, links)
    assert sp.tp_comm_s == step_time(spec, 50_000_000, tp, 400e12, 8 * 989e12, no_nvls).tp_comm_s
    plain = Assumptions(sequence_parallel=False)
    assert step_time(spec, 50_000_000, tp, 400e12, 8 * 989e12, links, plain).tp_comm_s < step_time(
        spec, 50_000_000, tp, 400e12, 8 * 989e12, no_nvls, plain).tp_comm_s


HF_CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "hf-configs"


def _hf(name: str) -> ModelSpec:
    from fstrain.io.recipes import load_recipe_file

    return load_recipe_file(str(HF_CONFIGS / name / "config.json")).model


def test_a_sliding_window_cuts_the_attention_flops_to_the_keys_it_leaves() -> None:
    """Against a brute-force count: query i of a causal layer attends min(i, w) keys, where a full
    causal layer attends i; the FLOP convention counts the full square (s keys a query)."""
    from fstrain.core.plan.kernels import attended_keys

    mistral = _hf("Mistral-7B-v0.1")  # a 4096-token window on all 32 layers
    s, w = 32768, mistral.sliding_window
    brute = sum(min(i, w) for i in range(1, s + 1)) / sum(range(1, s + 1)) * s
    assert attended_keys(mistral, s) == pytest.approx(brute, rel=1e-3)
    assert attended_keys(mistral, 4096) == 4096  # the window covers the whole sequence
    gemma = _hf("gemma-2-2b-it")  # 13 of 26 layers windowed
    full = dataclasses.replace(gemma, sliding_window=0, sliding_window_layers=0)
    windowed = dataclasses.replace(gemma, sliding_window_layers=gemma.num_layers)
    mixed = flops_per_token(gemma, 16384).attention_core
    assert mixed == pytest.approx((flops_per_token(full, 16384).attention_core
                                   + flops_per_token(windowed, 16384).attention_core) / 2)
    assert mixed < flops_per_token(full, 16384).attention_core


def test_head_dim_and_shared_experts_in_the_flops() -> None:
    qwen3 = _hf("Qwen3-4B")  # 32 heads of 128 on a 2560-wide hidden state
    h, q, kv, ffn = 2560, 32 * 128, 8 * 128, 9728
    assert flops_per_token(qwen3, 4096).layer_matmuls == 2.0 * (2 * h * q + 2 * h * kv + 3 * h * ffn)
    assert flops_per_token(qwen3, 4096).attention_core == 4.0 * 4096 * q
    qwen2_moe = _hf("Qwen2-57B-A14B")
    assert qwen2_moe.moe is not None
    alone = dataclasses.replace(qwen2_moe, moe=dataclasses.replace(qwen2_moe.moe, shared_ffn_hidden_size=0,
                                                                   shared_expert_gate=False))
    shared = qwen2_moe.moe.shared_ffn_hidden_size
    added = flops_per_token(qwen2_moe, 4096).layer_matmuls - flops_per_token(alone, 4096).layer_matmuls
    assert added == 2.0 * (3 * qwen2_moe.hidden_size * shared + qwen2_moe.hidden_size)
