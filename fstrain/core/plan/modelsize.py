"""Parameter counts of a decoder-only transformer, derived from its architecture.

The count follows the modules a PyTorch implementation builds (Hugging Face Llama/GPT-2
layouts): separate q/k/v/o projections (num_heads x head_dim and num_kv_heads x head_dim wide,
biased as linear_bias or attention_bias says, with Qwen3's per-head or OLMo 2's whole-projection
q/k norms), a two-matrix GeLU FFN (fc1, fc2) or a three-matrix gated one (SwiGLU, GeGLU: gate,
up, down), one norm before attention and one before the FFN (Gemma 2 and 3 add one after each),
a final norm, and an output head unless it is tied to the token embedding. A fused projection
(Phi-3's qkv_proj and gate_up_proj) holds the same parameters as the separate ones. Every count
is checked against transformers' own on real ``config.json`` files
(tests/unit/test_hf_param_counts.py). For a GPT with GeLU 4h, biases,
LayerNorm and learned positions this is Narayanan et al. 2021 eq. 2,
``12 l h^2 (1 + 13/(12 h) + (V + s)/(12 l h))``, plus the final LayerNorm (2h).

A model trained without a vocabulary head (``--loss none``: sequence classification or
regression) has no output head even when it is not tied (Hugging Face's ``*ForSequenceClassification``
classes build none), and a classification head of its own when the recipe names one: BERT's
``BertPooler`` (``pooler: true``: hidden x hidden + bias, tanh, on the first token) and the
classifier ``nn.Linear(hidden, num_labels)`` (``num_labels``), with biases as ``linear_bias``
(transformers ``src/transformers/models/bert/modeling_bert.py``: ``BertPooler``,
``BertForSequenceClassification``). BERT's token-type embeddings (2 x hidden) are not counted:
2,048 parameters of bert-large's 335 million.

A mixture-of-experts layer replaces the FFN by ``num_experts`` FFNs of ``expert_ffn_hidden_size``
and a bias-free router (hidden x num_experts); a token runs through ``top_k`` of them, and through
the shared expert (an FFN of ``shared_ffn_hidden_size``, with Qwen2-MoE's hidden x 1 gate) if
there is one.
"""

from __future__ import annotations

from dataclasses import dataclass

from fstrain.core.plan.schema import ModelSpec


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
    head: int  # 0 when tied to the embedding, or without a vocabulary head
    num_layers: int
    largest_module: int  # the biggest single nn.Module (DeepSpeed's "largest layer")
    classifier: int = 0  # a classification head: pooler + classifier (with the last stage's head)
    vocab_head: bool = True  # the model computes logits over its vocabulary (loss is not "none")

    @property
    def per_layer(self) -> int:
        return self.attention_per_layer + self.ffn_per_layer + self.router_per_layer + self.norms_per_layer

    @property
    def layers(self) -> int:
        return self.per_layer * self.num_layers

    @property
    def total(self) -> int:
        return self.embedding + self.position_embedding + self.layers + self.final_norm + self.head + self.classifier

    @property
    def active_per_token(self) -> int:
        """Parameters one token touches (MoE: only its top-k experts)."""
        inactive = (self.ffn_per_layer - self.ffn_active_per_layer) * self.num_layers
        return self.total - inactive


def _ffn_params(hidden: int, ffn: int, gated: bool, bias: bool) -> tuple[int, int]:
    """(parameters, largest matrix incl. bias) of one FFN."""
    matrices = 3 if gated else 2
    weights = matrices * hidden * ffn
    biases = ((matrices - 1) * ffn + hidden) if bias else 0
    return weights + biases, hidden * ffn + (ffn if bias else 0)


def classifier_params(model: ModelSpec) -> int:
    """Parameters of the recipe's classification head: the pooler and the classifier."""
    h, bias = model.hidden_size, model.linear_bias
    pooler = h * h + (h if bias else 0) if model.pooler else 0
    labels = model.num_labels
    return pooler + h * labels + (labels if bias else 0)


def qk_norm_params(model: ModelSpec) -> int:
    """Weights of one block's query and key norms, RMSNorms in every model that has them (Qwen3,
    Gemma 3, OLMo 2): one head_dim-wide weight each (``head``, shared by the heads), or one as
    wide as the q and the k projection (``projection``)."""
    if model.qk_norm == "head":
        return 2 * model.attn_head_dim
    if model.qk_norm == "projection":
        return model.q_width + model.kv_width
    return 0


def attention_params(model: ModelSpec) -> int:
    """One block's attention: q, k, v and output projections, their biases and the q/k norms."""
    h, q_width, kv_width = model.hidden_size, model.q_width, model.kv_width
    biases = (q_width + 2 * kv_width if model.qkv_bias else 0) + (h if model.out_bias else 0)
    return 2 * h * q_width + 2 * h * kv_width + biases + qk_norm_params(model)


