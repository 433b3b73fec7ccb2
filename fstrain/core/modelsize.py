"""Parameter counts of a decoder-only transformer, derived from its architecture.

The count follows the modules a PyTorch implementation builds (Hugging Face Llama/GPT-2
layouts): separate q/k/v/o projections, a two-matrix GeLU FFN (fc1, fc2) or a three-matrix
SwiGLU FFN (gate, up, down), one norm before attention and one before the FFN, a final norm,
and an output head unless it is tied to the token embedding. For a GPT with GeLU 4h, biases,
LayerNorm and learned positions this is Narayanan et al. 2021 eq. 2,
``12 l h^2 (1 + 13/(12 h) + (V + s)/(12 l h))``, plus the final LayerNorm (2h).

A mixture-of-experts layer replaces the FFN by ``num_experts`` FFNs of ``expert_ffn_hidden_size``
and a bias-free router (hidden x num_experts); a token runs through ``top_k`` of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from fstrain.core.planfile import ModelSpec


@dataclass(frozen=True)
class ParamCount:
    """Parameters by part; ``*_per_layer`` values are for one transformer block."""

    embedding: int
    position_embedding: int
    attention_per_layer: int
    ffn_per_layer: int  # all experts for MoE
    ffn_active_per_layer: int  # the top-k experts a token uses (= ffn_per_layer when dense)
    router_per_layer: int
    norms_per_layer: int
    final_norm: int
    head: int  # 0 when tied to the embedding
    num_layers: int
    largest_module: int  # the biggest single nn.Module (DeepSpeed's "largest layer")

    @property
    def per_layer(self) -> int:
        return self.attention_per_layer + self.ffn_per_layer + self.router_per_layer + self.norms_per_layer

    @property
    def layers(self) -> int:
        return self.per_layer * self.num_layers

    @property
    def total(self) -> int:
        return self.embedding + self.position_embedding + self.layers + self.final_norm + self.head

    @property
    def active_per_token(self) -> int:
        """Parameters one token touches (MoE: only its top-k experts)."""
        inactive = (self.ffn_per_layer - self.ffn_active_per_layer) * self.num_layers
        return self.total - inactive


def _ffn_params(hidden: int, ffn: int, activation: str, bias: bool) -> tuple[int, int]:
    """(parameters, largest matrix incl. bias) of one FFN."""
    matrices = 3 if activation == "swiglu" else 2
    weights = matrices * hidden * ffn
    biases = ((matrices - 1) * ffn + hidden) if bias else 0
    return weights + biases, hidden * ffn + (ffn if bias else 0)


def count_parameters(model: ModelSpec) -> ParamCount:
    """Derive the parameter count of ``model`` part by part."""
    h = model.hidden_size
    q_width = model.num_heads * model.head_dim
    kv_width = model.num_kv_heads * model.head_dim
    bias = model.linear_bias
    attention = 2 * h * q_width + 2 * h * kv_width
    if bias:
        attention += q_width + 2 * kv_width + h
    norm_params = 2 * h if model.norm == "layernorm" else h
    if model.moe is None:
        ffn, largest_ffn = _ffn_params(h, model.ffn_hidden_size, model.activation, bias)
        ffn_active, router = ffn, 0
    else:
        expert, largest_ffn = _ffn_params(h, model.moe.expert_ffn_hidden_size, model.activation, bias)
        ffn, ffn_active = expert * model.moe.num_experts, expert * model.moe.top_k
        router = h * model.moe.num_experts
    embedding = model.vocab_size * h
    largest = max(embedding, h * q_width + (q_width if bias else 0), largest_ffn)
    return ParamCount(
        embedding=embedding,
        position_embedding=model.seq_len * h if model.position_embedding == "learned" else 0,
        attention_per_layer=attention,
        ffn_per_layer=ffn,
        ffn_active_per_layer=ffn_active,
        router_per_layer=router,
        norms_per_layer=2 * norm_params,
        final_norm=norm_params,
        head=0 if model.tied_embeddings else embedding,
        num_layers=model.num_layers,
        largest_module=largest,
    )
