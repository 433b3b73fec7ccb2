"""Recipes: the shipped ones against published parameter counts, and precise schema errors."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from fstrain.core.plan.recipe import PARAMS_TOLERANCE, parse_count, parse_recipe, plan_name_from
from fstrain.errors import InputError
from fstrain.io.recipes import load_recipe_file, load_shipped_recipe, shipped_recipe_names

REPO = Path(__file__).resolve().parents[2]

# Published totals: Hugging Face model cards / safetensors metadata (exact where the card gives
# the exact count), Mixtral paper (46.7B total, 12.9B active), GPT-2 XL (1,557,611,200).
PUBLISHED = {
    "tiny": (875_264, None),
    "tiny-moe": (205_632, None),  # fstrain's own test MoE: the built model's count (test_train_model)
    "gpt2-1.5b": (1_557_611_200, None),
    "llama2-7b": (6_738_415_616, "6.74B"),
    "llama2-13b": (13_015_864_320, "13.0B"),
    "llama2-70b": (68_976_648_192, "68.98B"),
    "llama3.1-8b": (8_030_261_248, "8.03B"),
    "llama3.1-70b": (70_553_706_496, "70.6B"),
    "llama3.1-405b": (405_853_388_800, "405.9B"),
    "mixtral-8x7b": (46_702_792_704, "46.7B"),
}

LLAMA2_7B: dict[str, Any] = {
    "name": "llama2-7b",
    "model": {
        "num_layers": 32,
        "hidden_size": 4096,
        "num_heads": 32,
        "ffn_hidden_size": 11008,
        "activation": "swiglu",
        "vocab_size": 32000,
        "seq_len": 4096,
    },
}


def test_every_recipe_is_shipped_and_mirrored() -> None:
    assert shipped_recipe_names() == sorted(PUBLISHED)
    # recipes/ at the top is a view of the packaged copies: same names, same bytes.
    top = sorted(p.name for p in (REPO / "recipes").glob("*.yaml"))
    assert top == sorted(f"{name}.yaml" for name in PUBLISHED)
    for name in top:
        assert (REPO / "recipes" / name).read_bytes() == (REPO / "fstrain" / "recipes" / name).read_bytes()


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_shipped_recipe_parameter_counts(name: str) -> None:
    recipe = load_shipped_recipe(name)
    exact, rounded = PUBLISHED[name]
    assert recipe.params.total == exact
    assert recipe.stated_params == exact
    assert recipe.model.name == name
    if rounded is not None:  # the rounded figure papers and model cards quote
        digits = rounded.rstrip("B").split(".")[1]
        assert f"{exact / 1e9:.{len(digits)}f}B" == rounded


def test_mixtral_active_parameters_match_the_paper() -> None:
    recipe = load_shipped_recipe("mixtral-8x7b")
    assert round(recipe.params.active_per_token / 1e9, 1) == 12.9


def test_gqa_and_tied_embeddings_change_the_count() -> None:
    mha = parse_recipe(LLAMA2_7B, "x.yaml")
    gqa_data = copy.deepcopy(LLAMA2_7B)
    gqa_data["model"]["num_kv_heads"] = 8
    gqa = parse_recipe(gqa_data, "x.yaml")
    # k and v projections shrink from 4096 to 1024 columns in each of 32 layers.
    assert mha.params.total - gqa.params.total == 32 * 2 * 4096 * (4096 - 1024)
    tied_data = copy.deepcopy(LLAMA2_7B)
    tied_data["model"]["tied_embeddings"] = True
    assert mha.params.total - parse_recipe(tied_data, "x.yaml").params.total == 32000 * 4096


def test_training_defaults_are_read() -> None:
    recipe = load_shipped_recipe("llama3.1-405b")
    assert recipe.training.global_batch_tokens == 16 * 1024 * 1024
    assert recipe.training.train_tokens == 15_600_000_000_000
    assert recipe.training.precision == "bf16"


@pytest.mark.parametrize(
    ("change", "where", "message"),
    [
        ({"model": {"hidden_sise": 1}}, "x.yaml: model.hidden_sise", "unknown key 'hidden_sise'"),
        ({"modle": {}}, "x.yaml: modle", "unknown key 'modle'"),
        ({"model": {"num_layers": None}}, "x.yaml: model.num_layers", "expected a positive integer, got None"),
        ({"model": {"num_layers": "32"}}, "x.yaml: model.num_layers", "expected a positive integer, got '32'"),
        ({"model": {"num_layers": True}}, "x.yaml: model.num_layers", "expected a positive integer, got True"),
        ({"model": {"activation": "relu"}}, "x.yaml: model.activation",
         "expected one of gelu, swiglu, geglu, got 'relu'"),
        ({"model": {"num_kv_heads": 5}}, "x.yaml: model.num_kv_heads", "num_kv_heads (5) must divide num_heads (32)"),
        (
            {"model": {"num_heads": 3}},
            "x.yaml: model.num_heads",
            "hidden_size (4096) is not a multiple of num_heads (3)",
        ),
        ({"model": {"dropout": 1.5}}, "x.yaml: model.dropout", "expected a probability"),
        ({"model": {"tied_embeddings": "yes"}}, "x.yaml: model.tied_embeddings", "expected true or false"),
        (
            {"model": {"moe": {"num_experts": 2, "top_k": 3, "expert_ffn_hidden_size": 8}}},
            "x.yaml: model.moe.top_k",
            "top_k (3) is larger than num_experts (2)",
        ),
        ({"model": {"moe": {"num_experts": 2}}}, "x.yaml: model.moe.top_k", "missing key 'top_k'"),
        ({"model": {"qk_norm": "rms"}}, "x.yaml: model.qk_norm", "expected one of none, head, projection"),
        ({"model": {"head_dim": -8}}, "x.yaml: model.head_dim", "expected a whole number >= 0"),
        ({"model": {"attention_bias": "qkv", "linear_bias": True}}, "x.yaml: model.attention_bias",
         "attention_bias is set beside linear_bias: true"),
        ({"model": {"sliding_window_layers": 4}}, "x.yaml: model.sliding_window_layers",
         "sliding_window_layers is set but sliding_window is 0"),
        ({"model": {"sliding_window": 4096, "sliding_window_layers": 33}}, "x.yaml: model.sliding_window_layers",
         "sliding_window_layers (33) is more than num_layers (32)"),
        ({"model": {"moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 8, "shared_expert_gate": True}}},
         "x.yaml: model.moe.shared_expert_gate", "shared_expert_gate is true but there is no shared expert"),
        ({"model": {"moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 8, "router_dtype": "bf16"}}},
         "x.yaml: model.moe.router_dtype", "expected one of compute, fp32"),
        ({"training": {"precision": "fp8"}}, "x.yaml: training.precision", "expected one of bf16, fp16, fp32"),
        (
            {"training": {"global_batch_size": 8, "global_batch_tokens": 8}},
            "x.yaml: training.global_batch_tokens",
            "both set",
        ),
        ({"model": {"params": "seven"}}, "x.yaml: model.params", "expected a positive count, got 'seven'"),
        (
            {"model": {"params": 7_000_000_000}},
            "x.yaml: model.params",
            "the architecture gives 6,738,415,616 parameters but params states 7,000,000,000 (-3.74%",
        ),
    ],
)
def test_schema_errors_name_file_key_and_expectation(change: dict[str, Any], where: str, message: str) -> None:
    data = copy.deepcopy(LLAMA2_7B)
    for section, values in change.items():
        if section in data and isinstance(data[section], dict):
            data[section].update(values)
        else:
            data[section] = values
    with pytest.raises(InputError) as caught:
        parse_recipe(data, "x.yaml")
    assert caught.value.where == where
    assert message in caught.value.message


def test_missing_required_key() -> None:
    data = copy.deepcopy(LLAMA2_7B)
    del data["model"]["vocab_size"]
    with pytest.raises(InputError, match="missing key 'vocab_size'") as caught:
        parse_recipe(data, "x.yaml")
    assert caught.value.where == "x.yaml: model.vocab_size"


def test_stated_params_within_tolerance_pass() -> None:
    data = copy.deepcopy(LLAMA2_7B)
    data["model"]["params"] = "6.74B"  # the rounded published figure
    assert parse_recipe(data, "x.yaml").stated_params == 6_740_000_000
    data["model"]["params"] = int(6_738_415_616 * (1 + 2 * PARAMS_TOLERANCE))
    with pytest.raises(InputError):
        parse_recipe(data, "x.yaml")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        (6738415616, 6738415616),
        (6.74e9, 6_740_000_000),
        ("6.74e9", 6_740_000_000),
        ("6.74B", 6_740_000_000),
        ("15T", 15_000_000_000_000),
        ("70b", 70_000_000_000),
        ("125M", 125_000_000),
        ("1_000", 1000),
    ],
)
def test_parse_count(text: object, value: int) -> None:
    assert parse_count(text, "--model-params") == value


@pytest.mark.parametrize("text", ["", "B", "-5", "0", "nan", "inf", True, None])
def test_parse_count_rejects(text: object) -> None:
    with pytest.raises(InputError, match="expected a positive count"):
        parse_count(text, "--model-params")


def test_user_recipe_file_errors(tmp_path: Path) -> None:
    broken = tmp_path / "mine.yaml"
    broken.write_text("model:\n  num_layers: 2\n  hidden_size: [\n")
    with pytest.raises(InputError, match="not valid YAML") as caught:
        load_recipe_file(str(broken))
    assert caught.value.where.startswith(f"{broken}:")  # with the line of the problem
    with pytest.raises(InputError, match="recipe file not found"):
        load_recipe_file(str(tmp_path / "absent.yaml"))
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(InputError, match="expected a mapping, got list"):
        load_recipe_file(str(listed))


def test_user_recipe_takes_its_name_from_the_file(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "my-model.yaml"
    data = copy.deepcopy(LLAMA2_7B)
    del data["name"]
    path.write_text(yaml.safe_dump(data))
    recipe = load_recipe_file(str(path))
    assert recipe.model.name == "my-model"
    assert recipe.params.total == 6_738_415_616


@pytest.mark.parametrize("name", ["llama2-7b", "my_model.v2", "A", "x" * 64, "7b"])
def test_safe_plan_names_are_kept(name: str) -> None:
    assert parse_recipe({**copy.deepcopy(LLAMA2_7B), "name": name}, "x.yaml").model.name == name


@pytest.mark.parametrize("name", ["run; rm -rf ~", "$(reboot)", "a b", "-rf", ".hidden", "x" * 65, "a\nb", "",
                                  "caf\u00e9", "a/b", 7, None])
def test_a_plan_name_outside_the_safe_set_is_refused(name: object) -> None:
    with pytest.raises(InputError) as caught:
        parse_recipe({**copy.deepcopy(LLAMA2_7B), "name": name}, "x.yaml")
    line = caught.value.one_line()
    assert line.startswith("x.yaml: name: the name ") and "\n" not in line
    assert "is not 1-64 letters, digits, '.', '_' or '-' (not starting with '.' or '-')" in line


def test_a_name_from_a_file_or_folder_is_made_safe(tmp_path: Path) -> None:
    import yaml

    data = copy.deepcopy(LLAMA2_7B)
    del data["name"]
    path = tmp_path / "Llama 2 (copy).yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_recipe_file(str(path)).model.name == "Llama-2-copy"
    assert plan_name_from("..-x" * 40) == ("x..-" * 16)[:63]
    assert plan_name_from("$$$") == ""


def test_unknown_shipped_model_lists_the_known_ones() -> None:
    with pytest.raises(InputError, match="unknown model 'llama5'") as caught:
        load_shipped_recipe("llama5")
    assert "llama3.1-8b" in caught.value.hint and caught.value.where == "--model"


def test_head_dim_frees_the_head_width_from_hidden_size() -> None:
    """Qwen3-4B's attention: 32 heads of 128 on a 2560-wide hidden state (q is 4096 wide)."""
    data = copy.deepcopy(LLAMA2_7B)
    data["model"].update(hidden_size=2560, num_heads=32, num_kv_heads=8, head_dim=128, qk_norm="head")
    model = parse_recipe(data, "x.yaml").model
    assert (model.attn_head_dim, model.q_width, model.kv_width) == (128, 4096, 1024)
    derived = parse_recipe({**data, "model": {**data["model"], "head_dim": 0}}, "x.yaml").model
    assert derived.attn_head_dim == 80


def test_new_architecture_keys_round_trip_through_a_plan_file() -> None:
    """A plan file holds the model as asdict writes it; reading it back gives the same model."""
    from dataclasses import asdict

    from fstrain.core.plan.recipe import parse_model_section
    from fstrain.core.plan.schema import ModelSpec, MoESpec

    gemma_like = ModelSpec("g", 26, 2304, 8, 4, 9216, "geglu", 256000, 8192, tied_embeddings=True, head_dim=256,
                           qk_norm="head", post_norms=True, sliding_window=4096, sliding_window_layers=13)
    qwen2_moe_like = ModelSpec("q", 28, 3584, 28, 4, 2560, "swiglu", 151936, 4096, attention_bias="qkv",
                               moe=MoESpec(64, 8, 2560, shared_ffn_hidden_size=20480, shared_expert_gate=True,
                                           router_dtype="fp32"))
    for model in (gemma_like, qwen2_moe_like):
        section = {key: value for key, value in asdict(model).items() if key != "name"}
        assert parse_model_section(section, "plan.yaml", model.name) == model
