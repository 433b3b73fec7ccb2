"""Model recipes: a decoder-only transformer and optional training defaults, validated.

A recipe is data (``recipes/*.yaml``); this module takes the already-parsed mapping and the
place it came from (``where``, usually the file name) and returns a :class:`Recipe`, or raises
one :class:`~fstrain.errors.InputError` that names the file, the key and what was expected.
Reading files and YAML lives at the edge (``fstrain.io.recipes``).

Schema (every key is checked; unknown keys are errors, so a typo never passes silently)::

    name: llama2-7b                 # optional, defaults to the file stem; [A-Za-z0-9._-], 1-64
    description: ...                # optional, free text
    source: ...                     # optional, where the numbers come from
    hf_ids: [meta-llama/Llama-2-7b-hf]   # optional: Hugging Face ids --model also accepts
    model:
      num_layers: 32
      hidden_size: 4096
      num_heads: 32
      num_kv_heads: 32              # optional, default num_heads (GQA when fewer)
      ffn_hidden_size: 11008        # optional with moe (defaults to the expert size)
      activation: swiglu            # gelu (2 matrices) | swiglu | geglu (3 matrices)
      vocab_size: 32000
      seq_len: 4096
      tied_embeddings: false        # optional, default false
      norm: rmsnorm                 # optional: rmsnorm | layernorm
      linear_bias: false            # optional: biases on every linear (GPT-2)
      position_embedding: rope      # optional: rope | learned
      dropout: 0.0                  # optional, 0 <= p < 1
      head_dim: 128                 # optional, default hidden_size / num_heads (0 says so too)
      qk_norm: none                 # optional: none | head (Qwen3, Gemma 3) | projection (OLMo 2)
      attention_bias: none          # optional: none | qkv (Qwen2) | all (q, k, v and o)
      mlp_bias: false               # optional: biases on the FFN linears
      post_norms: false             # optional: a norm after each sublayer too (Gemma 2 and 3)
      sliding_window: 0             # optional: tokens a windowed layer attends back to (0: none)
      sliding_window_layers: 0      # optional: how many layers use it (default: all)
      moe:                          # optional
        num_experts: 8
        top_k: 2
        expert_ffn_hidden_size: 14336
        shared_ffn_hidden_size: 0   # optional: an always-on shared expert this wide
        shared_expert_gate: false   # optional: Qwen2-MoE's sigmoid gate on it
        router_dtype: compute       # optional: compute | fp32
      params: 6738415616            # optional: the published count, cross-checked
    training:                       # optional defaults, each overridable on the command line
      global_batch_size: 1024       # sequences (or global_batch_tokens, not both)
      micro_batch_size: 1
      precision: bf16               # bf16 | fp16 | fp32 | bf16-pure | amp-bf16 | amp-fp16
      optimizer: adamw              # adamw | sgd | adam8bit
      activation_checkpointing: none    # none | selective-op | every-k:N | full | megatron-selective
      flash_attention: true
      train_tokens: 2e12

A stated ``params`` must agree with the derived count within :data:`PARAMS_TOLERANCE`
(relative). Published counts are rounded to three or four significant digits (under 0.1 %
off), while a mistyped field (a hidden size, an FFN width, a layer count) moves the count by
well over a percent.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fstrain.core.plan.acpolicy import parse_ac
from fstrain.core.plan.modelsize import ParamCount, count_parameters
from fstrain.core.plan.precision import PRECISIONS
from fstrain.core.plan.schema import (
    ACTIVATIONS,
    ATTENTION_BIASES,
    OPTIMIZERS,
    QK_NORMS,
    ROUTER_DTYPES,
    ModelSpec,
    MoESpec,
)
from fstrain.errors import InputError

PARAMS_TOLERANCE = 0.005
# A plan's name (its model's) travels into plan files, rendered files, run records and the
# trainer's summary: letters, digits, '.', '_' and '-' need no quoting in a file name or a shell.
MAX_PLAN_NAME_CHARS = 64
_PLAN_NAME_RE = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9._-]{{0,{MAX_PLAN_NAME_CHARS - 1}}}")
NORMS = ("rmsnorm", "layernorm")
POSITION_EMBEDDINGS = ("rope", "learned")
_SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}

_TOP_KEYS = ("name", "description", "source", "hf_ids", "model", "training")
_MODEL_KEYS = (
    "num_layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "ffn_hidden_size",
    "activation",
    "vocab_size",
    "seq_len",
    "tied_embeddings",
    "norm",
    "linear_bias",
    "position_embedding",
    "dropout",
    "pooler",
    "num_labels",
    "head_dim",
    "qk_norm",
    "attention_bias",
    "mlp_bias",
    "post_norms",
    "sliding_window",
    "sliding_window_layers",
    "moe",
    "params",
)
_MOE_SIZES = ("num_experts", "top_k", "expert_ffn_hidden_size")
_MOE_KEYS = (*_MOE_SIZES, "shared_ffn_hidden_size", "shared_expert_gate", "router_dtype")
_TRAINING_KEYS = (
    "global_batch_size",
    "global_batch_tokens",
    "micro_batch_size",
    "precision",
    "optimizer",
    "activation_checkpointing",
    "flash_attention",
    "train_tokens",
)


@dataclass(frozen=True)
class TrainingDefaults:
    """Training settings a recipe suggests; ``None`` means "not stated"."""

    global_batch_size: int | None = None  # sequences per optimizer step
    global_batch_tokens: int | None = None  # tokens per optimizer step (alternative)
    micro_batch_size: int | None = None
    precision: str | None = None
    optimizer: str | None = None
    activation_checkpointing: str | None = None
    flash_attention: bool | None = None
    train_tokens: int | None = None


@dataclass(frozen=True)
class Recipe:
    """A validated recipe: the model, its derived parameter count and training defaults."""

    model: ModelSpec
    params: ParamCount
    training: TrainingDefaults
    stated_params: int | None = None
    description: str = ""
    source: str = ""
    where: str = ""
    hf_ids: tuple[str, ...] = ()  # Hugging Face model ids of this architecture (--model accepts them)
    hf_config: str = ""  # the config.json text the recipe was read from ("" for a recipe YAML)


def parse_recipe(data: Any, where: str, default_name: str = "") -> Recipe:
    """Validate a parsed recipe mapping; ``where`` names the file in every error."""
    top = _mapping(data, where, "the recipe")
    _no_unknown(top, _TOP_KEYS, where, "")
    if "name" in top:
        name = check_plan_name(top["name"], _at(where, "name"))
    else:
        name = plan_name_from(default_name)
        if not name:
            raise InputError("the recipe has no name", "name the model, e.g. name: llama2-7b", where)
    if "model" not in top:
        raise InputError("missing section 'model'", "describe the architecture under model:", where)
    model, stated = _parse_model(_mapping(top["model"], where, "model"), where, name)
    training = _parse_training(top.get("training"), where)
    params = count_parameters(model)
    if stated is not None and abs(params.total - stated) > PARAMS_TOLERANCE * stated:
        raise InputError(
            f"the architecture gives {params.total:,} parameters but params states {stated:,} "
            f"({(params.total - stated) / stated:+.2%}, tolerance {PARAMS_TOLERANCE:.1%})",
            "check num_layers, hidden_size, ffn_hidden_size, num_kv_heads, head_dim, vocab_size and tied_embeddings",
            _at(where, "model.params"),
        )
    return Recipe(
        model=model,
        params=params,
        training=training,
        stated_params=stated,
        description=_text(top, "description", where),
        source=_text(top, "source", where),
        where=where,
        hf_ids=_text_list(top, "hf_ids", where),
    )


def check_plan_name(name: Any, where: str) -> str:
    """A plan's (its model's) name: 1-64 letters, digits, '.', '_' or '-', not starting with
    '.' or '-' (a hidden file, an option)."""
    if not isinstance(name, str) or not _PLAN_NAME_RE.fullmatch(name):
        shown = name[:80] if isinstance(name, str) else name
        raise InputError(f"the name {shown!r} is not 1-{MAX_PLAN_NAME_CHARS} letters, digits, '.', '_' or '-' "
                         "(not starting with '.' or '-')", "rename it, e.g. llama2-7b or my_model.v2", where)
    return name


def plan_name_from(text: str) -> str:
    """A plan name made from a file or folder name: ``Llama 3 (copy)`` -> ``Llama-3-copy``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).lstrip(".-")[:MAX_PLAN_NAME_CHARS].rstrip("-")


