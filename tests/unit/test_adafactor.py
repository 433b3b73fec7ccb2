"""``--optimizer adafactor``: Hugging Face's Adafactor as the Trainer runs it. States per parameter
tensor (factored where it sees the model's own tensors, full on DeepSpeed's flat partitions), the
update's temporaries, and the refusals, on hand-computed bytes."""

from __future__ import annotations

import json
from dataclasses import replace
from math import prod
from pathlib import Path

import pytest
import yaml

from fstrain.core.job.plan import check_plan_fits_launch, check_trainer_optimizer
from fstrain.core.plan.adafactor import check_adafactor, factored, state_elements, step_kernels, step_temporary_bytes
from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.blocktime import KernelModel
from fstrain.core.plan.hostlaunch import parameter_tensors
from fstrain.core.plan.kernelcost import GpuRates
from fstrain.core.plan.memory import (
    block_matmuls,
    memory_breakdown,
    optimizer_step_items,
    stage_model_states,
    stage_shapes,
)
from fstrain.core.plan.modelsize import count_parameters, parameter_shapes
from fstrain.core.plan.plancluster import uniform_cluster
from fstrain.core.plan.planfile import PlanFile
from fstrain.core.plan.planner import Pins, PlanModel, TrainingSpec, plan
from fstrain.core.plan.schema import PlanKnobs
from fstrain.core.plan.timemodel import step_time
from fstrain.core.render.deepspeed import render_deepspeed
from fstrain.core.render.fsdp import render_fsdp
from fstrain.core.render.options import TrainingOptions
from fstrain.errors import ConfigError, InputError
from fstrain.io.recipes import load_recipe_file, load_shipped_recipe
from fstrain.train.trace import check_traceable
from tests.helpers import run_fstrain
from tests.plans import TINY_MODEL, make_plan
from tests.unit.test_loss_none import MINI_BERT, MINI_BERT_PARAMS

# MINI_BERT's second moment, by hand: embedding (1000, 64) 1000 + 64; positions (32, 64) 96; a block:
# q/k/v/o (64, 64) 4 x 128, their biases 4 x 64, FFN (256, 64) and (64, 256) 2 x 320, their biases 256 + 64,
# two LayerNorms 4 x 64 -> 1,984; final norm 128; pooler (64, 64) 128 + bias 64; classifier (3, 64) 67 + 3.
MINI_BERT_STATES = 1_064 + 96 + 2 * 1_984 + 128 + 192 + 70  # 5,518 fp32 values
LARGEST = 1000 * 64  # the embedding, the largest tensor (and module)


def test_state_elements_follow_the_shapes() -> None:
    # (4, 3): 4 row + 3 column values; (3,): full; (2, 4, 3): rows shape[:-1] = 8, columns (2, 3) = 6.
    assert state_elements([(4, 3), (3,), (2, 4, 3)]) == 7 + 3 + 14
    assert state_elements(parameter_shapes(MINI_BERT)) == MINI_BERT_STATES
    assert sum(prod(s) for s in parameter_shapes(MINI_BERT)) == MINI_BERT_PARAMS


HF_CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "hf-configs"


@pytest.mark.parametrize("name", ["llama3.1-8b", "mixtral-8x7b", "gpt2-1.5b", "Qwen3-4B", "Qwen2-57B-A14B",
                                  "gemma-2-2b-it", "Qwen2.5-7B"])
def test_the_shapes_add_up_to_the_parameter_count(name: str) -> None:
    """Shipped recipes, and Hugging Face configs with head_dim, q/k norms, post norms, qkv
    biases and a gated shared expert."""
    if (HF_CONFIGS / name).is_dir():
        spec = load_recipe_file(str(HF_CONFIGS / name / "config.json")).model
    else:
        spec = load_shipped_recipe(name).model
    for vocab_head in (True, False):
        shapes = parameter_shapes(spec, vocab_head)
        assert sum(prod(s) for s in shapes) == count_parameters(spec, vocab_head).total


def _knobs(strategy: str = "ddp", dp: int = 1, precision: str = "fp32", **changes: object) -> PlanKnobs:
    fields: dict[str, object] = dict(strategy=strategy, zero_stage={"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3}[
        strategy], dp=dp, tp=1, pp=1, shard_group_size=1 if strategy == "ddp" else dp, micro_batch_size=2,
        grad_accum_steps=1, precision=precision, optimizer="adafactor", seq_len=32, flash_attention=False,
        loss="none")
    fields.update(changes)
    return PlanKnobs(**fields)  # type: ignore[arg-type]


def _memory(knobs: PlanKnobs, assumptions: Assumptions = Assumptions()):  # type: ignore[no-untyped-def]
    params = count_parameters(MINI_BERT, vocab_head=False)
    return memory_breakdown(MINI_BERT, params, params.total, knobs, knobs.dp, assumptions)


