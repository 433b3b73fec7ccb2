"""``fstrain plan --trace``: PyTorch's own fake-tensor memory trace of the bundled trainer's model.

The traces at full size or of many depths take 10 to 120 s each on 2 cores: they are marked
``slow``, so ``pytest -m "not slow"`` keeps the small ones (CI runs them all).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fstrain.core.plan.memory import layer_activation_bytes, memory_breakdown
from fstrain.core.plan.schema import MoESpec
from fstrain.core.render.fsdp import render_fsdp
from fstrain.errors import ConfigError
from fstrain.train.trace import _Tracer, check_traceable, trace_plan
from tests.helpers import run_fstrain
from tests.plans import TINY_MODEL, make_plan

MODEL = replace(TINY_MODEL, num_layers=11, dropout=0.0)
# A small Mixtral layout: 8 SwiGLU experts, top-2, GQA, rotary positions.
MOE_MODEL = replace(TINY_MODEL, dropout=0.0, norm="rmsnorm", activation="swiglu", position_embedding="rope",
                    linear_bias=False, tied_embeddings=False, hidden_size=256, num_heads=8, num_kv_heads=2,
                    seq_len=128, vocab_size=64, moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=384))


@pytest.mark.slow
@pytest.mark.parametrize(("ac", "gas", "depths"), [
    ("none", 1, (2, 3, 4)),
    ("every-k:2", 1, (5, 7, 9)),
    # Full AC: at 2 blocks the backward peak has no prefetched all-gather, so 2/3/4 is not affine
    # and the window slides to 3/4/5.
    ("full", 2, (2, 3, 4, 5)),
])
def test_extrapolation_is_exact(ac: str, gas: int, depths: tuple[int, ...]) -> None:
    # 11 blocks traced whole against three depths extrapolated: the same bytes in every category.
    plan = make_plan("fsdp-full", dp=4, model=MODEL, activation_checkpointing=ac, seq_len=64, grad_accum_steps=gas)
    fsdp = render_fsdp(plan).config
    whole = trace_plan(plan, fsdp, full_depth_limit=100)
    extrapolated = trace_plan(plan, fsdp, full_depth_limit=0)
    assert not whole.extrapolated and extrapolated.extrapolated
    assert whole.depths == (11,) and extrapolated.depths == depths
    assert (extrapolated.moment, extrapolated.categories) == (whole.moment, whole.categories)


@pytest.mark.slow
def test_sharded_states_are_the_planners() -> None:
    plan = make_plan("fsdp-full", dp=2, model=MODEL, activation_checkpointing="selective-op", seq_len=64)
    traced = trace_plan(plan, render_fsdp(plan).config)
    from fstrain.core.plan.modelsize import count_parameters

    params = count_parameters(MODEL).total
    # fp32 shards (FSDP pads each tensor to a multiple of the mesh size) and AdamW's m and v.
    assert params * 4 // 2 <= traced.categories["parameters"] <= params * 4 // 2 + 4096
    assert traced.raw["OptState"] == pytest.approx(2 * traced.categories["parameters"], rel=1e-3)  # + step counters


def test_what_the_trainer_does_not_run_is_refused_before_torch() -> None:
    with pytest.raises(ConfigError, match="pin --tp 1 --pp 1"):
        check_traceable(make_plan("fsdp-full", dp=2, tp=2))
    with pytest.raises(ConfigError, match="pin --strategy fsdp-full"):
        check_traceable(make_plan("zero3", dp=2))
    with pytest.raises(ConfigError, match="--loss fused"):
        check_traceable(make_plan("fsdp-full", dp=2, loss="fused"))
    with pytest.raises(ConfigError, match="re-plan without --compile"):
        check_traceable(make_plan("fsdp-full", dp=2, compile=True))


def test_zero3_is_traced_as_fsdp_full_with_every_other_knob_the_same() -> None:
    from fstrain.api.trace import stand_in_knobs

    zero3 = make_plan("zero3", dp=8, activation_checkpointing="full", micro_batch_size=2, grad_accum_steps=4).knobs
    assert stand_in_knobs(zero3) == replace(zero3, strategy="fsdp-full")  # ZeRO stage 3 both
    # FSDP's CPU offload moves parameters with the optimizer: ZeRO-3's optimizer-only offload has
    # no FSDP kind (and the trace runs without offload anyway).
    assert stand_in_knobs(replace(zero3, offload="optimizer")).offload == "none"
    assert stand_in_knobs(replace(zero3, offload="optimizer+params")).offload == "optimizer+params"
    for strategy in ("fsdp-full", "fsdp-grad-op", "ddp", "zero1", "zero2"):  # traced as they are, or refused
        knobs = make_plan(strategy, dp=8).knobs
        assert stand_in_knobs(knobs) == knobs


@pytest.mark.slow
def test_cli_trace_json_and_table() -> None:
    common = ("plan", "--model", "tiny", "--gpu", "h100-sxm", "--num-nodes", "1", "--strategy", "fsdp-full",
              "--tp", "1", "--pp", "1", "--ac", "selective-op", "--trace")
    result = run_fstrain(*common, "--json", timeout=600)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    trace = doc["trace"]
    assert trace["plan"].startswith("FSDP full-shard") and trace["traced"]["moment"] in ("forward", "backward",
                                                                                             "optimizer step")
    assert trace["analytic"]["parameters"] == doc["plans"][0]["memory"]["parameters"]
    assert set(trace["error_pct"]) == {"parameters", "gradients", "optimizer_states", "activations", "buffers",
                                       "total"}
    human = run_fstrain(*common, timeout=600)
    assert human.returncode == 0 and "analytic vs PyTorch's trace" in human.stderr
    bad = run_fstrain("plan", "--model", "tiny", "--gpu", "h100-sxm", "--strategy", "zero2", "--trace")
    assert bad.returncode == 2 and "--trace" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_cli_trace_of_a_chosen_zero3_plan_traces_its_fsdp2_equivalent() -> None:
    # No --strategy: ZeRO-3 is the best plan here (it ties with FSDP full-shard and ranks first).
    common = ("plan", "--model", "tiny", "--gpu", "h100-sxm", "--num-nodes", "1", "--gpus-per-node", "2", "--top", "1")
    result = run_fstrain(*common, "--trace", "--json", timeout=600)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    best, trace = doc["plans"][0], doc["trace"]
    assert best["strategy"] == "zero3" and trace["plan"].startswith("ZeRO-3, ")
    assert trace["traced_plan"] == trace["plan"].replace("ZeRO-3", "FSDP full-shard", 1)
    assert trace["traced"]["total"] > 0
    # The analytic column is the planner's own for that FSDP plan, pinned: the same things counted.
    knobs = ("--strategy", "fsdp-full", "--micro-batch", str(best["micro_batch_size"]), "--grad-accum",
             str(best["grad_accum_steps"]), "--ac", best["activation_checkpointing"])
    fsdp = json.loads(run_fstrain(*common, *knobs, "--json").stdout)["plans"][0]
    rows = ("parameters", "gradients", "optimizer_states", "activations", "buffers")
    assert {key: trace["analytic"][key] for key in rows} == {key: fsdp["memory"][key] for key in rows}
    own = sum(best["memory"][key] for key in rows) / 2**30
    assert trace["stand_in"] == (
        f"traced as {trace['traced_plan']}: ZeRO-3's FSDP2 equivalent (the same states sharded over every "
        "data-parallel rank; DeepSpeed's partitioning does not run on fake tensors); both columns are FSDP "
        f"full-shard's, ZeRO-3's own analytic total is {own:.2f} GiB")


@pytest.mark.parametrize(("precision", "param_bytes", "state_bytes"), [
    ("bf16-pure", 2, 4),  # a bf16 model: bf16 shards, AdamW's m and v in bf16 (torchtune)
    ("amp-bf16", 4, 8),  # autocast over fp32 weights: fp32 shards and states
])
def test_traced_states_per_precision_mode(precision: str, param_bytes: int, state_bytes: int) -> None:
    from fstrain.core.plan.memory import model_states
    from fstrain.core.plan.modelsize import count_parameters

    model = replace(MODEL, num_layers=3)  # traced whole, no extrapolation
    plan = make_plan("fsdp-full", dp=2, model=model, activation_checkpointing="full", seq_len=64, precision=precision)
    traced = trace_plan(plan, render_fsdp(plan).config)
    params = count_parameters(model).total
    analytic = model_states(params, "fsdp-full", 2, precision)
    assert analytic.parameters == params * param_bytes // 2
    assert analytic.parameters <= traced.categories["parameters"] <= analytic.parameters + 4096
    assert traced.raw["OptState"] == pytest.approx(analytic.optimizer_states, rel=1e-2)
    assert analytic.optimizer_states == params * state_bytes // 2


@pytest.mark.slow
@pytest.mark.parametrize("ac", ["none", "selective-op", "every-k:2", "full"])
def test_moe_blocks_store_what_the_planner_counts(ac: str) -> None:
    # What one more block (one more period of every-k:2) adds at the traced forward peak: the
    # activations the planner counts per block, within 5 %. (What is left is FSDP's bf16 cast of
    # the rotary tables, seq x head_dim bytes per block, which the planner does not count.)
    plan = make_plan("fsdp-full", dp=4, model=MOE_MODEL, activation_checkpointing=ac, seq_len=128,
                     micro_batch_size=4, grad_accum_steps=1, precision="bf16")
    trace = _Tracer(plan, render_fsdp(plan).config)
    period = 2 if ac == "every-k:2" else 1

    def stored(blocks: int) -> int:
        forward = trace(blocks)["forward"]
        return sum(forward.get(kind, 0) for kind in ("Activation", "Temp", "Inputs"))

    per_block = [layer_activation_bytes(MOE_MODEL, 4, 128, ac=policy) for policy in ("none", "full")]
    predicted = sum(per_block) if ac == "every-k:2" else layer_activation_bytes(MOE_MODEL, 4, 128, ac=ac)
    assert predicted == pytest.approx(stored(3 * period) - stored(2 * period), rel=0.05)


@pytest.mark.slow
def test_mixtral_traces_at_full_size() -> None:
    # Mixtral 8x7B's real layout (46.7B parameters) over 16 ranks: 8 experts do not split by
    # expert, so FSDP shards the stacked expert weights on dim 1; every rank still holds 1/16.
    from fstrain.core.plan.modelsize import count_parameters
    from fstrain.io.recipes import load_shipped_recipe

    mixtral = load_shipped_recipe("mixtral-8x7b").model
    plan = make_plan("fsdp-full", dp=16, model=mixtral, activation_checkpointing="full", seq_len=4096,
                     micro_batch_size=1, grad_accum_steps=2, precision="bf16")
    traced = trace_plan(plan, render_fsdp(plan).config)
    assert traced.extrapolated and max(traced.depths) <= 6
    params = count_parameters(mixtral)
    assert traced.categories["parameters"] == pytest.approx(4 * params.total / 16, rel=1e-3)
    assert traced.raw["OptState"] == pytest.approx(2 * traced.categories["parameters"], rel=1e-3)
    # The planner's breakdown agrees category by category (and the peak is in backward for both).
    analytic = memory_breakdown(mixtral, params, params.total, plan.knobs, 8)
    assert (analytic.phase, traced.moment) == ("backward", "backward")
    for category, value in traced.categories.items():
        assert getattr(analytic, category) == pytest.approx(value, rel=0.05), category


@pytest.mark.slow
def test_attention_dropout_is_traced_as_the_flash_kernel_runs_it() -> None:
    # The CPU attention kernel cannot drop out (SDPA would fall back to the math path and store
    # every s x s probability); the GPU flash kernel stores nothing for dropout, so the trace turns
    # attention dropout off. What dropout adds is then only the residual and embedding dropouts'
    # noise, which CPU dropout keeps in the input's dtype (2 bytes; CUDA's fused kernel a 1-byte mask).
    layers, s, b, h = 4, 512, 4, 128
    traced = {}
    for dropout in (0.0, 0.1):
        model = replace(TINY_MODEL, num_layers=layers, dropout=dropout, hidden_size=h, num_heads=4, num_kv_heads=4,
                        ffn_hidden_size=4 * h, seq_len=s)
        plan = make_plan("fsdp-full", dp=4, model=model, activation_checkpointing="none", seq_len=s,
                         micro_batch_size=b, grad_accum_steps=1)
        traced[dropout] = trace_plan(plan, render_fsdp(plan).config).categories["activations"]
    assert traced[0.1] - traced[0.0] == (2 * layers + 1) * s * b * h * 2


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "dp", "micro_batch", "ac", "fused_rmsnorm"), [
    ("llama3.1-8b", 8, 2, "selective-op", False),  # peaks in the loss's backward
    ("llama3.1-70b", 64, 1, "every-k:2", False),  # the first block in backward is checkpointed, the next is not
    ("llama3.1-405b", 512, 1, "full", False),  # wide blocks: the peak is in the second norm's backward
    ("llama3.1-8b", 8, 1, "none", True),  # --fused-rmsnorm: each norm keeps its bf16 input, not an fp32 copy
])
def test_shipped_recipes_trace_like_the_planner_counts(recipe: str, dp: int, micro_batch: int, ac: str,
                                                       fused_rmsnorm: bool) -> None:
    """Full size, 8K tokens: every category of the planner's breakdown within 5 % of PyTorch's trace."""
    from fstrain.core.plan.memory import memory_breakdown
    from fstrain.core.plan.modelsize import count_parameters
    from fstrain.io.recipes import load_shipped_recipe

    model = load_shipped_recipe(recipe).model
    plan = make_plan("fsdp-full", dp=dp, model=model, activation_checkpointing=ac, seq_len=8192,
                     micro_batch_size=micro_batch, grad_accum_steps=2, precision="bf16", fused_rmsnorm=fused_rmsnorm)
    traced = trace_plan(plan, render_fsdp(plan).config)
    params = count_parameters(model)
    analytic = memory_breakdown(model, params, params.total, plan.knobs, 8)
    assert analytic.phase == {"loss or elsewhere": "loss"}.get(traced.moment, traced.moment)
    for category, value in traced.categories.items():
        if value >= 64 << 20:  # under 64 MiB (the rotary tables) there is nothing to compare
            assert getattr(analytic, category) == pytest.approx(value, rel=0.05), category


@pytest.mark.parametrize(("shape", "num_chunks", "dim"), [
    ((10, 3), 4, 0),  # uneven: 3, 3, 3, 1
    ((7,), 8, 0),  # fewer rows than chunks: the last chunk empty
    ((3, 9), 5, 1),  # along dim 1
    ((16, 2), 4, 0),  # even
    ((5,), 1, 0),
])
def test_lazy_chunks_are_fsdp2s_chunks(shape: tuple[int, ...], num_chunks: int, dim: int) -> None:
    """The trace's on-demand chunks are FSDP2's own ``_chunk_with_empty``: the same views (shape,
    strides, offset, values), empty tensors past torch.chunk's last."""
    import torch
    from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty

    from fstrain.train.trace import LazyChunks

    tensor = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
    expected, lazy = _chunk_with_empty(tensor, num_chunks, dim), LazyChunks(tensor, num_chunks, dim)
    assert len(lazy) == len(expected) == num_chunks
    for got, want in zip(lazy, expected, strict=True):
        assert (got.shape, got.stride(), got.storage_offset()) == (want.shape, want.stride(), want.storage_offset())
        assert torch.equal(got, want)
    assert [c.shape for c in lazy[-2:]] == [c.shape for c in expected[-2:]]
