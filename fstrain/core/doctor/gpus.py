"""GPUs: count vs slots, one type everywhere, ECC and memory health, throttling, persistence mode,
foreign processes, free memory vs the plan, PCIe links running below their capability."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fstrain.core.doctor.facts import DoctorFacts, HostFacts
from fstrain.core.doctor.result import CheckResult, Finding, group, skipped
from fstrain.core.parsers.nvidia_smi_q import Entry, gpu_health, parse_nvidia_smi_q
from fstrain.core.topo.topology import format_cpu_list, normalize_pci_bus_id
from fstrain.errors import ParseError

GIB = 1 << 30
# Clock event reasons, as NVML names them (nvidia-smi -q spellings are normalised to these).
THROTTLE_FAIL = {
    "hw_slowdown": "HW slowdown (the board cut its clocks: power or thermal emergency)",
    "hw_thermal_slowdown": "HW thermal slowdown (too hot)",
    "hw_power_brake_slowdown": "HW power brake (the PSU or BMC asserted power brake)",
    "sw_thermal_slowdown": "SW thermal slowdown (above the slowdown temperature)",
}
THROTTLE_WARN = {"sw_power_cap": "SW power cap (at its power limit while idle?)"}
THROTTLE_FIX = ("check cooling, power supplies and the BMC event log (`ipmitool sel list`); watch it live with "
                "`nvidia-smi -q -d PERFORMANCE`; drain the node if it persists")
Judgement = tuple[str, str, str] | None  # (verdict, problem, fix) for one GPU, None when it is fine
GpuFn = Callable[[HostFacts, Mapping[str, Any]], Judgement]


def size(nbytes: int) -> str:
    return f"{nbytes / GIB:.1f} GiB" if nbytes >= GIB else f"{nbytes / (1 << 20):.0f} MiB"


def gpus(host: HostFacts) -> list[Mapping[str, Any]]:
    return [g for g in (host.report or {}).get("gpus") or [] if isinstance(g, Mapping)]


def gpu_hosts(facts: DoctorFacts) -> list[HostFacts]:
    return [h for h in facts.probed if gpus(h)]


def no_gpu_reason(facts: DoctorFacts) -> str:
    reasons = sorted({str((h.report or {}).get("gpu_source_reason") or "no GPU found") for h in facts.probed})
    return f"no NVIDIA GPU on any host ({'; '.join(reasons)})" if reasons else "no host was probed"


def index_list(indices: Sequence[int]) -> str:
    """GPU 3 / GPUs 0-3,6."""
    text = format_cpu_list(indices)
    return f"GPU {text}" if len(indices) == 1 else f"GPUs {text}"


def q_sections(host: HostFacts) -> dict[str, Entry]:
    """``nvidia-smi -q`` sections by PCI bus id (from the doctor's own run, or the probe's fallback)."""
    text = host.nvidia_smi_q
    if text is None:
        q = ((host.report or {}).get("nvidia_smi") or {}).get("q")
        text = q.get("stdout") if isinstance(q, Mapping) and q.get("exit_code") == 0 else None
    if not text:
        return {}
    try:
        parsed = parse_nvidia_smi_q(text, source=f"{host.name}: nvidia-smi -q")
    except ParseError:
        return {}
    sections = {}
    for section in parsed.gpus:
        bus = gpu_health(section).get("pci_bus_id")
        if isinstance(bus, str):
            sections[bus] = section
    return sections


def q_section(host: HostFacts, gpu: Mapping[str, Any]) -> Entry | None:
    bus = gpu.get("pci_bus_id")
    if not isinstance(bus, str):
        return None
    try:
        return q_sections(host).get(normalize_pci_bus_id(bus))
    except ValueError:
        return None


def driver_cuda_version(host: HostFacts) -> str | None:
    """The newest CUDA the driver supports: NVML's answer, else ``CUDA Version`` of ``nvidia-smi -q``."""
    report = host.report or {}
    if report.get("cuda_driver_version"):
        return str(report["cuda_driver_version"])
    text = host.nvidia_smi_q
    if text is None:
        q = (report.get("nvidia_smi") or {}).get("q")
        text = q.get("stdout") if isinstance(q, Mapping) else None
    if not text:
        return None
    try:
        return parse_nvidia_smi_q(text).cuda_version
    except ParseError:
        return None


def _per_gpu(check_id: str, facts: DoctorFacts, judge: GpuFn, ok: str) -> list[CheckResult]:
    """Run ``judge`` on every GPU; one finding per host, GPUs with the same problem listed together."""
    chosen = gpu_hosts(facts)
    if not chosen:
        return skipped(check_id, no_gpu_reason(facts))
    findings = []
    for host in chosen:
        problems: dict[tuple[str, str, str], list[int]] = {}
        for gpu in gpus(host):
            verdict = judge(host, gpu)
            if verdict is not None:
                problems.setdefault(verdict, []).append(int(gpu.get("index", -1)))
        if not problems:
            findings.append(Finding(host.name, "ok", ok))
            continue
        worst = "fail" if any(v == "fail" for v, _, _ in problems) else "warn"
        message = "; ".join(f"{index_list(ix)}: {problem}" for (_, problem, _), ix in problems.items())
        fixes = dict.fromkeys(fix for (_, _, fix) in problems)
        findings.append(Finding(host.name, worst, message, "; ".join(fixes)))
    return group(check_id, findings)


