"""Megatron-LM's DDP and distributed optimizer (fstrain/core/plan/megatron.py) on values: its own
bytes-per-parameter table, the memory breakdown of ``--framework megatron`` against DeepSpeed's
ZeRO-1, the fp32 gradient reduction, and its pipeline schedules (1F1B and interleaved)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from fstrain.api.plan import ClusterRequest, resolve_cluster
from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.megatron import megatron_bytes, runnable_schedules
from fstrain.core.plan.memory import MEGATRON_STEP_GRADS_ITEM, MemoryBreakdown, StageShape, backward_buffer_items
from fstrain.core.plan.pipeline import schedule_problem
from fstrain.core.plan.planfile import PlanFile
from fstrain.core.plan.planner import Pins, PlanModel, TrainingSpec, plan
from fstrain.core.render.deepspeed import render_deepspeed
from fstrain.errors import ConfigError, InputError
from fstrain.io.recipes import load_shipped_recipe
from tests.helpers import run_fstrain
from tests.plans import make_plan

from .test_timemodel import NO_OVERLAP, knobs, run

LLAMA = PlanModel.from_spec(load_shipped_recipe("llama3.1-8b").model)
STAGE = StageShape(8_000_000_000, 32, 500_000_000, 500_000_000, True, 1)
H100X16 = resolve_cluster(ClusterRequest(num_nodes=2, gpus_per_node=8, gpu="h100-sxm"))


@pytest.mark.parametrize(("precision", "plain", "fixed", "sharded"),
                         [("fp16", 20, 4, 16), ("bf16", 18, 6, 12), ("fp32", 16, 8, 8)])
@pytest.mark.parametrize("d", [2, 8, 64])
def test_bytes_per_parameter_are_megatrons_table(precision: str, plain: int, fixed: int, sharded: int, d: int) -> None:
    """docs/user-guide/features/dist_optimizer.md L16-20 (@d98e8a6): 20 / 4 + 16/d, 18 / 6 + 12/d, 16 / 8 + 8/d."""
    per_param = megatron_bytes(precision)
    assert per_param.at_step(1) == plain
    assert per_param.at_step(d) == pytest.approx(fixed + sharded / d)


def test_bf16_gradients_without_fp32_main_grads() -> None:
    """--grad-reduce-in-bf16: a bf16 buffer, cast to fp32 main gradients at the step (as fp16's)."""
    assert megatron_bytes("bf16", fp32_main_grads=False) == megatron_bytes("fp16")
    assert megatron_bytes("bf16").step_grad_copy == 0


def breakdown(framework: str, strategy: str = "zero1", precision: str = "bf16",
              assumptions: Assumptions = Assumptions()) -> MemoryBreakdown:
    pins = Pins(strategy=strategy, tp=1, pp=1, micro_batch_size=1, grad_accum_steps=1, activation_checkpointing="full")
    training = TrainingSpec(4096, None, framework=framework, precision=precision)
    result = plan(LLAMA, training, H100X16, pins, assumptions, suggest=False)
    (only,) = [*result.plans, *result.rejected]
    return only.memory


def test_distributed_optimizer_keeps_a_whole_fp32_gradient_buffer() -> None:
    n, d = LLAMA.num_params, 16
    megatron = breakdown("megatron")
    assert (megatron.parameters, megatron.gradients, megatron.optimizer_states) == (2 * n, 4 * n, 12 * n // d)
    deepspeed = breakdown("deepspeed")  # DeepSpeed's ZeRO-1: 16-bit gradients and an fp32 partition
    assert deepspeed.gradients == 2 * n + 4 * n // d
    assert megatron.gradients - deepspeed.gradients == 2 * n - 4 * n // d
    # The buffer is its own bucket: no reduce buckets, no foreach temporaries (fused Adam in place).
    assert not [name for name in dict(megatron.details) if "bucket" in name or "temporaries" in name]
    zero1 = dataclasses.replace(knobs(strategy="zero1", zero_stage=1, shard_group_size=16, dp=16), framework="megatron")
    assert backward_buffer_items("zero1", STAGE, zero1) == []
    assert backward_buffer_items("zero1", STAGE, dataclasses.replace(zero1, framework="deepspeed"))


def test_fp16_casts_its_gradient_shard_to_fp32_at_the_step_only() -> None:
    n, d = LLAMA.num_params, 16
    fp16 = breakdown("megatron", precision="fp16")
    assert (fp16.gradients, fp16.optimizer_states) == (2 * n, 12 * n // d)
    assert fp16.phase != "optimizer step" and MEGATRON_STEP_GRADS_ITEM not in dict(fp16.details)
    bf16 = breakdown("megatron", precision="bf16")
    step = dict(fp16.moments)["optimizer step"] - dict(bf16.moments)["optimizer step"]
    # fp16 holds 2 bytes less of gradient buffer per parameter and 4/d more at the step.
    fragmentation = Assumptions().fragmentation_fraction
    assert step == pytest.approx((-2 * n + 4 * n // d) * (1 + fragmentation), rel=1e-6)


def test_plain_optimizer_is_eighteen_bytes_per_parameter() -> None:
    n = LLAMA.num_params
    ddp = breakdown("megatron", strategy="ddp")
    assert ddp.parameters + ddp.gradients + ddp.optimizer_states == 18 * n
    assert "DDP gradient buckets" not in dict(ddp.details)
    assert breakdown("fstrain", strategy="ddp").gradients == 2 * n  # torch DDP's bf16 gradients


def test_megatron_reduces_its_fp32_buffer() -> None:
    """ZeRO-1 moves a reduce-scatter of the gradients and an all-gather of the parameters:
    4 + 2 bytes an element for Megatron under bf16, 2 + 2 for DeepSpeed; DDP's all-reduce 2 x 4."""
    zero1 = {"strategy": "zero1", "zero_stage": 1, "shard_group_size": 128}
    deepspeed = run(knobs(**zero1)).dp_comm_s
    megatron = run(knobs(**zero1, framework="megatron")).dp_comm_s
    assert megatron == pytest.approx(deepspeed * 6 / 4)
    assert run(knobs(framework="megatron")).dp_comm_s == pytest.approx(2 * run(knobs()).dp_comm_s)
    bf16_grads = dataclasses.replace(NO_OVERLAP, megatron_fp32_main_grads=False)
    assert run(knobs(**zero1, framework="megatron"), bf16_grads).dp_comm_s == pytest.approx(deepspeed)
    # --overlap-param-gather: the all-gather hides behind the next forward, where DeepSpeed's is exposed.
    overlapped = dataclasses.replace(NO_OVERLAP, dp_overlap=1.0)
    ring = 127 / 128
    gather = ring * 2 * 8e9 / 400e9
    assert run(knobs(**zero1), overlapped).dp_exposed_s == pytest.approx(gather)
    assert run(knobs(**zero1, framework="megatron"), overlapped).dp_exposed_s == 0.0


def _pipeline(framework: str, schedule: str | None) -> Pins:
    return Pins(strategy="zero1", tp=1, pp=2, micro_batch_size=1, grad_accum_steps=8, activation_checkpointing="full",
                pp_schedule=schedule)


def test_the_distributed_optimizer_runs_the_interleaved_schedule() -> None:
    assert runnable_schedules("zero1", "megatron") == ("1f1b", "interleaved")
    assert runnable_schedules("zero1", "deepspeed") == ("1f1b",)
    assert runnable_schedules("zero1", "fstrain") == ("1f1b",)
    assert runnable_schedules("fsdp-full", "megatron") == ("1f1b", "interleaved", "zero-bubble")
    training = TrainingSpec(4096, None, framework="megatron")
    result = plan(LLAMA, training, H100X16, _pipeline("megatron", "interleaved"), suggest=False)
    (chosen,) = [*result.plans, *result.rejected]
    assert (chosen.knobs.pp_schedule, chosen.knobs.pp_virtual_stages) == ("interleaved", 2)
    one = plan(LLAMA, training, H100X16, _pipeline("megatron", "1f1b"), suggest=False)
    (plain,) = [*one.plans, *one.rejected]
    # The last rank (the logits make it the heavier) holds Megatron's warm-up 2 (p - r - 1) + (v - 1) p + 1
    # = 3 chunk micro-batches of 8 layers, against 1F1B's one micro-batch of 16 layers.
    assert "2 chunks of 8 layers, 3 chunk micro-batches in flight" in " ".join(dict(chosen.memory.details))
    assert "16 layers x 1 micro-batch," in " ".join(dict(plain.memory.details))
    unpinned = plan(LLAMA, training, H100X16, _pipeline("megatron", None), suggest=False)
    assert {p.knobs.pp_schedule for p in (*unpinned.plans, *unpinned.rejected)} == {"1f1b"}
    assert plain.memory.gradients == chosen.memory.gradients


def test_other_schedules_are_refused_with_the_runtime_that_lacks_them() -> None:
    with pytest.raises(ConfigError, match="Megatron-LM runs ZeRO-1 with its own schedules, 1F1B and interleaved"):
        plan(LLAMA, TrainingSpec(4096, None, framework="megatron"), H100X16, _pipeline("megatron", "zero-bubble"))
    with pytest.raises(ConfigError, match="DeepSpeed's pipeline engine"):
        plan(LLAMA, TrainingSpec(4096, None), H100X16, _pipeline("fstrain", "interleaved"))


def test_plan_files_of_the_distributed_optimizer_keep_interleaving() -> None:
    document = make_plan("zero1", dp=2, pp=2, grad_accum_steps=4).to_dict()
    document["plan"].update({"framework": "megatron", "pp_schedule": "interleaved", "pp_virtual_stages": 2})
    knobs_read = PlanFile.from_dict(document, "plan.yaml").knobs
    assert (knobs_read.framework, knobs_read.pp_schedule) == ("megatron", "interleaved")
    document["plan"].update({"pp_schedule": "zero-bubble", "pp_virtual_stages": 1})
    with pytest.raises(InputError, match="under Megatron-LM"):
        PlanFile.from_dict(document, "plan.yaml")


def test_the_deepspeed_file_of_a_megatron_plan_names_megatrons_flags() -> None:
    megatron = make_plan("zero1", dp=2, pp=2, grad_accum_steps=4, pp_schedule="interleaved", pp_virtual_stages=2,
                         framework="megatron")
    notes = " ".join(render_deepspeed(megatron).notes)
    assert "Megatron-LM's distributed optimizer" in notes
    assert ("with --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
            "--num-virtual-stages-per-pipeline-rank 2") in notes
    assert "Megatron" not in " ".join(render_deepspeed(make_plan("zero1", dp=2, pp=2, grad_accum_steps=4)).notes)
    plain = " ".join(render_deepspeed(make_plan("ddp", dp=2, framework="megatron")).notes)
    assert "Megatron-LM's DDP with its plain optimizer" in plain and "--use-distributed" not in plain
    assert "run it with --overlap-grad-reduce," in plain


def test_the_cli_plans_megatrons_most_common_setup(tmp_path: Path) -> None:
    """`--framework megatron --strategy zero1 --pp-schedule interleaved`, refused before, plans:
    Llama 3.1 8B on 16 H100 with TP 2, PP 2 (dp 4), its gradient buffer 4 bytes a parameter."""
    args = ("plan", "--model", "llama3.1-8b", "--num-nodes", "2", "--gpu", "h100-sxm", "--framework", "megatron",
            "--strategy", "zero1", "--tp", "2", "--pp", "2", "--pp-schedule", "interleaved", "--global-batch", "64",
            "--micro-batch", "1", "--ac", "full")
    result = run_fstrain(*args, "--json", "--out", str(tmp_path / "plan.yaml"))
    assert result.returncode == 0, result.stderr
    best = json.loads(result.stdout)["plans"][0]
    assert (best["pp_schedule"], best["pp_virtual_stages"], best["strategy"]) == ("interleaved", 2, "zero1")
    memory = best["memory"]
    # Per parameter of the rank: 2 bytes of parameters, 4 of fp32 gradients, 12/4 of sharded states.
    assert memory["gradients"] == 2 * memory["parameters"]
    assert memory["optimizer_states"] * 4 == memory["gradients"] * 3
    saved = PlanFile.from_dict(yaml.safe_load((tmp_path / "plan.yaml").read_text()), "plan.yaml")
    assert (saved.knobs.framework, saved.knobs.pp_schedule) == ("megatron", "interleaved")


def test_the_search_under_megatron_keeps_to_what_megatron_runs() -> None:
    """Megatron's data parallelism is its DDP, its distributed optimizer or torch FSDP2 (without
    PP or EP: arguments.py L1031-1045); its recompute is whole layers or its selective modules."""
    training = TrainingSpec(4096, 64, framework="megatron")
    result = plan(LLAMA, training, H100X16, Pins(tp=2), suggest=False)
    searched = [*result.plans, *result.rejected]
    assert {p.knobs.strategy for p in searched} == {"ddp", "zero1", "fsdp-full"}
    assert "fsdp-full" not in {p.knobs.strategy for p in searched if p.knobs.pp > 1}
    assert "selective-op" not in {p.knobs.activation_checkpointing for p in searched}
    for strategy, pp in (("zero3", 1), ("fsdp-hybrid", 1), ("fsdp-full", 2)):
        with pytest.raises(ConfigError, match="--framework megatron: "):
            plan(LLAMA, training, H100X16, Pins(strategy=strategy, pp=pp))


@pytest.mark.parametrize(("micro_batches", "torch_ok", "megatron_ok"), [(8, True, True), (6, True, False),
                                                                         (10, True, False), (12, True, True)])
def test_megatrons_interleaving_takes_whole_groups_of_pp(micro_batches: int, torch_ok: bool, megatron_ok: bool) -> None:
    """pp 4, 2 chunks: torch needs a multiple of m // pp rounds, Megatron a multiple of pp."""
    assert (schedule_problem("interleaved", 4, micro_batches, 32, 2, megatron=True) == "") == megatron_ok
    assert (schedule_problem("interleaved", 4, micro_batches, 32, 2) == "") == torch_ok
