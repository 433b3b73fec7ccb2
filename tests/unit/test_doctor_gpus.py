"""GPU, NVLink, topology and software checks on real captured reports (edited where a fault must show)."""

from __future__ import annotations

from typing import Any

import pytest

from fstrain.core.doctor.catalogue import run_checks, select
from fstrain.core.doctor.facts import PlanNeeds
from fstrain.core.doctor.result import CheckResult
from tests.unit.doctor_reports import (
    A10_Q,
    H100_Q,
    NCCL2397,
    SIMAI,
    TITANV_Q,
    V100_Q,
    edit_section,
    facts,
    host,
    probe_report,
    report_from_nvidia_smi_q,
)


def rows(results: list[CheckResult], check_id: str) -> dict[tuple[str, ...], tuple[str, str, str]]:
    return {r.hosts: (r.verdict, r.message, r.fix) for r in results if r.id == check_id}


def run(check_id: str, *hosts: Any, **extra: Any) -> dict[tuple[str, ...], tuple[str, str, str]]:
    return rows(run_checks(facts(*hosts, **extra), select(check_id)), check_id)


def q_report(path: Any, name: str, text: str | None = None) -> dict[str, Any]:
    return report_from_nvidia_smi_q(text if text is not None else path.read_text(), name)


def test_real_h100_capture_is_throttled_by_power_brake_on_every_gpu() -> None:
    result = run("gpu.clocks", host("h1", q_report(H100_Q, "h1")))
    verdict, message, fix = result[("h1",)]
    assert verdict == "fail"
    assert message == ("GPUs 0-7: clocks throttled: HW power brake (the PSU or BMC asserted power brake), "
                       "HW slowdown (the board cut its clocks: power or thermal emergency)")
    assert "ipmitool sel list" in fix


def test_idle_is_not_throttling() -> None:
    assert run("gpu.clocks", host("a", q_report(A10_Q, "a")))[("a",)][0] == "ok"  # "Idle" is active there


def test_real_a10_capture_has_a_pending_row_remap() -> None:
    verdict, message, fix = run("gpu.ecc", host("a", q_report(A10_Q, "a")))[("a",)]
    assert (verdict, message) == ("fail", "GPU 0: row remapping pending (4 uncorrectable rows)")
    assert "nvidia-smi -r" in fix


def test_uncorrectable_ecc_error_edited_into_one_h100_gpu() -> None:
    text = H100_Q.read_text()
    healthy = run("gpu.ecc", host("h", q_report(H100_Q, "h", text)))
    assert healthy[("h",)][0] == "ok"
    broken = edit_section(text, "00000000:3B:00.0", "DRAM Uncorrectable            : 0",
                          "DRAM Uncorrectable            : 2")
    verdict, message, _ = run("gpu.ecc", host("h", q_report(H100_Q, "h", broken)))[("h",)]
    assert (verdict, message) == ("fail", "GPU 1: 2 uncorrectable ECC errors since the last reset")


def test_lifetime_only_errors_and_remap_failure() -> None:
    text = H100_Q.read_text()
    lifetime = text.index("Aggregate", text.index("GPU 00000000:19:00.0"))  # GPU 0's lifetime counters
    aggregate = text[:lifetime] + text[lifetime:].replace(
        "DRAM Uncorrectable            : 0", "DRAM Uncorrectable            : 3", 1)
    verdict, message, _ = run("gpu.ecc", host("h", q_report(H100_Q, "h", aggregate)))[("h",)]
    assert (verdict, message) == ("warn", "GPU 0: 3 uncorrectable ECC errors over its life")
    failed = edit_section(text, "00000000:4C:00.0", "Remapping Failure Occurred        : No",
                          "Remapping Failure Occurred        : Yes")
    verdict, message, fix = run("gpu.ecc", host("h", q_report(H100_Q, "h", failed)))[("h",)]
    assert (verdict, message) == ("fail", "GPU 2: row remapping failed")
    assert "RMA" in fix


