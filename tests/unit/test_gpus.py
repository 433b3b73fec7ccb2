"""The GPU table: names as NVML reports them (captured outputs), memory, peaks, errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fstrain.core.plan.gpus import GPUS, known_gpu_names, lookup_gpu
from fstrain.errors import InputError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "planner" / "gpus"


def captured_gpus(path: Path) -> set[tuple[str, int]]:
    """(product name, memory.total MiB) pairs from `nvidia-smi -q` or `--query-gpu ... --format=csv`."""
    text = path.read_text()
    if path.suffix == ".csv":
        rows = [line.split(", ") for line in text.splitlines()[1:] if line.strip()]
        return {(row[1], int(row[2].split()[0])) for row in rows}
    names = re.findall(r"^\s*Product Name\s*:\s*(.+?)\s*$", text, re.M)
    totals = re.findall(r"FB Memory Usage\s*\n\s*Total\s*:\s*(\d+) MiB", text)
    assert names and len(names) == len(totals)
    return set(zip(names, (int(t) for t in totals), strict=True))


@pytest.mark.parametrize("path", sorted(p for p in FIXTURES.iterdir() if p.suffix in (".txt", ".csv")), ids=str)
def test_captured_gpus_are_known_with_their_memory(path: Path) -> None:
    for name, total_mib in captured_gpus(path):
        spec = lookup_gpu(name)
        assert spec.memory_bytes == total_mib * 2**20, (name, spec.name)


@pytest.mark.parametrize(
    ("name", "short"),
    [
        ("h100-sxm", "h100-sxm"),
        ("H100-SXM", "h100-sxm"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("nvidia   h100 80gb hbm3", "h100-sxm"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("A100-SXM4-40GB", "a100-40gb"),  # drivers before R460 print no vendor prefix
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("Tesla V100-SXM2-32GB", "v100-32gb"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA L40S", "l40s"),
        ("b200", "b200"),
    ],
)
def test_lookup_accepts_short_labels_and_nvml_names(name: str, short: str) -> None:
    assert lookup_gpu(name).name == short


def test_unknown_gpu_lists_the_known_names() -> None:
    with pytest.raises(InputError, match="unknown GPU 'h100'") as caught:
        lookup_gpu("h100")
    assert caught.value.where == "--gpu"
    for name in (
        "v100-32gb",
        "a100-40gb",
        "a100-80gb",
        "h100-sxm",
        "h100-pcie",
        "h100-nvl",
        "h200",
        "l40s",
        "l4",
        "b200",
    ):
        assert name in caught.value.hint


def test_table_covers_the_issue_and_uses_dense_peaks() -> None:
    assert set(known_gpu_names()) >= {
        "v100-16gb",
        "v100-32gb",
        "a100-40gb",
        "a100-80gb",
        "a100-pcie-40gb",
        "a100-pcie-80gb",
        "h100-sxm",
        "h100-pcie",
        "h100-nvl",
        "h200",
        "l40s",
        "l4",
        "b200",
    }
    h100 = lookup_gpu("h100-sxm")
    # Dense figures (torchtitan get_peak_flops, composer GPU_AVAILABLE_FLOPS), not "with sparsity".
    assert h100.bf16_flops == pytest.approx(989.4e12)
    assert h100.fp8_flops == pytest.approx(2 * h100.bf16_flops, rel=1e-3)
    assert lookup_gpu("a100-80gb").bf16_flops == 312e12
    assert lookup_gpu("l40s").bf16_flops == pytest.approx(362.05e12)
    assert lookup_gpu("v100-32gb").peak_flops("bf16") == 0  # V100 has no bf16
    assert lookup_gpu("v100-32gb").peak_flops("fp16") == 125e12
    assert h100.nvlink_bandwidth_bytes_per_s == 900e9 and h100.nvlink_domain_size == 8
    assert lookup_gpu("l40s").nvlink_domain_size == 1
    for spec in GPUS:
        assert 0 < spec.achievable_mfu < 1 and spec.memory_bytes > 0 and spec.hbm_bandwidth_bytes_per_s > 0


@pytest.mark.parametrize(
    ("name", "label", "bf16_tflops", "memory_gib"),
    [
        ("h100-96gb", "H100-96GB", 989.4, 95.6),
        ("NVIDIA GeForce RTX 4090", "RTX-4090", 165.2, 24.0),
        ("rtx-a6000", "RTX-A6000", 154.8, 48.0),
        ("gb200", "GB200", 2500, 185.0),
        ("AMD Instinct MI300X", "MI300X", 1307.4, 192.0),
        ("h100-nvl", "H100-NVL", 835, 93.6),
        ("NVIDIA H100 PCIe", "H100-PCIe", 756, 79.6),
        ("l40s", "L40S", 362.05, 45.0),
        ("b200", "B200", 2250, 179.1),
    ],
)
def test_more_gpus_by_any_name(name: str, label: str, bf16_tflops: float, memory_gib: float) -> None:
    spec = lookup_gpu(name)
    assert spec.label == label
    assert spec.bf16_flops == pytest.approx(bf16_tflops * 1e12)
    assert spec.memory_bytes / 2**30 == pytest.approx(memory_gib, abs=0.1)