# --- count and type --------------------------------------------------------------------------


def check_count(facts: DoctorFacts) -> list[CheckResult]:
    if not facts.probed:
        return skipped("gpu.count", "no host was probed")
    with_gpus = gpu_hosts(facts)
    if not with_gpus and not any((h.report or {}).get("nvidia_pci_devices") for h in facts.probed):
        return skipped("gpu.count", no_gpu_reason(facts))
    return group("gpu.count", [_count_finding(facts, h, bool(with_gpus)) for h in facts.probed])


def _count_finding(facts: DoctorFacts, host: HostFacts, others_have: bool) -> Finding:
    report = host.report or {}
    found = len(gpus(host))
    on_bus = len(report.get("nvidia_pci_devices") or [])
    if found == 0 and on_bus:
        return Finding(host.name, "fail", f"{on_bus} NVIDIA GPU(s) on the PCI bus but none answers "
                       f"({report.get('gpu_source_reason')})", "install or load the NVIDIA driver: `nvidia-smi` must "
                       "list the GPUs")
    if found == 0 and others_have:
        return Finding(host.name, "fail", "no GPU, while other hosts have GPUs", f"leave it out: --exclude {host.name}")
    expected = host.slots
    if facts.plan is not None and facts.plan.gpus_per_node != found:
        return Finding(host.name, "fail", f"{found} GPUs; the plan is for {facts.plan.gpus_per_node} per node",
                       "make a plan for this cluster (`fstrain plan ... --out plan.yaml`)")
    if expected is not None and found < expected:
        return Finding(host.name, "fail", f"{found} GPU{'s' if found != 1 else ''} for slots={expected}",
                       "look for the missing GPUs (`nvidia-smi -L`; `dmesg | grep -i xid` for a GPU fallen off "
                       f"the bus), or set slots={found}")
    used = f", {expected} used (slots)" if expected is not None and expected < found else ""
    return Finding(host.name, "ok", f"{found} GPU{'s' if found != 1 else ''}{used}")


def check_type(facts: DoctorFacts) -> list[CheckResult]:
    hosts = gpu_hosts(facts)
    if not hosts:
        return skipped("gpu.type", no_gpu_reason(facts))
    kinds = {h.name: _kind(h) for h in hosts}
    distinct = set(kinds.values())
    if len(distinct) == 1 and "/" not in next(iter(distinct)):
        return [CheckResult("gpu.type", "ok", tuple(kinds), f"{next(iter(distinct))} on every host")]
    fix = ("the plan gives every rank the same work: the smallest GPU memory bounds what fits and the slowest GPU "
           "the step time (fstrain plan --node TYPE:COUNTxN per kind); or keep one type with --include/--exclude")
    return group("gpu.type", [Finding(h, "warn", f"{kind}; the cluster mixes GPU types", fix)
                              for h, kind in kinds.items()])


def _kind(host: HostFacts) -> str:
    names: dict[str, int] = {}
    for gpu in gpus(host):
        memory = gpu.get("memory_total_bytes")
        label = str(gpu.get("name") or "unknown GPU") + (f" {round(memory / GIB)} GiB" if memory else "")
        names[label] = names.get(label, 0) + 1
    return " / ".join(f"{n}x {label}" for label, n in names.items())


# --- health ----------------------------------------------------------------------------------


def _ecc(host: HostFacts, gpu: Mapping[str, Any]) -> Judgement:
    ecc = gpu.get("ecc") or {}
    retired = gpu.get("retired_pages") or {}
    rows = gpu.get("remapped_rows") or {}
    reset = "reset the GPU when idle (`nvidia-smi -r -i N`) or reboot the node"
    if rows.get("failure"):
        return "fail", "row remapping failed", "drain the node: the GPU needs service (RMA)"
    if (ecc.get("volatile_uncorrected") or 0) > 0:
        return "fail", f"{ecc['volatile_uncorrected']} uncorrectable ECC errors since the last reset", reset
    if rows.get("pending"):
        return "fail", f"row remapping pending ({rows.get('uncorrectable') or 0} uncorrectable rows)", reset
    if retired.get("pending"):
        return "fail", "a page retirement is pending", reset
    if (ecc.get("aggregate_uncorrected") or 0) > 0:
        return ("warn", f"{ecc['aggregate_uncorrected']} uncorrectable ECC errors over its life",
                "watch it (`nvidia-smi -q -d ECC,ROW_REMAPPER`): more errors mean service")
    return None


def check_ecc(facts: DoctorFacts) -> list[CheckResult]:
    return _per_gpu("gpu.ecc", facts, _ecc, "no uncorrectable ECC errors, no pending retirement or remapping")


