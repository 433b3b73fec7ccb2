"""A Hugging Face ``config.json`` as a recipe: the architecture fields mapped to the recipe schema.

Pure: takes the parsed JSON object and returns the mapping :func:`fstrain.core.plan.recipe.parse_recipe`
validates, so a ``config.json`` is checked exactly as a recipe is. Each supported ``model_type``
is described by a :class:`Family`: what transformers builds for it (read from its
``modeling_*.py``), so that the recipe's parameter count equals transformers' own
(``tests/unit/test_hf_param_counts.py`` builds every fixture with ``AutoModelForCausalLM``).

============  =====================================================================================
llama         SwiGLU, RMSNorm, RoPE, GQA, head_dim, attention_bias (q, k, v, o) and mlp_bias
mistral       as llama without biases, sliding_window on every layer (Mistral 7B v0.1)
mixtral       as mistral, with num_local_experts experts, top num_experts_per_tok
qwen2         as llama with biases on q, k and v only; a sliding window past max_window_layers
qwen2_moe     as qwen2, with experts of moe_intermediate_size and a gated shared expert
qwen3         as llama with per-head q/k RMSNorms (q_norm, k_norm: head_dim wide)
qwen3_moe     as qwen3, with experts of moe_intermediate_size
phi3          as mistral (fused qkv_proj and gate_up_proj hold the same parameters)
gemma         GeGLU (gelu_pytorch_tanh), head_dim, tied embeddings
gemma2        as gemma with a norm after each sublayer too; a sliding window on every other layer
gemma3_text   as gemma2 with per-head q/k norms; the window on five layers in six
olmo2         as llama with q/k RMSNorms over the whole projections
granite       as llama (its multipliers scale activations, not parameters)
starcoder2    GeLU MLP (c_fc, c_proj), LayerNorm, biases on every linear (use_bias), a sliding window
gpt2          GeLU, LayerNorm, learned positions, biases, tied embeddings, dropout
============  =====================================================================================

``seq_len`` is the pre-training context: ``original_max_position_embeddings`` (in ``rope_scaling``
or, as Phi-3 writes it, at the top) when the config stretches RoPE (Llama 3.1: 8192, not
131072), else ``max_position_embeddings`` (``n_positions`` for GPT-2); ``fstrain plan --seq-len``
overrides it. What changes neither the parameters nor the memory and time fstrain models is not
read: logit soft-capping (Gemma 2), RoPE bases and scaling, Granite's multipliers.

Refused with one line each: DeepSeek-V2/V3's multi-head latent attention (low-rank q and kv
projections fstrain's attention does not model), vision-language configs (``gemma3``: plan the
``text_config`` as a ``gemma3_text`` config) and MoE models whose layers are not all alike
(``mlp_only_layers``, ``decoder_sparse_step``, ``first_k_dense_replace``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fstrain.errors import InputError

SILU = ("silu", "swish")
GELU = ("gelu", "gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu_python")


@dataclass(frozen=True)
class Family:
    """What transformers builds for one ``model_type``, as the recipe schema says it."""

    architecture: str
    """The ``*ForCausalLM`` class (named in errors and in the recipe's description)."""
    activation: str = "swiglu"
    """The recipe's activation; its config's ``hidden_act`` must be one of its functions."""
    tied_default: bool = False
    """``tie_word_embeddings`` when the config leaves it out (the config class's default)."""
    attention_bias: str = "key"
    """"key": the config's ``attention_bias`` biases q, k, v and o; "qkv": q, k and v always
    (Qwen2); "qkv_bias": q, k and v as its ``qkv_bias`` key says, default true (Qwen2-MoE);
    "none": the code builds none."""
    mlp_bias: bool = False
    """Whether the code honours the config's ``mlp_bias`` (Llama, Granite)."""
    linear_bias_key: str = ""
    """A key that biases every linear (StarCoder2's ``use_bias``, default true); "" for none."""
    norm: str = "rmsnorm"
    qk_norm: str = "none"
    post_norms: bool = False
    window: str = "none"
    """Which layers use ``sliding_window``: "all", "qwen" (``use_sliding_window``, from
    ``max_window_layers`` on), "alternate" (every other, from the first), "pattern" (all but every
    ``sliding_window_pattern``-th) or "none". A ``layer_types`` list in the config overrides it."""
    moe: str = "none"
    """"mixtral" (``num_local_experts`` of ``intermediate_size``), "qwen" (``num_experts`` of
    ``moe_intermediate_size``, with Qwen2-MoE's shared expert when it has one) or "none"."""


FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaForCausalLM", mlp_bias=True),
    "mistral": Family("MistralForCausalLM", attention_bias="none", window="all"),
    "mixtral": Family("MixtralForCausalLM", attention_bias="none", window="all", moe="mixtral"),
    "qwen2": Family("Qwen2ForCausalLM", attention_bias="qkv", window="qwen"),
    "qwen2_moe": Family("Qwen2MoeForCausalLM", attention_bias="qkv_bias", window="qwen", moe="qwen"),
    "qwen3": Family("Qwen3ForCausalLM", qk_norm="head", window="qwen"),
    "qwen3_moe": Family("Qwen3MoeForCausalLM", qk_norm="head", window="qwen", moe="qwen"),
    "phi3": Family("Phi3ForCausalLM", attention_bias="none", window="all"),
    "gemma": Family("GemmaForCausalLM", activation="geglu", tied_default=True),
    "gemma2": Family("Gemma2ForCausalLM", activation="geglu", tied_default=True, post_norms=True, window="alternate"),
    "gemma3_text": Family("Gemma3ForCausalLM", activation="geglu", tied_default=True, qk_norm="head",
                          post_norms=True, window="pattern"),
    "olmo2": Family("Olmo2ForCausalLM", qk_norm="projection"),
    "granite": Family("GraniteForCausalLM", mlp_bias=True),
    "starcoder2": Family("Starcoder2ForCausalLM", activation="gelu", tied_default=True, attention_bias="none",
                         linear_bias_key="use_bias", norm="layernorm", window="all"),
}
SUPPORTED = {**{kind: family.architecture for kind, family in FAMILIES.items()}, "gpt2": "GPT2LMHeadModel"}
_HINT = "supported: " + ", ".join(f"{arch} (model_type {kind})" for kind, arch in SUPPORTED.items())
# Known architectures fstrain cannot describe, each with why and what to do instead.
REFUSED = {
    "deepseek_v2": ("DeepSeek-V2's multi-head latent attention (kv_lora_rank) is not modelled: fstrain's attention "
                    "is full q, k, v and o projections", "write a recipe YAML that approximates it (docs/configs.md)"),
    "deepseek_v3": ("DeepSeek-V3's multi-head latent attention (kv_lora_rank) is not modelled: fstrain's attention "
                    "is full q, k, v and o projections", "write a recipe YAML that approximates it (docs/configs.md)"),
    "gemma3": ("a vision-language model (Gemma3ForConditionalGeneration): fstrain plans decoder-only language models",
               "plan its text decoder: save the config's text_config as a config.json with "
               "\"model_type\": \"gemma3_text\""),
}


