"""The loss's memory by ``--loss``: the bytes per logit of fstrain.core.plan.losses against the tensors
the bundled trainer's loss really allocates, and the loss moment against PyTorch's own trace."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from fstrain.core.job.plan import check_trainer_loss
from fstrain.core.plan.losses import LossPeaks, loss_chunks, loss_peaks, parse_loss
from fstrain.core.plan.memory import memory_breakdown
from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.render.fsdp import render_fsdp
from fstrain.errors import ConfigError, InputError
from fstrain.train.model import GPT, head_logits
from fstrain.train.steps import lm_loss
from fstrain.train.trace import trace_plan
from tests.plans import TINY_MODEL, make_plan


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages created under this mode that are still alive, after every op
    (storages of ``existing`` tensors, which ops may return views of, are not counted)."""

    def __init__(self, existing: tuple[torch.Tensor, ...] = ()) -> None:
        super().__init__()
        self.existing = {t.untyped_storage().data_ptr() for t in existing}
        self.live: dict[int, int] = {}
        self.now = 0
        self.peak = 0

    def _free(self, key: int) -> None:
        self.now -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                key = storage.data_ptr()
                if key not in self.live and key not in self.existing and storage.nbytes():
                    self.live[key] = storage.nbytes()
                    self.now += storage.nbytes()
                    weakref.finalize(storage, self._free, key)
        self.peak = max(self.peak, self.now)
        return out

    def reset_peak(self) -> None:
        self.peak = self.now


def measure(run_forward: Callable[[], torch.Tensor], existing: tuple[torch.Tensor, ...]) -> tuple[int, int]:
    """The highest live bytes during the loss's forward and during its backward."""
    with LiveBytes(existing) as live:
        loss = run_forward()
        forward = live.peak
        live.reset_peak()
        loss.backward()
        return forward, live.peak


def test_parse_loss() -> None:
    assert [parse_loss(v, "--loss") for v in ("full", "fused", "megatron-core", "chunked", "chunked:3")] == [
        "full", "fused", "megatron-core", "chunked:8", "chunked:3"]
    assert [loss_chunks(v) for v in ("full", "chunked:8", "chunked:3")] == [1, 8, 3]
    for bad in ("liger", "chunked:0", "chunked:x", "full:2"):
        with pytest.raises(InputError, match="--loss"):
            parse_loss(bad, "--loss")


@pytest.mark.parametrize(("loss", "dtype"), [
    ("full", torch.bfloat16), ("full", torch.float32), ("chunked:4", torch.bfloat16), ("chunked:3", torch.float32),
    ("chunked:1", torch.bfloat16),
])
def test_loss_peaks_are_the_trainers_tensors(loss: str, dtype: torch.dtype) -> None:
    # The output projection and the loss as the bundled trainer runs them (model.head_logits,
    # steps.lm_loss), on real CPU tensors: a large vocabulary against a narrow hidden size, so the
    # logits dominate; the hidden states and the head's weight exist before the measurement.
    batch, seq, hidden, vocab = 2, 240, 8, 2048
    torch.manual_seed(0)
    head = torch.nn.Linear(hidden, vocab, bias=False).to(dtype)
    states = torch.randn(batch, seq, hidden, dtype=dtype, requires_grad=True)
    tokens = torch.randint(0, vocab, (batch, seq))
    forward, backward = measure(lambda: lm_loss(head_logits(head, states, loss_chunks(loss)), tokens),
                                (head.weight, states, tokens))
    expected = loss_peaks(loss, batch * seq * vocab, 2 if dtype == torch.bfloat16 else 4)
    # What else is live is per token (targets, row statistics, the chunks' inputs) and under 1 %
    # here; the full loss's copies cover seq - 1 positions, the planner counts seq.
    assert forward == pytest.approx(expected.forward, rel=0.01)
    assert backward == pytest.approx(expected.backward, rel=0.01)