def test_processes_and_persistence_from_real_captures() -> None:
    v100, titan = host("v", q_report(V100_Q, "v")), host("t", q_report(TITANV_Q, "t"))
    procs = run("gpu.processes", v100, titan)
    assert procs[("v",)][:2] == ("warn", "GPU 0: in use by pid 315406 /usr/bin/python 30.5 GiB")
    assert procs[("t",)][1] == ("GPU 0: in use by pid 100607 /usr/lib/xorg/Xorg 142 MiB, pid 100838 "
                                "/usr/bin/gnome-shell 33 MiB, pid 101815 /opt/test 111 MiB")
    persistence = run("gpu.persistence", v100, titan, host("h", q_report(H100_Q, "h")))
    assert persistence[("v", "t")][0] == "warn" and "nvidia-smi -pm 1" in persistence[("v", "t")][2]
    assert persistence[("h",)][:2] == ("ok", "persistence mode on")


def test_memory_against_a_plan() -> None:
    plan = PlanNeeds("plan.yaml", gpu_memory_bytes=20 << 30, checkpoint_bytes=None, world_size=8, num_nodes=1,
                     gpus_per_node=8, gpu="h100")
    result = run("gpu.memory", host("v", q_report(V100_Q, "v")), host("h", q_report(H100_Q, "h")), plan=plan)
    assert result[("v",)][:2] == ("fail", "GPU 0: 1.3 GiB free, the plan needs 20.0 GiB per GPU")
    assert result[("h",)][:2] == ("ok", "free memory covers the plan's 20.0 GiB per GPU")
    assert run("gpu.memory", host("h", q_report(H100_Q, "h")))[()][0] == "skipped"


def test_pcie_generation_drop_counts_only_when_busy() -> None:
    text = TITANV_Q.read_text()
    assert run("gpu.pcie", host("t", q_report(TITANV_Q, "t", text)))[("t",)][0] == "ok"  # gen 1 of 3, idle
    busy = text.replace("        Idle                              : Active",
                        "        Idle                              : Not Active")
    verdict, message, _ = run("gpu.pcie", host("t", q_report(TITANV_Q, "t", busy)))[("t",)]
    assert (verdict, message) == ("warn", "GPU 0: PCIe gen 1 of 3 while busy")
    narrow = edit_section(H100_Q.read_text(), "00000000:19:00.0", "Current                   : 16x",
                          "Current                   : 8x")
    verdict, message, _ = run("gpu.pcie", host("h", q_report(H100_Q, "h", narrow)))[("h",)]
    assert (verdict, message) == ("warn", "GPU 0: PCIe link x8 of x16")


def test_count_against_slots_and_type_mix() -> None:
    h100, a10 = host("h", q_report(H100_Q, "h"), slots=8), host("a", q_report(A10_Q, "a"), slots=2)
    count = run("gpu.count", h100, a10)
    assert count[("h",)][:2] == ("ok", "8 GPUs")
    assert count[("a",)][:2] == ("fail", "1 GPU for slots=2")
    kinds = run("gpu.type", h100, a10)
    assert kinds[("h",)][:2] == ("warn", "8x NVIDIA H100 80GB HBM3 80 GiB; the cluster mixes GPU types")
    assert "smallest GPU memory bounds what fits" in kinds[("a",)][2]
    same = run("gpu.type", host("h1", q_report(H100_Q, "h1")), host("h2", q_report(H100_Q, "h2")))
    assert same == {("h1", "h2"): ("ok", "8x NVIDIA H100 80GB HBM3 80 GiB on every host", "")}


def test_gpus_on_the_bus_without_a_driver() -> None:
    report = probe_report(SIMAI, "s")
    report.update(gpus=[], gpu_source="none", gpu_source_reason="nvidia-smi failed: NVIDIA-SMI has failed",
                  nvidia_pci_devices=["0000:13:00.0", "0000:14:00.0"])
    verdict, message, _ = run("gpu.count", host("s", report))[("s",)]
    assert verdict == "fail" and message.startswith("2 NVIDIA GPU(s) on the PCI bus but none answers")


def test_nvlink_all_up_then_one_link_down() -> None:
    a, b = probe_report(SIMAI, "s1"), probe_report(SIMAI, "s2")
    assert run("topo.nvlink", host("s1", a), host("s2", b)) == {("s1", "s2"): ("ok", "every NVLink up", "")}
    b["gpus"][1]["nvlinks"][4] = {"active": False, "link": 4}
    result = run("topo.nvlink", host("s1", a), host("s2", b))
    assert result[("s2",)][:2] == ("fail", "GPU 1: 11 of 12 NVLinks up (links 4 down)")
    assert "nvidia-smi nvlink" in result[("s2",)][2]
    assert result[("s1",)][0] == "ok"


