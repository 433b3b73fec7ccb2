"""Framework profiles (fstrain/core/plan/frameworks.py): each profile's effect on the memory
breakdown, as the number the cited code implies; the --framework flag and the plan.yaml field."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from fstrain.api.plan import ClusterRequest, TrainingRequest, resolve_cluster, resolve_training
from fstrain.core.job.plan import check_trace_framework
from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.frameworks import FRAMEWORKS, framework_assumptions, profile
from fstrain.core.plan.memory import (
    FSDP1_ROOT_ITEM,
    NO_SYNC_ITEM,
    TP_GATHER_ITEM,
    ZERO3_PERSISTENT_ITEM,
    MemoryBreakdown,
)
from fstrain.core.plan.planfile import PlanFile
from fstrain.core.plan.planner import Pins, PlanModel, TrainingSpec, plan
from fstrain.errors import ConfigError, InputError
from fstrain.io.recipes import load_shipped_recipe
from tests.helpers import run_fstrain
from tests.plans import make_plan

LLAMA = PlanModel.from_spec(load_shipped_recipe("llama3.1-8b").model)  # 32 layers, hidden 4096
H100X8 = resolve_cluster(ClusterRequest(num_nodes=1, gpus_per_node=8, gpu="h100-sxm"))


def breakdown(framework: str, strategy: str = "fsdp-full", tp: int = 1, gas: int = 1, offload: str = "none",
              model: PlanModel = LLAMA, seq: int = 4096, assumptions: Assumptions = Assumptions()) -> MemoryBreakdown:
    pins = Pins(strategy=strategy, tp=tp, pp=1, micro_batch_size=1, grad_accum_steps=gas,
                activation_checkpointing="full", offload=offload)
    result = plan(model, TrainingSpec(seq, None, framework=framework), H100X8, pins, assumptions, suggest=False)
    (only,) = [*result.plans, *result.rejected]
    assert only.knobs.framework == framework
    return only.memory


def items(memory: MemoryBreakdown) -> dict[str, int]:
    return dict(memory.details)


def test_an_unknown_name_lists_the_names() -> None:
    with pytest.raises(InputError) as caught:
        profile("megatron-lm")
    assert "unknown framework 'megatron-lm'" in str(caught.value)
    assert all(name in caught.value.hint for name in FRAMEWORKS)
    assert FRAMEWORKS[0] == "fstrain" and len(FRAMEWORKS) == len(set(FRAMEWORKS))


def test_every_setting_a_profile_changes_is_cited() -> None:
    default = profile("fstrain")
    for name in FRAMEWORKS:
        p = profile(name)
        cited = {setting for setting, _ in p.citations}
        changed = {f.name for f in dataclasses.fields(p)
                   if f.name not in ("name", "summary", "citations") and getattr(p, f.name) != getattr(default, f.name)}
        assert changed <= cited, (name, changed - cited)
        assert all(source.strip() for _, source in p.citations)


def test_fsdp1_no_sync_keeps_the_whole_unsharded_gradient() -> None:
    # Lightning's no_backward_sync: bf16 gradients of every parameter on every GPU while accumulating.
    lightning = breakdown("lightning", gas=4)
    assert items(lightning)[NO_SYNC_ITEM] == 2 * LLAMA.num_params
    assert lightning.gradients == 0  # no sharded gradient exists until the last micro-batch reduces
    # FSDP2 as torchtitan and the bundled trainer run it: sharded fp32 gradients instead.
    torchtitan = breakdown("torchtitan", gas=4)
    assert NO_SYNC_ITEM not in items(torchtitan) and torchtitan.gradients == 4 * LLAMA.num_params // 8
    # FSDP1 keeps the root unit (embedding, final norm, head) gathered through the loss too.
    outside = 2 * 128256 * 4096 + 4096
    assert items(lightning)[FSDP1_ROOT_ITEM] == 2 * outside and FSDP1_ROOT_ITEM not in items(torchtitan)
    assert lightning.peak - torchtitan.peak == pytest.approx(
        (1 + Assumptions().fragmentation_fraction) * (2 * LLAMA.num_params + 2 * outside - 4 * LLAMA.num_params // 8),
        rel=1e-6)  # plus the allocator's margin
    # One micro-batch: nothing accumulates; a DeepSpeed strategy has no no_sync.
    assert NO_SYNC_ITEM not in items(breakdown("lightning", gas=1))
    assert NO_SYNC_ITEM not in items(breakdown("accelerate", strategy="zero2", gas=4))
    assert items(breakdown("hf-trainer", gas=2))[NO_SYNC_ITEM] == 2 * LLAMA.num_params


def test_megatron_keeps_a_global_all_gather_buffer_under_sequence_parallelism() -> None:
    # layers.py: get_global_memory_buffer().get_tensor([s * tp/tp, b, h]) in bf16, never freed.
    megatron = items(breakdown("megatron", tp=2, seq=4096))
    assert megatron[TP_GATHER_ITEM] == 4096 * 1 * 4096 * 2
    assert TP_GATHER_ITEM not in items(breakdown("megatron", tp=1))
    assert TP_GATHER_ITEM not in items(breakdown("torchtitan", tp=2))
    no_sp = Assumptions(sequence_parallel=False)
    assert TP_GATHER_ITEM not in items(breakdown("megatron", tp=2, assumptions=no_sp))


def test_nanotron_runs_tensor_parallelism_without_sequence_parallelism() -> None:
    assert framework_assumptions(profile("nanotron"), Assumptions()).sequence_parallel is False
    assert framework_assumptions(profile("megatron"), Assumptions()).sequence_parallel is True
    nanotron = breakdown("nanotron", tp=2)
    # The same moments as fstrain's model with sequence parallelism off: replicated tensors whole.
    no_sp = breakdown("fstrain", tp=2, assumptions=Assumptions(sequence_parallel=False))
    assert nanotron.moments == no_sp.moments
    assert dict(nanotron.moments)["loss"] > dict(breakdown("fstrain", tp=2).moments)["loss"]
    assert TP_GATHER_ITEM not in items(nanotron)  # the buffer is sequence parallelism's


def test_each_framework_brings_its_loss_kernel() -> None:
    def loss(framework: str, given: str | None = None) -> str:
        request = TrainingRequest(seq_len=4096, global_batch=8, framework=framework, loss=given)
        return resolve_training(LLAMA, None, request)[0].loss

    assert [loss(name) for name in ("fstrain", "torchtitan", "megatron", "nanotron", "lightning", "flash-attn")] == [
        "full", "full", "megatron-inplace", "megatron-core", "litgpt", "fused"]
    assert loss("megatron", "chunked") == "chunked:8"  # a --loss given wins


def test_a_hand_written_deepspeed_config_allocates_deepspeed_default_buckets_whole() -> None:
    tiny = PlanModel.from_spec(load_shipped_recipe("tiny").model)
    assert tiny.num_params < 50_000_000
    rendered = items(breakdown("fstrain", strategy="zero3", model=tiny, seq=256))
    own = items(breakdown("deepspeed", strategy="zero3", model=tiny, seq=256))
    # stage3.py allocates reduce_bucket_size (5e8) elements whatever the model; render caps it.
    assert own["DeepSpeed reduce bucket"] == 2 * 500_000_000
    assert rendered["DeepSpeed reduce bucket"] == 2 * tiny.num_params
    # ZeRO-2 under a hand-written config: two whole buckets (overlap_comm).
    assert items(breakdown("deepspeed", strategy="zero2", model=tiny, seq=256))[
        "DeepSpeed reduce buckets (2, overlap_comm)"] == 2 * 2 * 500_000_000


def test_deepspeed_buckets_and_persistent_parameters_by_profile() -> None:
    h = 4096
    assert profile("deepspeed").bucket_elements(h) == (500_000_000, 50_000_000, 100_000)
    assert profile("hf-trainer").bucket_elements(h) == (h * h, int(0.9 * h * h), 10 * h)
    assert profile("fstrain").bucket_elements(h) == (0, 0, 0)
    offloaded = items(breakdown("deepspeed", strategy="zero3", offload="optimizer+params"))
    # Llama 3.1 8B: two RMSNorm weights of 4096 per block and the final norm stay whole (bf16).
    assert offloaded[ZERO3_PERSISTENT_ITEM] == 2 * (32 * 2 * 4096 + 4096)
    assert offloaded["ZeRO-3 prefetch"] == 2 * 50_000_000
    assert offloaded["DeepSpeed reduce bucket"] == 2 * 500_000_000
    hf = items(breakdown("hf-trainer", strategy="zero3"))
    assert hf["DeepSpeed reduce bucket"] == 2 * h * h and hf["ZeRO-3 prefetch"] == 2 * int(0.9 * h * h)
    assert ZERO3_PERSISTENT_ITEM not in items(breakdown("fstrain", strategy="zero3"))


def test_plan_flag_json_and_plan_file(tmp_path: Path) -> None:
    out = tmp_path / "plan.yaml"
    args = ("plan", "--model", "llama3.1-8b", "--num-nodes", "1", "--gpus-per-node", "8", "--gpu", "h100-sxm",
            "--strategy", "fsdp-full", "--tp", "1", "--pp", "1", "--micro-batch", "1", "--grad-accum", "4",
            "--global-batch", "32", "--ac", "full", "--seq-len", "4096")
    result = run_fstrain(*args, "--framework", "lightning", "--json", "--out", str(out))
    assert result.returncode == 0, result.stderr
    best = json.loads(result.stdout)["plans"][0]
    assert best["framework"] == "lightning" and best["memory"]["details"][NO_SYNC_ITEM] == 2 * LLAMA.num_params
    saved = PlanFile.from_dict(yaml.safe_load(out.read_text()), str(out))
    assert saved.knobs.framework == "lightning"
    data = yaml.safe_load(out.read_text())
    data["plan"]["framework"] = "keras"
    with pytest.raises(InputError) as caught:
        PlanFile.from_dict(data, "plan.yaml")
    assert "plan.framework is 'keras'" in str(caught.value) and "lightning" in caught.value.hint
    bad = run_fstrain(*args, "--framework", "keras")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"error: --framework: unknown framework 'keras' (hint: use one of {', '.join(FRAMEWORKS)})"]


def test_the_trace_refuses_another_frameworks_plan() -> None:
    check_trace_framework(make_plan("fsdp-full"), "--trace")
    with pytest.raises(ConfigError, match=r"--framework lightning.*re-plan with --framework fstrain"):
        check_trace_framework(make_plan("fsdp-full", framework="lightning"), "--trace")
