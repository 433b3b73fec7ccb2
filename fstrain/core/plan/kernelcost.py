"""What the kernels of one training step cost on one GPU: GEMMs by shape, attention by kernel,
memory-bound work by its HBM traffic, and the launch overhead of each kernel.

- **GEMMs** are priced on an efficiency curve (:class:`GemmEfficiency`): achieved TFLOP/s for
  one ``M x K @ K x N`` matmul in a dtype. :class:`PublishedGemmCurve` is the default, a roofline
  with the two quantization losses NVIDIA's "Matrix Multiplication Background User's Guide"
  (docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication, sections
  "Math And Memory Bounds", "Tile Quantization", "Wave Quantization") describes: cuBLAS splits
  ``C`` into ``128 x 128`` output tiles, each SM computes one tile at a time, so the GEMM takes
  ``ceil(tiles / SMs)`` waves of full tiles whatever part of the last wave or tile is used; a
  wave runs at ``LARGE_GEMM_PEAK_FRACTION`` of the tensor-core peak, the fraction a large square
  GEMM reaches (``fstrain bench`` measured 690 TFLOP/s for bf16 ``8192^3`` on an H200, 0.70 of
  989: tests/fixtures/gpu/h200-2026-11-30/bench-compute.json; the same fraction is assumed on
  other GPUs, whose large-GEMM rate was not measured here); and no GEMM beats reading its
  operands and writing its output once at the HBM rate (arithmetic intensity bound). A small or
  skinny GEMM loses to the waves and the bound; ``fstrain bench --suite compute`` measures the
  curve at the model's own shapes, which replaces this one.
- **Attention** by its kernel: FlashAttention (and SDPA's flash backend) at the fraction of the
  peak FlashAttention-2's own benchmarks reach (Dao, "FlashAttention-2", arXiv 2307.08691, fig. 4-6:
  forward + backward 50-73 % of the A100's peak at head dim 128, less at short sequences, about
  half that fraction on H100, which FlashAttention-3, arXiv 2407.08608 fig. 1, puts at 330-350
  TFLOP/s for FA2); a causal mask skips half the score blocks. Eager attention is two batched
  GEMMs per head (``QK^T``, ``AV``) on the GEMM curve and its ``s x s`` softmax, scale and mask
  as HBM traffic.
- **Memory-bound work** (norms, rotary, activations, residual adds, the loss over the logits,
  the optimizer's update) as bytes over the HBM bandwidth large copies reach.
- **Launch overhead**: eager PyTorch issues each kernel from the CPU; when a kernel's GPU work
  is shorter than issuing the next, the GPU waits. One micro-batch's kernels cost
  ``max(GPU time, host time)``; small models and micro-batches pay the second
  (:mod:`fstrain.core.plan.hostlaunch` prices the host's time per forward and backward kernel).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

TILE = 128  # cuBLAS's large output tile edge (the guide's 128 x 128 / 256 x 128 tiles)
LARGE_GEMM_PEAK_FRACTION = 0.70  # bf16 8192^3 on an H200: 690 of 989 TFLOP/s (see the module doc)
# FlashAttention-2's forward + backward rate at long sequences, as a fraction of the dense
# bf16 peak: A100 ~190 of 312 TFLOP/s (FA2 paper fig. 4, head dim 128, seq 8k-16k); H100
# ~330 of 989 (FA3 paper fig. 1, FA2 at head dim 128). Ampere-and-older / Hopper-and-newer.
FLASH_PEAK_FRACTION = {"ampere": 0.60, "hopper": 0.33}
# FA2's rate at sequence length s is about FLASH x s / (s + FLASH_HALF_SEQ): the figures show
# roughly half the long-sequence rate at 512 tokens.
FLASH_HALF_SEQ = 512
HOPPER_AND_NEWER = ("h100", "h200", "b200", "gb200", "mi300x")
# Streaming multiprocessors (AMD: compute units) per GPU, from the architecture whitepapers.
SMS = {
    "v100-16gb": 80, "v100-32gb": 80, "v100-pcie-16gb": 80, "v100-pcie-32gb": 80,
    "a100-40gb": 108, "a100-80gb": 108, "a100-pcie-40gb": 108, "a100-pcie-80gb": 108,
    "h100-sxm": 132, "h100-pcie": 114, "h100-nvl": 132, "h100-96gb": 132, "h200": 132, "h200-nvl": 132,
    "l40s": 142, "l4": 58, "b200": 148, "gb200": 152, "rtx-4090": 128, "rtx-a6000": 84, "mi300x": 304,
}
DEFAULT_SMS = 108


class GemmEfficiency(Protocol):
    """Achieved TFLOP/s of one GEMM ``(M x K) @ (K x N)`` in ``dtype`` (bf16, fp16, fp8, fp32)."""

    def tflops(self, m: int, n: int, k: int, dtype: str) -> float: ...


@dataclass(frozen=True)
class GpuRates:
    """What the kernel costs depend on, of one GPU: its name (for its SM count), dense peaks in
    FLOP/s per dtype, and HBM bandwidth in bytes/s."""

    name: str
    peak_flops: tuple[tuple[str, float], ...]
    hbm_bytes_per_s: float

    def peak(self, dtype: str) -> float:
        rates = dict(self.peak_flops)
        return rates.get(dtype) or rates.get("fp16") or rates["fp32"]

    @property
    def hopper_or_newer(self) -> bool:
        return self.name.startswith(HOPPER_AND_NEWER)


def generation(gpu_name: str) -> str:
    """The GPU's generation as the fitted constants group them: ``volta``, ``ampere`` (Ampere
    and Ada), ``hopper`` (Hopper and newer: Blackwell and MI300X have no runs of their own yet)."""
    if gpu_name.startswith(HOPPER_AND_NEWER):
        return "hopper"
    return "volta" if gpu_name.startswith("v100") else "ampere"


DTYPE_BYTES = {"fp8": 1, "bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class PublishedGemmCurve:
    """The default GEMM curve of one GPU (see the module doc): waves of 128 x 128 tiles at
    ``LARGE_GEMM_PEAK_FRACTION`` of the peak, bounded by the operands' HBM traffic."""

    gpu: GpuRates
    hbm_efficiency: float = 0.89

    def tflops(self, m: int, n: int, k: int, dtype: str) -> float:
        if min(m, n, k) <= 0:
            return 0.0
        sms = SMS.get(self.gpu.name, DEFAULT_SMS)
        waves = math.ceil(math.ceil(m / TILE) * math.ceil(n / TILE) / sms)
        compute_s = 2.0 * k * waves * sms * TILE * TILE / (self.gpu.peak(dtype) * LARGE_GEMM_PEAK_FRACTION)
        traffic = DTYPE_BYTES.get(dtype, 2) * (m * k + k * n + m * n)
        memory_s = traffic / (self.gpu.hbm_bytes_per_s * self.hbm_efficiency)
        return 2.0 * m * n * k / max(compute_s, memory_s) / 1e12


