"""flash-attention's fused MLP (checkpoint levels 0/1/2) and fused dropout-add-norm in the planner
(fstrain/core/plan/kernels.py, memory.py; the flash-attn framework profile).

The expected bytes are counted here from the tensors flash-attention's autograd functions save
(Dao-AILab/flash-attention@0251105):

- ``FusedMLPFunc.forward`` (flash_attn/ops/fused_dense.py L337-343): level 0 saves
  ``x, weight1, weight2, pre_act, output1``; level 1 ``x, weight1, weight2, pre_act``; level 2
  ``x, weight1, weight2, bias1``. The weights are parameters, not activations; ``x`` is the FFN
  input (h wide), ``pre_act`` and ``output1`` are FFN-wide, all in the compute dtype.
- ``LayerNormFn.forward`` (flash_attn/ops/triton/layer_norm.py L914-916) saves ``residual_out``
  (h wide, the residual's dtype: fp32 under autocast), ``mean`` and ``rstd`` (one fp32 each per
  row; RMSNorm: ``rstd`` only) and ``seeds`` (one int64 per row when dropout > 0), where eager
  PyTorch keeps the norm's input and statistics and dropout's 1-byte mask per element.
- ``MHA`` (flash_attn/modules/mha.py L459) projects q, k and v with one ``nn.Linear``: under
  autocast one 16-bit cast of its input is saved, where three linears save one each.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from fstrain.api.plan import ClusterRequest, resolve_cluster
from fstrain.core.plan.assumptions import Assumptions, with_overrides
from fstrain.core.plan.blocktime import KernelModel
from fstrain.core.plan.frameworks import framework_assumptions, fused_kernels_note, profile
from fstrain.core.plan.kernelcost import GpuRates
from fstrain.core.plan.kernels import (
    EAGER_BLOCK,
    FusedBlock,
    check_fused_block,
    elementwise_bytes_per_token,
    fused_mlp_recompute_bytes,
)
from fstrain.core.plan.memory import MemoryBreakdown, block_backward_extra_bytes, layer_activation_bytes
from fstrain.core.plan.planner import Pins, PlanModel, TrainingSpec, plan
from fstrain.core.plan.schema import ModelSpec, MoESpec, PlanKnobs
from fstrain.errors import ConfigError, InputError
from fstrain.io.recipes import load_shipped_recipe
from tests.helpers import run_fstrain

GPT2_XL = load_shipped_recipe("gpt2-1.5b").model  # hidden 1600, FFN 6400, LayerNorm, dropout 0.1, 48 layers
LLAMA = load_shipped_recipe("llama3.1-8b").model  # SwiGLU, RMSNorm, no dropout
A100X8 = resolve_cluster(ClusterRequest(num_nodes=1, gpus_per_node=8, gpu="a100-80gb"))
B, S = 4, 1024
TOKENS = B * S
H, FFN = 1600, 6400


def saved(level: int | None = None, dropout_add_ln: bool = False, precision: str = "amp-bf16",
          model: ModelSpec = GPT2_XL, ac: str = "none", packed_qkv: bool = False) -> int:
    return layer_activation_bytes(model, B, S, 1, ac, True, precision,
                                  fused=FusedBlock(level, dropout_add_ln, packed_qkv))


@pytest.mark.parametrize("precision, a", [("amp-bf16", 2), ("bf16", 2), ("fp16", 2)])
def test_each_mlp_checkpoint_level_saves_what_fused_mlp_func_saves(precision: str, a: int) -> None:
    eager = saved(None, precision=precision)
    # Level 0 saves x, pre_act and output1: eager PyTorch's fc1 input, GeLU input and fc2 input.
    assert saved(0, precision=precision) == eager
    # Level 1 drops output1 (FFN-wide), level 2 also pre_act.
    assert eager - saved(1, precision=precision) == TOKENS * FFN * a == 52_428_800
    assert eager - saved(2, precision=precision) == 2 * TOKENS * FFN * a
    # GPT-2 XL's 48 blocks at 4 x 1024 tokens: level 1 keeps 2.34 GiB less, level 2 4.69 GiB.
    assert 48 * (eager - saved(1, precision=precision)) / 2**30 == pytest.approx(2.34, abs=0.01)


def test_the_backward_recomputes_what_the_level_did_not_save() -> None:
    """fused_dense.py L368-395: level 1 recomputes output1 from pre_act, level 2 both from x, so
    the block in backward holds what level 0 does; the temporaries grow by what was not saved."""
    def extra(level: int | None) -> int:
        return block_backward_extra_bytes(GPT2_XL, B, S, 1, "amp-bf16", True, "block", 4,
                                          fused=FusedBlock(level))

    wide = TOKENS * FFN * 2
    assert extra(0) == extra(None)
    assert extra(1) == extra(0) + wide and extra(2) == extra(0) + 2 * wide
    for level in (1, 2):  # stored + in backward: the same at every level
        assert saved(level) + extra(level) == saved(0) + extra(0)


def test_fused_dropout_add_layernorm_keeps_a_seed_per_row_not_a_mask_per_element() -> None:
    eager = saved(None)
    fused = saved(None, dropout_add_ln=True)
    # Per token and norm, autocast (fp32 residual): eager keeps the fp32 input (4h), mean and rstd
    # (8) and the residual dropout's mask (h); fused keeps residual_out (4h), mean and rstd (8)
    # and an int64 seed (8). Two norms a block.
    assert eager - fused == 2 * TOKENS * (H - 8)
    without_dropout = dataclasses.replace(GPT2_XL, dropout=0.0)
    assert saved(None, True, model=without_dropout) == saved(None, False, model=without_dropout)


def test_fused_rmsnorm_keeps_the_residual_and_rstd() -> None:
    """With an RMSNorm (is_rms_norm) no mean; eager RMSNorm keeps an fp32 copy of its input, 1/rms
    and its output besides (memory.py), the fused kernel its residual and rstd."""
    eager = saved(None, precision="bf16", model=LLAMA)
    fused = saved(None, True, precision="bf16", model=LLAMA)
    h = LLAMA.hidden_size
    assert eager - fused == 2 * TOKENS * ((4 * h + 4 + 2 * h) - (2 * h + 4))


def test_a_packed_qkv_linear_saves_one_autocast_cast_not_three() -> None:
    assert saved(packed_qkv=False) - saved(packed_qkv=True) == 2 * TOKENS * H * 2
    assert saved(precision="bf16", packed_qkv=True) == saved(precision="bf16")  # one shared input either way


def test_full_recompute_keeps_the_block_input_whatever_the_kernels() -> None:
    assert saved(2, True, ac="full", packed_qkv=True) == saved(None, ac="full") == TOKENS * H * 4


def breakdown(framework: str, assume: tuple[str, ...] = (), ac: str = "none",
              model: ModelSpec = GPT2_XL) -> MemoryBreakdown:
    pins = Pins(strategy="zero1", tp=1, pp=1, micro_batch_size=B, grad_accum_steps=16, activation_checkpointing=ac,
                offload="none")
    assumptions = with_overrides(Assumptions(), list(assume))
    training = TrainingSpec(S, None, "amp-bf16", loss="fused", framework=framework)
    result = plan(PlanModel.from_spec(model), training, A100X8, pins, assumptions, suggest=False)
    (only,) = [*result.plans, *result.rejected]
    return only.memory


def activations_line(memory: MemoryBreakdown) -> tuple[str, int]:
    (line,) = [(name, value) for name, value in memory.details if name.startswith("activations (")]
    return line


def test_the_flash_attn_profile_changes_the_activations_line() -> None:
    eager_name, eager = activations_line(breakdown("fstrain"))
    name, value = activations_line(breakdown("flash-attn"))
    assert eager_name == "activations (48 layers x 1 micro-batch, AC none)"
    assert name == ("activations (48 layers x 1 micro-batch, AC none, fused MLP lvl 0, fused dropout-add-norm, "
                    "packed qkv)")
    assert eager - value == 48 * TOKENS * (2 * (H - 8) + 2 * H * 2)
    # An --assume wins over the profile: level 2 keeps two FFN-wide tensors less per block.
    name2, value2 = activations_line(breakdown("flash-attn", ("mlp_checkpoint_lvl=2",)))
    assert name2.endswith("fused MLP lvl 2, fused dropout-add-norm, packed qkv)")
    assert value - value2 == 48 * 2 * TOKENS * FFN * 2
    # The same kernels by --assume alone, without the profile.
    by_assume = ("fused_mlp=true", "fused_dropout_add_ln=true", "packed_qkv=true")
    assert activations_line(breakdown("fstrain", by_assume))[1] == value


def test_the_profile_leaves_swiglu_unfused_and_says_so() -> None:
    assumptions = framework_assumptions(profile("flash-attn"), Assumptions(), LLAMA)
    assert (assumptions.fused_mlp, assumptions.fused_dropout_add_ln, assumptions.packed_qkv) == (False, True, True)
    assert fused_kernels_note(profile("flash-attn"), Assumptions(), LLAMA) == (
        "fused dropout-add-norm, packed qkv, no fused MLP (flash-attn fuses dense GeLU MLPs, llama3.1-8b is swiglu)")
    assert fused_kernels_note(profile("flash-attn"), Assumptions(), GPT2_XL) == (
        "fused MLP lvl 0, fused dropout-add-norm, packed qkv")
    assert fused_kernels_note(profile("fstrain"), Assumptions(), GPT2_XL) == ""
    assert activations_line(breakdown("flash-attn", model=LLAMA, ac="full"))[0].endswith(
        "AC full, fused dropout-add-norm, packed qkv)")


def test_what_the_fused_mlp_cannot_run_is_refused_in_one_line() -> None:
    with pytest.raises(InputError, match=r"llama3\.1-8b uses swiglu"):
        check_fused_block(LLAMA, True, 0)
    with pytest.raises(InputError, match="FusedMLP has levels 0, 1 and 2"):
        check_fused_block(GPT2_XL, True, 3)
    with pytest.raises(InputError, match="but fused_mlp is off"):
        check_fused_block(GPT2_XL, False, 1)
    check_fused_block(GPT2_XL, True, 2)
    moe = dataclasses.replace(GPT2_XL, name="gelu-moe", moe=MoESpec(8, 2, FFN))
    with pytest.raises(InputError, match="gelu-moe is a mixture of experts"):
        check_fused_block(moe, True, 0)
    with pytest.raises(ConfigError, match="selective-op"):
        breakdown("flash-attn", ac="selective-op")
    assert FusedBlock() == EAGER_BLOCK and EAGER_BLOCK.describe() == ""


def test_plan_flags() -> None:
    args = ("plan", "--model", "gpt2-1.5b", "--num-nodes", "1", "--gpus-per-node", "8", "--gpu", "a100-80gb",
            "--strategy", "zero1", "--tp", "1", "--pp", "1", "--micro-batch", "4", "--seq-len", "1024",
            "--precision", "amp-bf16", "--ac", "none")
    ok = run_fstrain(*args, "--framework", "flash-attn", "--assume", "mlp_checkpoint_lvl=1", "--json")
    assert ok.returncode == 0, ok.stderr
    details = json.loads(ok.stdout)["plans"][0]["memory"]["details"]
    assert ("activations (48 layers x 1 micro-batch, AC none, fused MLP lvl 1, fused dropout-add-norm, packed qkv)"
            in details)
    human = run_fstrain(*args, "--framework", "flash-attn")
    training_line = " ".join(human.stderr.split())
    assert "as flash-attn keeps it, fused MLP lvl 0, fused dropout-add-norm, packed qkv" in training_line
    bad = run_fstrain("plan", "--model", "llama3.1-8b", "--num-nodes", "1", "--gpus-per-node", "8",
                      "--gpu", "a100-80gb", "--assume", "fused_mlp=true")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "error: --assume: fused_mlp is flash-attention's fc1 + GeLU kernel, but llama3.1-8b uses swiglu "
        "(flash-attention runs it as an unfused GatedMlp) (hint: leave fused_mlp out for this model)"]


def test_fused_kernels_move_less_elementwise_traffic_and_level_1_recomputes_the_gelu() -> None:
    a = 2
    eager = elementwise_bytes_per_token(GPT2_XL, a, False, False)
    # 2 LayerNorms, 2 adds, 2 residual dropouts (read, write, a 1-byte mask); GeLU
    assert (eager.replicated, eager.sharded) == (H * (2 * 2 * a + 2 * 3 * a + 2 * (2 * a + 1)), FFN * 2 * a)
    fused = elementwise_bytes_per_token(GPT2_XL, a, False, False, FusedBlock(0, True))
    # One kernel per norm reads the block output and the residual, writes the output and the sum;
    # the GeLU is fc1's epilogue, which writes the pre-activation besides its output.
    assert (fused.replicated, fused.sharded) == (H * 2 * 4 * a, FFN * a)
    assert [fused_mlp_recompute_bytes(a, FusedBlock(level)) for level in (None, 0, 1, 2)] == [0, 0, 2 * a, a]


def test_level_2_runs_fc1_again_in_backward() -> None:
    a100 = GpuRates("a100-80gb", (("bf16", 312e12), ("fp16", 312e12), ("fp32", 19.5e12)), 2039e9)
    knobs = PlanKnobs("zero1", 1, 8, 1, 1, 8, B, 1, precision="amp-bf16", seq_len=S)

    def terms(level: int) -> tuple[float, float, KernelModel]:
        model = KernelModel(a100, Assumptions(fused_mlp=True, mlp_checkpoint_lvl=level, compute_time_scale=1.0))
        micro_batch = model.micro_batch(GPT2_XL, knobs, GPT2_XL.num_layers, last_stage=False)
        return micro_batch.gemm_s, micro_batch.memory_s, model

    gemm0, memory0, model0 = terms(0)
    gemm1, memory1, _ = terms(1)
    gemm2, memory2, _ = terms(2)
    fc1_forward = model0.gemms.linear(TOKENS, H, FFN, "bf16")[0]
    assert gemm1 == gemm0 and gemm2 == pytest.approx(gemm0 + GPT2_XL.num_layers * fc1_forward)
    hbm = model0.hbm_bytes_per_s
    assert memory1 - memory0 == pytest.approx(GPT2_XL.num_layers * TOKENS * FFN * 2 * 2 / hbm)
    assert memory2 - memory0 == pytest.approx(GPT2_XL.num_layers * TOKENS * FFN * 2 / hbm)


def test_under_an_achievable_mfu_level_2_adds_fc1_forward_flops() -> None:
    def compute_s(level: int) -> float:
        pins = Pins(strategy="zero1", tp=1, pp=1, micro_batch_size=B, grad_accum_steps=16,
                    activation_checkpointing="none", offload="none")
        training = TrainingSpec(S, None, "amp-bf16", loss="fused", framework="flash-attn")
        assumptions = with_overrides(Assumptions(), [f"mlp_checkpoint_lvl={level}", "mfu=0.4"])
        (only,) = [*plan(PlanModel.from_spec(GPT2_XL), training, A100X8, pins, assumptions, suggest=False).plans]
        assert only.time is not None
        return only.time.compute_s

    peak = 312e12  # A100 bf16
    fc1_forward = 16 * TOKENS * 48 * 2 * H * FFN / (peak * 0.4)  # 16 micro-batches, 48 blocks
    level1_traffic = compute_s(1) - compute_s(0)
    assert compute_s(2) - compute_s(0) == pytest.approx(fc1_forward + level1_traffic / 2, rel=1e-6)
