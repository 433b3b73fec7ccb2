"""The reference model against the planner's parameter count, and the trainer's synthetic data."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.plan.schema import ModelSpec, MoESpec
from fstrain.core.render.options import TrainingOptions, lr_multiplier
from fstrain.errors import ConfigError
from fstrain.train.data import SyntheticData
from fstrain.train.model import GPT, TransformerBlock, num_parameters
from fstrain.train.steps import lm_loss
from tests.plans import TINY_MODEL

LLAMA_LIKE = replace(TINY_MODEL, activation="swiglu", norm="rmsnorm", position_embedding="rope", linear_bias=False,
                     tied_embeddings=False, ffn_hidden_size=172)
MIXTRAL_LIKE = replace(LLAMA_LIKE, moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=96))


@pytest.mark.parametrize(
    "spec",
    [
        TINY_MODEL,
        LLAMA_LIKE,
        replace(LLAMA_LIKE, num_kv_heads=1),  # multi-query attention
        replace(LLAMA_LIKE, num_kv_heads=4, tied_embeddings=True),
        replace(TINY_MODEL, tied_embeddings=False, linear_bias=False, norm="rmsnorm"),
        MIXTRAL_LIKE,
        replace(TINY_MODEL, linear_bias=False, moe=MoESpec(num_experts=3, top_k=1, expert_ffn_hidden_size=80)),
        replace(LLAMA_LIKE, head_dim=24, qk_norm="head", attention_bias="qkv"),  # Qwen3 / Qwen2
        replace(LLAMA_LIKE, qk_norm="projection", attention_bias="all", mlp_bias=True),  # OLMo 2 / Llama biases
        replace(LLAMA_LIKE, activation="geglu", post_norms=True, head_dim=32, tied_embeddings=True),  # Gemma 2
        replace(MIXTRAL_LIKE, qk_norm="head", activation="geglu"),
    ],
    ids=["gpt2-like-gqa", "llama-like-gqa", "mqa", "mha-tied", "gelu-rmsnorm", "mixtral-like", "gelu-moe-top1",
         "qwen3-like", "olmo2-like", "gemma2-like", "qk-norm-moe"],
)
def test_parameter_count_matches_the_planner(spec: ModelSpec) -> None:
    model = GPT(spec)
    assert num_parameters(model) == count_parameters(spec).total
    tokens = torch.randint(0, spec.vocab_size, (2, spec.seq_len))
    assert model(tokens).shape == (2, spec.seq_len, spec.vocab_size)


def test_gqa_shapes_and_tied_head() -> None:
    model = GPT(TINY_MODEL)
    attn = model.blocks[0].attn
    assert attn.q_proj.out_features == 64 and attn.k_proj.out_features == attn.v_proj.out_features == 2 * 16
    assert model.lm_head.weight is model.tok_embeddings.weight
    assert sum(isinstance(m, TransformerBlock) for m in model.modules()) == 2


@pytest.mark.parametrize("spec", [LLAMA_LIKE, TINY_MODEL, MIXTRAL_LIKE], ids=["llama", "gpt2-bias-dropout", "moe"])
@pytest.mark.parametrize("ac", ["selective-op", "every-k:2", "full", "megatron-selective", "selective"])
def test_activation_checkpointing_gives_the_same_gradients(ac: str, spec: ModelSpec) -> None:
    tokens = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    grads = []
    for mode in ("none", ac):
        torch.manual_seed(0)
        model = GPT(replace(spec, num_layers=3), activation_checkpointing=mode)
        torch.manual_seed(1)  # the same dropout masks in both runs (checkpoints replay the RNG)
        lm_loss(model(tokens), tokens).backward()
        grads.append([p.grad.clone() for p in model.parameters()])  # type: ignore[union-attr]
    for plain, checkpointed in zip(*grads, strict=True):
        torch.testing.assert_close(plain, checkpointed)


def test_selective_op_saves_every_other_matmul() -> None:
    from torch.utils.checkpoint import CheckpointPolicy

    from fstrain.train.checkpointing import MATMUL_OPS, _policy

    class Ctx:
        is_recompute = False

    policy = _policy({"forward": 0, "recompute": 0})
    mm = next(iter(MATMUL_OPS))
    decisions = [policy(Ctx(), mm) for _ in range(7)]  # q, k, v, o, gate, up, down
    save, recompute = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
    assert decisions == [save, recompute, save, recompute, save, recompute, save]
    assert policy(Ctx(), torch.ops.aten.silu.default) == recompute
    assert policy(Ctx(), torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default) == save


def test_moe_block_is_mixtrals_routing() -> None:
    # Hugging Face's MixtralSparseMoeBlock, written as its loop over experts, on the same weights.
    torch.manual_seed(0)
    moe = GPT(MIXTRAL_LIKE).blocks[0].mlp
    x = torch.randn(2, 16, MIXTRAL_LIKE.hidden_size)
    flat = x.reshape(-1, x.shape[-1])
    probs = torch.softmax(moe.router(flat), dim=-1, dtype=torch.float32)
    weights, chosen = probs.topk(2, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    expected = torch.zeros_like(flat)
    for e in range(4):
        rows, slot = torch.where(chosen == e)
        h = torch.nn.functional.silu(flat[rows] @ moe.w1[e].T) * (flat[rows] @ moe.w3[e].T)
        expected.index_add_(0, rows, (h @ moe.w2[e].T) * weights[rows, slot, None])
    torch.testing.assert_close(moe(x), expected.reshape(x.shape))
    assert (chosen == 0).any() and (chosen == 3).any()  # more than one expert is really used


def test_moe_trains_and_traces_under_fake_tensors() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.manual_seed(0)
    model = GPT(MIXTRAL_LIKE)
    tokens = torch.randint(0, 256, (4, 32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = lm_loss(model(tokens), tokens)
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert losses[-1] < losses[0] - 0.5
    assert model.blocks[0].mlp.w1.grad is not None and model.blocks[0].mlp.router.weight.grad is not None
    with FakeTensorMode():  # data-dependent routing, but every shape is static
        fake = GPT(replace(MIXTRAL_LIKE, num_layers=1), activation_checkpointing="selective-op")
        fake_tokens = torch.randint(0, 256, (2, 64))
        lm_loss(fake(fake_tokens), fake_tokens).backward()
        assert fake.blocks[0].mlp.w2.grad is not None


def test_selective_op_recomputes_the_router() -> None:
    from torch.utils.checkpoint import CheckpointPolicy

    from fstrain.train.checkpointing import MATMUL_OPS, _policy

    class Ctx:
        is_recompute = False

    policy = _policy({"forward": 0, "recompute": 0}, frozenset({(64, 4)}))
    mm = next(iter(MATMUL_OPS))
    weights = [torch.empty(64, 64), torch.empty(64, 32), torch.empty(64, 4), torch.empty(64, 32)]  # q, k, router, v
    decisions = [policy(Ctx(), mm, torch.empty(8, 64), w) for w in weights]
    save, recompute = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
    assert decisions == [save, recompute, recompute, save]


def test_unknown_policy_is_one_clear_error() -> None:
    from fstrain.errors import InputError

    with pytest.raises(InputError, match="every-k:0"):
        GPT(LLAMA_LIKE, activation_checkpointing="every-k:0")


def test_unsupported_models_are_refused() -> None:
    with pytest.raises(ConfigError, match="experts have no biases"):
        GPT(replace(TINY_MODEL, moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=128)))
    with pytest.raises(ConfigError, match="num_kv_heads"):
        GPT(replace(TINY_MODEL, num_kv_heads=3))


@pytest.mark.parametrize(
    ("spec", "where", "what"),
    [
        (replace(LLAMA_LIKE, sliding_window=32), "model.sliding_window", "sliding-window attention"),
        (replace(MIXTRAL_LIKE, moe=MoESpec(4, 2, 96, shared_ffn_hidden_size=64)), "model.moe.shared_ffn_hidden_size",
         "a shared expert"),
        (replace(MIXTRAL_LIKE, moe=MoESpec(4, 2, 96, router_dtype="fp32")), "model.moe.router_dtype", "fp32 router"),
        (replace(MIXTRAL_LIKE, mlp_bias=True), "model.mlp_bias", "experts have no biases"),
    ],
)
def test_what_the_reference_trainer_does_not_build_is_refused_in_one_line(spec: ModelSpec, where: str,
                                                                        what: str) -> None:
    """Never a silently different model: the plan models these, the bundled trainer names them."""
    from fstrain.core.job.plan import check_supported

    with pytest.raises(ConfigError, match=what) as caught:
        check_supported(spec)
    assert caught.value.where == where and "\n" not in str(caught.value)


def test_synthetic_batches_are_a_pure_function_of_step_and_rank() -> None:
    data = SyntheticData(vocab_size=256, seq_len=64, seed=5)
    again = SyntheticData(vocab_size=256, seq_len=64, seed=5)
    a = data.batch(step=3, micro_step=1, dp_rank=1, dp_size=2, micro_batch_size=4)
    assert a.shape == (4, 64)
    assert torch.equal(a, again.batch(3, 1, 1, 2, 4))
    assert not torch.equal(a, data.batch(3, 1, 0, 2, 4))  # ranks see different samples
    assert not torch.equal(a, data.batch(4, 1, 1, 2, 4))
    # Every sample comes from the fixed pool: that is what makes the loss fall quickly.
    pool = {tuple(row.tolist()) for row in data.pool}
    assert all(tuple(row.tolist()) in pool for row in a)


def test_a_step_sees_the_same_sequences_on_any_split_of_its_global_batch() -> None:
    """dp 2 x micro 3 x accum 1, dp 3 x micro 2 x accum 1 and dp 2 x micro 1 x accum 3: six
    sequences per step, the same six, in the same global order."""
    data = SyntheticData(vocab_size=256, seq_len=16, seed=5)

    def global_batch(dp: int, micro: int, accum: int) -> torch.Tensor:
        return torch.cat([data.batch(7, m, r, dp, micro) for m in range(accum) for r in range(dp)])

    two = global_batch(2, 3, 1)
    assert torch.equal(two, global_batch(3, 2, 1)) and torch.equal(two, global_batch(2, 1, 3))
    assert two.shape == (6, 16) and len({tuple(row.tolist()) for row in two}) > 1
    assert not torch.equal(two, torch.cat([data.batch(8, 0, r, 2, 3) for r in range(2)]))


def test_lr_multiplier() -> None:
    constant = TrainingOptions(warmup_steps=4)
    assert [lr_multiplier(s, constant) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cosine = TrainingOptions(warmup_steps=2, total_steps=12, min_lr_ratio=0.1)
    values = [lr_multiplier(s, cosine) for s in range(14)]
    assert values[:3] == [0.5, 1.0, 1.0]
    assert values[7] == pytest.approx(0.55)  # halfway through the decay
    assert values[12] == values[13] == pytest.approx(0.1)
    assert lr_multiplier(0, TrainingOptions(warmup_steps=0)) == 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_mm_and_its_gradients_are_a_loop_over_groups(dtype: torch.dtype) -> None:
    from fstrain.train.grouped_mm import grouped_mm

    torch.manual_seed(0)
    x = torch.randn(10, 16, requires_grad=True)
    w = torch.randn(4, 16, 8, requires_grad=True)
    offsets = torch.tensor([3, 5, 5, 10], dtype=torch.int32)  # group 2 has no rows
    grad = torch.randn(10, 8)
    y = grouped_mm(x.to(dtype), w.to(dtype), offsets)
    y.backward(grad.to(dtype))
    expected = torch.cat([x[0:3] @ w[0], x[3:5] @ w[1], x[5:10] @ w[3]])
    gx, gw = x.grad, w.grad
    x.grad = w.grad = None
    expected.backward(grad)
    tol = {"rtol": 2e-2, "atol": 1e-1} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(y.float(), expected, **tol)
    torch.testing.assert_close(gx, x.grad, **tol)
    torch.testing.assert_close(gw, w.grad, **tol)
    assert gw is not None and not gw[2].any()  # the empty group gets a zero gradient


def test_tiny_moe_recipe_builds_its_stated_count() -> None:
    from fstrain.io.recipes import load_shipped_recipe

    recipe = load_shipped_recipe("tiny-moe")
    assert num_parameters(GPT(recipe.model)) == count_parameters(recipe.model).total == recipe.stated_params
