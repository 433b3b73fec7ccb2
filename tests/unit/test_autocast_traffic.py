"""What autocast, dropout, eager softmax and gradient accumulation cost a step, on values:
fstrain.core.plan.autocast, kernels.elementwise_bytes_per_token, kernelcost.eager_score_bytes
and KernelModel.grad_accumulation_s."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.autocast import activation_casts, cast_inputs, weight_casts
from fstrain.core.plan.blocktime import KernelModel
from fstrain.core.plan.kernelcost import GpuRates, eager_score_bytes
from fstrain.core.plan.kernels import EAGER_BLOCK, FusedBlock, elementwise_bytes_per_token
from fstrain.core.plan.schema import PlanKnobs
from tests.plans import TINY_MODEL

V100 = GpuRates("v100-16gb", (("fp16", 125e12), ("fp32", 15.7e12)), 900e9)
# A BERT-like block: LayerNorm, GeLU, biases, learned positions, dropout 0.1.
BERT = replace(TINY_MODEL, norm="layernorm", activation="gelu", position_embedding="learned", hidden_size=64,
               num_heads=4, num_kv_heads=4, ffn_hidden_size=256, linear_bias=True, dropout=0.1)
NO_DROPOUT = replace(BERT, dropout=0.0)


def test_eager_softmax_traffic_op_by_op() -> None:
    # fp32: scale 8, mask 8, softmax 8, dropout 9 | dropout 9, softmax 12, scale 8.
    assert eager_score_bytes(4, autocast=False, dropout=True) == (33.0, 29.0)
    # fp16 under autocast: scale 4, mask promotes 2 -> 4 (6), softmax in fp32 8, dropout 9, cast back 6 |
    # cast 6, dropout 9, softmax 12, the promotion's cast 6, scale 4.
    assert eager_score_bytes(2, autocast=True, dropout=True) == (33.0, 37.0)
    # bf16 without autocast or dropout: scale 4, mask 4, softmax 4 | softmax 6, scale 4.
    assert eager_score_bytes(2, autocast=False, dropout=False) == (12.0, 10.0)


def test_dropout_and_the_fp32_residual_stream_in_the_elementwise_traffic() -> None:
    h, ffn = 64, 256
    plain = elementwise_bytes_per_token(NO_DROPOUT, 2, False, False)
    assert (plain.replicated, plain.sharded) == (h * (2 * 2 * 2 + 2 * 3 * 2), ffn * 4)  # 2 LayerNorms, 2 adds
    dropped = elementwise_bytes_per_token(BERT, 2, False, False)
    assert dropped.replicated - plain.replicated == h * 2 * (2 * 2 + 1)  # two dropouts: read, write, 1-byte mask
    # Under autocast the norms read and write fp32 and each add reads the 16-bit branch and the fp32 stream.
    amp = elementwise_bytes_per_token(BERT, 2, False, False, residual=4)
    assert amp.replicated == h * (2 * 2 * 4 + 2 * (2 + 2 * 4) + 2 * (2 * 2 + 1))
    # flash-attention's fused dropout-add-norm runs the dropouts inside its kernel.
    assert elementwise_bytes_per_token(BERT, 2, False, False, FusedBlock(None, True)).replicated == h * 2 * 4 * 2


def test_autocast_casts_by_hand() -> None:
    assert cast_inputs(BERT, EAGER_BLOCK) == 4  # q, k, v, fc1
    assert cast_inputs(replace(BERT, activation="swiglu"), FusedBlock(None, False, True)) == 3  # qkv, gate, up
    weights = weight_casts(1000, 2, 2, forward_passes=2.0)  # recomputed: cast twice, one gradient cast
    assert (weights.bytes, weights.kernels) == (1000 * (2 * 6 + 6), 6)
    acts = activation_casts(BERT, EAGER_BLOCK, tokens=10, a=2, forward_passes=1.0)
    assert (acts.bytes, acts.kernels) == (4 * 10 * 64 * 2 * 6, 8)


def _knobs(precision: str, grad_accum: int = 1) -> PlanKnobs:
    return PlanKnobs("ddp", 0, 1, 1, 1, 1, 4, grad_accum, precision=precision, seq_len=512, flash_attention=False,
                     loss="none")


def test_autocast_is_its_own_term_and_only_under_autocast() -> None:
    kernels = KernelModel(V100, replace(Assumptions(), compute_time_scale=1.0))
    amp = kernels.micro_batch(BERT, _knobs("amp-fp16"), BERT.num_layers)
    fp16 = kernels.micro_batch(BERT, _knobs("fp16"), BERT.num_layers)
    assert fp16.autocast_s == 0.0 and amp.autocast_s > 0
    assert amp.gemm_s == fp16.gemm_s  # the same matmuls, in the same dtype
    # The casts: per block each weight and bias cast once forward and back once (6 + 6 bytes a
    # parameter), the four norm-fed linears' inputs likewise (6 + 6 bytes a hidden element).
    h, ffn, tokens = 64, 256, 4 * 512
    block_params = 4 * h * h + 2 * h * ffn + 4 * h + ffn + h
    head = h * BERT.num_labels * 12 + tokens * h * 2 * 6
    expected = (BERT.num_layers * (block_params * 12 + 4 * tokens * h * 12) + head) / kernels.hbm_bytes_per_s
    assert amp.autocast_s == pytest.approx(expected)
    assert amp.total_s > fp16.total_s + amp.autocast_s  # and the fp32 residual stream and softmax besides


def test_gradient_accumulation_adds_each_later_micro_batch() -> None:
    kernels = KernelModel(V100, replace(Assumptions(), compute_time_scale=1.0))
    assert kernels.grad_accumulation_s(1e9, 4, 1) == 0.0
    assert kernels.grad_accumulation_s(1e9, 4, 4) == pytest.approx(3 * 1e9 * 12 / kernels.hbm_bytes_per_s)


def test_the_step_names_both_terms_in_its_breakdown() -> None:
    from fstrain.core.plan.plancluster import uniform_cluster
    from fstrain.core.plan.timemodel import step_time

    kernels = KernelModel(V100, replace(Assumptions(), compute_time_scale=1.0))
    links = uniform_cluster(1, 1, "v100-16gb").links()
    params = 10_000_000

    def run(precision: str, grad_accum: int) -> dict[str, float]:
        return step_time(BERT, params, _knobs(precision, grad_accum), 50e12, 125e12, links, Assumptions(),
                         kernels=kernels).to_dict()

    plain, amp = run("fp16", 1), run("amp-fp16", 4)
    assert "autocast_s" not in plain and "grad_accumulation_s" not in plain
    assert amp["autocast_s"] == pytest.approx(4 * kernels.micro_batch(BERT, _knobs("amp-fp16", 4), 2).autocast_s)
    assert amp["grad_accumulation_s"] == pytest.approx(kernels.grad_accumulation_s(params, 4, 4))  # fp32 grads
