"""A Hugging Face ``config.json`` as a recipe: the architecture fields mapped to the recipe schema.

Pure: takes the parsed JSON object and returns the mapping :func:`fstrain.core.plan.recipe.parse_recipe`
validates, so a ``config.json`` is checked exactly as a recipe is. Supported ``model_type``:

==========  ==============================================================================
llama       LlamaConfig: SwiGLU, RMSNorm, RoPE, GQA (``num_key_value_heads``), optional biases
mistral     MistralConfig: as llama
mixtral     MixtralConfig: as llama, with ``num_local_experts`` experts, top ``num_experts_per_tok``
gpt2        GPT2Config: GELU, LayerNorm, learned positions, biases, tied embeddings, dropout
==========  ==============================================================================

``seq_len`` is the pre-training context: ``rope_scaling.original_max_position_embeddings`` when
the config stretches RoPE (Llama 3.1: 8192, not 131072), else ``max_position_embeddings``
(``n_positions`` for GPT-2); ``fstrain plan --seq-len`` overrides it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fstrain.errors import InputError

SUPPORTED = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}
_HINT = "supported: " + ", ".join(f"{arch} (model_type {kind})" for kind, arch in SUPPORTED.items())


def is_hf_config(data: Any) -> bool:
    """Whether a parsed document looks like a Hugging Face config (not an fstrain recipe)."""
    return isinstance(data, Mapping) and ("model_type" in data or "architectures" in data)


def recipe_from_hf_config(data: Mapping[str, Any], where: str, name: str) -> dict[str, Any]:
    """The recipe mapping for a Hugging Face ``config.json`` (raises InputError when unsupported)."""
    kind = data.get("model_type")
    if kind not in SUPPORTED:
        architectures = data.get("architectures") or []
        shown = architectures[0] if isinstance(architectures, list) and architectures else "?"
        raise InputError(
            f"unsupported architecture {shown!r} (model_type {kind!r}) in a Hugging Face config",
            f"{_HINT}; for another model write a recipe YAML (docs/configs.md)",
            where,
        )
    model = _gpt2(data, where) if kind == "gpt2" else _llama_like(data, where, moe=kind == "mixtral")
    return {"name": name, "description": f"{SUPPORTED[kind]} from {where}", "source": where, "model": model}


def _llama_like(data: Mapping[str, Any], where: str, *, moe: bool) -> dict[str, Any]:
    heads = _get(data, "num_attention_heads", where)
    activation = data.get("hidden_act", "silu")
    if activation not in ("silu", "swish"):
        raise InputError(f"hidden_act {activation!r} is not supported (a SwiGLU model has silu)",
                         "fstrain models SwiGLU (silu) and GELU (gpt2) feed-forwards", f"{where}: hidden_act")
    bias = bool(data.get("attention_bias", False)) or bool(data.get("mlp_bias", False))
    model: dict[str, Any] = {
        "num_layers": _get(data, "num_hidden_layers", where),
        "hidden_size": _get(data, "hidden_size", where),
        "num_heads": heads,
        "num_kv_heads": data.get("num_key_value_heads") or heads,
        "ffn_hidden_size": _get(data, "intermediate_size", where),
        "activation": "swiglu",
        "vocab_size": _get(data, "vocab_size", where),
        "seq_len": _seq_len(data, "max_position_embeddings", where),
        "tied_embeddings": bool(data.get("tie_word_embeddings", False)),
        "norm": "rmsnorm",
        "linear_bias": bias,
        "position_embedding": "rope",
        "dropout": data.get("attention_dropout", 0.0) or 0.0,
    }
    if moe:
        model["moe"] = {
            "num_experts": _get(data, "num_local_experts", where),
            "top_k": _get(data, "num_experts_per_tok", where),
            "expert_ffn_hidden_size": model["ffn_hidden_size"],
        }
    return model


def _gpt2(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    hidden = _get(data, "n_embd", where)
    inner = data.get("n_inner")
    return {
        "num_layers": _get(data, "n_layer", where),
        "hidden_size": hidden,
        "num_heads": _get(data, "n_head", where),
        "ffn_hidden_size": inner if inner is not None else (4 * hidden if isinstance(hidden, int) else hidden),
        "activation": "gelu",
        "vocab_size": _get(data, "vocab_size", where),
        "seq_len": _seq_len(data, "n_positions", where),
        "tied_embeddings": bool(data.get("tie_word_embeddings", True)),
        "norm": "layernorm",
        "linear_bias": True,
        "position_embedding": "learned",
        "dropout": data.get("resid_pdrop", 0.1),
    }


def _seq_len(data: Mapping[str, Any], key: str, where: str) -> Any:
    scaling = data.get("rope_scaling")
    if isinstance(scaling, Mapping) and scaling.get("original_max_position_embeddings"):
        return scaling["original_max_position_embeddings"]
    return _get(data, key, where)


def _get(data: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise InputError(f"missing key {key!r} in the Hugging Face config", "is this the model's config.json?",
                         f"{where}: {key}")
    return data[key]