def is_hf_config(data: Any) -> bool:
    """Whether a parsed document looks like a Hugging Face config (not an fstrain recipe)."""
    return isinstance(data, Mapping) and ("model_type" in data or "architectures" in data)


def recipe_from_hf_config(data: Mapping[str, Any], where: str, name: str) -> dict[str, Any]:
    """The recipe mapping for a Hugging Face ``config.json`` (raises InputError when unsupported)."""
    kind = data.get("model_type")
    if isinstance(kind, str) and kind in REFUSED:
        what, hint = REFUSED[kind]
        raise InputError(f"model_type {kind!r}: {what}", hint, f"{where}: model_type")
    if kind not in SUPPORTED:
        architectures = data.get("architectures") or []
        shown = architectures[0] if isinstance(architectures, list) and architectures else "?"
        raise InputError(
            f"unsupported architecture {shown!r} (model_type {kind!r}) in a Hugging Face config",
            f"{_HINT}; for another model write a recipe YAML (docs/configs.md)",
            where,
        )
    model = _gpt2(data, where) if kind == "gpt2" else _decoder(data, where, FAMILIES[kind])
    return {"name": name, "description": f"{SUPPORTED[kind]} from {where}", "source": where, "model": model}


def _decoder(data: Mapping[str, Any], where: str, family: Family) -> dict[str, Any]:
    heads = _get(data, "num_attention_heads", where)
    model: dict[str, Any] = {
        "num_layers": _get(data, "num_hidden_layers", where),
        "hidden_size": _get(data, "hidden_size", where),
        "num_heads": heads,
        "num_kv_heads": data.get("num_key_value_heads") or heads,
        "ffn_hidden_size": _get(data, "intermediate_size", where),
        "activation": _activation(data, where, family),
        "vocab_size": _get(data, "vocab_size", where),
        "seq_len": _seq_len(data, "max_position_embeddings", where),
        "tied_embeddings": bool(data.get("tie_word_embeddings", family.tied_default)),
        "norm": family.norm,
        "position_embedding": "rope",
        "dropout": data.get("attention_dropout", 0.0) or 0.0,
        "qk_norm": family.qk_norm,
        "post_norms": family.post_norms,
    }
    if data.get("head_dim") is not None:  # else transformers derives hidden_size / num_heads too
        model["head_dim"] = data["head_dim"]
    model.update(_biases(data, family))
    model.update(_window(data, where, family, model["num_layers"]))
    if family.moe != "none":
        model.update(_moe(data, where, family))
    return model


