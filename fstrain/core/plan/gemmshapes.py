"""The GEMMs a transformer block runs, by shape: what ``fstrain bench --model`` measures.

A GEMM here is ``C[m x n] = A[m x k] @ B[k x n]``: ``2 m n k`` FLOPs, ``k`` the inner (summed)
dimension. :func:`model_gemms` lists what one block runs for ``tokens`` tokens (micro-batch x
sequence), from the planner's own :func:`fstrain.core.plan.memory.block_matmuls`, so the shapes
``fstrain bench --model`` measures are the shapes the planner prices:

- forward ``y = x W^T``: ``(m, n, k) = (tokens, out, in)``;
- backward, input gradient ``dx = dy W``: ``(tokens, in, out)``;
- backward, weight gradient ``dW = dy^T x``: ``(out, in, tokens)``.

Under tensor parallelism the column-parallel linears (q, k, v, gate, up, the output head) keep
``out / tp`` of their outputs and the row-parallel ones (o, down) ``in / tp`` of their inputs
(Megatron-LM's split; torchtitan's Llama plan is the same), and every rank runs all ``tokens``.
A mixture of experts runs each expert's matmuls on ``tokens x top_k / num_experts`` tokens on
average (dropless, balanced routing, as the memory model counts it), and its shared expert's (and
Qwen2-MoE's hidden -> 1 gate's) on every token.
"""

from __future__ import annotations

from dataclasses import dataclass

from fstrain.core.plan.memory import block_matmuls, shared_expert_matmuls
from fstrain.core.plan.schema import ModelSpec
from fstrain.errors import InputError


@dataclass(frozen=True)
class GemmShape:
    """One GEMM of a step: ``C[m x n] = A[m x k] @ B[k x n]``; ``label`` says which (``q fwd``)."""

    m: int
    n: int
    k: int
    label: str = ""

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


def _linear_names(model: ModelSpec) -> list[tuple[str, bool]]:
    """Names of block_matmuls' entries, in its order, and whether each is row-parallel under TP."""
    attention = [("q", False), ("k", False), ("v", False), ("o", True)]
    mlp = [("gate", False), ("up", False), ("down", True)] if model.gated else [("up", False), ("down", True)]
    return attention + mlp


def model_gemms(model: ModelSpec, tokens: int, tp: int = 1, *, head: bool = True) -> list[GemmShape]:
    """The distinct GEMMs of one block (forward, input gradient, weight gradient of every linear)
    and, with ``head``, of the output layer, for ``tokens`` tokens on one of ``tp`` ranks; shapes
    that repeat (k and v, gate and up) are listed once, labelled with every linear that runs them."""
    if tokens < 1 or tp < 1:
        raise InputError(f"tokens and tp must be at least 1, got tokens={tokens}, tp={tp}",
                         "give a positive --seq-len, --micro-batch and --tp", "GEMM shapes")
    expert_tokens = tokens
    if model.moe is not None:
        expert_tokens = max(1, round(tokens * model.moe.top_k / model.moe.num_experts))
    linears: list[tuple[str, int, int, int]] = []  # name, in, out, tokens
    for index, ((n_in, n_out), (name, row)) in enumerate(zip(block_matmuls(model), _linear_names(model), strict=True)):
        split_in, split_out = (_split(n_in, tp, name), n_out) if row else (n_in, _split(n_out, tp, name))
        rows = expert_tokens if (model.moe is not None and index >= 4) else tokens
        linears.append((("expert " if model.moe is not None and index >= 4 else "") + name, split_in, split_out, rows))
    shared_names = [(f"shared {name}", row) for name, row in _linear_names(model)[4:]] + [("shared gate", False)]
    for (n_in, n_out), (name, row) in zip(shared_expert_matmuls(model), shared_names, strict=False):
        # The gate's one output is not split (exact=False keeps it 1 wide on every rank).
        split_in, split_out = (_split(n_in, tp, name), n_out) if row else (n_in, _split(n_out, tp, name, n_out > 1))
        linears.append((name, split_in, split_out, tokens))
    if head:
        linears.append(("head", model.hidden_size, _split(model.vocab_size, tp, "head", exact=False), tokens))
    shapes: dict[tuple[int, int, int], list[str]] = {}
    for name, n_in, n_out, rows in linears:
        for kind, key in (("fwd", (rows, n_out, n_in)), ("dgrad", (rows, n_in, n_out)), ("wgrad", (n_out, n_in, rows))):
            shapes.setdefault(key, []).append(f"{name} {kind}")
    return [GemmShape(m, n, k, ", ".join(labels)) for (m, n, k), labels in shapes.items()]


def _split(width: int, tp: int, name: str, exact: bool = True) -> int:
    if exact and width % tp:
        raise InputError(f"{tp} does not divide the {name} projection's width {width}",
                         "give a --tp that divides the model's widths (heads, FFN)", "--tp")
    return max(1, -(-width // tp))
