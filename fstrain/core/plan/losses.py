"""How the training code computes the loss, and what that holds per logit at the loss's two peaks.

The logits of a large vocabulary are the biggest tensors of a step, and each loss implementation
keeps different copies of them. Each ``--loss`` value names one implementation; its bytes per
logit element are read off its source and checked against PyTorch's own trace of the bundled
trainer (``fstrain plan --trace``, ``tests/unit/test_loss_memory.py``). ``w`` is the compute
dtype's size (2 for bf16/fp16, 4 for fp32); ``n`` the logit elements (tokens x vocabulary / TP);
``c`` one chunk's elements.

- ``full``: ``F.cross_entropy(logits.float(), ...)``, the bundled trainer's, torchtitan's
  (``cross_entropy_loss``) and Hugging Face's (``ForCausalLMLoss``) loss, eager. Forward peaks in
  ``log_softmax``: the logits (w), their fp32 copy (4; in fp32 the copy of the shifted view) and
  the fp32 log-softmax it saves (4). Backward peaks in ``log_softmax``'s backward: the saved
  log-softmax, ``nll_loss``'s dense fp32 gradient and ``log_softmax``'s fp32 output (4 + 4 + 4);
  the logits are gone by then (nothing keeps them for backward). Peak: backward, 12.
- ``fused``: a fused cross-entropy kernel on the logits in the compute dtype (flash-attn's
  ``CrossEntropyLoss``, llm-foundry's default ``fused_crossentropy``): it keeps the logits for
  backward (w) and writes their gradient in the compute dtype (w). Peak: backward, 2w.
- ``megatron``: Megatron-LM's ``vocab_parallel_cross_entropy`` as DeepSpeedExamples' Megatron-LM
  (2020, DeepSpeed's ZeRO and ZeRO-Offload tutorials) runs it: ``FP16_Module`` returns the logits
  in fp32 (4, held by ``forward_step`` through the loss), the loss clones them (4) and takes
  ``exp`` of the clone out of place (4); backward works in place on the saved softmax (4) and
  casts it to the compute dtype (w). Peak: forward, 12.
- ``megatron-core``: Megatron-LM core's version (``megatron/core/tensor_parallel/cross_entropy.py``
  at 19a9b780, as ATorch's ``vocab_parallel_cross_entropy`` forks it): called on
  ``logits.float()`` while the caller still holds the logits (w), it subtracts the row maximum
  out of place (4 beside the fp32 copy's 4) and takes ``exp`` in place; backward as above. Peak:
  forward, w + 8. (Later Megatron-LM versions subtract in place: ``megatron-inplace``.)
- ``megatron-inplace``: Megatron-LM core's current version (NVIDIA/Megatron-LM
  ``megatron/core/tensor_parallel/cross_entropy.py`` @d98e8a6 L25 ``.float()``, L42 ``-=``): the
  caller's logits (w) and one fp32 copy (4), on which the max is subtracted and ``exp`` taken in
  place and which is saved as the softmax; backward as above. Peak: forward and backward, w + 4.
- ``litgpt``: LitGPT's ``chunked_cross_entropy`` (Lightning-AI/litgpt ``litgpt/utils.py`` @2685705
  L302-352, default ``chunk_size=128``), called on the logits in the compute dtype as the caller
  holds them (``litgpt/finetune/full.py`` L284, ``pretrain.py`` L354): ``F.cross_entropy`` per chunk
  of 128 tokens without an upcast, so each chunk's log-softmax is saved in the compute dtype (w
  over all chunks). Forward: the logits and the saved log-softmaxes, 2w (a micro-batch above one
  adds the contiguous copy that ``reshape`` makes of the shifted logits, freed before backward).
  Backward: the logits (still held by the training loop), the saved log-softmaxes, every chunk's
  gradient and their concatenation into the logits' gradient (``split``'s backward), 4w.
- ``chunked:N``: torchtune's ``CEWithChunkedOutputLoss`` (default 8 chunks), eager: the output
  projection runs per chunk of tokens (``chunked_output``), so every chunk's logits are
  materialised at once (w); each chunk is upcast (4c) and its log-softmax saved (4 per logit over
  all chunks). Forward peaks at the last chunk: ``wn + 4n + 4c``. Backward runs the chunks' losses
  last to first, each with ``nll_loss``'s and ``log_softmax``'s fp32 gradients (8c) while the
  saved log-softmaxes are still there: ``4n + 8c``. ``chunked:1`` is ``full`` in bf16/fp16.
- ``none``: no vocabulary head at all: a model trained on a pooled or per-token head of its own
  (sequence classification or regression, e.g. Hugging Face's ``BertForSequenceClassification``:
  ``BertPooler`` (hidden x hidden, tanh) on the first token, then ``nn.Linear(hidden,
  num_labels)``, ``modeling_bert.py``). There are no logits over the vocabulary, so no logits
  spike (0 bytes here), no LM-head matmul, and no untied output matrix; the model's own head is
  described by ``pooler`` and ``num_labels`` in the recipe (``fstrain.core.plan.modelsize``).
"""