def test_the_peaks_by_loss_on_values() -> None:
    n = 1000
    assert loss_peaks("full", n, 2) == LossPeaks(10 * n, 12 * n)  # backward: log-softmax, its two gradients
    assert loss_peaks("fused", n, 2) == LossPeaks(2 * n, 4 * n)
    assert loss_peaks("megatron", n, 2) == LossPeaks(12 * n, 6 * n)  # forward: fp32 logits, clone, exp
    assert loss_peaks("megatron-core", n, 2) == LossPeaks(10 * n, 6 * n)  # logits, fp32 copy, shifted copy
    assert loss_peaks("megatron-inplace", n, 2) == LossPeaks(6 * n, 6 * n)  # logits, fp32 copy shifted in place
    assert loss_peaks("litgpt", n, 2) == LossPeaks(4 * n, 8 * n)  # no upcast; logits, log-softmax, grads, concat
    assert loss_peaks("chunked:8", n, 2) == LossPeaks(2 * n + 4 * n + 4 * 125, 4 * n + 8 * 125)
    assert loss_peaks("chunked:1", n, 2) == loss_peaks("full", n, 2)
    assert loss_peaks("megatron", n, 2).moment == "forward" and loss_peaks("full", n, 2).moment == "backward"


def test_chunked_loss_is_the_full_loss() -> None:
    spec = replace(TINY_MODEL, dropout=0.0)
    torch.manual_seed(0)
    whole = GPT(spec)
    chunked = GPT(spec, loss_chunks=3)
    chunked.load_state_dict(whole.state_dict())
    tokens = torch.randint(0, spec.vocab_size, (2, 50))
    full_loss, chunked_loss = lm_loss(whole(tokens), tokens), lm_loss(chunked(tokens), tokens)
    assert torch.allclose(full_loss, chunked_loss, rtol=1e-5)
    full_loss.backward()
    chunked_loss.backward()
    assert whole.lm_head.weight.grad is not None and chunked.lm_head.weight.grad is not None
    assert torch.allclose(whole.lm_head.weight.grad, chunked.lm_head.weight.grad, rtol=1e-4, atol=1e-7)


def test_the_trainer_runs_full_and_chunked_only() -> None:
    for loss in ("full", "chunked:8"):
        check_trainer_loss(make_plan("fsdp-full", loss=loss), "plan.yaml")
    for loss in ("fused", "megatron", "megatron-core"):
        with pytest.raises(ConfigError, match=f"--loss {loss}.*re-plan with --loss full"):
            check_trainer_loss(make_plan("fsdp-full", loss=loss), "plan.yaml")


GRID = [  # vocabulary, hidden, sequence, micro-batch, AC, loss, norm
    # over 10 s on 2 cores; the other cases run the same code in a quick run
    pytest.param(16000, 64, 128, 2, "selective-op", "full", "rmsnorm", marks=pytest.mark.slow),
    (16000, 64, 128, 2, "none", "chunked:4", "rmsnorm"),
    (12000, 128, 128, 2, "full", "full", "layernorm"),
    (12000, 128, 128, 2, "full", "chunked:8", "layernorm"),
    (8000, 128, 256, 1, "selective-op", "chunked:3", "rmsnorm"),
]


@pytest.mark.parametrize(("vocab", "hidden", "seq", "mbs", "ac", "loss", "norm"), GRID)
def test_the_loss_moment_is_the_traced_one(vocab: int, hidden: int, seq: int, mbs: int, ac: str, loss: str,
                                           norm: str) -> None:
    # PyTorch's trace of the bundled trainer (FSDP2, 2 ranks) peaks in the loss; the planner's loss
    # moment agrees in every category within 1 % (the issue asks 5 %), and FSDP holds no unit then.
    model = replace(TINY_MODEL, num_layers=2, dropout=0.0, vocab_size=vocab, hidden_size=hidden, norm=norm,
                    seq_len=seq)
    plan = make_plan("fsdp-full", dp=2, model=model, activation_checkpointing=ac, seq_len=seq, micro_batch_size=mbs,
                     loss=loss)
    traced = trace_plan(plan, render_fsdp(plan).config)
    params = count_parameters(model)
    analytic = memory_breakdown(model, params, params.total, plan.knobs, 8)
    assert (traced.moment, analytic.phase) == ("loss or elsewhere", "loss")
    for category in ("parameters", "gradients", "optimizer_states", "activations"):
        assert getattr(analytic, category) == pytest.approx(traced.categories[category], rel=0.01), category
    unsharded = ("Unsharded Param", "Unsharded Grad", "All Gather", "Reduce Scatter")
    assert analytic.buffers == 0 and sum(traced.raw.get(kind, 0) for kind in unsharded) == 0