@dataclass
class KernelTime:
    """Seconds of GPU work by kind, and the number of kernels, of some part of a step."""

    gemm_s: float = 0.0
    attention_s: float = 0.0
    memory_s: float = 0.0  # elementwise, norms, loss, optimizer: HBM traffic
    autocast_s: float = 0.0  # autocast's casts (fstrain.core.plan.autocast): HBM traffic
    forward_kernels: float = 0.0  # issued by forward (and recomputed forward) ops
    backward_kernels: float = 0.0  # issued by autograd's engine
    graph_launches: float = 0.0  # the same work as CUDA graph replays: one a block and pass

    def add(self, other: KernelTime, times: float = 1.0) -> None:
        self.gemm_s += times * other.gemm_s
        self.attention_s += times * other.attention_s
        self.memory_s += times * other.memory_s
        self.autocast_s += times * other.autocast_s
        self.forward_kernels += times * other.forward_kernels
        self.backward_kernels += times * other.backward_kernels
        self.graph_launches += times * other.graph_launches

    @property
    def kernels(self) -> float:
        return self.forward_kernels + self.backward_kernels

    @property
    def gpu_s(self) -> float:
        return self.gemm_s + self.attention_s + self.memory_s + self.autocast_s


class GemmPricer:
    """Seconds of GEMMs on one curve, cached per shape (the planner's search asks for few shapes
    many times)."""

    def __init__(self, curve: GemmEfficiency) -> None:
        self.curve = curve
        self._seconds: dict[tuple[int, int, int, str], float] = {}

    def seconds(self, m: int, n: int, k: int, dtype: str) -> float:
        key = (m, n, k, dtype)
        cached = self._seconds.get(key)
        if cached is None:
            rate = self.curve.tflops(m, n, k, dtype)
            cached = 2.0 * m * n * k / (rate * 1e12) if rate > 0 else 0.0
            self._seconds[key] = cached
        return cached

    def linear(self, tokens: int, n_in: int, n_out: int, dtype: str) -> tuple[float, float]:
        """(forward, backward) seconds of one linear ``tokens x n_in -> n_out``: the forward GEMM,
        and backward's grad-input (``tokens x n_out @ n_out x n_in``) and grad-weight
        (``n_in x tokens @ tokens x n_out``)."""
        forward = self.seconds(tokens, n_out, n_in, dtype)
        backward = self.seconds(tokens, n_in, n_out, dtype) + self.seconds(n_in, n_out, tokens, dtype)
        return forward, backward


