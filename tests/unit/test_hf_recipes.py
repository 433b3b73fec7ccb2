"""--model takes any case, Hugging Face ids and the local Hugging Face cache; --recipe takes a
Hugging Face config.json."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from fstrain.errors import InputError
from fstrain.io.recipes import hub_cache_dir, load_model, load_recipe_file, load_shipped_recipe, resolve_model_name
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


@pytest.mark.parametrize("wanted", ["Qwen/Qwen3-4B", "org-x/Qwen3-4B"])
def test_model_from_the_hugging_face_cache(tmp_path: Path, wanted: str) -> None:
    """refs/main names the snapshot; an older one beside it is not read."""
    folder = tmp_path / "hub" / ("models--" + wanted.replace("/", "--"))
    for revision, source in (("0ld", "Qwen2.5-7B"), ("c0ffee", "Qwen3-4B")):
        (folder / "snapshots" / revision).mkdir(parents=True)
        (folder / "snapshots" / revision / "config.json").write_text((CONFIGS / source / "config.json").read_text())
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("c0ffee")
    recipe = load_model(wanted, {"HF_HOME": str(tmp_path)})
    assert recipe.model.name == "Qwen3-4B" and recipe.model.qk_norm == "head"
    assert recipe.params.total == load_recipe_file(str(CONFIGS / "Qwen3-4B" / "config.json")).params.total
    assert recipe.where.endswith("snapshots/c0ffee/config.json")


def test_hugging_face_cache_precedence(tmp_path: Path) -> None:
    assert hub_cache_dir({"HF_HUB_CACHE": "/a", "HF_HOME": "/b"}) == Path("/a")
    assert hub_cache_dir({"HF_HOME": "/b", "XDG_CACHE_HOME": "/c"}) == Path("/b/hub")
    assert hub_cache_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/huggingface/hub")
    assert hub_cache_dir({}) == Path.home() / ".cache" / "huggingface" / "hub"


def test_snapshot_without_refs_main_is_the_latest(tmp_path: Path) -> None:
    folder = tmp_path / "models--acme--tiny-llama" / "snapshots" / "pinned"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text((CONFIGS / "Llama-3.2-1B" / "config.json").read_text())
    recipe = load_model("acme/tiny-llama", {"HF_HUB_CACHE": str(tmp_path)})
    assert recipe.model.name == "tiny-llama" and recipe.model.tied_embeddings


def test_model_missing_from_the_cache_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not in the Hugging Face cache") as info:
        load_model("acme/nothing", {"HF_HUB_CACHE": str(tmp_path)})
    assert str(tmp_path / "models--acme--nothing") in info.value.hint and info.value.where == "--model"
    with pytest.raises(InputError, match="unknown model 'nothing'"):  # not an id: the shipped names
        load_model("nothing", {"HF_HUB_CACHE": str(tmp_path)})


def test_plan_takes_a_model_from_the_hugging_face_cache(tmp_path: Path) -> None:
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((CONFIGS / "Qwen3-8B" / "config.json").read_text())
    result = run_fstrain("plan", "--model", "Qwen/Qwen3-8B", "--gpu", "h100-sxm", "--num-nodes", "1", "--json",
                         env={"HF_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert '"qk_norm": "head"' in result.stdout and '"head_dim": 128' in result.stdout