def count_parameters(model: ModelSpec, vocab_head: bool = True) -> ParamCount:
    """Derive the parameter count of ``model`` part by part; ``vocab_head`` False (``--loss none``)
    leaves out the output head over the vocabulary."""
    h = model.hidden_size
    bias = model.ffn_bias
    norm_params = 2 * h if model.norm == "layernorm" else h
    if model.moe is None:
        ffn, largest_ffn = _ffn_params(h, model.ffn_hidden_size, model.gated, bias)
        ffn_active, router = ffn, 0
    else:
        expert, largest_ffn = _ffn_params(h, model.moe.expert_ffn_hidden_size, model.gated, bias)
        shared = 0
        if model.moe.shared_ffn_hidden_size:
            shared, largest_shared = _ffn_params(h, model.moe.shared_ffn_hidden_size, model.gated, bias)
            largest_ffn = max(largest_ffn, largest_shared)
        # The shared expert runs for every token: it counts among the active parameters.
        ffn, ffn_active = expert * model.moe.num_experts + shared, expert * model.moe.top_k + shared
        router = h * model.moe.num_experts + (h if model.moe.shared_expert_gate else 0)
    embedding = model.vocab_size * h
    largest = max(embedding, h * model.q_width + (model.q_width if model.qkv_bias else 0), largest_ffn)
    return ParamCount(
        embedding=embedding,
        position_embedding=model.seq_len * h if model.position_embedding == "learned" else 0,
        attention_per_layer=attention_params(model),
        ffn_per_layer=ffn,
        ffn_active_per_layer=ffn_active,
        router_per_layer=router,
        norms_per_layer=model.norms_per_block * norm_params,
        final_norm=norm_params,
        head=0 if model.tied_embeddings or not vocab_head else embedding,
        num_layers=model.num_layers,
        largest_module=largest,
        classifier=classifier_params(model),
        vocab_head=vocab_head,
    )


def parameter_shapes(model: ModelSpec, vocab_head: bool = True) -> list[tuple[int, ...]]:
    """The shape of every parameter tensor, as ``torch.nn.Linear`` (out, in) and ``nn.Embedding``
    (rows, hidden) hold them, in the layout :func:`count_parameters` counts (its total is the sum
    of their sizes). An optimizer that works per tensor (Adafactor's factored second moment)
    needs these, not the count. A mixture of experts' expert weights are one (out, in) matrix per
    expert (Hugging Face's Mixtral; a grouped 3-D weight factors the same way)."""
    h, q_width, kv_width = model.hidden_size, model.q_width, model.kv_width
    Shape = tuple[int, ...]
    norm: list[Shape] = [(h,)] * (2 if model.norm == "layernorm" else 1)
    block: list[Shape] = [(q_width, h), (kv_width, h), (kv_width, h), (h, q_width)]
    if model.qkv_bias:
        block += [(q_width,), (kv_width,), (kv_width,)]
    if model.out_bias:
        block.append((h,))
    if model.qk_norm == "head":
        block += [(model.attn_head_dim,)] * 2
    elif model.qk_norm == "projection":
        block += [(q_width,), (kv_width,)]
    block += _ffn_shapes(model) + norm * model.norms_per_block
    shapes: list[Shape] = [(model.vocab_size, h)]
    if model.position_embedding == "learned":
        shapes.append((model.seq_len, h))
    shapes += block * model.num_layers + norm
    if vocab_head and not model.tied_embeddings:
        shapes.append((model.vocab_size, h))
    bias = model.linear_bias
    if model.pooler:
        shapes += [(h, h)] + ([(h,)] if bias else [])
    if model.num_labels:
        shapes += [(model.num_labels, h)] + ([(model.num_labels,)] if bias else [])
    return shapes


def _ffn_shapes(model: ModelSpec) -> list[tuple[int, ...]]:
    """One block's feed-forward tensors: the FFN, or the router, the experts and a shared expert."""
    h = model.hidden_size

    Shape = tuple[int, ...]

    def one_ffn(width: int) -> list[Shape]:
        ffn_in = 2 if model.gated else 1
        weights: list[Shape] = [(width, h)] * ffn_in
        weights.append((h, width))
        if not model.ffn_bias:
            return weights
        biases: list[Shape] = [(width,)] * ffn_in
        return [*weights, *biases, (h,)]

    if model.moe is None:
        return one_ffn(model.ffn_hidden_size)
    shapes: list[Shape] = [(model.moe.num_experts, h)]  # the router, bias-free
    shapes += one_ffn(model.moe.expert_ffn_hidden_size) * model.moe.num_experts
    if model.moe.shared_ffn_hidden_size:
        shapes += one_ffn(model.moe.shared_ffn_hidden_size)
    if model.moe.shared_expert_gate:
        shapes.append((1, h))
    return shapes