def parse_model_section(section: Any, where: str, name: str) -> ModelSpec:
    """A ``model:`` mapping (a recipe's, or a plan's), checked exactly as a recipe is."""
    model, _ = _parse_model(_mapping(section, where, "model"), where, name)
    return model


def _parse_model(section: Mapping[str, Any], where: str, name: str) -> tuple[ModelSpec, int | None]:
    _no_unknown(section, _MODEL_KEYS, where, "model.")
    moe = _parse_moe(section.get("moe"), where)
    ints = {key: _positive_int(section, key, where, "model.") for key in ("num_layers", "hidden_size", "num_heads")}
    ints["vocab_size"] = _positive_int(section, "vocab_size", where, "model.")
    ints["seq_len"] = _positive_int(section, "seq_len", where, "model.")
    kv_heads = _positive_int(section, "num_kv_heads", where, "model.", default=ints["num_heads"])
    default_ffn = moe.expert_ffn_hidden_size if moe is not None else None
    ffn = _positive_int(section, "ffn_hidden_size", where, "model.", default=default_ffn)
    model = ModelSpec(
        name=name,
        num_layers=ints["num_layers"],
        hidden_size=ints["hidden_size"],
        num_heads=ints["num_heads"],
        num_kv_heads=kv_heads,
        ffn_hidden_size=ffn,
        activation=_choice(section, "activation", ACTIVATIONS, where, "model."),
        vocab_size=ints["vocab_size"],
        seq_len=ints["seq_len"],
        tied_embeddings=_bool(section, "tied_embeddings", where, "model.", False),
        moe=moe,
        norm=_choice(section, "norm", NORMS, where, "model.", "rmsnorm"),
        linear_bias=_bool(section, "linear_bias", where, "model.", False),
        position_embedding=_choice(section, "position_embedding", POSITION_EMBEDDINGS, where, "model.", "rope"),
        dropout=_dropout(section, where),
        pooler=_bool(section, "pooler", where, "model.", False),
        num_labels=_count(section, "num_labels", where),
        head_dim=_count(section, "head_dim", where),
        qk_norm=_choice(section, "qk_norm", QK_NORMS, where, "model.", "none"),
        attention_bias=_choice(section, "attention_bias", ATTENTION_BIASES, where, "model.", "none"),
        mlp_bias=_bool(section, "mlp_bias", where, "model.", False),
        post_norms=_bool(section, "post_norms", where, "model.", False),
        sliding_window=_count(section, "sliding_window", where),
        sliding_window_layers=_count(section, "sliding_window_layers", where),
    )
    _check_shapes(model, where)
    _check_biases(model, where)
    _check_window(model, where)
    stated = parse_count(section["params"], _at(where, "model.params")) if "params" in section else None
    return model, stated


