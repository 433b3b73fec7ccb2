"""Software consistency: the interpreter and working directory exist everywhere; python, torch,
its CUDA runtime, NCCL, deepspeed and the driver are the same on every host; torch's CUDA build is
supported by the driver; NCCL is not too old."""

from __future__ import annotations

import re
from collections.abc import Callable

from fstrain.core.doctor.facts import DoctorFacts, HostFacts, software
from fstrain.core.doctor.gpus import driver_cuda_version, gpu_hosts, no_gpu_reason
from fstrain.core.doctor.result import CheckResult, Finding, group, skipped

OLDEST_GOOD_NCCL = (2, 19)  # what torch >= 2.2 ships; older NCCL predates cuMem-by-default and <c2c> topologies


def version_tuple(text: str | None) -> tuple[int, ...]:
    """``2.13.0+cu124`` -> (2, 13, 0); ``12.4`` -> (12, 4); unparsable -> ()."""
    if not text:
        return ()
    match = re.match(r"(\d+(?:\.\d+)*)", text)
    return tuple(int(p) for p in match.group(1).split(".")) if match else ()


def check_interpreter(facts: DoctorFacts) -> list[CheckResult]:
    findings = []
    for host in facts.reached:
        if host.python_error is not None:
            fallback = f"; the other checks ran with {host.probe_python}" if host.report is not None else ""
            findings.append(Finding(host.name, "fail", f"{host.python} cannot run: {host.python_error}{fallback}",
                                    "install it there, or pass --python with the interpreter that has torch"))
        elif host.report is None:
            findings.append(Finding(host.name, "fail", f"the probe did not run: {host.probe_error}",
                                    "run `python3 - < fstrain/io/probe_remote.py` there to see why"))
        else:
            findings.append(Finding(host.name, "ok", f"{host.python} runs"))
    if not findings:
        return skipped("sw.interpreter", "no host was reached")
    return group("sw.interpreter", findings)


def check_workdir(facts: DoctorFacts) -> list[CheckResult]:
    if not facts.workdir:
        return skipped("sw.workdir", "--workdir not given")
    findings = []
    for host in facts.reached:
        if host.workdir_exists is None:
            why = f": {host.python} {host.python_error}" if host.python_error else ""
            findings.append(Finding(host.name, "skipped", f"could not be checked{why}"))
        elif host.workdir_exists:
            findings.append(Finding(host.name, "ok", f"{facts.workdir} exists"))
        else:
            findings.append(Finding(host.name, "fail", f"{facts.workdir} does not exist",
                                    f"create it and put the code there (`mkdir -p {facts.workdir}`), or use a "
                                    "directory on shared storage"))
    return group("sw.workdir", findings)


# --- same version everywhere -----------------------------------------------------------------


def _consistent(check_id: str, values: dict[str, str], what: str, fix: Callable[[str], str],
                severity: Callable[[str, str], str] = lambda a, b: "fail") -> list[CheckResult]:
    """One row per distinct value: the most common one ok, the others ``severity(value, common)``."""
    if not values:
        return []
    counts: dict[str, int] = {}
    for value in values.values():
        counts[value] = counts.get(value, 0) + 1
    common = max(counts, key=lambda v: counts[v])  # ties: first seen
    if len(counts) == 1:
        return [CheckResult(check_id, "ok", tuple(values), f"{what} {common} on every host")]
    findings = [Finding(h, "ok", f"{what} {v} (most hosts)") if v == common else
                Finding(h, severity(v, common), f"{what}: {v}; most hosts have {common}", fix(common))
                for h, v in values.items()]
    return group(check_id, findings)


def _python_severity(value: str, common: str) -> str:
    # a different minor version is another ABI (wheels, pickles); a patch release is a warning
    return "fail" if version_tuple(value)[:2] != version_tuple(common)[:2] else "warn"


def check_python(facts: DoctorFacts) -> list[CheckResult]:
    values, executables = {}, {}
    for host in facts.probed:
        sw = software(host)
        if sw.get("python"):
            exe = str(sw.get("python_executable") or "")
            values[host.name] = f"{sw['python']} ({exe})" if exe else str(sw["python"])
            executables[str(sw["python"])] = exe
    if not values:
        return skipped("sw.python", "no host was probed")

    def fix(common: str) -> str:
        exe = common.partition(" (")[2].rstrip(")")
        return f"run the same interpreter everywhere: put {exe} first on PATH on these hosts, or pass --python {exe}"

    return _consistent("sw.python", values, "Python", fix, _python_severity)


def _package_check(check_id: str, facts: DoctorFacts, key: str, label: str, absent: str, install: str,
                   all_absent: Callable[[str], list[CheckResult]]) -> list[CheckResult]:
    values = {}
    for host in facts.probed:
        sw = software(host)
        values[host.name] = str(sw[key]) if sw.get(key) else absent
    if not values:
        return skipped(check_id, "no host was probed")
    if set(values.values()) == {absent}:
        return all_absent(absent)
    return _consistent(check_id, values, label, lambda common: install.format(version=common, python=facts.python))


