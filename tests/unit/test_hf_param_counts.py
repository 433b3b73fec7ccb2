"""A Hugging Face config.json's recipe has exactly the parameters transformers builds from it.

Every fixture in tests/fixtures/hf-configs (real config.json files of released models, sources in
its SOURCES.md) is read as ``--recipe`` reads it and built with
``AutoModelForCausalLM.from_config`` on the meta device (shapes only, no memory); the recipe's
count must equal the model's, and the recipe's sliding window the layers transformers gives one.
Families without a fixture of their own are built from small configs of their model_type.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from fstrain.core.plan.hfconfig import recipe_from_hf_config
from fstrain.core.plan.recipe import Recipe, parse_recipe
from fstrain.errors import InputError
from fstrain.io.recipes import load_recipe_file

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "hf-configs"
# Real configs fstrain refuses, with what its one line says.
REFUSED = {"DeepSeek-Coder-V2-Lite-Instruct": "multi-head latent attention"}
FIXTURES = sorted(p.name for p in CONFIGS.iterdir() if p.is_dir() and p.name not in REFUSED)


@cache
def transformers_model(config_json: str) -> tuple[int, int, int]:
    """(parameters, layers with a sliding window, the window) of the model transformers builds
    from ``config_json``, built once per session on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**json.loads(config_json))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    window = getattr(config, "sliding_window", None) or 0
    types = getattr(config, "layer_types", None)
    if types is not None:  # the families that mix windowed and full layers say which is which
        windowed = sum(1 for kind in types if kind == "sliding_attention")
    else:  # Mistral, Mixtral, Phi-3, StarCoder2: the window's mask on every layer
        windowed = config.num_hidden_layers if window else 0
    return params, windowed, window if windowed else 0


def check_against_transformers(recipe: Recipe, config: dict[str, Any]) -> None:
    params, windowed, window = transformers_model(json.dumps(config))
    assert recipe.params.total == params
    assert (recipe.model.windowed_layers, recipe.model.sliding_window if windowed else 0) == (windowed, window)


@pytest.mark.parametrize("folder", FIXTURES)
def test_real_config_counts_exactly_what_transformers_builds(folder: str) -> None:
    path = CONFIGS / folder / "config.json"
    check_against_transformers(load_recipe_file(str(path)), json.loads(path.read_text()))


def test_fixtures_cover_ten_families() -> None:
    kinds = {json.loads((CONFIGS / folder / "config.json").read_text())["model_type"] for folder in FIXTURES}
    assert len(kinds) >= 10, sorted(kinds)


def test_what_the_fixtures_exercise() -> None:
    """The features this file exists for are in the fixtures, with the values their configs give."""
    qwen3 = load_recipe_file(str(CONFIGS / "Qwen3-4B" / "config.json")).model
    assert (qwen3.attn_head_dim, qwen3.q_width, qwen3.hidden_size, qwen3.qk_norm) == (128, 4096, 2560, "head")
    assert load_recipe_file(str(CONFIGS / "Qwen2.5-7B" / "config.json")).model.attention_bias == "qkv"
    gemma = load_recipe_file(str(CONFIGS / "gemma-2-2b-it" / "config.json")).model
    assert (gemma.activation, gemma.post_norms, gemma.tied_embeddings, gemma.q_width) == ("geglu", True, True, 2048)
    moe = load_recipe_file(str(CONFIGS / "Qwen2-57B-A14B" / "config.json")).model.moe
    assert moe is not None and (moe.shared_ffn_hidden_size, moe.shared_expert_gate, moe.top_k) == (20480, True, 8)
    phi3 = load_recipe_file(str(CONFIGS / "Phi-3-mini-4k-instruct" / "config.json")).model
    assert (phi3.seq_len, phi3.sliding_window, phi3.windowed_layers) == (4096, 2047, 32)


@pytest.mark.parametrize(("folder", "message"), REFUSED.items())
def test_refused_real_config_says_why_in_one_line(folder: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as caught:
        load_recipe_file(str(CONFIGS / folder / "config.json"))
    assert "\n" not in caught.value.message and caught.value.hint


# Families without a fixture here: small configs of their model_type (transformers' defaults for
# every other field), enough to exercise what each builds differently.
SMALL = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 256}
SYNTHETIC = {
    "gemma": {"model_type": "gemma", "head_dim": 32, "hidden_act": "gelu", "hidden_activation": None},
    "gemma3_text": {"model_type": "gemma3_text", "head_dim": 32, "sliding_window": 16, "sliding_window_pattern": 3,
                    "num_hidden_layers": 7},
    "olmo2": {"model_type": "olmo2", "attention_bias": True},
    "granite": {"model_type": "granite", "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True},
    "starcoder2": {"model_type": "starcoder2", "sliding_window": 32, "hidden_act": "gelu_pytorch_tanh"},
    "llama-biases": {"model_type": "llama", "attention_bias": True, "mlp_bias": True, "head_dim": 8},
    "qwen2-window": {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 16,
                     "max_window_layers": 1},
    "qwen3-moe-tied": {"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
                       "moe_intermediate_size": 24, "tie_word_embeddings": True},
}


@pytest.mark.parametrize("case", SYNTHETIC)
def test_small_config_of_each_other_family_counts_exactly(case: str) -> None:
    config = {**SMALL, **SYNTHETIC[case]}
    recipe = parse_recipe(recipe_from_hf_config(config, case, case), case)
    check_against_transformers(recipe, config)