def _parse_moe(value: Any, where: str) -> MoESpec | None:
    if value is None:
        return None
    section = _mapping(value, where, "model.moe")
    _no_unknown(section, _MOE_KEYS, where, "model.moe.")
    sizes = {key: _positive_int(section, key, where, "model.moe.") for key in _MOE_SIZES}
    moe = MoESpec(
        **sizes,
        shared_ffn_hidden_size=_count(section, "shared_ffn_hidden_size", where, "model.moe."),
        shared_expert_gate=_bool(section, "shared_expert_gate", where, "model.moe.", False),
        router_dtype=_choice(section, "router_dtype", ROUTER_DTYPES, where, "model.moe.", "compute"),
    )
    if moe.top_k > moe.num_experts:
        raise InputError(
            f"top_k ({moe.top_k}) is larger than num_experts ({moe.num_experts})",
            "a token is routed to at most num_experts experts",
            _at(where, "model.moe.top_k"),
        )
    if moe.shared_expert_gate and not moe.shared_ffn_hidden_size:
        raise InputError("shared_expert_gate is true but there is no shared expert",
                         "give its width as shared_ffn_hidden_size, or leave the gate out",
                         _at(where, "model.moe.shared_expert_gate"))
    return moe


def _check_shapes(model: ModelSpec, where: str) -> None:
    if not model.head_dim and model.hidden_size % model.num_heads:
        raise InputError(
            f"hidden_size ({model.hidden_size}) is not a multiple of num_heads ({model.num_heads})",
            "the head dimension is hidden_size / num_heads unless head_dim states it",
            _at(where, "model.num_heads"),
        )
    if model.num_kv_heads > model.num_heads or model.num_heads % model.num_kv_heads:
        raise InputError(
            f"num_kv_heads ({model.num_kv_heads}) must divide num_heads ({model.num_heads})",
            "grouped-query attention shares each KV head among num_heads / num_kv_heads query heads",
            _at(where, "model.num_kv_heads"),
        )


