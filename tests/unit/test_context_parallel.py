"""Context parallelism (--cp) in the planner: ring-attention memory and time, search, plan files, refusals."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from fstrain.core.job.plan import check_plan_fits_launch, check_trainer_cp
from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.contextparallel import RING_BUFFER_ITEM, cp_rank_view, ring_buffer_bytes, ring_chunk_bytes
from fstrain.core.plan.memory import communicator_count, memory_breakdown
from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.plan.plancluster import uniform_cluster
from fstrain.core.plan.planfile import PlanFile, validate_cp
from fstrain.core.plan.planner import Pins, PlanModel, TrainingSpec, plan, plan_file
from fstrain.core.plan.schema import PlanKnobs
from fstrain.core.plan.timemodel import ring_attention_time, step_time
from fstrain.core.render.bundle import render_bundle
from fstrain.core.render.deepspeed import render_deepspeed
from fstrain.core.render.fsdp import render_accelerate, render_fsdp
from fstrain.errors import ConfigError, InputError
from fstrain.io.recipes import load_shipped_recipe
from fstrain.io.render_files import bundle_files, render_and_write
from fstrain.train.settings import load_settings
from fstrain.train.trace import check_traceable
from tests.helpers import run_fstrain
from tests.plans import make_plan

from .test_timemodel import LINKS, LLAMA, NO_OVERLAP

PARAMS = count_parameters(LLAMA)
TINY = load_shipped_recipe("tiny").model


def knobs(**changes: object) -> PlanKnobs:
    """LLAMA (8B shape) on 8 GPUs: FSDP full-shard, dp 4 x cp 2, one 8192-token sequence, no AC."""
    base = PlanKnobs("fsdp-full", 3, 4, 1, 1, 4, 1, 1, "none", "none", "bf16", "adamw", 8192, cp=2)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_the_world_counts_cp_and_the_batch_does_not() -> None:
    k = knobs()
    assert k.world_size == 4 * 2 == 8 and k.global_batch_size == 4  # cp ranks share their sequences
    view = cp_rank_view(k)
    assert (view.dp, view.shard_group_size, view.seq_len, view.cp) == (8, 8, 4096, 1)
    assert view.global_batch_size * view.seq_len == k.global_batch_size * k.seq_len  # same tokens
    hybrid = cp_rank_view(knobs(strategy="fsdp-hybrid", dp=8, shard_group_size=2))
    assert (hybrid.dp, hybrid.shard_group_size) == (16, 4)  # shard over group x cp, replicate over the rest
    assert cp_rank_view(knobs(cp=1)) == knobs(cp=1)


def test_ring_chunks_and_buffers_by_hand() -> None:
    # 4096 local tokens x (K + V, each repeated to 32 heads x 128) x 2 bytes = 64 MiB.
    assert ring_chunk_bytes(LLAMA, knobs()) == 4096 * 2 * 4096 * 2 == 67_108_864
    assert ring_chunk_bytes(LLAMA, knobs(tp=2)) == 33_554_432  # each TP rank its heads
    assert ring_chunk_bytes(LLAMA, knobs(), 4) == 134_217_728  # the fp32 dK/dV accumulator
    # Backward of one layer: all-gathered K/V (2 chunks) + the concatenated local chunk (3 x 64 MiB),
    # the fp32 dQ (64 MiB), three fp32 dK/dV chunks (3 x 128 MiB), one step's dQ, dK, dV (3 x 32 MiB).
    assert ring_buffer_bytes(LLAMA, knobs()) == (3 * 64 + 64 + 3 * 128 + 3 * 32) << 20 == 771_751_936
    # cp 4: 2048 local tokens, 4 gathered chunks + 1 of 32 MiB, 32 MiB dQ, 3 x 64 MiB, 3 x 16 MiB.
    assert ring_buffer_bytes(LLAMA, knobs(cp=4, dp=2, shard_group_size=2)) == (5 * 32 + 32 + 3 * 64 + 3 * 16) << 20
    assert ring_buffer_bytes(LLAMA, knobs(cp=1)) == 0


def test_cp_2_at_twice_the_sequence_holds_what_cp_1_holds_plus_the_ring() -> None:
    one = memory_breakdown(LLAMA, PARAMS, PARAMS.total, knobs(cp=1, dp=8, shard_group_size=8), 8)
    two = memory_breakdown(LLAMA, PARAMS, PARAMS.total, knobs(seq_len=16384), 8)
    d1, d2 = dict(one.details), dict(two.details)
    # Same states (FSDP over dp x cp = 8 ranks either way), same activations per GPU (8192 tokens).
    assert (two.parameters, two.optimizer_states) == (one.parameters, one.optimizer_states)
    for name, value in d1.items():
        if name.startswith("activations (") or name in ("logits and loss", "final norm and head input"):
            assert d2[name] == value, name
    backward1, backward2 = dict(one.moments)["backward"], dict(two.moments)["backward"]
    ring = ring_buffer_bytes(LLAMA, knobs(seq_len=16384))
    assert ring == 2 * 771_751_936  # 8192 local tokens: twice the 8192-token sequence's chunks
    # The ring's buffers are backward's (with the allocator's margin on them), and CP adds the
    # cp and dp process groups' NCCL buffers to every moment.
    groups = communicator_count(knobs(seq_len=16384)) - communicator_count(knobs(cp=1, dp=8, shard_group_size=8))
    assert groups == 2  # world + dp(4) + cp(2), against world alone
    nccl = groups * Assumptions().nccl_bytes_per_communicator
    margin = 1 + Assumptions().fragmentation_fraction
    assert backward2 - backward1 == pytest.approx(nccl + ring * margin, abs=4)
    assert dict(two.moments)["loss"] - dict(one.moments)["loss"] == nccl
    assert RING_BUFFER_ITEM not in d2  # the peak is the loss: 8192 tokens x 128,256 logits
    assert two.phase == one.phase == "loss"


def test_ring_attention_time_by_hand() -> None:
    # LLAMA at 8192 tokens, cp 2 on NVLink (450 GB/s), 400 TFLOP/s effective: the rank's forward
    # attention is 4096 tokens x 4 x 8192 x 4096 FLOPs = 1.37 ms, its backward 2.5x that.
    k = knobs()
    attention = 4096 * 4 * 8192 * 4096 / 400e12
    flops = step_time(LLAMA, PARAMS.total, k, 400e12, 8 * 989e12, LINKS, NO_OVERLAP)
    assert flops.tokens_per_step == 4 * 8192
    from fstrain.core.plan.timemodel import flops_per_token

    per_token = flops_per_token(LLAMA, 8192)
    # The all-gather (64 MiB: 0.15 ms) hides behind the local chunk's SDPA (0.69 ms) both ways, and
    # dK/dV's fp32 steps (128 MiB: 0.30 ms) behind the next chunk's backward, but for the last one.
    assert ring_attention_time(LLAMA, k, per_token, 400e12, LINKS, NO_OVERLAP) == pytest.approx(134_217_728 / 450e9)
    # A GPU 1000x faster hides nothing: forward and backward all-gathers less the first chunk,
    # the dK/dV step less the next chunk, and the last dK/dV step whole.
    fast = attention / 1000
    gather, dkv = 67_108_864 / 450e9, 134_217_728 / 450e9
    exposed = (gather - fast / 2) + (gather - 2.5 * fast / 2) + (dkv - 2.5 * fast / 2) + dkv
    assert ring_attention_time(LLAMA, k, per_token, 400e15, LINKS, NO_OVERLAP) == pytest.approx(exposed)
    # Full AC runs the forward ring again.
    full = knobs(activation_checkpointing="full")
    assert ring_attention_time(LLAMA, full, per_token, 400e15, LINKS, NO_OVERLAP) == \
        pytest.approx(exposed + gather - fast / 2)
    assert ring_attention_time(LLAMA, knobs(cp=1), per_token, 400e15, LINKS, NO_OVERLAP) == 0.0
    # Latency: one step of the ring (NVLink's alpha) per step, (cp - 1) per all-gather.
    alpha = Assumptions(nvlink_latency_s=1e-5, collective_base_latency_s=0.0, collective_efficiency=1.0)
    assert ring_attention_time(LLAMA, k, per_token, 400e12, LINKS, alpha) == pytest.approx(134_217_728 / 450e9 + 1e-5)


def test_cp_halves_the_compute_and_reduces_over_dp_x_cp() -> None:
    # The same 8192-token sequences on 8 GPUs: cp 2 gives each rank half of each sequence.
    one = step_time(LLAMA, PARAMS.total, knobs(cp=1, dp=4, shard_group_size=4), 400e12, 4 * 989e12, LINKS,
                    NO_OVERLAP)
    two = step_time(LLAMA, PARAMS.total, knobs(), 400e12, 8 * 989e12, LINKS, NO_OVERLAP)
    assert two.compute_s == pytest.approx(one.compute_s / 2)
    assert two.tokens_per_step == one.tokens_per_step and two.model_flops_per_step == one.model_flops_per_step
    # FSDP's all-gathers and reduce-scatters run over dp x cp = 8 ranks, as for dp 8 without CP.
    dp8 = step_time(LLAMA, PARAMS.total, knobs(cp=1, dp=8, shard_group_size=8), 400e12, 8 * 989e12, LINKS,
                    NO_OVERLAP)
    assert two.dp_comm_s == pytest.approx(dp8.dp_comm_s)
    assert two.cp_comm_s == pytest.approx(32 * 134_217_728 / 450e9)  # 32 layers x the last dK/dV step
    assert two.step_time_s == pytest.approx(two.compute_s + two.cp_comm_s + two.dp_exposed_s)
    assert two.to_dict()["cp_comm_s"] == two.cp_comm_s and "cp_comm_s" not in one.to_dict()


def test_the_search_uses_cp_only_when_pinned() -> None:
    model = PlanModel.from_spec(load_shipped_recipe("llama3.1-8b").model)
    cluster = uniform_cluster(1, 8, "h100-sxm")
    result = plan(model, TrainingSpec(65536, 4), cluster, Pins(cp=2))
    evaluated = [*result.plans, *result.rejected]
    assert evaluated and all(p.knobs.cp == 2 and p.knobs.pp == 1 for p in evaluated)
    assert {p.knobs.strategy for p in evaluated} <= {"fsdp-full", "fsdp-grad-op", "fsdp-hybrid"}
    assert all(p.knobs.dp * p.knobs.tp == 4 for p in evaluated)
    assert result.best is not None and result.best.to_dict()["cp"] == 2 and "cp=2" in result.best.describe()
    free = plan(model, TrainingSpec(8192, 64), cluster)
    assert {p.knobs.cp for p in (*free.plans, *free.rejected)} == {1}


@pytest.mark.parametrize(
    ("pins", "training", "message"),
    [
        (Pins(cp=0), TrainingSpec(8192, 8), "cp=0 is not a positive integer"),
        (Pins(cp=3), TrainingSpec(8192, 8), r"cp=3 \(x tp=1 x pp=1\) does not divide the 8 GPUs"),
        (Pins(cp=2, tp=8), TrainingSpec(8192, 8), r"cp=2 \(x tp=8 x pp=1\) does not divide"),
        (Pins(cp=2, strategy="zero3"), TrainingSpec(8192, 8), "does not run with zero3"),
        (Pins(cp=2, strategy="ddp"), TrainingSpec(8192, 8), "does not run with ddp"),
        (Pins(cp=2, pp=2), TrainingSpec(8192, 8), "pipeline parallelism"),
        (Pins(cp=4), TrainingSpec(8196, 8), "does not split into 2 x cp = 8 equal chunks"),
        (Pins(cp=2), TrainingSpec(8192, 8, flash_attention=False, precision="fp16"), "FlashAttention"),
    ],
)
def test_impossible_cp_pins_are_errors(pins: Pins, training: TrainingSpec, message: str) -> None:
    model = PlanModel.from_spec(load_shipped_recipe("llama3.1-8b").model)
    with pytest.raises(ConfigError, match=message) as caught:
        plan(model, training, uniform_cluster(1, 8, "h100-sxm"), pins)
    assert caught.value.hint
    if pins.strategy == "zero3":
        assert "Ulysses" in caught.value.hint


def test_cp_needs_the_architecture() -> None:
    with pytest.raises(ConfigError, match="needs the model's layers"):
        plan(PlanModel(8_000_000_000), TrainingSpec(8192, 8), uniform_cluster(1, 8, "h100-sxm"), Pins(cp=2))


def test_plan_files_carry_cp_and_old_ones_still_load() -> None:
    model = PlanModel.from_spec(load_shipped_recipe("llama3.1-8b").model)
    cluster = uniform_cluster(1, 8, "h100-sxm")
    result = plan(model, TrainingSpec(32768, 4), cluster, Pins(cp=2, strategy="fsdp-full", tp=1))
    saved = plan_file(result, model, cluster)
    document = saved.to_dict()
    assert document["plan"]["cp"] == 2 and document["predicted"]["cp"] == 2
    assert PlanFile.from_dict(document, "plan.yaml").knobs == saved.knobs
    del document["plan"]["cp"]  # written before context parallelism
    assert PlanFile.from_dict(document, "plan.yaml").knobs.cp == 1


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cp": 0}, r"plan.cp must be a positive integer, got 0"),
        ({"cp": "two"}, r"plan.cp must be a positive integer, got 'two'"),
        ({"cp": 2, "strategy": "zero3"}, r"plan.cp is 2: context parallelism does not run with zero3"),
        ({"cp": 2, "pp": 2}, r"plan.cp is 2: context parallelism with pipeline parallelism"),
        ({"cp": 2, "seq_len": 130}, r"does not split into 2 x cp = 4 equal chunks"),
        ({"cp": 2, "seq_len": 0, "flash_attention": False}, r"needs a FlashAttention-style SDPA kernel"),
    ],
)
def test_plan_file_cp_errors_name_the_key(changes: dict[str, object], message: str) -> None:
    document = make_plan("fsdp-full", dp=2, model=TINY).to_dict()
    document["plan"].update(changes)
    with pytest.raises(InputError, match=message) as caught:
        PlanFile.from_dict(document, "plan.yaml")
    assert caught.value.hint
    validate_cp(make_plan("fsdp-full", dp=2, model=TINY, cp=2).knobs, TINY, "plan.yaml")  # fine


def test_the_trainer_launch_trace_and_renderers_say_what_cp_means(tmp_path: Path) -> None:
    chosen = make_plan("fsdp-full", dp=2, model=TINY, cp=2)
    with pytest.raises(ConfigError, match="does not run context parallelism") as caught:
        check_trainer_cp(chosen, "plan.yaml")
    assert "context_parallel_degree = 2" in caught.value.hint
    with pytest.raises(ConfigError, match="does not run context parallelism"):
        check_traceable(chosen)
    with pytest.raises(ConfigError, match=r"dp\(2\) \* cp\(2\) \* tp\(1\) \* pp\(1\) = 4 processes"):
        check_plan_fits_launch(chosen, 2, "--plan")
    with pytest.raises(ConfigError, match="does not run context parallelism"):
        check_plan_fits_launch(chosen, 4, "--plan")
    check_trainer_cp(make_plan("fsdp-full", dp=2, model=TINY), "plan.yaml")  # cp 1 trains
    with pytest.raises(ConfigError, match="DeepSpeed has no ring-attention context parallelism"):
        render_deepspeed(chosen)
    fsdp = render_fsdp(chosen)
    assert fsdp.config["mesh"] == {"dim_names": ["shard"], "shape": [4]} and fsdp.config["world_size"] == 4
    assert fsdp.config["context_parallel"] == {"degree": 2, "rotate_method": "allgather", "load_balance": True}
    assert "context_parallel" not in render_fsdp(make_plan("fsdp-full", dp=2, model=TINY)).config
    hybrid = render_fsdp(make_plan("fsdp-hybrid", dp=4, shard_group_size=2, model=TINY, cp=2))
    assert hybrid.config["mesh"] == {"dim_names": ["replicate", "shard"], "shape": [2, 4]}
    assert "set up context parallelism" in " ".join(render_accelerate(chosen).notes)
    bundle = render_bundle(chosen, out_dir=str(tmp_path))
    assert bundle.deepspeed is None and "ds_config.json" not in bundle_files(bundle)
    assert "Ulysses" in " ".join(bundle.notes["ds_config.json"]) and "cp=2" in bundle.readme


def test_the_bundled_trainer_refuses_a_cp_plan_before_torch(tmp_path: Path) -> None:
    render_and_write(make_plan("fsdp-full", dp=2, model=TINY, cp=2), tmp_path / "r", force=False)
    assert not (tmp_path / "r" / "ds_config.json").exists()
    # Rendered again over a cp = 1 plan's files (--force), the old ds_config.json does not stay behind.
    render_and_write(make_plan("fsdp-full", dp=2, model=TINY), tmp_path / "again", force=False)
    assert (tmp_path / "again" / "ds_config.json").exists()
    render_and_write(make_plan("fsdp-full", dp=2, model=TINY, cp=2), tmp_path / "again", force=True)
    assert not (tmp_path / "again" / "ds_config.json").exists() and (tmp_path / "again" / "fsdp.yaml").exists()
    args = ["--plan", str(tmp_path / "r" / "plan.yaml"), "--fsdp-config", str(tmp_path / "r" / "fsdp.yaml")]
    with pytest.raises(ConfigError, match="does not run context parallelism"):
        load_settings(args, 4)


def test_plan_cli_shows_takes_and_refuses_cp(tmp_path: Path) -> None:
    helped = run_fstrain("plan", "--help")
    assert helped.returncode == 0 and "--cp" in helped.stdout
    base = ("plan", "--model", "llama3.1-8b", "--num-nodes", "1", "--gpus-per-node", "8", "--gpu", "h100-sxm",
            "--seq-len", "65536", "--global-batch", "4", "--strategy", "fsdp-full", "--tp", "1")
    result = run_fstrain(*base, "--cp", "2", "--json", "--out", str(tmp_path / "plan.yaml"))
    assert result.returncode == 0, result.stderr
    best = json.loads(result.stdout)["plans"][0]
    assert best["cp"] == 2 and best["dp"] == 4 and best["time_breakdown"]["cp_comm_s"] > 0
    assert "cp: 2" in (tmp_path / "plan.yaml").read_text()
    human = run_fstrain(*base, "--cp", "2")
    assert human.returncode == 0 and "CP ring" in human.stderr and " cp " in human.stderr
    for flag, value, text in (("--cp", "0", "--cp"), ("--cp", "3", "does not divide the 8 GPUs"),
                              ("--strategy", "zero3", "DeepSpeed-Ulysses")):
        args = [*base, "--cp", "2"] if flag != "--cp" else list(base)
        bad = run_fstrain(*args, flag, value)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and text in bad.stderr, bad.stderr
    launch = run_fstrain("launch", "--plan", str(tmp_path / "plan.yaml"), "--dry-run", "--hosts", "localhost",
                         "--nproc-per-node", "8")
    assert launch.returncode == 2 and "does not run context parallelism" in launch.stderr
    assert launch.stderr.count("\n") == 1
    traced = run_fstrain(*base, "--cp", "2", "--trace", "--json")
    assert traced.returncode == 2 and traced.stdout == "" and "does not run context parallelism" in traced.stderr
    rendered = run_fstrain("render", "--plan", str(tmp_path / "plan.yaml"), "-o", str(tmp_path / "out"))
    assert rendered.returncode == 0, rendered.stderr
    written = sorted(path.name for path in (tmp_path / "out").iterdir())
    assert "fsdp.yaml" in written and "ds_config.json" not in written
    assert "context_parallel" in (tmp_path / "out" / "fsdp.yaml").read_text()


def test_torchtitans_context_parallel_runs_hold_their_cp_1_siblings_memory() -> None:
    """torchtitan's 2024 Llama 3.1 8B long-context runs (FSDP 8 CP 1 at 32K, FSDP 4 CP 2 at 64K, FSDP 2
    CP 4 at 128K, FSDP 1 CP 8 at 256K) all hold 32K tokens and 8-way sharded states per GPU: the
    model predicts one memory for all four (measured: 83.9, 84.2, 84.0, 84.5 GiB). They also ran
    torch.compile and fp8, which this comparison leaves out on every run alike."""
    from tests.unit.test_planner_accuracy import deep_merge, evaluate, load_cases

    ids = ("tt2412-8b-fsdp8-cp1-32k", "tt2412-8b-fsdp4-cp2-64k", "tt2412-8b-fsdp2-cp4-128k", "tt2412-8b-fsdp1-cp8-256k")
    cases = {case.id: case for case in load_cases() if case.id in ids}
    outcomes = []
    for run_id in ids:
        case = cases[run_id]
        eager = dataclasses.replace(case, run=deep_merge(case.run, {"fstrain": {"compile": False, "fp8": False}}))
        outcome = evaluate(eager)
        assert outcome.plan is not None and outcome.plan.fits, outcome.error or outcome.unsupported
        assert outcome.plan.knobs.cp == case.flags.get("cp", 1)
        outcomes.append(outcome)
    assert len({o.predicted_memory_bytes for o in outcomes}) == 1
    speeds = [o.predicted_tokens_per_s_per_gpu for o in outcomes]
    assert speeds == sorted(speeds, reverse=True)  # attention grows with the sequence
