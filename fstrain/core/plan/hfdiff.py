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
- Attention through SDPA (the plan with FlashAttention), per layer that stores its activations
  (measured at 2 and 3 layers of each model on fake tensors, to the byte): transformers' rotary
  positions (``apply_rotary_pos_emb``) keep no rotated copy of q, ``q x a`` bytes per token fewer
  than the bundled model; without a mask SDPA takes K and V at their own width (``enable_gqa``,
  ``sdpa_attention_forward``), where the bundled model repeats them to every query head, ``2 (q -
  kv) x a`` fewer (Llama 3.1 8B at 4096 tokens: 80 MiB a layer fewer in all). With a sliding
  window that does not cover the batch (Mistral 7B v0.1 at 4096 tokens: the window is 4096)
  transformers builds a boolean mask (transformers 5.25.0 ``masking_utils.py`` L286,
  ``_ignore_causal_mask_sdpa``: no skipping once ``kv_length >= local_attention_size``), repeats
  K and V, and SDPA converts the mask to the query's dtype in every layer and keeps that copy for
  backward (``convert_boolean_attn_mask`` in aten's ``scaled_dot_product_attention``; measured on
  the CPU kernel, and on a GPU a mask selects the memory-efficient kernel, which keeps its
  attention bias for backward too): ``s x b x a`` bytes per token more (Mistral 7B at 4096: +32
  MiB, against 32 MiB fewer for q, a layer). Phi-3's fused ``qkv_proj`` keeps its whole output
  (v is a view of it): ``(q + 2 kv) x a`` more (Phi-3 mini at 2040 tokens: 23.9 MiB a layer more
  in all, to the byte).
- Eager attention (the plan without FlashAttention) runs its softmax in fp32
  (``models/llama/modeling_llama.py`` L197, ``eager_attention_forward``:
  ``softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)``) and keeps those
  probabilities beside their 16-bit cast, which the planner counts alone: ``4 x heads x s x s x b``
  bytes more per layer that stores its activations (Llama 3.2 1B, 1 x 2048: 512 MiB a layer; the
  trace holds 556, the 44 MiB left, 8 % of the difference, not accounted for).

The trace answers transformers' packed-sequence check for the real batch
(:func:`fstrain.train.hf_model.unpacked_batches`); the figures above are for unpacked batches.
"""

from __future__ import annotations

from dataclasses import dataclass

from fstrain.core.plan.acpolicy import checkpointed_blocks
from fstrain.core.plan.memory import comm_bytes, weight_bytes
from fstrain.core.plan.modelsize import ParamCount
from fstrain.core.plan.schema import ModelSpec, PlanKnobs

# The strategies whose FSDP2 units reshard after forward (the bundled trainer's root included).
RESHARDING = ("fsdp-full", "fsdp-hybrid")
# model_types whose attention computes q, k and v with one fused linear (Phi-3's qkv_proj).
FUSED_QKV = ("phi3",)


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


def hf_differences(model: ModelSpec, params: ParamCount, knobs: PlanKnobs, phase: str,
                   model_type: str = "") -> list[HfDifference]:
    """What the trace of transformers' model holds beside the planner's breakdown at its peak
    ``phase`` (the module docstring says each item's cause); ``model_type``: the config.json's."""
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
    if knobs.flash_attention and stored:
        sdpa = _sdpa_difference(model, knobs, seq_len, stored, model_type in FUSED_QKV)
        if sdpa.bytes:  # Mistral at its window's length: the mask's copy and q's cancel
            found.append(sdpa)
    if stored and not knobs.flash_attention:
        scores = model.num_heads * seq_len * seq_len * knobs.micro_batch_size // knobs.tp
        found.append(HfDifference(
            "activations", stored * scores * 4,
            f"transformers' eager attention runs its softmax in fp32 and keeps the fp32 probabilities beside their "
            f"16-bit cast, in each of the {stored} layers that store their activations",
        ))
    return found


def _sdpa_difference(model: ModelSpec, knobs: PlanKnobs, seq_len: int, stored: int, fused_qkv: bool) -> HfDifference:
    """What transformers' SDPA attention stores beside the bundled model's, over ``stored`` layers."""
    a = weight_bytes(knobs.precision)
    tokens = seq_len * knobs.micro_batch_size
    q, kv = model.q_width, model.kv_width
    rotated = q if model.position_embedding == "rope" else 0
    masked = min(stored, model.windowed_layers) if attention_masked(model, seq_len) else 0
    per_layer = -rotated * a * tokens + (q + 2 * kv) * a * tokens * fused_qkv
    total = stored * per_layer - (stored - masked) * 2 * (q - kv) * a * tokens + masked * seq_len * tokens * a
    why = ["no rotated copy of q" if rotated else "",
           "K and V at their own width" if masked < stored and kv < q else "",
           f"a 16-bit copy of the sliding-window mask ({model.sliding_window} tokens do not cover {seq_len})"
           if masked else "", "the fused qkv_proj's whole output kept" if fused_qkv else ""]
    said = "; ".join(w for w in why if w)
    return HfDifference("activations", total // knobs.tp,
                        f"transformers' SDPA attention: {said} ({stored} layers store their activations)")
