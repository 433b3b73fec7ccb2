"""The built-in GPU table: memory, dense peak FLOP/s, bandwidths and planning defaults.

Sources (see docs/planner.md and ../shared/references/planner.md section 3): NVIDIA datasheets,
with the dense Tensor-Core figures (the datasheets print "with sparsity", twice the dense
number) as torchtitan ``get_peak_flops`` and MosaicML composer ``GPU_AVAILABLE_FLOPS`` use them.
The fp8 column is the datasheets' "FP8 Tensor Core" figure halved the same way (H100 SXM 3,958
with sparsity: 1,979 dense; B200 9 PFLOPS: 4,500; MI300X 5,229.8: 2,614.9; Ada's with FP32
accumulate, which ``torch._scaled_mm`` uses); 0 for Ampere and Volta, which have no fp8 tensor
cores (``fstrain plan --fp8`` refuses them).
``memory_bytes`` is what NVML reports as ``memory.total`` (MiB x 2**20; captured nvidia-smi
output where we have it: 81559 MiB for H100 80GB HBM3, 81920 MiB for A100-SXM4-80GB, 32480 MiB
for V100-PCIE-32GB), so "usable" in a plan means the number ``nvidia-smi`` shows; the CUDA
context, NCCL and fragmentation are charged separately by the memory model.

Each GPU answers to its short lower-case name (``h100-sxm``), its display label and the product
names NVML reports (``NVIDIA H100 80GB HBM3``, ``NVIDIA A100-SXM4-80GB``, ``Tesla V100-SXM2-32GB``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fstrain.core.plan.precision import compute_dtype
from fstrain.errors import InputError

_MIB = 1 << 20
_T = 1e12
_GB = 1e9


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model; bandwidths in bytes per second, FLOP/s dense (no sparsity)."""

    name: str
    """Short lower-case name used on the command line, e.g. ``h100-sxm``."""
    label: str
    """Display name, e.g. ``H100-SXM``."""
    memory_bytes: int
    """NVML ``memory.total``: the capacity a plan may fill."""
    bf16_flops: float
    """Dense BF16 Tensor-Core peak (0: not supported, e.g. V100)."""
    fp16_flops: float
    fp8_flops: float
    fp32_flops: float
    """Non-tensor FP32 peak: PyTorch does not use TF32 for matmuls unless asked to."""
    hbm_bandwidth_bytes_per_s: float
    nvlink_bandwidth_bytes_per_s: float
    """Total bidirectional NVLink bandwidth per GPU (0: none)."""
    nvlink_domain_size: int
    """GPUs that share NVLink by default: 8 on an SXM board, 2 for bridged pairs, 1 for none."""
    host_link_bytes_per_s: float
    """PCIe to the host, bidirectional (CPU offload traffic)."""
    nic_gbps_per_gpu: float
    """Default scale-out bandwidth per GPU in Gb/s when --inter-node-gbps is not given."""
    achievable_mfu: float
    """Assumed fraction of the dense peak that large transformer matmuls reach (with recompute)."""
    nvml_names: tuple[str, ...] = ()
    nvls_efficiency: float = 0.0
    """NCCL's NVLink SHARP efficiency (0: no NVLS): see ``_NVLS_EFFICIENCY``."""

    def peak_flops(self, precision: str) -> float:
        """Dense peak FLOP/s for ``bf16``, ``fp16``, ``fp8`` or ``fp32`` compute; a precision mode
        (``amp-bf16``, ``bf16-pure``...) computes in its compute dtype (fstrain.core.plan.precision)."""
        key = precision if precision == "fp8" else compute_dtype(precision)
        return {"bf16": self.bf16_flops, "fp16": self.fp16_flops, "fp8": self.fp8_flops, "fp32": self.fp32_flops}[key]