def throttle_reasons(gpu: Mapping[str, Any]) -> list[str]:
    """NVML names (``hw_slowdown``); ``nvidia-smi -q`` spellings (``HW Slowdown``, ``Idle``) normalised."""
    found = []
    for reason in gpu.get("throttle_reasons") or []:
        name = str(reason).strip().lower().replace(" ", "_")
        found.append("gpu_idle" if name == "idle" else name)
    return found


def _clocks(host: HostFacts, gpu: Mapping[str, Any]) -> Judgement:
    reasons = throttle_reasons(gpu)
    bad = [THROTTLE_FAIL[r] for r in reasons if r in THROTTLE_FAIL]
    if bad:
        return "fail", "clocks throttled: " + ", ".join(bad), THROTTLE_FIX
    soft = [THROTTLE_WARN[r] for r in reasons if r in THROTTLE_WARN]
    if soft:
        return "warn", "clocks throttled: " + ", ".join(soft), "check the power limit (`nvidia-smi -q -d POWER`)"
    return None


def check_clocks(facts: DoctorFacts) -> list[CheckResult]:
    return _per_gpu("gpu.clocks", facts, _clocks, "no thermal or power throttling")


def check_persistence(facts: DoctorFacts) -> list[CheckResult]:
    hosts = gpu_hosts(facts)
    if not hosts:
        return skipped("gpu.persistence", no_gpu_reason(facts))
    findings = []
    for host in hosts:
        modes = {int(g.get("index", -1)): (q_section(host, g) or Entry("", None)).value_at("Persistence Mode")
                 for g in gpus(host)}
        off = [i for i, mode in modes.items() if mode == "Disabled"]
        if all(mode is None for mode in modes.values()):
            findings.append(Finding(host.name, "skipped", "persistence mode not known (no nvidia-smi -q)"))
        elif off:
            findings.append(Finding(host.name, "warn", f"{index_list(off)}: persistence mode off (the driver "
                                    "tears down and re-initialises the GPU around every job: slow starts)",
                                    "enable it: `sudo nvidia-smi -pm 1`, or run nvidia-persistenced"))
        else:
            findings.append(Finding(host.name, "ok", "persistence mode on"))
    return group("gpu.persistence", findings)


def _processes(host: HostFacts, gpu: Mapping[str, Any]) -> Judgement:
    procs = [p for p in gpu.get("processes") or [] if isinstance(p, Mapping)]
    if not procs:
        return None
    listing = ", ".join(f"pid {p.get('pid')} {p.get('name') or '?'}"
                        + (f" {size(p['used_memory_bytes'])}" if p.get("used_memory_bytes") else "")
                        for p in procs)
    return "warn", f"in use by {listing}", "stop them (see `nvidia-smi`), or leave these GPUs out with --exclude"


def check_processes(facts: DoctorFacts) -> list[CheckResult]:
    return _per_gpu("gpu.processes", facts, _processes, "no other process holds GPU memory")


def check_memory(facts: DoctorFacts) -> list[CheckResult]:
    plan = facts.plan
    if plan is None or not plan.gpu_memory_bytes:
        return skipped("gpu.memory", "--plan not given" if plan is None else "the plan predicts no memory")
    need = plan.gpu_memory_bytes

    def judge(host: HostFacts, gpu: Mapping[str, Any]) -> Judgement:
        total, free = gpu.get("memory_total_bytes"), gpu.get("memory_free_bytes")
        if total and total < need:
            return ("fail", f"{total / GIB:.1f} GiB in all, the plan needs {need / GIB:.1f} GiB per GPU",
                    "re-plan for this GPU (`fstrain plan --gpu ...`)")
        if free is not None and free < need:
            return ("fail", f"{free / GIB:.1f} GiB free, the plan needs {need / GIB:.1f} GiB per GPU",
                    "free the GPU memory (gpu.processes lists who holds it)")
        return None

    return _per_gpu("gpu.memory", facts, judge, f"free memory covers the plan's {need / GIB:.1f} GiB per GPU")


def _pcie(host: HostFacts, gpu: Mapping[str, Any]) -> Judgement:
    link = dict(gpu.get("pcie") or {})
    section = q_section(host, gpu)
    if section is not None:  # the probe's nvidia-smi fallback keeps only the maxima
        health = gpu_health(section)["pcie"]
        if isinstance(health, Mapping):
            for key, value in health.items():
                link.setdefault(key, value)
    max_w, cur_w, max_g, cur_g = (link.get(k) for k in ("max_width", "cur_width", "max_gen", "cur_gen"))
    fix = "reseat the GPU or its riser/cable, check the slot and BIOS PCIe settings (`lspci -vv` LnkSta)"
    if max_w and cur_w and cur_w < max_w:
        return "warn", f"PCIe link x{cur_w} of x{max_w}", fix
    idle = "gpu_idle" in throttle_reasons(gpu)
    if max_g and cur_g and cur_g < max_g and not idle:  # an idle GPU lowers its PCIe generation by design
        return "warn", f"PCIe gen {cur_g} of {max_g} while busy", fix
    return None


def check_pcie(facts: DoctorFacts) -> list[CheckResult]:
    return _per_gpu("gpu.pcie", facts, _pcie, "PCIe links at full width")