def _step_item(knobs: PlanKnobs, assumptions: Assumptions = Assumptions()) -> dict[str, int]:
    """The optimizer step's temporaries for MINI_BERT without a vocabulary head."""
    stage = stage_shapes(count_parameters(MINI_BERT, vocab_head=False), 1, 1, 1, True)[0]
    return dict(optimizer_step_items(knobs, stage_model_states(stage, knobs), stage, assumptions))


def test_factored_states_and_temporaries_on_the_models_own_tensors() -> None:
    knobs = _knobs()
    assert factored("ddp", "fp32") and factored("ddp", "amp-fp16") and factored("ddp", "bf16-pure")
    memory = _memory(knobs)
    assert memory.optimizer_states == 4 * MINI_BERT_STATES  # 22,072 bytes against AdamW's 8 x 170,499
    assert memory.parameters == memory.gradients == 4 * MINI_BERT_PARAMS
    # One parameter at a time: two fp32 tensors of the largest (update, then -update).
    assert _step_item(knobs) == {"Adafactor update temporaries": 2 * 4 * LARGEST}
    # 16-bit parameters add their fp32 copies of the gradient and the parameter.
    assert step_temporary_bytes("ddp", "bf16-pure", LARGEST, MINI_BERT_PARAMS) == 4 * 4 * LARGEST
    assert _memory(_knobs(precision="bf16-pure")).optimizer_states == 4 * MINI_BERT_STATES  # fp32 states