def _check_biases(model: ModelSpec, where: str) -> None:
    """linear_bias already biases every linear: a narrower bias key beside it says nothing more,
    so it is more likely a mistake than a wish."""
    if model.linear_bias and (model.attention_bias != "none" or model.mlp_bias):
        key = "attention_bias" if model.attention_bias != "none" else "mlp_bias"
        raise InputError(f"{key} is set beside linear_bias: true, which puts biases on every linear already",
                         f"keep linear_bias: true alone, or set linear_bias: false and say which biases with {key}",
                         _at(where, f"model.{key}"))


def _check_window(model: ModelSpec, where: str) -> None:
    if model.sliding_window_layers > model.num_layers:
        raise InputError(f"sliding_window_layers ({model.sliding_window_layers}) is more than num_layers "
                         f"({model.num_layers})", "count the layers that attend through the window",
                         _at(where, "model.sliding_window_layers"))
    if model.sliding_window_layers and not model.sliding_window:
        raise InputError("sliding_window_layers is set but sliding_window is 0",
                         "give the window in tokens as sliding_window, or leave sliding_window_layers out",
                         _at(where, "model.sliding_window_layers"))


def _parse_training(value: Any, where: str) -> TrainingDefaults:
    if value is None:
        return TrainingDefaults()
    section = _mapping(value, where, "training")
    _no_unknown(section, _TRAINING_KEYS, where, "training.")
    if "global_batch_size" in section and "global_batch_tokens" in section:
        raise InputError(
            "global_batch_size and global_batch_tokens are both set",
            "give the global batch once, in sequences or in tokens",
            _at(where, "training.global_batch_tokens"),
        )

    def optional_int(key: str) -> int | None:
        return _positive_int(section, key, where, "training.") if key in section else None

    def optional_choice(key: str, allowed: tuple[str, ...]) -> str | None:
        return _choice(section, key, allowed, where, "training.") if key in section else None

    tokens = section.get("train_tokens")
    return TrainingDefaults(
        global_batch_size=optional_int("global_batch_size"),
        global_batch_tokens=optional_int("global_batch_tokens"),
        micro_batch_size=optional_int("micro_batch_size"),
        precision=optional_choice("precision", PRECISIONS),
        optimizer=optional_choice("optimizer", OPTIMIZERS),
        activation_checkpointing=(
            parse_ac(section["activation_checkpointing"], _at(where, "training.activation_checkpointing"))
            if "activation_checkpointing" in section
            else None
        ),
        flash_attention=_bool(section, "flash_attention", where, "training.", None),
        train_tokens=None if tokens is None else parse_count(tokens, _at(where, "training.train_tokens")),
    )