def check_torch(facts: DoctorFacts) -> list[CheckResult]:
    def none(absent: str) -> list[CheckResult]:
        return [CheckResult("sw.torch", "warn", tuple(h.name for h in facts.probed),
                            f"torch is not importable by {facts.python} on any host",
                            f"install torch for {facts.python}, or pass --python with the interpreter that has it")]

    return _package_check("sw.torch", facts, "torch", "torch", "not importable",
                          "install torch {version} for {python} there (`{python} -m pip install torch=={version}`)",
                          none)


def check_cuda_runtime(facts: DoctorFacts) -> list[CheckResult]:
    return _package_check("sw.cuda_runtime", facts, "torch_cuda", "torch CUDA runtime", "none (CPU build)",
                          "install the torch build for CUDA {version} there", lambda _: skipped(
                              "sw.cuda_runtime", "torch is a CPU build (or missing) on every host",
                              [h.name for h in facts.probed]))


def check_nccl(facts: DoctorFacts) -> list[CheckResult]:
    return _package_check("sw.nccl", facts, "nccl", "NCCL", "none (torch without NCCL)",
                          "install the same torch build everywhere: it brings NCCL {version}", lambda _: skipped(
                              "sw.nccl", "torch has no NCCL on any host (CPU build or missing)",
                              [h.name for h in facts.probed]))


def check_deepspeed(facts: DoctorFacts) -> list[CheckResult]:
    return _package_check("sw.deepspeed", facts, "deepspeed", "deepspeed", "not installed",
                          "install deepspeed {version} there (`{python} -m pip install deepspeed=={version}`)",
                          lambda _: skipped("sw.deepspeed", "deepspeed is not installed on any host (only "
                                            "--backend deepspeed needs it)", [h.name for h in facts.probed]))


def check_driver(facts: DoctorFacts) -> list[CheckResult]:
    hosts = gpu_hosts(facts)
    if not hosts:
        return skipped("sw.driver", no_gpu_reason(facts))
    values = {h.name: str((h.report or {}).get("driver_version") or "unknown") for h in hosts}
    return _consistent("sw.driver", values, "NVIDIA driver",
                       lambda common: f"install driver {common} there (mixed drivers give mixed CUDA behaviour)",
                       lambda a, b: "warn")


# --- torch CUDA vs driver, NCCL age ----------------------------------------------------------


def check_cuda_driver(facts: DoctorFacts) -> list[CheckResult]:
    hosts = gpu_hosts(facts)
    if not hosts:
        return skipped("sw.cuda_driver", no_gpu_reason(facts))
    return group("sw.cuda_driver", [_cuda_finding(h) for h in hosts])


def _cuda_finding(host: HostFacts) -> Finding:
    sw = software(host)
    if not sw.get("torch"):
        return Finding(host.name, "skipped", "torch is not importable")
    runtime = sw.get("torch_cuda")
    count = len((host.report or {}).get("gpus") or [])
    if not runtime:
        return Finding(host.name, "fail", f"torch {sw['torch']} is a CPU build but the host has {count} GPUs",
                       "install a CUDA build of torch (https://pytorch.org/get-started/locally/)")
    driver = driver_cuda_version(host)
    if driver is None:
        return Finding(host.name, "skipped", "the driver's CUDA version is not known (no NVML or nvidia-smi -q)")
    need, have = version_tuple(str(runtime))[:2], version_tuple(driver)[:2]
    if need[:1] > have[:1]:
        return Finding(host.name, "fail", f"torch is built for CUDA {runtime}; the driver supports up to CUDA {driver}",
                       f"upgrade the driver, or install the torch build for CUDA {have[0]}.x")
    if need > have:
        return Finding(host.name, "warn", f"torch is built for CUDA {runtime}; the driver supports {driver}: it runs "
                       "through minor-version compatibility, without PTX JIT", "upgrade the driver")
    return Finding(host.name, "ok", f"torch CUDA {runtime} runs on the driver's CUDA {driver}")


def check_nccl_version(facts: DoctorFacts) -> list[CheckResult]:
    findings = []
    for host in facts.probed:
        version = software(host).get("nccl")
        if not version:
            continue
        if version_tuple(str(version))[:2] < OLDEST_GOOD_NCCL:
            findings.append(Finding(host.name, "warn", f"NCCL {version} is older than 2.19",
                                    "upgrade torch (torch >= 2.2 ships NCCL >= 2.19): older NCCL lacks years of "
                                    "hang and performance fixes, cuMem by default and <c2c> topology support"))
        else:
            findings.append(Finding(host.name, "ok", f"NCCL {version}"))
    if not findings:
        return skipped("sw.nccl_version", "torch has no NCCL on any host (CPU build or missing)")
    return group("sw.nccl_version", findings)
