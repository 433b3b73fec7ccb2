"""--model takes any case and Hugging Face ids; --recipe takes a Hugging Face config.json."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from fstrain.errors import InputError
from fstrain.io.recipes import load_recipe_file, load_shipped_recipe, resolve_model_name
from tests.helpers import run_fstrain

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "hf-configs"


@pytest.mark.parametrize(
    ("given", "shipped"),
    [("llama3.1-8b", "llama3.1-8b"), ("Llama3.1-8B", "llama3.1-8b"), ("meta-llama/Llama-3.1-8B", "llama3.1-8b"),
     ("meta-llama/Meta-Llama-3.1-8B", "llama3.1-8b"), ("Meta-Llama-3.1-70B-Instruct", "llama3.1-70b"),
     ("gpt2-xl", "gpt2-1.5b"), ("openai-community/gpt2-xl", "gpt2-1.5b"), ("TINY", "tiny"),
     ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"), ("meta-llama/llama-2-7b-hf", "llama2-7b")],
)
def test_model_names_and_hugging_face_ids(given: str, shipped: str) -> None:
    assert resolve_model_name(given) == shipped
    assert load_shipped_recipe(given).model.name == shipped


def test_unknown_model_names_the_known_ones() -> None:
    with pytest.raises(InputError, match="unknown model 'llama-9'") as info:
        resolve_model_name("llama-9")
    assert "meta-llama/Llama-3.1-8B" in info.value.hint and "config.json" in info.value.hint


@pytest.mark.parametrize(
    ("folder", "shipped"),
    [("Llama-3.1-8B", "llama3.1-8b"), ("Llama-2-7b-hf", "llama2-7b"), ("gpt2-xl", "gpt2-1.5b"),
     ("Mixtral-8x7B-v0.1", "mixtral-8x7b")],
)
def test_hugging_face_config_maps_to_the_shipped_recipe(folder: str, shipped: str) -> None:
    recipe = load_recipe_file(str(CONFIGS / folder / "config.json"))
    expected = load_shipped_recipe(shipped)
    assert recipe.model.name == folder
    assert replace(recipe.model, name=shipped) == expected.model
    assert recipe.params.total == expected.params.total


def test_mistral_config() -> None:
    model = load_recipe_file(str(CONFIGS / "Mistral-7B-v0.1" / "config.json")).model
    assert (model.num_layers, model.num_kv_heads, model.ffn_hidden_size, model.seq_len) == (32, 8, 14336, 32768)
    assert model.moe is None and model.activation == "swiglu"
    assert (model.sliding_window, model.windowed_layers) == (4096, 32)


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    path = tmp_path / "rwkv" / "config.json"
    path.parent.mkdir()
    path.write_text('{"architectures": ["RwkvForCausalLM"], "model_type": "rwkv", "hidden_size": 2048}')
    with pytest.raises(InputError, match=r"unsupported architecture 'RwkvForCausalLM' \(model_type 'rwkv'\)") as info:
        load_recipe_file(str(path))
    assert "Qwen3ForCausalLM" in info.value.hint and info.value.where == str(path)
    broken = tmp_path / "config.json"
    broken.write_text('{"model_type": "llama", "hidden_size": 4096}')
    with pytest.raises(InputError, match="missing key 'num_attention_heads'"):
        load_recipe_file(str(broken))


def test_plan_takes_a_config_json() -> None:
    result = run_fstrain("plan", "--recipe", str(CONFIGS / "Llama-3.1-8B" / "config.json"), "--gpu", "h100-sxm",
                         "--num-nodes", "1", "--json")
    assert result.returncode == 0, result.stderr
    assert '"num_layers": 32' in result.stdout