def parse_count(value: Any, where: str) -> int:
    """A positive count written as 6738415616, 6.74e9, '6.74e9' or '6.74B' (K, M, B/G, T)."""
    number: float | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        text = value.strip().replace("_", "").replace(",", "")
        scale = _SUFFIXES.get(text[-1:].lower(), 1.0)
        try:
            number = float(text[:-1] if scale != 1.0 else text) * scale
        except ValueError:
            number = None
    if number is None or not math.isfinite(number) or number < 1:
        raise InputError(f"expected a positive count, got {value!r}", "write it as 6738415616, 6.74e9 or 6.74B", where)
    return round(number)


def _at(where: str, key: str) -> str:
    return f"{where}: {key}" if where else key


def _mapping(value: Any, where: str, key: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InputError(
            f"expected a mapping, got {type(value).__name__}", f"write {key} as 'key: value' lines", _at(where, key)
        )
    return value


def _no_unknown(section: Mapping[str, Any], known: tuple[str, ...], where: str, prefix: str) -> None:
    unknown = sorted(str(key) for key in section if key not in known)
    if unknown:
        raise InputError(
            f"unknown key {unknown[0]!r}" + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""),
            f"known keys here: {', '.join(known)}",
            _at(where, prefix + unknown[0]),
        )


def _positive_int(section: Mapping[str, Any], key: str, where: str, prefix: str, default: int | None = None) -> int:
    if key not in section:
        if default is not None:
            return default
        raise InputError(
            f"missing key {key!r}", "every architecture needs it (see docs/planner.md)", _at(where, prefix + key)
        )
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"expected a positive integer, got {value!r}", "write a whole number, 1 or more",
                         _at(where, prefix + key))
    return value


def _choice(
    section: Mapping[str, Any],
    key: str,
    allowed: tuple[str, ...],
    where: str,
    prefix: str,
    default: str | None = None,
) -> str:
    if key not in section and default is not None:
        return default
    if key not in section:
        raise InputError(f"missing key {key!r}", f"use one of {', '.join(allowed)}", _at(where, prefix + key))
    value = section[key]
    if value not in allowed:
        raise InputError(f"expected one of {', '.join(allowed)}, got {value!r}", "use one of the values listed",
                         _at(where, prefix + key))
    return str(value)


def _bool(section: Mapping[str, Any], key: str, where: str, prefix: str, default: Any) -> Any:
    if key not in section:
        return default
    value = section[key]
    if not isinstance(value, bool):
        raise InputError(f"expected true or false, got {value!r}", "write true or false", _at(where, prefix + key))
    return value


def _count(section: Mapping[str, Any], key: str, where: str, prefix: str = "model.") -> int:
    value = section.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"expected a whole number >= 0, got {value!r}", "write e.g. 2, or 0 for none",
                         _at(where, f"{prefix}{key}"))
    return value


def _dropout(section: Mapping[str, Any], where: str) -> float:
    value = section.get("dropout", 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 1.0:
        raise InputError(f"expected a probability 0 <= p < 1, got {value!r}", "write e.g. 0.1, or 0 for none",
                         _at(where, "model.dropout"))
    return float(value)


def _text_list(section: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = section.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise InputError(f"expected a list of names, got {value!r}", "write [org/name, ...]", _at(where, key))
    return tuple(value)


def _text(section: Mapping[str, Any], key: str, where: str) -> str:
    value = section.get(key, "")
    if not isinstance(value, str):
        raise InputError(f"expected text, got {value!r}", "quote it", _at(where, key))
    return value
