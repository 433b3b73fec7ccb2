"""Parameter counts against Narayanan et al. 2021 (eq. 2, Table 1), Kaplan et al. and model cards."""

from __future__ import annotations

import pytest

from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.plan.schema import ModelSpec

# Narayanan et al. 2021 Table 1: (heads, hidden, layers) -> billions of parameters, V=51200, s=2048.
NARAYANAN_TABLE_1 = [
    (24, 2304, 24, "1.65"),
    (32, 3072, 30, "3.56"),
    (32, 4096, 36, "7.47"),
    (48, 6144, 40, "18.45"),
    (64, 8192, 48, "39.1"),
    (80, 10240, 60, "76.05"),
    (96, 12288, 80, "145.6"),
    (128, 16384, 96, "310.1"),
    (128, 20480, 105, "529.6"),
    (160, 25600, 128, "1008.0"),
]


def megatron_gpt(heads: int, hidden: int, layers: int, vocab: int = 51200, seq: int = 2048) -> ModelSpec:
    """The GPT of the Megatron papers: GeLU 4h, biases, LayerNorm, learned positions, tied head."""
    return ModelSpec(
        name="gpt",
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=heads,
        ffn_hidden_size=4 * hidden,
        activation="gelu",
        vocab_size=vocab,
        seq_len=seq,
        tied_embeddings=True,
        norm="layernorm",
        linear_bias=True,
        position_embedding="learned",
    )


@pytest.mark.parametrize(("heads", "hidden", "layers", "published"), NARAYANAN_TABLE_1)
def test_narayanan_equation_2_and_table_1(heads: int, hidden: int, layers: int, published: str) -> None:
    count = count_parameters(megatron_gpt(heads, hidden, layers))
    nl, h, v, s = layers, hidden, 51200, 2048
    equation_2 = 12 * nl * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * nl * h))
    # Equation 2 leaves out only the final LayerNorm (2h).
    assert count.total == round(equation_2) + 2 * h
    decimals = len(published.split(".")[1])
    assert f"{count.total / 1e9:.{decimals}f}" == published


def test_kaplan_non_embedding_count() -> None:
    # Kaplan et al. 2020: N = 12 n_layer d_model^2 for d_attn = d_ff / 4 = d_model (weights only).
    spec = megatron_gpt(16, 1024, 24)
    count = count_parameters(spec)
    weights = (count.attention_per_layer - 4 * 1024) + (count.ffn_per_layer - 5 * 1024)
    assert weights * 24 == 12 * 24 * 1024**2


def test_llama_3_2_3b_with_tied_embeddings() -> None:
    spec = ModelSpec("llama3.2-3b", 28, 3072, 24, 8, 8192, "swiglu", 128256, 8192, tied_embeddings=True)
    assert count_parameters(spec).total == 3_212_749_824  # model card: 3.21B


def test_largest_module_is_what_deepspeed_calls_the_largest_layer() -> None:
    llama = ModelSpec("l", 32, 4096, 32, 8, 14336, "swiglu", 128256, 8192)
    assert count_parameters(llama).largest_module == 128256 * 4096  # the embedding
    small_vocab = ModelSpec("l", 32, 4096, 32, 8, 14336, "swiglu", 1000, 8192)
    assert count_parameters(small_vocab).largest_module == 4096 * 14336  # one FFN matrix
