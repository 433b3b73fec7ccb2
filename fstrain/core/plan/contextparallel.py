"""Context parallelism as torchtitan runs it: ring attention over ``cp`` ranks per sequence.

Sources (read at these commits):

- torchtitan ``torchtitan/parallelisms/parallel_dims.py`` @01223650a29e: the world is
  ``dp_replicate x dp_shard x cp x tp x pp``, meshed in that order (``cp`` inside ``dp_shard``,
  outside ``tp``), and ``dp_shard`` and ``cp`` are flattened into one mesh that FSDP2 shards the
  parameters over and reduces the gradients over ("dp_cp"; later "dp_shard_cp"). The cp ranks of
  a sequence hold the same batch: the global batch counts ``dp`` only.
- torchtitan ``train.py`` (``create_context_parallel_ctx`` over the inputs, the labels and the
  rotary table): every rank embeds, runs its blocks and computes the loss for ``seq_len / cp``
  tokens; only attention sees the other ranks' keys and values.
- torch ``torch/distributed/tensor/experimental/_attention.py`` @0123248a484f (what
  ``context_parallel`` dispatches SDPA to): ``_templated_ring_attention`` with
  ``enable_load_balance=True`` (each rank holds chunks ``i`` and ``2cp-1-i`` of ``2 cp`` equal
  chunks, so the sequence must divide by ``2 cp`` and every rank does ``1/cp`` of the causal
  attention work) and torchtitan's default ``context_parallel_rotate_method = "allgather"``:
  forward all-gathers the K/V chunks once, issued before the first (local) chunk's SDPA and
  awaited after it; backward all-gathers K/V again and passes the dK/dV accumulators around the
  ring in fp32 (``convert_to_f32=True``, all-to-all rotater) once per step, ``cp`` times.
  torchtitan's Llama repeats K and V to every query head before SDPA (``repeat_kv``), so the
  chunks that travel are ``num_heads`` wide.

DeepSpeed's ZeRO engine has no ring attention; DeepSpeed-Ulysses is a different scheme (an
all-to-all that trades the sequence split for a head split around attention), not modelled here.
"""

from __future__ import annotations

from dataclasses import replace

from fstrain.core.plan.precision import mode
from fstrain.core.plan.schema import ModelSpec, PlanKnobs

CP_STRATEGIES = ("fsdp-full", "fsdp-grad-op", "fsdp-hybrid")  # torchtitan applies CP under FSDP2
RING_BUFFER_ITEM = "ring attention buffers (one layer's backward, cp > 1)"


def cp_problem(
    cp: int, strategy: str | None, pp: int | None, ep: int | None, flash_attention: bool, seq_len: int
) -> tuple[str, str] | None:
    """Why ``cp`` cannot run with the rest of the configuration, as (what, hint); None if it can.
    ``None`` for strategy, pp or ep means "not chosen yet" (a planner pin left open)."""
    if cp == 1:
        return None
    if strategy is not None and strategy not in CP_STRATEGIES:
        return (
            f"context parallelism does not run with {strategy}",
            "ring-attention CP is torchtitan's, under FSDP2: use --strategy fsdp-full, fsdp-grad-op or fsdp-hybrid "
            "(DeepSpeed's ZeRO has no ring attention; DeepSpeed-Ulysses is a different sequence-parallel scheme, "
            "which fstrain does not plan)",
        )
    if pp is not None and pp > 1:
        return (f"context parallelism with pipeline parallelism (pp={pp}) is not modelled",
                "use --pp 1 with --cp, or --cp 1 with a pipeline")
    if ep is not None and ep > 1:
        return (f"context parallelism with expert parallelism (ep={ep}) is not modelled",
                "use --ep 1 with --cp, or --cp 1 with expert parallelism")
    if not flash_attention:
        return ("ring attention needs a FlashAttention-style SDPA kernel (flash, memory-efficient or cuDNN)",
                "drop --no-flash-attention, or use --cp 1")
    if seq_len and seq_len % (2 * cp):
        return (f"the sequence of {seq_len} tokens does not split into 2 x cp = {2 * cp} equal chunks "
                "(load-balanced causal sharding)",
                f"use a --seq-len that is a multiple of {2 * cp}, or another --cp")
    return None


def cp_rank_view(knobs: PlanKnobs) -> PlanKnobs:
    """``knobs`` as one context-parallel rank's FSDP sees them: a data-parallel rank of
    ``dp x cp`` (parameters sharded and gradients reduced over them, hybrid groups ``cp`` times
    larger) that runs ``seq_len / cp`` tokens per sequence. The tokens per step are unchanged
    (``dp x cp`` sequences of ``seq_len / cp``). ``knobs`` itself when ``cp`` is 1."""
    cp = knobs.cp
    if cp == 1:
        return knobs
    return replace(knobs, dp=knobs.dp * cp, shard_group_size=knobs.shard_group_size * cp,
                   seq_len=knobs.seq_len // cp, cp=1)


def ring_chunk_bytes(model: ModelSpec, knobs: PlanKnobs, element_bytes: int | None = None) -> int:
    """Bytes of one rank's K and V chunk for one micro-batch: ``b x s/cp`` tokens, K and V each
    ``num_heads x head_dim`` wide (repeated to every query head), this rank's heads under TP, in
    ``element_bytes`` (default the compute dtype)."""
    a = element_bytes or mode(knobs.precision).compute_bytes
    tokens = knobs.micro_batch_size * knobs.seq_len // knobs.cp
    return tokens * 2 * model.num_heads * model.attn_head_dim * a // knobs.tp


def ring_buffer_bytes(model: ModelSpec, knobs: PlanKnobs) -> int:
    """What ring attention allocates beyond the tensors a block saves, at its highest point (one
    layer's attention backward; forward holds less): the all-gathered K/V of all ``cp`` chunks
    and the concatenated local chunk sent into it; the fp32 dQ accumulator; the fp32 dK/dV
    accumulator, the one received and the concatenation being sent (three fp32 K/V chunks); and
    one step's SDPA gradients (dQ, dK, dV) in the compute dtype. 0 without context parallelism."""
    if knobs.cp == 1:
        return 0
    kv = ring_chunk_bytes(model, knobs)
    q = kv // 2  # the local Q (or output) chunk: one of the two equal-width K and V
    kv32 = ring_chunk_bytes(model, knobs, 4)
    q32 = kv32 // 2
    return (knobs.cp + 1) * kv + q32 + 3 * kv32 + 3 * q
