"""A measured curve of the rate a GPU runs GEMMs at, by shape and dtype.

A GEMM is ``C[m x n] = A[m x k] @ B[k x n]`` (``2 m n k`` FLOPs; the shapes a model runs:
:mod:`fstrain.core.plan.gemmshapes`). :class:`MeasuredGemmCurve` answers ``tflops(m, n, k,
dtype)``, the achieved TFLOP/s of one GEMM (the method the step-time model's ``GemmEfficiency``
protocol asks for), from measured points:

- a measured shape gets its measured rate;
- any other shape gets the weighted geometric mean of the rates of the ``NEIGHBOURS`` measured
  shapes of its dtype nearest to it in log2(m), log2(n), log2(k), each weighted 1 / distance**2
  (inverse-distance weighting, Shepard's method, on the k nearest).

Why not a fitted roofline (``min(peak, intensity x bandwidth)`` plus a launch term) per dtype: the
rate of a GEMM is not a smooth function of its shape. cuBLAS picks a tile and a split-K per shape,
a shape that leaves the last wave of tiles half empty runs at a fraction of its neighbour's rate
(wave quantization), and narrow shapes change kernels altogether; three parameters fitted over a
few points misplace exactly the shapes a model runs. Measuring the model's own shapes
(``fstrain bench --model``) and reading a measured shape back unchanged keeps those effects, and
log-space neighbours give the nearby shapes (another micro-batch) the rates of the shapes most
like them. Outside the measured shapes the rate is that of the nearest ones (no extrapolation),
so measure the shapes you plan. A rate is never above the best measured one of its dtype
(a geometric mean of measured rates cannot be, and it is checked).

Pure: stdlib and fstrain only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fstrain.errors import InputError

NEIGHBOURS = 4
"""Measured shapes an unmeasured one is interpolated from."""

DTYPE_NAMES: dict[str, str] = {
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
    "tf32": "tf32",
    "fp8": "fp8", "float8_e4m3fn": "fp8", "torch.float8_e4m3fn": "fp8",
}
"""Every spelling of a dtype (fstrain's short names, torch's) -> the short name the curve keeps."""


def dtype_name(text: str, where: str = "dtype") -> str:
    """``bfloat16`` / ``torch.bfloat16`` / ``bf16`` -> ``bf16``; one InputError for anything else."""
    name = DTYPE_NAMES.get(str(text).strip().lower())
    if name is None:
        raise InputError(f"unknown GEMM dtype {text!r}", f"use one of {', '.join(sorted(set(DTYPE_NAMES.values())))}",
                         where)
    return name


def weighted_log_mean(values: list[tuple[float, float]]) -> float:
    """The mean of log(value) over (distance, value) pairs, each weighted 1 / distance^2
    (distances > 0)."""
    weights = [1.0 / d**2 for d, _ in values]
    return sum(w * math.log(v) for w, (_, v) in zip(weights, values, strict=True)) / sum(weights)


@dataclass(frozen=True)
class GemmPoint:
    """One measured GEMM: its shape, dtype and achieved TFLOP/s (10**12 FLOP/s)."""

    m: int
    n: int
    k: int
    dtype: str
    tflops: float


@dataclass(frozen=True)
class MeasuredGemmCurve:
    """Achieved GEMM TFLOP/s per shape and dtype, from measured points (see the module's doc).

    ``device_name`` is the device the points were measured on (``NVIDIA H200``, a CPU's name),
    ``device_type`` ``cuda`` or ``cpu``, ``source`` where they came from (for the report). Points are
    checked when the curve is built; a shape measured more than once keeps its slower rate.
    """

    points: tuple[GemmPoint, ...]
    device_name: str = ""
    device_type: str = "cuda"
    source: str = ""

    def __post_init__(self) -> None:
        where = self.source or "GEMM curve"
        measured: dict[tuple[str, int, int, int], float] = {}
        for p in self.points:
            if min(p.m, p.n, p.k) < 1 or not (p.tflops > 0 and math.isfinite(p.tflops)):
                raise InputError(f"a measured GEMM needs positive sizes and rate, got {p.m}x{p.n}x{p.k} at "
                                 f"{p.tflops} TFLOP/s", "measure it again with `fstrain bench --suite compute`", where)
            key = (dtype_name(p.dtype, where), p.m, p.n, p.k)
            measured[key] = min(measured.get(key, p.tflops), p.tflops)
        if not measured:
            raise InputError("the GEMM curve has no measured points",
                             "run `fstrain bench --suite compute` (with --model for the model's own shapes)", where)
        object.__setattr__(self, "points", tuple(GemmPoint(m, n, k, d, t) for (d, m, n, k), t in measured.items()))

    @property
    def dtypes(self) -> list[str]:
        return sorted({p.dtype for p in self.points})

    def best_tflops(self, dtype: str) -> float:
        """The best measured rate of ``dtype``: no answer of :meth:`tflops` is above it."""
        return max(p.tflops for p in self._of(dtype))

    def tflops(self, m: int, n: int, k: int, dtype: str) -> float:
        """Achieved TFLOP/s of ``C[m x n] = A[m x k] @ B[k x n]`` in ``dtype``."""
        nearest = self.nearest(m, n, k, dtype)
        if nearest[0][0] == 0.0:
            return nearest[0][1].tflops
        rate = math.exp(weighted_log_mean([(d, p.tflops) for d, p in nearest]))
        return min(rate, max(p.tflops for _, p in nearest))  # rounding must not lift it above them

    def nearest(self, m: int, n: int, k: int, dtype: str) -> list[tuple[float, GemmPoint]]:
        """The ``NEIGHBOURS`` measured points of ``dtype`` nearest to the shape in log2(m, n, k),
        with their distances, nearest first."""
        if min(m, n, k) < 1:
            raise InputError(f"a GEMM needs positive sizes, got {m}x{n}x{k}", "ask for m, n, k >= 1", "GEMM curve")
        here = (math.log2(m), math.log2(n), math.log2(k))
        return sorted(((math.dist(here, (math.log2(p.m), math.log2(p.n), math.log2(p.k))), p)
                       for p in self._of(dtype)), key=lambda dp: dp[0])[:NEIGHBOURS]

    def _of(self, dtype: str) -> list[GemmPoint]:
        name = dtype_name(dtype, "GEMM curve")
        mine = [p for p in self.points if p.dtype == name]
        if not mine:
            raise InputError(f"the GEMM curve{self._from()} has no {name} points (measured: {', '.join(self.dtypes)})",
                             f"measure {name} GEMMs with `fstrain bench --suite compute --gemm-dtype {name}`",
                             "GEMM curve")
        return mine

    def _from(self) -> str:
        return f" from {self.device_name}" if self.device_name else ""

    def __str__(self) -> str:
        return f"{len(self.points)} GEMM{'s' if len(self.points) > 1 else ''}{self._from()}"