def _activation(data: Mapping[str, Any], where: str, family: Family) -> str:
    # Gemma 2 and 3 read hidden_activation; the others hidden_act (Gemma's configs carry a null
    # hidden_activation beside it).
    key = "hidden_activation" if data.get("hidden_activation") is not None else "hidden_act"
    act = data.get(key, "silu" if family.activation == "swiglu" else "gelu_pytorch_tanh")
    accepted = SILU if family.activation == "swiglu" else GELU
    if act not in accepted:
        raise InputError(f"{key} {act!r} is not supported for {family.architecture}",
                         f"fstrain models its {family.activation} feed-forward with {' or '.join(accepted)}",
                         f"{where}: {key}")
    return family.activation


def _biases(data: Mapping[str, Any], family: Family) -> dict[str, Any]:
    if family.linear_bias_key:
        return {"linear_bias": bool(data.get(family.linear_bias_key, True))}
    attention = {
        "key": "all" if data.get("attention_bias", False) else "none",
        "qkv": "qkv",
        "qkv_bias": "qkv" if data.get("qkv_bias", True) else "none",
        "none": "none",
    }[family.attention_bias]
    return {"attention_bias": attention, "mlp_bias": family.mlp_bias and bool(data.get("mlp_bias", False))}


def _window(data: Mapping[str, Any], where: str, family: Family, layers: Any) -> dict[str, Any]:
    """``sliding_window`` and how many layers use it, as transformers' ``layer_types`` says."""
    window = data.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0 or not isinstance(layers, int):
        return {}
    types = data.get("layer_types")
    if isinstance(types, list):
        windowed = sum(1 for kind in types if kind == "sliding_attention")
    elif family.window == "all":
        windowed = layers
    elif family.window == "qwen":
        first = data.get("max_window_layers", layers)
        windowed = max(0, layers - first) if data.get("use_sliding_window") and isinstance(first, int) else 0
    elif family.window == "alternate":
        windowed = (layers + 1) // 2
    elif family.window == "pattern":
        pattern = data.get("sliding_window_pattern", 6)
        if not isinstance(pattern, int) or pattern < 1:
            raise InputError(f"sliding_window_pattern {pattern!r} is not a positive integer",
                             "every n-th layer attends globally: give n", f"{where}: sliding_window_pattern")
        windowed = layers - layers // pattern
    else:
        windowed = 0
    return {"sliding_window": window, "sliding_window_layers": windowed} if windowed else {}


def _moe(data: Mapping[str, Any], where: str, family: Family) -> dict[str, Any]:
    if family.moe == "mixtral":
        width = _get(data, "intermediate_size", where)
        moe: dict[str, Any] = {"num_experts": _get(data, "num_local_experts", where)}
    else:
        _uniform_layers(data, where, family)
        width = _get(data, "moe_intermediate_size", where)
        moe = {"num_experts": _get(data, "num_experts", where)}
    moe["top_k"] = _get(data, "num_experts_per_tok", where)
    moe["expert_ffn_hidden_size"] = width
    shared = data.get("shared_expert_intermediate_size") or 0
    if family.architecture == "Qwen2MoeForCausalLM" and shared:
        moe["shared_ffn_hidden_size"] = shared
        moe["shared_expert_gate"] = True
    # Every layer is a mixture of experts: the dense width is only the experts' own.
    return {"moe": moe, "ffn_hidden_size": width}


def _uniform_layers(data: Mapping[str, Any], where: str, family: Family) -> None:
    """fstrain plans identical blocks: refuse a Qwen MoE whose dense and sparse layers mix."""
    dense = data.get("mlp_only_layers") or []
    step = data.get("decoder_sparse_step", 1)
    if dense or step != 1:
        key = "mlp_only_layers" if dense else "decoder_sparse_step"
        raise InputError(f"{family.architecture} with dense layers among the experts ({key} {data.get(key)!r}): "
                         "fstrain plans models whose blocks are all alike",
                         "write a recipe YAML with every layer a mixture of experts (docs/configs.md)",
                         f"{where}: {key}")


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
    if data.get("original_max_position_embeddings"):  # Phi-3 writes it at the top
        return data["original_max_position_embeddings"]
    return _get(data, key, where)


def _get(data: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise InputError(f"missing key {key!r} in the Hugging Face config", "is this the model's config.json?",
                         f"{where}: {key}")
    return data[key]