def test_pcie_gpus_without_nvlink_are_fine() -> None:
    assert run("topo.nvlink", host("p", probe_report(NCCL2397, "p")))[("p",)][:2] == ("ok", "no NVLink (PCIe GPUs)")


def test_identical_nodes_and_an_odd_one() -> None:
    a, b, c = (probe_report(SIMAI, n) for n in ("s1", "s2", "s3"))
    same = run("topo.identical", host("s1", a), host("s2", b), host("s3", c))
    assert same == {("s1", "s2", "s3"): ("ok", "the same topology as every host with the same GPUs", "")}
    c["rdma"]["devices"] = c["rdma"]["devices"][:1]  # one NIC missing on s3
    odd = run("topo.identical", host("s1", a), host("s2", b), host("s3", c))
    verdict, message, _ = odd[("s3",)]
    assert verdict == "warn" and "differs from s1, s2" in message and "NICs:" in message


@pytest.mark.parametrize(("torch_cuda", "verdict", "fragment"), [
    ("12.1", "ok", "torch CUDA 12.1 runs on the driver's CUDA 12.2"),
    ("12.4", "warn", "minor-version compatibility"),
    ("13.0", "fail", "the driver supports up to CUDA 12.2"),
    (None, "fail", "is a CPU build but the host has 8 GPUs"),
])
def test_torch_cuda_build_vs_driver(torch_cuda: str | None, verdict: str, fragment: str) -> None:
    report = q_report(H100_Q, "h")  # driver 535.161.08: CUDA 12.2, from the capture's header
    report["software"]["torch_cuda"] = torch_cuda
    result = run("sw.cuda_driver", host("h", report))[("h",)]
    assert result[0] == verdict and fragment in result[1]


def test_driver_and_nccl_versions() -> None:
    h100, a10 = q_report(H100_Q, "h"), q_report(A10_Q, "a")
    drivers = run("sw.driver", host("h", h100), host("a", a10))
    assert drivers[("a",)][:2] == ("warn", "NVIDIA driver: 535.129.03; most hosts have 535.161.08")
    a10["software"]["nccl"] = "2.18.1"
    old = run("sw.nccl_version", host("h", h100), host("a", a10))
    assert old[("a",)][:2] == ("warn", "NCCL 2.18.1 is older than 2.19")
    assert old[("h",)][:2] == ("ok", "NCCL 2.20.5")
    versions = run("sw.nccl", host("h", h100), host("a", a10))
    assert versions[("a",)][0] == "fail" and versions[("h",)][0] == "ok"


def test_every_gpu_check_is_skipped_with_a_reason_without_gpus() -> None:
    from tests.unit.doctor_reports import minimal_report

    doctor = facts(host("n1", minimal_report("n1")), host("n2", minimal_report("n2")))
    gpu_checks = select("gpu,topo,sw.driver,sw.cuda_driver")
    results = run_checks(doctor, gpu_checks)
    assert {r.verdict for r in results} == {"skipped"}
    assert all("no NVIDIA GPU on any host (no NVIDIA GPU on the PCI bus)" in r.message or r.id == "gpu.memory"
               for r in results)


def test_real_h200_probe_report_is_healthy() -> None:
    """The report captured on a lent H200 (tests/fixtures/probe/SOURCES.md): one healthy GPU."""
    from tests.unit.doctor_reports import PROBE

    report = probe_report(PROBE / "h200-1x-vm-real.json", "h200")
    verdicts = {r.id: (r.verdict, r.message) for r in run_checks(facts(host("h200", report)), select("gpu"))}
    assert verdicts["gpu.count"] == ("ok", "1 GPU")
    assert verdicts["gpu.type"] == ("ok", "1x NVIDIA H200 140 GiB on every host")
    assert {verdicts[c][0] for c in ("gpu.ecc", "gpu.clocks", "gpu.processes")} == {"ok"}
    assert verdicts["gpu.persistence"][0] == "skipped"  # that report holds no nvidia-smi -q text
