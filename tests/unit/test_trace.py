"""``fstrain plan --trace``: PyTorch's own fake-tensor memory trace of the bundled trainer's model."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fstrain.core.render.fsdp import render_fsdp
from fstrain.errors import ConfigError
from fstrain.train.trace import check_traceable, trace_plan
from tests.helpers import run_fstrain
from tests.plans import TINY_MODEL, make_plan

MODEL = replace(TINY_MODEL, num_layers=11, dropout=0.0)


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


def test_sharded_states_are_the_planners() -> None:
    plan = make_plan("fsdp-full", dp=2, model=MODEL, activation_checkpointing="selective-op", seq_len=64)
    traced = trace_plan(plan, render_fsdp(plan).config)
    from fstrain.core.modelsize import count_parameters

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
    bad = run_fstrain("plan", "--model", "tiny", "--gpu", "h100-sxm", "--strategy", "zero3", "--trace")
    assert bad.returncode == 2 and "--trace" in bad.stderr and "Traceback" not in bad.stderr