def test_deepspeeds_flat_partitions_get_a_full_second_moment() -> None:
    assert not factored("zero2", "fp32") and not factored("ddp", "bf16")  # stage 0's fp32 master is flat too
    zero2 = _memory(_knobs("zero2", dp=4, precision="bf16"))
    # ZeRO-2 counts the fp32 master with the optimizer: (4 master + 4 second moment) per parameter / 4 ranks.
    assert zero2.optimizer_states == 8 * MINI_BERT_PARAMS // 4
    # The update runs on the rank's whole partition at once: two fp32 copies of it.
    assert step_temporary_bytes("zero2", "bf16", LARGEST, MINI_BERT_PARAMS // 4) == 2 * 4 * (MINI_BERT_PARAMS // 4)
    assert _step_item(_knobs("zero2", dp=4, precision="bf16")) == {
        "Adafactor update temporaries": 2 * 4 * (MINI_BERT_PARAMS // 4)}
    ddp_bf16 = _memory(_knobs(precision="bf16"))
    assert ddp_bf16.optimizer_states == 8 * MINI_BERT_PARAMS  # master + full second moment


def test_adamw_per_parameter_loop_holds_one_parameters_copy() -> None:
    knobs = _knobs(optimizer="adamw")
    assert _step_item(knobs) == {"AdamW foreach temporaries": 4 * MINI_BERT_PARAMS}
    loop = Assumptions(adamw_foreach=False)
    assert _step_item(knobs, loop) == {"AdamW temporaries (one parameter)": 4 * LARGEST}


def test_fsdp_and_offload_are_refused_in_one_line() -> None:
    for strategy in ("fsdp-full", "fsdp-grad-op", "fsdp-hybrid"):
        with pytest.raises(InputError, match="FSDP2 keeps DTensor shards") as caught:
            check_adafactor("adafactor", strategy, "none", "--optimizer")
        assert "\n" not in str(caught.value)
    with pytest.raises(InputError, match="CPU Adam"):
        check_adafactor("adafactor", "zero2", "optimizer", "--optimizer")
    check_adafactor("adamw", "fsdp-full", "none", "--optimizer")  # only Adafactor is refused


def test_the_search_skips_what_it_cannot_model_and_pins_are_refused() -> None:
    spec = load_shipped_recipe("tiny").model
    cluster = uniform_cluster(1, 4, "h100-sxm")
    result = plan(PlanModel.from_spec(spec), TrainingSpec(spec.seq_len, 16, "bf16", "adafactor"), cluster,
                  suggest=False)
    strategies = {p.knobs.strategy for p in (*result.plans, *result.rejected)}
    assert strategies and strategies <= {"ddp", "zero1", "zero2", "zero3"}
    assert {p.knobs.offload for p in (*result.plans, *result.rejected)} == {"none"}
    with pytest.raises(InputError, match="fsdp-full"):
        plan(PlanModel.from_spec(spec), TrainingSpec(spec.seq_len, 16, "bf16", "adafactor"), cluster,
             Pins(strategy="fsdp-full"))
    with pytest.raises(InputError, match="offload"):
        plan(PlanModel.from_spec(spec), TrainingSpec(spec.seq_len, 16, "bf16", "adafactor"), cluster,
             Pins(offload="optimizer"))


def test_plan_file_round_trip_and_refusal() -> None:
    plan_file = make_plan("zero2", dp=2, optimizer="adafactor")
    assert PlanFile.from_dict(plan_file.to_dict(), "plan.yaml") == plan_file
    data = make_plan("fsdp-full", dp=2).to_dict()
    data["plan"]["optimizer"] = "adafactor"
    with pytest.raises(InputError, match=r"plan\.optimizer"):
        PlanFile.from_dict(data, "plan.yaml")


def test_deepspeed_render_leaves_the_optimizer_to_the_script_and_the_trainer_refuses() -> None:
    rendered = render_deepspeed(make_plan("zero2", optimizer="adafactor"))
    assert "optimizer" not in rendered.config and rendered.config["zero_allow_untested_optimizer"] is True
    assert any("transformers.optimization.Adafactor" in note for note in rendered.notes)
    fsdp_file = render_fsdp(make_plan("ddp", dp=1, optimizer="adafactor"))  # the file a ddp plan gets
    assert fsdp_file.config["optimizer"] == {"name": "adafactor", "lr": TrainingOptions().lr, "scale_parameter": False,
                                             "relative_step": False, "weight_decay": TrainingOptions().weight_decay}
    assert any("transformers.optimization.Adafactor" in note for note in fsdp_file.notes)
    with pytest.raises(ConfigError, match="--optimizer adafactor"):
        check_trainer_optimizer(make_plan("zero2", optimizer="adafactor"), "--plan")
    with pytest.raises(ConfigError, match="--optimizer adafactor"):  # fstrain launch --plan
        check_plan_fits_launch(make_plan("zero2", optimizer="adafactor"), 2, "--plan")
    with pytest.raises(ConfigError, match="--optimizer adafactor"):  # fstrain plan --trace
        check_traceable(make_plan("ddp", dp=1, optimizer="adafactor"))


def test_cli(tmp_path: Path) -> None:
    out = tmp_path / "plan.yaml"
    argv = ["plan", "--model", "tiny", "--gpu", "h100-sxm", "--num-nodes", "1", "--gpus-per-node", "2",
            "--optimizer", "adafactor", "--precision", "bf16"]
    result = run_fstrain(*argv, "--strategy", "zero2", "--tp", "1", "--pp", "1", "--json", "--out", str(out))
    assert result.returncode == 0, result.stderr
    best = json.loads(result.stdout)["plans"][0]
    params = count_parameters(load_shipped_recipe("tiny").model).total
    # bf16 ZeRO-2 over 2 ranks: the fp32 master and a full fp32 second moment, halved.
    assert best["strategy"] == "zero2" and best["memory"]["optimizer_states"] == 8 * params // 2
    assert yaml.safe_load(out.read_text())["plan"]["optimizer"] == "adafactor"
    refused = run_fstrain(*argv, "--strategy", "fsdp-full")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "--optimizer" in refused.stderr
    assert "adafactor" in run_fstrain("plan", "--help").stdout


def test_the_step_issues_its_kernels_tensor_by_tensor() -> None:
    """transformers' Adafactor.step: 24 kernels a factored matrix, 16 a 1-D tensor (the module's
    count); on DeepSpeed's flat fp32 partitions two full-moment groups. For BERT-large (146
    matrices, 241 vectors) that is 7,360 calls at 12 us, 51 ms a step above AdamW's loop of 8
    calls a tensor: the Trainer's page measured 0.5025 - 0.4515 = 51 ms between the two."""
    assert step_kernels("ddp", "fp32", 146, 241) == 146 * 24 + 241 * 16 == 7360
    assert step_kernels("ddp", "bf16", 146, 241) == step_kernels("zero2", "fp32", 146, 241) == 2 * 16
    bert = replace(TINY_MODEL, norm="layernorm", linear_bias=True, dropout=0.1)
    v100 = GpuRates("v100-16gb", (("fp16", 125e12), ("fp32", 15.7e12)), 900e9)
    kernels = KernelModel(v100, Assumptions())
    links = uniform_cluster(1, 1, "v100-16gb").links()

    def optimizer_s(optimizer: str) -> float:
        knobs = PlanKnobs("ddp", 0, 1, 1, 1, 1, 1, 1, precision="fp32", optimizer=optimizer, seq_len=128)
        return step_time(bert, 1000, knobs, 10e12, 15.7e12, links, Assumptions(adamw_foreach=False),
                         kernels=kernels).optimizer_s

    tensors = parameter_tensors(bert, bert.num_layers)
    matrices = bert.num_layers * len(block_matmuls(bert)) + 2
    per_call = Assumptions().kernel_launch_s + Assumptions().python_op_s
    issued = step_kernels("ddp", "fp32", matrices, tensors - matrices)
    assert optimizer_s("adafactor") == pytest.approx(issued * per_call)
    assert optimizer_s("adamw") == pytest.approx(tensors * 8 * per_call)  # host-bound, both