# Scale-out defaults: DGX-1 4x100 Gb/s per 8 V100; DGX A100 8x200 Gb/s HDR; DGX/HGX H100, H200,
# B200 one 400 Gb/s NIC per GPU; PCIe servers are assumed to have 2x100 Gb/s per 8 GPUs.
# MFU defaults: Narayanan et al. 2021 reach 52 % of peak on A100 with recompute; torchtitan and
# MosaicML report 40-58 % on H100 for Llama-size models; PCIe parts and small GPUs lower.
# PCIe-card NVLink bridges are optional, so those default to an NVLink domain of 1 (H100/H200 NVL
# are sold as bridged pairs: 2); a probe or --nvlink-domain-size says otherwise.
_ROWS: tuple[tuple[Any, ...], ...] = (
    # name, label, MiB, dense TFLOPS bf16, fp16, fp8, fp32, HBM GB/s, NVLink GB/s, domain,
    # PCIe GB/s, NIC Gb/s per GPU, MFU, NVML product names
    ("v100-16gb", "V100-SXM2-16GB", 16160, 0, 125, 0, 15.7, 900, 300, 8, 32, 50, 0.40, ("Tesla V100-SXM2-16GB",)),
    ("v100-32gb", "V100-SXM2-32GB", 32510, 0, 125, 0, 15.7, 900, 300, 8, 32, 50, 0.40, ("Tesla V100-SXM2-32GB",)),
    ("v100-pcie-16gb", "V100-PCIe-16GB", 16160, 0, 112, 0, 14, 900, 0, 1, 32, 25, 0.40, ("Tesla V100-PCIE-16GB",)),
    ("v100-pcie-32gb", "V100-PCIe-32GB", 32480, 0, 112, 0, 14, 900, 0, 1, 32, 25, 0.40, ("Tesla V100-PCIE-32GB",)),
    (
        "a100-40gb",
        "A100-SXM4-40GB",
        40536,
        312,
        312,
        0,
        19.5,
        1555,
        600,
        8,
        64,
        200,
        0.50,
        ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
    ),
    (
        "a100-80gb",
        "A100-SXM4-80GB",
        81920,
        312,
        312,
        0,
        19.5,
        2039,
        600,
        8,
        64,
        200,
        0.50,
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
    ),
    (
        "a100-pcie-40gb",
        "A100-PCIe-40GB",
        40536,
        312,
        312,
        0,
        19.5,
        1555,
        600,
        1,
        64,
        25,
        0.45,
        ("NVIDIA A100-PCIE-40GB", "A100-PCIE-40GB"),
    ),
    (
        "a100-pcie-80gb",
        "A100-PCIe-80GB",
        81920,
        312,
        312,
        0,
        19.5,
        1935,
        600,
        1,
        64,
        25,
        0.45,
        ("NVIDIA A100 80GB PCIe",),
    ),
    ("h100-sxm", "H100-SXM", 81559, 989.4, 989.4, 1978.9, 67, 3350, 900, 8, 128, 400, 0.45, ("NVIDIA H100 80GB HBM3",)),
    ("h100-pcie", "H100-PCIe", 81559, 756, 756, 1513, 51, 2000, 600, 1, 128, 25, 0.45, ("NVIDIA H100 PCIe",)),
    ("h100-nvl", "H100-NVL", 95830, 835, 835, 1671, 60, 3900, 600, 2, 128, 25, 0.45, ("NVIDIA H100 NVL",)),
    ("h200", "H200-SXM", 143771, 989, 989, 1979, 67, 4800, 900, 8, 128, 400, 0.45, ("NVIDIA H200",)),
    ("h200-nvl", "H200-NVL", 143771, 835, 835, 1671, 60, 4800, 900, 2, 128, 25, 0.45, ("NVIDIA H200 NVL",)),
    ("l40s", "L40S", 46068, 362.05, 362.05, 733, 91.6, 864, 0, 1, 64, 25, 0.40, ("NVIDIA L40S",)),
    ("l4", "L4", 23034, 121, 121, 242.5, 30.3, 300, 0, 1, 64, 25, 0.35, ("NVIDIA L4",)),
    ("b200", "B200", 183359, 2250, 2250, 4500, 75, 8000, 1800, 8, 128, 400, 0.40, ("NVIDIA B200",)),
    # Meta's Grand Teton H100 96GB HBM2e at 500 W (torchtitan's benchmark machines): torchtitan
    # reports MFU against the SXM peak and measures 33-39 % for Llama 3.1 8B-405B, so the peak
    # is the SXM figure with a lower achievable MFU; memory is the 96 GB part's NVML total.
    ("h100-96gb", "H100-96GB", 97871, 989.4, 989.4, 1978.9, 67, 2400, 900, 8, 128, 400, 0.38,
     ("NVIDIA H100 96GB HBM2e",)),
    # Ada / Ampere workstation and gaming cards: dense Tensor-Core figures with FP32 accumulate
    # (the datasheets' sparse numbers halved; PyTorch accumulates in FP32); no NVLink by default.
    ("rtx-4090", "RTX-4090", 24564, 165.2, 165.2, 330.3, 82.6, 1008, 0, 1, 64, 25, 0.35,
     ("NVIDIA GeForce RTX 4090",)),
    ("rtx-a6000", "RTX-A6000", 49140, 154.8, 154.8, 0, 38.7, 768, 0, 1, 64, 25, 0.35, ("NVIDIA RTX A6000",)),
    # GB200: one Blackwell GPU of a Grace-Blackwell superchip, NVLink 5 across an NVL72 rack (72
    # GPUs in one NVLink domain); 2,500 dense BF16 TFLOPS per GPU as the frameworks use it.
    ("gb200", "GB200", 189471, 2500, 2500, 5000, 80, 8000, 1800, 72, 128, 400, 0.40, ("NVIDIA GB200",)),
    # AMD MI300X (rocm-smi names; the planner's "NVLink" is Infinity Fabric: 7 x 128 GB/s links,
    # 8 GPUs fully connected); dense BF16 1,307 TFLOPS; frameworks report lower MFU than on H100.
    ("mi300x", "MI300X", 196592, 1307.4, 1307.4, 2614.9, 163.4, 5300, 896, 8, 128, 400, 0.30,
     ("AMD Instinct MI300X",)),
)