from __future__ import annotations

from dataclasses import dataclass

from fstrain.errors import InputError

LOSS_KINDS = ("full", "fused", "megatron", "megatron-core", "megatron-inplace", "litgpt", "chunked", "none")
DEFAULT_CHUNKS = 8  # torchtune's CEWithChunkedOutputLoss(num_output_chunks=8)
TRAINER_LOSSES = ("full", "chunked")  # what the bundled trainer computes (fstrain/train/steps.py)


def parse_loss(value: str, where: str) -> str:
    """The canonical name of a ``--loss`` value: ``chunked`` becomes ``chunked:8``."""
    kind, _, count = value.partition(":")
    if kind not in LOSS_KINDS or (count and kind != "chunked"):
        raise InputError(f"unknown loss {value!r}", f"use one of {', '.join(LOSS_KINDS)} (chunked:N takes a number)",
                         where)
    if kind != "chunked":
        return kind
    if not count:
        return f"chunked:{DEFAULT_CHUNKS}"
    if not count.isdigit() or int(count) < 1:
        raise InputError(f"loss {value!r}: the chunk count must be a positive integer", "e.g. chunked:8", where)
    return f"chunked:{int(count)}"


def has_vocab_head(loss: str) -> bool:
    """Whether the model computes logits over its vocabulary (every loss but ``none``)."""
    return loss != "none"


def loss_chunks(loss: str) -> int:
    """Chunks of tokens the loss is computed in (1 unless ``chunked:N``)."""
    kind, _, count = loss.partition(":")
    return int(count) if kind == "chunked" else 1


@dataclass(frozen=True)
class LossPeaks:
    """Bytes the loss holds over the logits at its forward and its backward peak."""

    forward: int
    backward: int

    @property
    def peak(self) -> int:
        return max(self.forward, self.backward)

    @property
    def moment(self) -> str:
        """Where the peak lies: ``forward`` or ``backward`` (a tie reads as backward)."""
        return "forward" if self.forward > self.backward else "backward"


def loss_peaks(loss: str, logits: int, compute_bytes: int) -> LossPeaks:
    """What ``loss`` holds over ``logits`` elements (see the module docstring for each source)."""
    n, w = logits, compute_bytes
    kind = loss.partition(":")[0]
    if kind == "none":
        return LossPeaks(0, 0)
    if kind == "fused":
        return LossPeaks(w * n, 2 * w * n)
    if kind == "megatron":
        return LossPeaks(12 * n, (4 + w) * n)
    if kind == "megatron-core":
        return LossPeaks((w + 4 + 4) * n, (4 + w) * n)
    if kind == "megatron-inplace":
        return LossPeaks((w + 4) * n, (4 + w) * n)
    if kind == "litgpt":
        return LossPeaks(2 * w * n, 4 * w * n)
    chunks = loss_chunks(loss)
    c = -(-n // chunks)  # the largest chunk
    upcast = 4 if w != 4 else 0  # .float() of an fp32 chunk is the chunk itself
    if kind == "chunked":
        return LossPeaks(w * n + 4 * n + upcast * c, 4 * n + 8 * c)
    # full: the copy is an upcast, or in fp32 the contiguous copy of the shifted logits
    return LossPeaks((w + 4 + 4) * n, 12 * n)
