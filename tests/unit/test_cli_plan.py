"""`fstrain plan` as a user runs it: JSON on stdout, tables on stderr, one-line errors, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fstrain.core.plan import fittedbands
from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.planfile import PlanFile
from tests.helpers import run_fstrain

H100_64 = ("--num-nodes", "8", "--gpus-per-node", "8", "--gpu", "h100-sxm")


def test_json_document_has_the_issue_fields(tmp_path: Path) -> None:
    out = tmp_path / "plan.yaml"
    result = run_fstrain("plan", "--model", "llama3.1-70b", *H100_64, "--json", "--top", "3", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # --json: nothing for humans
    document = json.loads(result.stdout)
    plans = document["plans"]
    assert len(plans) == 6 and [p["fits"] for p in plans] == [True] * 3 + [False] * 3
    best = plans[0]
    for key in (
        "strategy",
        "zero_stage",
        "dp",
        "tp",
        "pp",
        "micro_batch_size",
        "grad_accum_steps",
        "activation_checkpointing",
        "offload",
        "step_time_s",
        "tokens_per_s",
        "mfu",
        "rejected_because",
    ):
        assert key in best
    memory = best["memory"]
    assert memory["peak"] == sum(memory[k] for k in ("model_states", "activations", "buffers", "overhead"))
    assert memory["model_states"] == memory["parameters"] + memory["gradients"] + memory["optimizer_states"]
    assert memory["required"] <= best["usable_bytes"] == 81559 * 2**20
    assert best["dp"] * best["tp"] * best["pp"] == 64 and best["rejected_because"] is None
    assert best["time_to_train_s"] == pytest.approx(15e12 / best["tokens_per_s"])  # the recipe's 15T tokens
    assert " GiB usable on H100-SXM (peak " in plans[3]["rejected_because"] and plans[3]["step_time_s"] is None
    assert document["training"]["global_batch_size"] == 512  # 4M tokens of 8192 from the recipe
    # --out saved the same best plan for render and launch.
    saved = PlanFile.from_dict(yaml.safe_load(out.read_text()), str(out))
    assert (saved.knobs.strategy, saved.knobs.tp, saved.knobs.dp) == (best["strategy"], best["tp"], best["dp"])
    assert saved.model.name == "llama3.1-70b" and saved.cluster.num_nodes == 8
    # Every plan carries its error band (fstrain/core/plan/errorband.py): the measured values
    # its peak and throughput are consistent with, P / (1 + high error) to P / (1 + low error).
    for p in plans:
        band = p["error_band"]
        memory, throughput = band["memory"], band["throughput"]
        assert band["nominal_coverage"] == fittedbands.NOMINAL_COVERAGE_PCT / 100
        assert memory["class"] in fittedbands.MEMORY_BANDS and 0 < memory["held_out_coverage"] <= 1
        assert memory["low_bytes"] == round(p["memory"]["peak"] / (1 + memory["error_high"]))
        assert memory["high_bytes"] == round(p["memory"]["peak"] / (1 + memory["error_low"]))
        if p["tokens_per_s"] is None:
            assert throughput is None
        else:
            assert throughput["low_tokens_per_s"] == pytest.approx(p["tokens_per_s"] / (1 + throughput["error_high"]))
            assert throughput["high_tokens_per_s"] == pytest.approx(p["tokens_per_s"] / (1 + throughput["error_low"]))
    assert saved.predicted["error_band"] == best["error_band"]


def test_plan_imports_no_torch_deepspeed_or_rich_for_json() -> None:
    code = (
        "import sys, io, contextlib\n"
        "from fstrain.cli.main import app\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        app(['plan', '--model', 'llama3.1-8b', '--gpu', 'h100-sxm', '--json'], prog_name='fstrain')\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = ('torch', 'deepspeed', 'rich', 'numpy', 'mlflow', 'wandb')\n"
        "print('HEAVY=' + ','.join(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "HEAVY="


def test_human_output_shows_plans_memory_bar_and_assumptions() -> None:
    result = run_fstrain("plan", "--model", "llama3.1-8b", "--gpu", "h100-sxm", "--train-tokens", "1T")
    assert result.returncode == 0 and result.stdout == ""
    err = result.stderr
    for text in (
        "model llama3.1-8b: 8.03B parameters",
        "searched ",
        "tokens/s",
        "chosen:",
        "█",
        "% band of measured runs like it): peak ",
        "peak",
        "assumptions",
        "cuda_context_bytes",
        "step ",
    ):
        assert text in err, text


def test_nothing_fits_exits_1_and_says_what_would() -> None:
    result = run_fstrain("plan", "--model", "llama3.1-405b", "--gpu", "a100-40gb", "--json")
    assert result.returncode == 1
    document = json.loads(result.stdout)
    assert document["fitting_total"] == 0 and all(not p["fits"] for p in document["plans"])
    assert any("nodes (" in s for s in document["suggestions"])
    assert all(p["tokens_per_s"] > 0 and p["step_time_s"] > 0 for p in document["plans"])  # had they fitted
    human = run_fstrain("plan", "--model", "llama3.1-405b", "--gpu", "a100-40gb")
    assert human.returncode == 1 and "nothing fits" in human.stderr and "would fit on " in human.stderr
    assert "tokens/s if it fit" in human.stderr and "#1 likely (" in human.stderr  # the closest one's band


def test_heterogeneous_nodes_name_the_bound() -> None:
    result = run_fstrain("plan", "--model", "llama2-7b", "--node", "h100-sxm:8", "--node", "a100-40gb:8x2", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["cluster"]["world_size"] == 24
    assert "memory bounded by 8x A100-SXM4-40GB" in document["cluster"]["bounded_by"]


def test_model_params_only() -> None:
    result = run_fstrain(
        "plan",
        "--model-params",
        "7.5B",
        "--gpu",
        "v100-32gb",
        "--num-nodes",
        "8",
        "--precision",
        "fp16",
        "--strategy",
        "zero3",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    best = json.loads(result.stdout)["plans"][0]
    assert best["memory"]["activations"] == 0 and best["step_time_s"] is None
    assert best["memory"]["model_states"] == 18 * 7_500_000_000 // 64  # DeepSpeed's ZeRO-3 accounting
    assert best["error_band"] is None  # no activations: no band learned on real runs applies


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("--model", "llama5", "--gpu", "h100-sxm"), "error: --model: unknown model 'llama5' (hint: known models: "),
        (("--model", "tiny", "--gpu", "h200x"), "error: --gpu: unknown GPU 'h200x' (hint: known GPUs: "),
        (("--model", "tiny"), "error: --gpu: which GPU? give --gpu"),
        (
            ("--model", "llama3.1-8b", "--gpu", "h100-sxm", "--tp", "3"),
            "error: --tp: tp=3 does not divide the world size 8",
        ),
        (
            ("--model", "llama3.1-8b", "--gpu", "h100-sxm", "--zero-stage", "2", "--strategy", "zero3"),
            "error: --zero-stage: --zero-stage 2 means zero2, but --strategy is zero3",
        ),
        (
            ("--model", "llama3.1-8b", "--gpu", "h100-sxm", "--offload", "disk"),
            "error: --offload: 'disk' is not one of none, optimizer, optimizer+params",
        ),
        (("--model", "tiny", "--recipe", "x.yaml", "--gpu", "l4"), "error: fstrain plan: give exactly one of --model"),
        (
            ("--model", "llama3.1-70b", "--gpu", "h100-sxm", "--pp-schedule", "gpipe"),
            "error: --pp-schedule: 'gpipe' is not a pipeline schedule (hint: use one of 1f1b, interleaved, zero-bubble",
        ),
        (
            ("--model", "llama3.1-70b", "--gpu", "h100-sxm", "--pp-virtual-stages", "3"),
            "error: --pp-virtual-stages: --pp-virtual-stages 3 without the interleaved schedule (hint: add",
        ),
        (
            ("--model", "llama3.1-70b", "--gpu", "h100-sxm", "--pp-schedule", "interleaved", "--pp-virtual-stages",
             "1"),
            "error: --pp-virtual-stages: --pp-virtual-stages 1: interleaving needs at least 2 model chunks",
        ),
        (
            ("--model", "llama3.1-70b", "--gpu", "h100-sxm", "--strategy", "zero1", "--pp", "2", "--pp-schedule",
             "interleaved"),
            "error: --pp-schedule: ZeRO-1 runs on DeepSpeed's pipeline engine, which has its own 1F1B schedule only",
        ),
        (
            ("--model", "llama3.1-70b", "--gpu", "h100-sxm", "--pp", "1", "--pp-schedule", "zero-bubble"),
            "error: --pp-schedule: the zero-bubble schedule needs a pipeline, and --pp is 1 (hint: give --pp 2",
        ),
        (
            ("--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--ep", "3"),
            "error: --ep: ep=3 does not divide the 8 experts (hint: use a divisor of 8)",
        ),
        (
            ("--model", "llama3.1-8b", "--gpu", "h100-sxm", "--ep", "2"),
            "error: --ep: ep=2 but llama3.1-8b has no experts (hint: expert parallelism is for mixture-of-experts",
        ),
        (
            ("--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--ep", "0"),
            "error: --ep: ep=0 is not a positive integer (hint: use 1 for no expert parallelism)",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], line: str) -> None:
    result = run_fstrain("plan", *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(line), result.stderr


def test_bad_recipe_key_names_file_and_key(tmp_path: Path) -> None:
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(
        "model:\n  num_layers: 2\n  hidden_size: 64\n  num_heads: 2\n  ffn_hidden_size: 256\n"
        "  activation: gelu\n  vocab_size: 256\n  seq_len: 64\n  hiden_size: 64\n"
    )
    result = run_fstrain("plan", "--recipe", str(recipe), "--gpu", "l4")
    assert result.returncode == 2
    assert result.stderr == (
        f"error: {recipe}: model.hiden_size: unknown key 'hiden_size' (hint: known keys here: num_layers, "
        "hidden_size, num_heads, num_kv_heads, ffn_hidden_size, activation, vocab_size, seq_len, tied_embeddings, "
        "norm, linear_bias, position_embedding, dropout, pooler, num_labels, head_dim, qk_norm, attention_bias, "
        "mlp_bias, post_norms, sliding_window, sliding_window_layers, moe, params)\n"
    )


def test_loss_flag_sets_the_logits_memory_and_the_output_names_the_peak_moment() -> None:
    pinned = ("plan", "--model", "llama3.1-8b", "--gpu", "h100-sxm", "--num-nodes", "1", "--gpus-per-node", "8",
              "--strategy", "fsdp-full", "--micro-batch", "1", "--grad-accum", "1", "--global-batch", "8",
              "--seq-len", "4096", "--ac", "none")
    documents = {}
    for loss in ("full", "fused", "chunked"):
        result = run_fstrain(*pinned, "--loss", loss, "--json")
        assert result.returncode == 0, result.stderr
        documents[loss] = json.loads(result.stdout)["plans"][0]
    logits = 4096 * 128256
    assert documents["full"]["memory"]["details"]["logits and loss"] == 12 * logits
    # The other moments are the same; the loss moment differs by the logits' bytes (plus the
    # allocator's fitted margin on them).
    loss_moment = {loss: doc["memory"]["moments"]["loss"] for loss, doc in documents.items()}
    margin = 1 + Assumptions().fragmentation_fraction
    assert loss_moment["full"] - loss_moment["fused"] == pytest.approx(margin * (12 - 4) * logits, abs=4)
    assert loss_moment["full"] - loss_moment["chunked"] == pytest.approx(margin * (12 - 6.5) * logits, abs=4)
    backward = {loss: doc["memory"]["moments"]["backward"] for loss, doc in documents.items()}
    assert backward["full"] == backward["fused"] == backward["chunked"]
    memory = documents["full"]["memory"]
    assert memory["phase"] == "loss" and memory["moments"]["loss"] == memory["peak"] == max(memory["moments"].values())
    assert set(memory["moments"]) == {"loss", "backward", "optimizer step"}
    human = run_fstrain(*pinned)
    assert human.returncode == 0 and "peak (loss moment)" in human.stderr and "backward moment" in human.stderr
    fused = run_fstrain(*pinned, "--loss", "fused")
    assert "fused loss" not in human.stderr and "FlashAttention, fused loss" in fused.stderr
    wrong = run_fstrain(*pinned, "--loss", "chunked:0")
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "--loss" in wrong.stderr
    assert "Traceback" not in wrong.stderr


def test_pipeline_schedule_flags_reach_the_plan_the_json_and_the_table(tmp_path: Path) -> None:
    pinned = ("plan", "--model", "llama3.1-70b", *H100_64, "--strategy", "fsdp-full", "--tp", "8", "--pp", "4",
              "--micro-batch", "1", "--ac", "full", "--offload", "none", "--global-batch", "256")
    assert "--pp-schedule" in run_fstrain("plan", "--help").stdout
    result = run_fstrain(*pinned, "--pp-schedule", "interleaved-1f1b", "--pp-virtual-stages", "4", "--json",
                         "--out", str(tmp_path / "plan.yaml"))
    assert result.returncode == 0, result.stderr
    [best] = json.loads(result.stdout)["plans"]
    assert (best["pp_schedule"], best["pp_virtual_stages"]) == ("interleaved", 4)
    saved = PlanFile.from_dict(yaml.safe_load((tmp_path / "plan.yaml").read_text()), "plan.yaml")
    assert (saved.knobs.pp_schedule, saved.knobs.pp_virtual_stages) == ("interleaved", 4)
    unpinned = run_fstrain(*pinned, "--json")
    assert [p["pp_schedule"] for p in json.loads(unpinned.stdout)["plans"]] == ["zero-bubble"]
    human = run_fstrain(*pinned, "--pp-schedule", "1f1b")
    assert human.returncode == 0 and "schedule" in human.stderr and "1f1b" in human.stderr


@pytest.mark.parametrize(
    ("precision", "strategy", "autocast", "ds_section"),
    [
        ("bf16-pure", "fsdp-full", None, "bf16"),  # DeepSpeed's equivalent keeps a master: its note says so
        ("amp-bf16", "zero2", "bfloat16", "torch_autocast"),
        ("amp-fp16", "ddp", "float16", "torch_autocast"),
    ],
)
def test_precision_modes_plan_save_and_render(
    tmp_path: Path, precision: str, strategy: str, autocast: str | None, ds_section: str
) -> None:
    plan_path = tmp_path / "plan.yaml"
    planned = run_fstrain("plan", "--model", "llama3.1-8b", "--num-nodes", "1", "--gpus-per-node", "8", "--gpu",
                          "h100-sxm", "--strategy", strategy, "--precision", precision, "--json", "--out",
                          str(plan_path))
    assert planned.returncode == 0, planned.stderr
    document = json.loads(planned.stdout)
    assert document["training"]["precision"] == precision and document["plans"][0]["strategy"] == strategy
    saved = PlanFile.from_dict(yaml.safe_load(plan_path.read_text()), str(plan_path))
    assert saved.knobs.precision == precision and saved.knobs.strategy == strategy
    rendered = run_fstrain("render", "--plan", str(plan_path), "-o", str(tmp_path / "out"), "--json")
    assert rendered.returncode == 0, rendered.stderr
    fsdp = yaml.safe_load((tmp_path / "out" / "fsdp.yaml").read_text())
    assert fsdp["autocast"] == autocast
    assert fsdp["model_dtype"] == ("bfloat16" if precision == "bf16-pure" else "float32")
    ds = json.loads((tmp_path / "out" / "ds_config.json").read_text())
    assert ds_section in ds


def test_a_tight_plan_says_so() -> None:
    # 83.5 GiB with the allocator's 10 % margin, 76.1 GiB without it, on 79.6 GiB: it trains with
    # the allocator squeezed, and the output says what fits and what does not.
    pinned = ("plan", "--model", "llama3.1-70b", "--num-nodes", "8", "--gpu", "h100-sxm", "--strategy", "zero3",
              "--tp", "4", "--pp", "1", "--micro-batch", "1", "--ac", "none", "--offload", "optimizer")
    result = run_fstrain(*pinned, "--json")
    assert result.returncode == 0, result.stderr
    best = json.loads(result.stdout)["plans"][0]
    assert best["fits"] and best["tight"]
    assert best["memory"]["required"] <= best["usable_bytes"] < best["memory"]["peak"]
    assert best["memory"]["peak"] - best["memory"]["required"] == best["memory"]["details"]["allocator fragmentation"]
    human = run_fstrain(*pinned)
    assert human.returncode == 0 and "tight: the live tensors" in human.stderr


def test_ep_flag_reaches_the_plan_the_json_the_table_and_the_plan_file(tmp_path: Path) -> None:
    pinned = ("plan", "--model", "mixtral-8x7b", *H100_64, "--strategy", "zero2", "--tp", "1", "--pp", "1",
              "--seq-len", "4096", "--global-batch", "128")
    assert "--ep N" in run_fstrain("plan", "--help").stdout
    result = run_fstrain(*pinned, "--ep", "4", "--json", "--out", str(tmp_path / "plan.yaml"))
    assert result.returncode == 0, result.stderr
    plans = json.loads(result.stdout)["plans"]
    assert {p["ep"] for p in plans} == {4}
    # mbs x 4096 tokens x top-2 x hidden 4096 x 2 bytes, sent and received
    tokens = plans[0]["micro_batch_size"] * 4096
    assert plans[0]["memory"]["details"]["MoE all-to-all send/recv (one layer, ep > 1)"] == 2 * tokens * 2 * 4096 * 2
    assert plans[0]["time_breakdown"]["ep_comm_s"] > 0
    saved = PlanFile.from_dict(yaml.safe_load((tmp_path / "plan.yaml").read_text()), "plan.yaml")
    assert saved.knobs.ep == 4
    # Unpinned, ZeRO-2 fits only with the experts split: 93 GB of bf16 parameters do not fit whole.
    unpinned = json.loads(run_fstrain(*pinned, "--json").stdout)["plans"]
    assert unpinned[0]["fits"] and unpinned[0]["ep"] > 1
    human = run_fstrain(*pinned, "--ep", "8")
    assert human.returncode == 0 and " ep " in human.stderr and "ep=8" in human.stderr
    assert "EP all-to-all" in human.stderr
    no_fit = run_fstrain(*pinned, "--ep", "1")
    assert no_fit.returncode == 1 and "without --ep 1" in no_fit.stderr
    # A saved ep > 1 plan is refused by the bundled trainer's launch before anything starts.
    tiny = run_fstrain("plan", "--model", "tiny-moe", "--num-nodes", "1", "--gpus-per-node", "4", "--gpu", "h100-sxm",
                       "--ep", "2", "--out", str(tmp_path / "tiny.yaml"))
    assert tiny.returncode == 0, tiny.stderr
    launch = run_fstrain("launch", "--plan", str(tmp_path / "tiny.yaml"), "--dry-run", "--hosts", "localhost",
                         "--nproc-per-node", "4")
    assert launch.returncode == 2, launch.stderr
    assert "does not run expert parallelism" in launch.stderr and launch.stderr.count("\n") == 1


def test_trace_refuses_an_expert_parallel_plan_in_one_line() -> None:
    result = run_fstrain("plan", "--model", "tiny-moe", "--num-nodes", "1", "--gpus-per-node", "4", "--gpu",
                         "h100-sxm", "--ep", "2", "--strategy", "fsdp-full", "--trace", "--json")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: --trace: the plan has ep=2, but the bundled trainer does not run expert")
    assert result.stderr.count("\n") == 1


def test_the_plan_shows_the_step_time_term_by_term() -> None:
    pinned = ("plan", "--model", "llama3.1-8b", "--gpu", "h100-sxm", "--num-nodes", "1", "--gpus-per-node", "8",
              "--strategy", "fsdp-full", "--micro-batch", "1", "--grad-accum", "1", "--global-batch", "8",
              "--seq-len", "4096", "--ac", "full")
    result = run_fstrain(*pinned, "--json")
    assert result.returncode == 0, result.stderr
    best = json.loads(result.stdout)["plans"][0]
    terms = best["time_breakdown"]
    kernels = terms["gemm_s"] + terms["attention_s"] + terms["elementwise_s"] + terms["launch_s"]
    assert terms["gemm_s"] > terms["attention_s"] > 0 and terms["elementwise_s"] > 0
    assert kernels == pytest.approx(terms["compute_s"])
    assert terms["step_time_s"] == pytest.approx(terms["compute_s"] + terms["optimizer_s"] + terms["bubble_s"]
                                                 + terms["tp_comm_s"] + terms["pp_comm_s"] + terms["dp_exposed_s"]
                                                 + terms["offload_s"])
    human = run_fstrain(*pinned).stderr
    for label in ("compute", "GEMMs", "attention", "elementwise, norms, loss (HBM)", "optimizer step"):
        assert f"  {label} " in human, label
    step_line = next(line for line in human.splitlines() if line.strip().startswith("step ") and "%" in line)
    assert f"{terms['step_time_s']:.3f} s 100.0 %" in step_line