# NVLink SHARP (NVLS): on NVSwitch systems of Hopper and Blackwell, NCCL's all-reduce lets the
# switch do the reduction. NCCL's own cost model (src/tuning/nvls.cc: nvlsEfficiency Hopper 0.85,
# Blackwell 0.74, Volta/Ampere 0) gives its all-reduce bus bandwidth as the NVLink bandwidth x
# efficiency x (nChannels - 1) / nChannels x 2; only NVSwitch boards have it (not NVL bridges).
_NVLS_EFFICIENCY = {"h100-sxm": 0.85, "h100-96gb": 0.85, "h200": 0.85, "b200": 0.74, "gb200": 0.74}

GPUS: tuple[GpuSpec, ...] = tuple(
    GpuSpec(
        name=row[0],
        label=row[1],
        memory_bytes=row[2] * _MIB,
        bf16_flops=row[3] * _T,
        fp16_flops=row[4] * _T,
        fp8_flops=row[5] * _T,
        fp32_flops=row[6] * _T,
        hbm_bandwidth_bytes_per_s=row[7] * _GB,
        nvlink_bandwidth_bytes_per_s=row[8] * _GB,
        nvlink_domain_size=row[9],
        host_link_bytes_per_s=row[10] * _GB,
        nic_gbps_per_gpu=row[11],
        achievable_mfu=row[12],
        nvml_names=row[13],
        nvls_efficiency=_NVLS_EFFICIENCY.get(row[0], 0.0),
    )
    for row in _ROWS
)


def _normal(text: str) -> str:
    """Case, spacing and the vendor prefix do not matter: 'NVIDIA  A100-SXM4-80GB' == 'a100-sxm4-80gb'."""
    words = text.strip().lower().replace("_", "-").split()
    if words and words[0] in ("nvidia", "tesla"):
        words = words[1:]
    return " ".join(words)


_BY_NAME: dict[str, GpuSpec] = {}
for _spec in GPUS:
    for _alias in (_spec.name, _spec.label, *_spec.nvml_names):
        _BY_NAME[_normal(_alias)] = _spec


def known_gpu_names() -> tuple[str, ...]:
    return tuple(spec.name for spec in GPUS)


def lookup_gpu(name: str, where: str = "--gpu") -> GpuSpec:
    """The GPU called ``name`` (short name, label or NVML product name), or an error listing them."""
    spec = _BY_NAME.get(_normal(name))
    if spec is None:
        raise InputError(
            f"unknown GPU {name!r}",
            f"known GPUs: {', '.join(known_gpu_names())} (NVML product names such as 'NVIDIA H100 80GB HBM3' work too)",
            where,
        )
    return spec
