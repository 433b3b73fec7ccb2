"""What transformers' own model holds that the planner's count does not, for ``plan --trace``.

The planner counts the bundled trainer's model (:mod:`fstrain.train.model`). The trace of a
model that came from a Hugging Face ``config.json`` runs transformers' own ``*ForCausalLM``
(:mod:`fstrain.train.hf_model`), which keeps other memory in three places. Each is measured on
fake tensors (docs/validation/planner.md, "Against PyTorch's memory trace") and given here in
bytes, beside the planner's column, not folded into it:

- The loss runs inside the model's forward (``labels=`` to ``forward``: transformers'
  ``ForCausalLMLoss``, ``loss/loss_utils.py`` L52-62, which upcasts the logits first), so under
  FSDP2 the root unit (embeddings, final norm, head) is still gathered when the loss spikes, and
  the backward that starts inside the root has already prefetched the last decoder layer. The
  bundled trainer computes the loss after the root's forward, every unit resharded. Where the
  planner's peak is the loss, the trace's buffers hold the root's and one layer's gathered
  parameters more (Llama 3.1 8B, dp 8: 2.363 GiB, to the byte).
- With a sliding window that does not cover the batch (Mistral 7B v0.1 at 4096 tokens: the window
  is 4096), transformers builds a boolean attention mask (transformers 5.25.0
  ``masking_utils.py`` L286, ``_ignore_causal_mask_sdpa``: no skipping once ``kv_length >=
  local_attention_size``), and SDPA converts it to the query's dtype in every layer
  (``convert_boolean_attn_mask`` in aten's ``scaled_dot_product_attention``) and keeps that copy
  for backward (measured on the CPU kernel; on a GPU a mask selects the memory-efficient kernel,
  which keeps its attention bias for backward too): ``s x s x b x a`` bytes per windowed layer
  that stores its activations (Mistral 7B, 1 x 4096: 32 MiB a layer, 1.0 GiB over 32 layers; the
  trace holds 0.99 GiB more than the planner). Eager attention adds the mask to the scores, which
  keeps nothing.
- Eager attention (the plan without FlashAttention) runs its softmax in fp32
  (``models/llama/modeling_llama.py`` L197, ``eager_attention_forward``:
  ``softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)``) and keeps those
  probabilities beside their 16-bit cast, which the planner counts alone: ``4 x heads x s x s x b``
  bytes more per layer that stores its activations (Llama 3.2 1B, 1 x 2048: 512 MiB a layer; the
  trace holds 556, the 44 MiB left, 8 % of the difference, not accounted for).

Without a mask and past the loss the two models store the same bytes: per layer, the trace of
Llama 3.1 8B's transformers class at 4096 tokens holds 864.53 MiB, as the planner counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from fstrain.core.plan.acpolicy import checkpointed_blocks
from fstrain.core.plan.memory import comm_bytes, weight_bytes
from fstrain.core.plan.modelsize import ParamCount
from fstrain.core.plan.schema import ModelSpec, PlanKnobs

# The strategies whose FSDP2 units reshard after forward (the bundled trainer's root included).
RESHARDING = ("fsdp-full", "fsdp-hybrid")


@dataclass(frozen=True)
class HfDifference:
    """Bytes per GPU transformers' model holds more (negative: fewer) in one category, and why."""

    category: str
    bytes: int
    why: str


def attention_masked(model: ModelSpec, seq_len: int) -> bool:
    """Whether transformers builds an attention mask for a batch of ``seq_len`` unpadded tokens:
    when a layer's sliding window does not cover the sequence (masking_utils skips the mask for
    SDPA only while ``kv_length < sliding_window``)."""
    return model.windowed_layers > 0 and model.sliding_window <= seq_len


def hf_differences(model: ModelSpec, params: ParamCount, knobs: PlanKnobs, phase: str) -> list[HfDifference]:
    """What the trace of transformers' model holds beside the planner's breakdown at its peak
    ``phase`` (the module docstring says each item's cause)."""
    found = []
    if phase == "loss" and knobs.strategy in RESHARDING and knobs.pp == 1:
        gather, _ = comm_bytes(knobs.precision, knobs.strategy)
        root = params.embedding + params.position_embedding + params.final_norm + params.head
        found.append(HfDifference(
            "buffers", (root + params.per_layer) * gather,
            "the loss runs inside transformers' forward: the root unit (embeddings, final norm, head) is still "
            "gathered at the loss, and the last decoder layer already prefetched for backward",
        ))
    seq_len = knobs.seq_len or model.seq_len
    stored = model.num_layers - checkpointed_blocks(knobs.activation_checkpointing, model.num_layers)
    masked = min(stored, model.windowed_layers)
    if knobs.flash_attention and masked and attention_masked(model, seq_len):
        mask = seq_len * seq_len * knobs.micro_batch_size * weight_bytes(knobs.precision)
        found.append(HfDifference(
            "activations", masked * mask,
            f"transformers builds a sliding-window mask ({model.sliding_window} tokens do not cover {seq_len}) and "
            f"SDPA keeps a 16-bit copy of it in each of the {masked} windowed layers that store their activations",
        ))
    if stored and not knobs.flash_attention:
        scores = model.num_heads * seq_len * seq_len * knobs.micro_batch_size // knobs.tp
        found.append(HfDifference(
            "activations", stored * scores * 4,
            f"transformers' eager attention runs its softmax in fp32 and keeps the fp32 probabilities beside their "
            f"16-bit cast, in each of the {stored} layers that store their activations",
        ))
    return found
