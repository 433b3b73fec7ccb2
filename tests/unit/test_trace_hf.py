"""``fstrain plan --trace`` of a model that came from a Hugging Face config.json: transformers'
own ``*ForCausalLM`` traced on fake tensors (fstrain/train/hf_model.py), against the planner.

Each family is traced at 2 or 3 decoder layers of its real widths (real config.json fixtures,
tests/fixtures/hf-configs), which costs a few CPU-seconds; the full-size traces are in
docs/validation/planner.md. Every category above 64 MiB agrees with the planner's, once what
transformers' model holds apart from the bundled one (fstrain/core/plan/hfdiff.py, each item
measured) is added, within 2 %. The extrapolation test (about 30 s) is marked ``slow``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fstrain.core.plan.hfdiff import hf_differences
from fstrain.core.plan.memory import memory_breakdown
from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.render.fsdp import render_fsdp
from fstrain.errors import ConfigError
from fstrain.io.recipes import load_recipe_file
from fstrain.train.trace import check_traceable, trace_plan
from tests.plans import make_plan

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "hf-configs"
BOUND = 0.02


@pytest.mark.parametrize(("folder", "layers", "ac", "seq_len"), [
    ("Llama-3.2-1B", 2, "none", 2048),  # llama: tied embeddings, GQA
    ("Qwen3-4B", 2, "none", 2048),  # qwen3: per-head q/k RMSNorms, head_dim 128 over hidden 2560
    # mistral: the 4096 window masks a 4096-token batch (kept by no layer under full AC); full AC
    # peaks in a layer's backward, which
    # at 2 layers has no next layer to prefetch (as the bundled model's trace: fstrain/train/trace.py)
    ("Mistral-7B-v0.1", 3, "full", 4096),
    # phi3: its 2047 window masks 4096 tokens (a 16-bit copy in each layer); the fused qkv_proj
    ("Phi-3-mini-4k-instruct", 2, "none", 4096),
])
def test_each_family_traces_like_the_planner_counts(folder: str, layers: int, ac: str, seq_len: int) -> None:
    recipe = load_recipe_file(str(CONFIGS / folder / "config.json"))
    model = replace(recipe.model, num_layers=layers)
    plan = make_plan("fsdp-full", dp=8, model=model, activation_checkpointing=ac, seq_len=seq_len,
                     micro_batch_size=1, grad_accum_steps=2, precision="bf16")
    traced = trace_plan(plan, render_fsdp(plan).config, hf_config=recipe.hf_config)
    params = count_parameters(model)
    analytic = memory_breakdown(model, params, params.total, plan.knobs, 8)
    expected = {key: getattr(analytic, key) for key in traced.categories}
    for item in hf_differences(model, params, plan.knobs, analytic.phase, json.loads(recipe.hf_config)["model_type"]):
        expected[item.category] += item.bytes
    for category, value in traced.categories.items():
        if value >= 64 << 20:
            assert expected[category] == pytest.approx(value, rel=BOUND), category


@pytest.mark.slow
def test_extrapolation_is_exact_for_transformers_layers() -> None:
    # every-k:2 through transformers' own per-layer checkpointing: 11 layers traced whole against
    # 5, 7 and 9 extrapolated, the same bytes in every category. One micro-batch a step: the
    # depths, not the accumulation, are what is extrapolated (test_trace.py's full-AC case
    # accumulates two).
    recipe = load_recipe_file(str(CONFIGS / "Llama-3.2-1B" / "config.json"))
    model = replace(recipe.model, num_layers=11)
    plan = make_plan("fsdp-full", dp=4, model=model, activation_checkpointing="every-k:2", seq_len=512,
                     micro_batch_size=1, grad_accum_steps=1, precision="bf16")
    fsdp = render_fsdp(plan).config
    whole = trace_plan(plan, fsdp, full_depth_limit=100, hf_config=recipe.hf_config)
    extrapolated = trace_plan(plan, fsdp, full_depth_limit=0, hf_config=recipe.hf_config)
    assert (whole.depths, extrapolated.depths) == ((11,), (5, 7, 9))
    assert (extrapolated.moment, extrapolated.categories) == (whole.moment, whole.categories)


def test_the_trace_builds_transformers_own_class() -> None:
    from fstrain.train.hf_model import hf_config, layer_period, model_class

    text = (CONFIGS / "gemma-2-2b-it" / "config.json").read_text()
    assert model_class(text) == "Gemma2ForCausalLM"
    assert layer_period(text) == 2  # sliding and full attention alternate: depths move by 2 layers
    cut = hf_config(text, 3)
    assert (cut.num_hidden_layers, cut.layer_types) == (3, ["sliding_attention", "full_attention",
                                                            "sliding_attention"])
    assert layer_period((CONFIGS / "Qwen3-8B" / "config.json").read_text()) == 1


@pytest.mark.parametrize(("knobs", "message"), [
    ({"activation_checkpointing": "selective-op"}, "transformers checkpoints whole decoder layers"),
    ({"loss": "chunked:8"}, "upcasts the whole logits"),
    ({"fused_rmsnorm": True}, "its own \\(unfused\\) RMSNorm"),
])
def test_what_transformers_model_does_not_run_is_one_line(knobs: dict[str, object], message: str) -> None:
    recipe = load_recipe_file(str(CONFIGS / "Llama-3.2-1B" / "config.json"))
    plan = make_plan("fsdp-full", dp=8, model=recipe.model, **knobs)
    with pytest.raises(ConfigError, match=message) as caught:
        check_traceable(plan, hf=True)
    assert "\n" not in caught.value.message and caught.value.hint


def test_a_class_without_sdpa_is_traced_eager_or_refused_in_one_line() -> None:
    from fstrain.train.hf_model import check_attention

    gemma2 = (CONFIGS / "gemma-2-2b-it" / "config.json").read_text()  # no SDPA in transformers 5.25
    with pytest.raises(ConfigError, match="Gemma2ForCausalLM has no SDPA attention") as caught:
        check_attention(gemma2, flash_attention=True)
    assert "--no-flash-attention" in caught.value.hint
    check_attention(gemma2, flash_attention=False)
    check_attention((CONFIGS / "Llama-3.2-1B" / "config.json").read_text(), flash_attention=True)


def test_a_missing_or_old_transformers_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    import transformers

    from fstrain.train.hf_model import require_transformers

    require_transformers()  # the installed one (pyproject: >=5.25)
    monkeypatch.setattr(transformers, "__version__", "4.57.1")
    with pytest.raises(ConfigError, match=r"transformers 4\.57\.1 is older than the trace needs \(5\.25\)"):
        require_transformers()
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails
    with pytest.raises(ConfigError, match="which is not installed") as caught:
        require_transformers()
    assert "pip install 'transformers>=5.25'" in caught.value.hint


def test_differences_in_bytes() -> None:
    # Llama 3.1 8B at the loss: the root (untied embedding and head, final norm) and a layer
    # gathered; and per layer 80 MiB fewer at 4096 tokens (no rotated q, K and V at kv width).
    recipe = load_recipe_file(str(CONFIGS / "Llama-3.1-8B" / "config.json"))
    params = count_parameters(recipe.model)
    knobs = make_plan("fsdp-full", dp=8, model=recipe.model, seq_len=4096, micro_batch_size=1,
                      precision="bf16").knobs
    gathered, sdpa = hf_differences(recipe.model, params, knobs, "loss")
    assert (gathered.category, gathered.bytes) == ("buffers", 2 * (2 * 128256 * 4096 + 4096 + params.per_layer))
    assert (sdpa.category, sdpa.bytes) == ("activations", -32 * 80 * 2**20)
    assert hf_differences(recipe.model, params, knobs, "backward") == [sdpa]
    # Mistral 7B v0.1: its 4096-token window does not cover 4096 tokens: a mask, kept by every
    # layer (+32 MiB), K and V repeated, and no rotated q (-32 MiB): nothing left to list.
    mistral = load_recipe_file(str(CONFIGS / "Mistral-7B-v0.1" / "config.json")).model
    assert hf_differences(mistral, count_parameters(mistral), knobs, "backward") == []
    [unmasked] = hf_differences(mistral, count_parameters(mistral), replace(knobs, seq_len=2048), "backward")
    assert unmasked.bytes == -32 * 40 * 2**20  # 40 MiB a layer at 2048 tokens, measured
    full = replace(knobs, activation_checkpointing="full")  # no layer stores its activations
    assert hf_differences(mistral, count_parameters(mistral), full, "backward") == []
    # Phi-3's fused qkv_proj: its whole output kept; at 2040 tokens (no mask) 23.9 MiB a layer more.
    phi3 = load_recipe_file(str(CONFIGS / "Phi-3-mini-4k-instruct" / "config.json")).model
    [fused] = hf_differences(phi3, count_parameters(phi3), replace(knobs, seq_len=2040), "backward", "phi3")
    assert fused.bytes == 32 * 2040 * 6144 * 2
    # Eager attention: the fp32 softmax output beside its bf16 cast, in every layer that stores.
    eager = replace(knobs, flash_attention=False, activation_checkpointing="every-k:4")
    [scores] = hf_differences(recipe.model, params, eager, "backward")
    assert (scores.category, scores.bytes) == ("activations", (32 - 8) * 32 * 4096 * 4096 * 4)


def test_a_model_from_a_config_json_keeps_its_text(tmp_path: Path) -> None:
    from fstrain.io.recipes import load_model

    path = CONFIGS / "Qwen3-8B" / "config.json"
    assert json.loads(load_recipe_file(str(path)).hf_config) == json.loads(path.read_text())
    snapshot = tmp_path / "models--Qwen--Qwen3-8B" / "snapshots" / "abc"  # --model ORG/NAME from the cache
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(path.read_text())
    assert load_model("Qwen/Qwen3-8B", {"HF_HUB_CACHE": str(tmp_path)}).hf_config == path.read_text()
    assert load_model("llama3.1-8b").hf_config == ""  # a shipped recipe: the bundled model is traced


def test_cli_refuses_an_unsupported_case_in_one_line_before_torch() -> None:
    from tests.helpers import run_fstrain

    bad = run_fstrain("plan", "--recipe", str(CONFIGS / "Llama-3.2-1B" / "config.json"), "--gpu", "h100-sxm",
                      "--strategy", "fsdp-full", "--tp", "1", "--pp", "1", "--ac", "selective-op", "--trace")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "transformers checkpoints whole decoder layers" in bad.stderr and "importing torch" not in bad.stderr
