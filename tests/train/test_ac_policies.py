"""Every activation checkpointing policy, and the chunked loss, through the real trainer: a rendered
plan, torchrun, two steps on CPU. Checkpointing and chunking change what is stored, never the
arithmetic, so each must reproduce the losses of the run without it (fp32, same seed, no dropout)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from fstrain.core.plan.losses import loss_chunks
from tests.plans import TINY_MODEL, make_plan
from tests.train.conftest import render, torchrun

pytestmark = pytest.mark.train

POLICIES = ("none", "selective-op", "every-k:2", "full", "megatron-selective")
MODEL = replace(TINY_MODEL, dropout=0.0, num_layers=4)


def _losses(tmp_path: Path, backend: str, ac: str, loss: str = "full") -> list[float]:
    strategy = "fsdp-full" if backend == "fsdp" else "zero2"
    plan = make_plan(strategy, dp=1, model=MODEL, precision="fp32", activation_checkpointing=ac,
                     micro_batch_size=2, grad_accum_steps=1, loss=loss)
    out = render(plan, tmp_path / f"{backend}-{ac.replace(':', '-')}-{loss.replace(':', '-')}")
    config = ["--fsdp-config", str(out / "fsdp.yaml")] if backend == "fsdp" else [
        "--backend", "deepspeed", "--deepspeed-config", str(out / "ds_config.json")]
    run = torchrun(1, ["--plan", str(out / "plan.yaml"), *config, "--steps", "2"], out / "summary.json")
    assert (run.summary["loss"], run.summary["loss_chunks"]) == (loss, loss_chunks(loss))
    losses: list[float] = run.summary["losses"]
    return losses


def test_fsdp_trainer_runs_every_policy_with_the_same_losses(tmp_path: Path) -> None:
    reference = _losses(tmp_path, "fsdp", "none")
    for ac in POLICIES[1:]:
        assert _losses(tmp_path, "fsdp", ac) == pytest.approx(reference, rel=1e-5), ac


@pytest.mark.parametrize("ac", ["every-k:2", "selective-op"])  # DeepSpeed's checkpoint; torch's op-level SAC
def test_deepspeed_trainer_runs_the_policies(tmp_path: Path, ac: str) -> None:
    assert _losses(tmp_path, "deepspeed", ac) == pytest.approx(_losses(tmp_path, "deepspeed", "none"), rel=1e-5)


@pytest.mark.parametrize("backend", ["fsdp", "deepspeed"])
def test_the_chunked_loss_trains_as_the_full_loss(tmp_path: Path, backend: str) -> None:
    # --loss chunked:N changes how the logits are held (one chunk upcast at a time), not the loss.
    assert _losses(tmp_path, backend, "none", "chunked:3") == pytest.approx(_losses(tmp_path, backend, "none"),
                                                                          rel=1e-5)