def flash_attention_s(
    gpu: GpuRates, dtype: str, flops_forward: float, seq_len: int, causal: bool
) -> tuple[float, float]:
    """(forward, backward) seconds of FlashAttention for ``flops_forward`` (``4 s^2 d`` per head
    and sequence, the full square); backward is 2.5x the forward's FLOPs (it recomputes QK^T)."""
    fraction = FLASH_PEAK_FRACTION["hopper" if gpu.hopper_or_newer else "ampere"]
    rate = gpu.peak(dtype) * fraction * seq_len / (seq_len + FLASH_HALF_SEQ)
    flops = flops_forward * (0.5 if causal else 1.0)
    return flops / rate, 2.5 * flops / rate


def eager_score_bytes(a: int, autocast: bool, dropout: bool) -> tuple[float, float]:
    """(forward, backward) HBM bytes per element of one ``s x s`` score matrix that eager
    attention's elementwise ops move, besides the two GEMMs, op by op as Hugging Face's
    ``BertSelfAttention.forward`` runs them (transformers src/transformers/models/bert/modeling_bert.py
    @004ad5f: ``attention_scores / math.sqrt(self.attention_head_size)``, ``attention_scores +
    attention_mask``, ``nn.Softmax(dim=-1)``, ``self.dropout(attention_probs)``, then
    ``torch.matmul(attention_probs, value_layer)``; GPT-2's eager attention the same with a
    ``torch.where`` for its causal mask).

    ``a`` is the compute dtype's bytes and ``p`` the softmax's: under autocast ``softmax`` is on
    the fp32 list (torch.amp's "CUDA Ops that can autocast to float32"), and the additive mask is
    in the parameters' dtype (``get_extended_attention_mask`` casts it to ``self.dtype``, fp32
    weights under autocast), so the masked scores are promoted to fp32 already. Forward: scale
    (read ``a``, write ``a``), mask (read ``a``, write ``p``), softmax (``2p``), dropout (read ``p``,
    write ``p`` and a 1-byte mask), and under autocast the matmul's cast of the probabilities back
    to ``a`` (``p + a``). Backward: the cast's gradient (``a + p``), dropout's (read ``p`` and the
    mask, write ``p``), softmax's (read the gradient and the saved output, write ``p``: ``3p``), the
    promotion's cast back to ``a`` under autocast (``p + a``), the scale's (``2a``)."""
    p = 4 if autocast else a
    cast = (p + a) if autocast else 0
    drop = (2 * p + 1) if dropout else 0
    forward = 2 * a + (a + p) + 2 * p + drop + cast
    backward = cast + drop + 3 * p + cast + 2 * a
    return float(forward), float(backward)


def eager_attention_s(
    gemms: GemmPricer, hbm_bytes_per_s: float, dtype: str, sequences_heads: int, seq_len: int, head_dim: int,
    autocast: bool = False, dropout: bool = False,
) -> tuple[float, float]:
    """(forward, backward) seconds of eager attention over ``sequences_heads`` (batch x local
    heads) score matrices: ``QK^T`` and ``AV`` as batched GEMMs (priced as one GEMM of the
    stacked rows: the batch fills the SMs), backward two of each; the scores' scale, mask,
    softmax and dropout as traffic (:func:`eager_score_bytes`)."""
    a = DTYPE_BYTES.get(dtype, 2)
    rows = sequences_heads * seq_len
    qk = gemms.seconds(rows, seq_len, head_dim, dtype)
    av = gemms.seconds(rows, head_dim, seq_len, dtype)
    forward_bytes, backward_bytes = eager_score_bytes(a, autocast, dropout)
    elements = sequences_heads * seq_len * seq_len
    return (qk + av + elements * forward_bytes / hbm_bytes_per_s,
            2 * (qk + av) + elements * backward_bytes / hbm_bytes_per_s)
