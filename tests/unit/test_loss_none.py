"""``--loss none``: a model trained without a vocabulary head (sequence classification, e.g. BERT
fine-tuning). Parameters, memory items, FLOPs and the plan file, on hand-computed values."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from fstrain.core.job.plan import check_trainer_loss
from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.losses import LossPeaks, loss_peaks, parse_loss
from fstrain.core.plan.memory import (
    CLASSIFIER_ITEM,
    HEAD_INPUT_ITEM,
    LOGITS_ITEM,
    classifier_head_bytes,
    memory_breakdown,
    stage_activation_bytes,
    stage_shapes,
)
from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.plan.plancluster import uniform_cluster
from fstrain.core.plan.planfile import PlanFile
from fstrain.core.plan.planner import Pins, PlanModel, TrainingSpec, plan
from fstrain.core.plan.recipe import parse_recipe
from fstrain.core.plan.schema import ModelSpec, PlanKnobs
from fstrain.core.plan.timemodel import flops_per_token
from fstrain.errors import ConfigError, InputError
from fstrain.train.trace import check_traceable
from tests.helpers import run_fstrain
from tests.plans import make_plan

# A two-layer BERT: post-LN encoder blocks (the same tensors as pre-LN), learned positions,
# LayerNorm, biases, dropout, a pooler and a 3-label classifier.
MINI_BERT = ModelSpec(
    name="mini-bert", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=4, ffn_hidden_size=256,
    activation="gelu", vocab_size=1000, seq_len=32, tied_embeddings=True, norm="layernorm", linear_bias=True,
    position_embedding="learned", dropout=0.1, pooler=True, num_labels=3,
)
# By hand: embedding 1000*64 = 64,000; positions 32*64 = 2,048; a block: q/k/v/o 4*64*64 + 4*64 = 16,640,
# FFN 2*64*256 + 256 + 64 = 33,088, two LayerNorms 256 -> 49,984; final norm 128; pooler 64*64 + 64 = 4,160;
# classifier 64*3 + 3 = 195.
BLOCK, CLASSIFIER = 49_984, 4_160 + 195
MINI_BERT_PARAMS = 64_000 + 2_048 + 2 * BLOCK + 128 + CLASSIFIER  # 170,499


def test_parse_and_peaks() -> None:
    assert parse_loss("none", "--loss") == "none"
    assert loss_peaks("none", 10**9, 2) == LossPeaks(0, 0)
    with pytest.raises(InputError, match="unknown loss"):
        parse_loss("none:2", "--loss")


def test_parameters_without_a_vocabulary_head() -> None:
    assert count_parameters(MINI_BERT).total == MINI_BERT_PARAMS
    assert count_parameters(MINI_BERT, vocab_head=False).total == MINI_BERT_PARAMS  # tied: nothing to drop
    untied = replace(MINI_BERT, tied_embeddings=False)
    assert count_parameters(untied).total == MINI_BERT_PARAMS + 64_000  # an output head over the vocabulary
    no_head = count_parameters(untied, vocab_head=False)
    assert no_head.head == 0 and no_head.classifier == CLASSIFIER and no_head.total == MINI_BERT_PARAMS
    # A per-token score without a pooler or biases (LlamaForSequenceClassification): hidden x labels.
    score = replace(MINI_BERT, pooler=False, linear_bias=False, num_labels=2)
    assert count_parameters(score).classifier == 64 * 2


def test_bert_large_counts_what_hugging_face_builds_less_token_types() -> None:
    """BertForSequenceClassification(bert-large-uncased, 2 labels) has 335,143,938 parameters, of
    which the token-type embeddings (2 x 1024) are not modelled."""
    spec = replace(MINI_BERT, name="bert-large", num_layers=24, hidden_size=1024, num_heads=16, num_kv_heads=16,
                   ffn_hidden_size=4096, vocab_size=30522, seq_len=512, num_labels=2)
    assert count_parameters(spec, vocab_head=False).total == 335_143_938 - 2 * 1024


def test_the_last_stage_keeps_no_embedding_copy_without_a_vocabulary_head() -> None:
    full = stage_shapes(count_parameters(MINI_BERT), tp=1, pp=2, micro_batches=2, tied=True)
    none = stage_shapes(count_parameters(MINI_BERT, vocab_head=False), tp=1, pp=2, micro_batches=2, tied=True)
    assert full[1].params == BLOCK + 64_000 + CLASSIFIER + 128  # a tied head's copy of the embedding
    assert none[1].params == BLOCK + CLASSIFIER + 128
    assert none[0].params == full[0].params == BLOCK + 64_000 + 2_048


def _knobs(**changes: object) -> PlanKnobs:
    fields: dict[str, object] = dict(strategy="ddp", zero_stage=0, dp=1, tp=1, pp=1, shard_group_size=1,
                                     micro_batch_size=2, grad_accum_steps=1, precision="fp32", seq_len=32,
                                     flash_attention=False, loss="none")
    fields.update(changes)
    return PlanKnobs(**fields)  # type: ignore[arg-type]


def test_classifier_head_bytes_on_values() -> None:
    # The last block's output, s b h x 4 (fp32 residual) = 32*2*64*4 = 16,384, kept alive by the pooled
    # view; the pooler's tanh output and the classifier input b h x 4 each and a 1-byte mask: 2*64*9.
    assert classifier_head_bytes(MINI_BERT, _knobs()) == 16_384 + 1_152
    # Under autocast the residual stream stays fp32 and the pooled tensors are fp16.
    assert classifier_head_bytes(MINI_BERT, _knobs(precision="amp-fp16")) == 16_384 + 2 * 64 * 5
    assert classifier_head_bytes(replace(MINI_BERT, pooler=False), _knobs()) == 16_384


def test_memory_has_no_logits_and_keeps_the_end_of_forward_moment() -> None:
    params = count_parameters(MINI_BERT, vocab_head=False)
    stage = stage_shapes(params, tp=1, pp=1, micro_batches=1, tied=True)[0]
    items = dict(stage_activation_bytes(MINI_BERT, stage, _knobs()))
    assert LOGITS_ITEM not in items and HEAD_INPUT_ITEM not in items
    assert items[CLASSIFIER_ITEM] == 17_536
    none = memory_breakdown(MINI_BERT, params, params.total, _knobs(), 1)
    assert [name for name, _ in none.moments] == ["loss", "backward", "optimizer step"]
    full = memory_breakdown(MINI_BERT, count_parameters(MINI_BERT), MINI_BERT_PARAMS, _knobs(loss="full"), 1)
    logits = 32 * 2 * 1000
    assert dict(full.details)[LOGITS_ITEM] == 12 * logits  # fp32 full: 12 bytes per logit, the loss moment's peak
    # The end of forward holds the classifier's input where the full loss holds the logits, the final
    # norm and the head's input (same stored activations, same model states): the difference and
    # the allocator's margin on it.
    head_input = 32 * 2 * (4 * 64 + 4 + 4 * 64)
    assert dict(full.moments)["loss"] - dict(none.moments)["loss"] == pytest.approx(
        (1 + Assumptions().fragmentation_fraction) * (12 * logits + head_input - 17_536), abs=2)


def test_flops_without_the_vocabulary_head() -> None:
    full, none = flops_per_token(MINI_BERT, 32), flops_per_token(MINI_BERT, 32, "none")
    assert full.head == 2 * 1000 * 64
    assert none.head == pytest.approx((2 * 64 * 64 + 2 * 64 * 3) / 32)  # pooler + classifier, once a sequence
    assert none.layer == full.layer  # bidirectional attention: the full s x s, as counted for every model
    assert none.attention_core == 4 * 32 * 64
    assert flops_per_token(replace(MINI_BERT, pooler=False), 32, "none").head == 2 * 64 * 3  # every token


def test_the_planner_drops_the_head_and_its_time() -> None:
    untied = replace(MINI_BERT, tied_embeddings=False)
    cluster = uniform_cluster(1, 1, "v100-16gb")
    pins = Pins(strategy="ddp", tp=1, pp=1, micro_batch_size=2, grad_accum_steps=1, activation_checkpointing="none")
    results = {loss: plan(PlanModel.from_spec(untied), TrainingSpec(32, None, "fp32", "adamw", False, loss=loss),
                          cluster, pins, suggest=False) for loss in ("full", "none")}
    full, none = (results[loss].plans[0] for loss in ("full", "none"))
    assert full.memory.parameters - none.memory.parameters == 4 * 64_000  # the untied head's fp32 weights
    assert none.knobs.loss == "none"
    assert full.time is not None and none.time is not None
    # The GPU's part shrinks; so tiny a model's step is host-bound (its kernels' launches), which
    # the head's few kernels hardly change.
    gpu_s = {name: p.time.compute_s - p.time.launch_s for name, p in (("full", full), ("none", none))}
    assert gpu_s["none"] < gpu_s["full"]
    assert none.time.compute_s <= full.time.compute_s


def test_plan_file_round_trip_and_bad_values() -> None:
    plan_file = make_plan("ddp", dp=1, model=MINI_BERT, loss="none")
    data = plan_file.to_dict()
    assert data["plan"]["loss"] == "none" and data["model"]["pooler"] is True and data["model"]["num_labels"] == 3
    assert PlanFile.from_dict(data, "plan.yaml") == plan_file
    data["model"]["num_labels"] = -1
    with pytest.raises(InputError, match=r"model\.num_labels"):
        PlanFile.from_dict(data, "plan.yaml")
    with pytest.raises(InputError, match=r"model\.pooler"):
        model = {k: v for k, v in data["model"].items() if k != "name"}
        parse_recipe({"name": "x", "model": {**model, "num_labels": 2, "pooler": "yes"}}, "r.yaml")


def test_the_bundled_trainer_refuses_a_plan_without_a_vocabulary_head() -> None:
    with pytest.raises(ConfigError, match="--loss none"):
        check_trainer_loss(make_plan("ddp", dp=1, loss="none"), "--plan")
    with pytest.raises(ConfigError, match="--loss none"):  # fstrain plan --trace
        check_traceable(make_plan("fsdp-full", dp=2, loss="none"))


def test_cli_plans_loss_none_and_writes_it(tmp_path: Path) -> None:
    recipe = tmp_path / "mini-bert.yaml"
    model = {k: v for k, v in MINI_BERT.__dict__.items() if k not in ("name", "moe")}
    recipe.write_text(yaml.safe_dump({"name": "mini-bert", "model": model}))
    out = tmp_path / "plan.yaml"
    argv = ["plan", "--recipe", str(recipe), "--gpu", "v100-16gb", "--num-nodes", "1", "--gpus-per-node", "1",
            "--strategy", "ddp", "--micro-batch", "2", "--grad-accum", "1", "--ac", "none", "--precision", "fp32",
            "--loss", "none"]
    result = run_fstrain(*argv, "--json", "--out", str(out))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["model"]["num_params"] == MINI_BERT_PARAMS
    assert "logits and loss" not in document["plans"][0]["memory"]["details"]
    written = yaml.safe_load(out.read_text())
    assert written["plan"]["loss"] == "none" and written["model"]["num_labels"] == 3
    human = run_fstrain(*argv)
    assert human.returncode == 0 and "no vocabulary head (loss none)" in human.stderr
    assert "none (no vocabulary head" in run_fstrain("plan", "--help").stdout.replace("\n", " ").replace("│", "")
