"""A Hugging Face model (``transformers``' own ``*ForCausalLM`` class, built from the user's
``config.json``) laid out as the plan says, for ``fstrain plan --trace``.

The model is ``AutoModelForCausalLM.from_config`` in the rendered FSDP file's model dtype, with
``attn_implementation="sdpa"`` (transformers' default where torch has SDPA; on a GPU it runs
FlashAttention-2 through SDPA when there is no mask) when the plan counts FlashAttention, and
``"eager"`` (the s x s scores materialised) when it does not. Each decoder layer (the model's
``_no_split_modules``, the classes HF Accelerate's FSDP auto-wrap and torchtitan shard one by one)
is its own ``fully_shard`` unit, then the root, with :func:`fstrain.train.fsdp_backend.shard_unit`,
the bundled model's own sharding. Activation checkpointing is transformers' own
(``activation_checkpointing_enable``: ``torch.utils.checkpoint``, non-reentrant, around each
decoder layer's ``forward``), switched on for exactly the layers the plan's policy checkpoints
(:func:`fstrain.core.plan.acpolicy.block_is_checkpointed`). The loss is the model's own: labels
passed to ``forward`` (``ForCausalLMLoss``: the logits upcast to fp32, then cross entropy).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh

from fstrain.core.plan.acpolicy import block_is_checkpointed
from fstrain.errors import ConfigError
from fstrain.train.fsdp_backend import model_dtype, shard_unit

# activation_checkpointing_enable with per-layer GradientCheckpointingLayer flags, and from_config's
# ``dtype``: the transformers the trace was written and checked against (pyproject's test extra).
MIN_TRANSFORMERS = (5, 25)


def require_transformers() -> None:
    """One line, not a traceback, when transformers is missing or older than :data:`MIN_TRANSFORMERS`."""
    wanted = ".".join(map(str, MIN_TRANSFORMERS))
    hint = f"pip install 'transformers>={wanted}', or plan with a shipped recipe to trace the bundled model"
    try:
        import transformers
    except ImportError:
        raise ConfigError("the trace of a Hugging Face model builds it with transformers, which is not installed",
                          hint, "--trace") from None
    version = tuple(int(part) for part in transformers.__version__.split(".")[:2] if part.isdigit())
    if version < MIN_TRANSFORMERS:
        raise ConfigError(f"transformers {transformers.__version__} is older than the trace needs ({wanted})",
                          hint, "--trace")


def hf_config(config_json: str, num_layers: int | None = None) -> Any:
    """transformers' config for ``config_json`` (a config.json's text), cut to its first
    ``num_layers`` decoder layers (their ``layer_types`` kept) when given."""
    from transformers import AutoConfig
    from transformers.utils import logging

    data = {**json.loads(config_json), "use_cache": False}  # training: no KV cache
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # generation settings a config carries (Gemma 2's cache_implementation)
    try:
        config = AutoConfig.for_model(**data)
        if num_layers is None:
            return config
        types = getattr(config, "layer_types", None)
        cut = {**data, "num_hidden_layers": num_layers}
        if types is not None:
            cut["layer_types"] = list(types[:num_layers])
        return AutoConfig.for_model(**cut)
    finally:
        logging.set_verbosity(verbosity)


def layer_period(config_json: str) -> int:
    """The fewest layers after which the layer types repeat (Gemma 2's alternating sliding and
    full attention: 2); 1 when every layer is alike."""
    types = list(getattr(hf_config(config_json), "layer_types", None) or ())
    for period in range(1, len(types) + 1):
        if all(kind == types[i % period] for i, kind in enumerate(types)):
            return period
    return 1


def attention_implementation(flash_attention: bool) -> str:
    """What the plan's attention counts, as transformers names it."""
    return "sdpa" if flash_attention else "eager"


def build_sharded_hf_model(config_json: str, num_layers: int, cfg: Mapping[str, Any], mesh: DeviceMesh, ac: str,
                           flash_attention: bool) -> torch.nn.Module:
    """The model transformers builds from ``config_json`` at ``num_layers`` layers, sharded and
    checkpointed as the module docstring says."""
    from transformers import AutoModelForCausalLM

    config = hf_config(config_json, num_layers)
    if flash_attention:
        # As the bundled model's trace does (fstrain/train/trace.py _flash_attention_dropout): the
        # GPU's flash kernel stores nothing for attention dropout; the CPU kernel cannot drop out
        # and would fall back to the math path, storing every s x s probability.
        config.attention_dropout = 0.0
    with model_dtype(cfg):
        model = AutoModelForCausalLM.from_config(
            config, attn_implementation=attention_implementation(flash_attention), dtype=torch.get_default_dtype()
        )
    model.train()
    layers = [m for m in model.modules() if type(m).__name__ in set(model._no_split_modules)]
    if ac != "none":
        model.activation_checkpointing_enable({"use_reentrant": False})
        for index, layer in enumerate(layers):
            layer.gradient_checkpointing = block_is_checkpointed(ac, index)
    for layer in layers:
        shard_unit(layer, cfg, mesh)
    shard_unit(model, cfg, mesh)
    return model


@contextlib.contextmanager
def unpacked_batches() -> Iterator[None]:
    """Each row of the traced batch is one sequence, as transformers finds in a real run.
    Without a cache or an attention mask (training), transformers looks for packed sequences in
    the position ids (``masking_utils.find_packed_sequence_indices``) and returns None when there
    are none, so SDPA runs with ``is_causal`` and no mask; that check reads values, which fake
    tensors do not have, so under ``FakeTensorMode`` it takes every batch for packed and builds
    an s x s mask (kept by every layer, and K and V repeated to every head) that a real run of
    the same batch does not. The check is answered as for the real batch while the trace runs."""
    from transformers import masking_utils

    found = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = found


def hf_loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The model's own causal-LM loss on ``tokens`` (labels = the inputs; transformers shifts them)."""
    return model(input_ids=tokens, labels=tokens).loss


def model_class(config_json: str) -> str:
    """The ``*ForCausalLM`` class transformers builds for ``config_json``."""
    return str(_causal_lm(config_json).__name__)


def check_attention(config_json: str, flash_attention: bool) -> None:
    """Refuse, in one line, a plan counting FlashAttention for a class transformers gives no SDPA
    attention (Gemma 2 in transformers 5.25: ``_supports_sdpa`` is False; on a GPU it runs
    FlashAttention-2 through the ``flash-attn`` package, which has no CPU kernel)."""
    built = _causal_lm(config_json)
    if flash_attention and not getattr(built, "_supports_sdpa", False):
        raise ConfigError(
            f"transformers' {built.__name__} has no SDPA attention, and its FlashAttention-2 needs a GPU",
            "re-plan with --no-flash-attention to trace its eager attention",
            "--trace",
        )


def _causal_lm(config_json: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM._model_mapping[type(hf_config(config_json))]
