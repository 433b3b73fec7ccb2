# ruff: noqa: UP006, UP035, UP031, UP015, SIM105, B023
# This file is sent verbatim to `python3 -` on nodes where fstrain is NOT installed, so it is
# self-contained, stdlib-only and written for Python 3.6+ (typing.List, no walrus, no f-string
# "=" specifiers); the ruff rules silenced above would modernise it past what old nodes run.
# (B023: the lambdas handed to _try() run at once, inside the loop that binds their variables.)
"""fstrain node probe: print one JSON report about this machine on stdout.

It never hangs: every subprocess has a timeout and NVML runs in a thread with a deadline. It never
fails: a missing tool or file is a recorded fact (``missing``), and an unexpected error in one
section is recorded (``errors``) while the other sections still run. Exit status 0 means the JSON
is complete.

Raw tool output (``nvidia-smi --query-gpu``, ``-q``, ``topo -m``) is kept as text: fstrain's pure
parsers turn it into values on the controller, where they are tested against captured fixtures.
"""

import json
import os
import platform
import re
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional  # noqa: F401 - used in type comments

SCHEMA = "fstrain-probe"
SCHEMA_VERSION = 1
ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "CUDA_")
TOOL_TIMEOUT_S = 20.0
SOFTWARE_TIMEOUT_S = 60.0  # importing torch on a cold file system can take this long
NVML_TIMEOUT_S = 30.0
QUERY_FIELDS = ["index", "name", "uuid", "pci.bus_id", "memory.total", "memory.free", "driver_version",
                "temperature.gpu", "clocks.sm", "clocks.max.sm", "pcie.link.gen.max", "pcie.link.width.max",
                "compute_cap"]
QUERY_FIELDS_MINIMAL = ["index", "name", "uuid", "pci.bus_id", "memory.total", "memory.free"]

Report = Dict[str, Any]


def read_text(path, default=None):
    # type: (str, Optional[str]) -> Optional[str]
    try:
        with open(path, "r", errors="replace") as handle:
            return handle.read().strip()
    except (OSError, ValueError):
        return default


def run_tool(argv, timeout_s=TOOL_TIMEOUT_S, env=None):
    # type: (List[str], float, Optional[Dict[str, str]]) -> Dict[str, Any]
    """Run one command; the result records exit code, output and why it did not run or finish."""
    result = {"argv": argv, "exit_code": None, "stdout": "", "stderr": "", "error": None}  # type: Dict[str, Any]
    if shutil.which(argv[0]) is None and not os.path.isabs(argv[0]):
        result["error"] = "not installed (%s not on PATH)" % argv[0]
        return result
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env)
    except OSError as exc:
        result["error"] = "cannot run: %s" % exc
        return result
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        result["error"] = "timed out after %.0f s" % timeout_s
    result["exit_code"] = proc.returncode
    result["stdout"] = out.decode("utf-8", "replace")
    result["stderr"] = err.decode("utf-8", "replace")[-2000:]
    result["seconds"] = round(time.monotonic() - start, 3)
    return result


def with_deadline(func, timeout_s):
    # type: (Callable[[], Any], float) -> Any
    """Run ``func`` in a daemon thread; raise TimeoutError if it has not returned in time."""
    box = {}  # type: Dict[str, Any]

    def target():
        # type: () -> None
        try:
            box["value"] = func()
        except BaseException as exc:  # reported to the caller below
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError("no answer within %.0f s" % timeout_s)
    if "error" in box:
        raise box["error"]
    return box.get("value")


# --- host, network -------------------------------------------------------------------------


def collect_host(report):
    # type: (Report) -> None
    report["hostname"] = socket.gethostname()
    report["kernel"] = platform.release()
    report["os"] = _os_pretty_name(read_text("/etc/os-release", "") or "")
    try:
        infos = with_deadline(lambda: socket.getaddrinfo(report["hostname"], None), 5.0)
        addresses = sorted({info[4][0] for info in infos})
        report["hostname_resolves_to"] = addresses
    except Exception as exc:  # a resolver failure is a fact about the node
        report["hostname_resolves_to"] = []
        report["missing"].append({"what": "hostname resolution", "why": "%s: %s" % (type(exc).__name__, exc)})


def _os_pretty_name(text):
    # type: (str) -> Optional[str]
    match = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', text, re.M)
    return match.group(1) if match else None


def collect_interfaces(report):
    # type: (Report) -> None
    addresses = {}  # type: Dict[str, List[str]]
    ip = run_tool(["ip", "-j", "addr", "show"])
    try:
        links = json.loads(ip["stdout"]) if ip["exit_code"] == 0 else None
    except ValueError:
        links = None  # an iproute2 that ignores -j
    if isinstance(links, list):
        for link in links:
            addresses[link.get("ifname", "")] = ["%s/%s" % (a.get("local"), a.get("prefixlen"))
                                                 for a in link.get("addr_info", []) if a.get("local")]
    else:
        ip = run_tool(["ip", "-o", "addr", "show"])  # iproute2 without JSON support
        for line in ip["stdout"].splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[2] in ("inet", "inet6"):
                addresses.setdefault(parts[1].split("@")[0], []).append(parts[3])
        if ip["exit_code"] != 0:
            # No iproute2 (minimal images, VMs): the kernel answers the same question without it.
            addresses = kernel_addresses()
            if not addresses:
                report["missing"].append({"what": "interface addresses",
                                          "why": ip["error"] or ip["stderr"].strip()})
    interfaces = []
    base = "/sys/class/net"
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        path = os.path.join(base, name)
        speed = _int(read_text(os.path.join(path, "speed")))
        interfaces.append({
            "name": name,
            "addresses": addresses.get(name, []),
            "mac": read_text(os.path.join(path, "address")),
            "mtu": _int(read_text(os.path.join(path, "mtu"))),
            "state": read_text(os.path.join(path, "operstate")),
            # speed is -1 or unreadable for links that are down or virtual
            "speed_mbps": speed if speed is not None and speed > 0 else None,
            "pci_bus_id": _pci_bus_id_of(os.path.join(path, "device")),
            "virtual": not os.path.exists(os.path.join(path, "device")),
        })
    report["interfaces"] = interfaces


SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's IPv4 address
SIOCGIFNETMASK = 0x891B  # and its netmask


def kernel_addresses():
    # type: () -> Dict[str, List[str]]
    """Addresses without iproute2: IPv4 through the SIOCGIFADDR ioctl, IPv6 from /proc/net/if_inet6."""
    import fcntl
    import struct

    found = {}  # type: Dict[str, List[str]]
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        names = []
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for name in names:
            request = struct.pack("256s", name.encode()[:15])
            try:
                address = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), SIOCGIFADDR, request)[20:24])
                mask = fcntl.ioctl(sock.fileno(), SIOCGIFNETMASK, request)[20:24]
            except OSError:
                continue  # no IPv4 address on this interface
            prefix = bin(struct.unpack("!I", mask)[0]).count("1")
            found.setdefault(name, []).append("%s/%d" % (address, prefix))
    finally:
        sock.close()
    for line in (read_text("/proc/net/if_inet6") or "").splitlines():
        fields = line.split()  # address(32 hex) index prefix(hex) scope flags name
        if len(fields) == 6 and len(fields[0]) == 32:
            groups = [fields[0][i:i + 4] for i in range(0, 32, 4)]
            packed = bytes.fromhex("".join(groups))
            address = socket.inet_ntop(socket.AF_INET6, packed)
            found.setdefault(fields[5], []).append("%s/%d" % (address, int(fields[2], 16)))
    return found


def _int(text):
    # type: (Optional[str]) -> Optional[int]
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


# --- CPU, NUMA, memory, limits ---------------------------------------------------------------


def collect_cpu(report):
    # type: (Report) -> None
    cpuinfo = read_text("/proc/cpuinfo", "") or ""
    fields = {}  # type: Dict[str, str]
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    model = fields.get("model name")
    if model is None:  # arm64 /proc/cpuinfo has no model name; lscpu does
        lscpu = run_tool(["lscpu"])
        match = re.search(r"^Model name:\s*(.+)$", lscpu["stdout"], re.M)
        model = match.group(1).strip() if match else None
    report["cpu"] = {
        "arch": platform.machine(),
        "model": model,
        "vendor": fields.get("vendor_id"),
        "family": _int(fields.get("cpu family")),
        "model_id": _int(fields.get("model")),
        "logical_cpus": os.cpu_count(),
        "online": read_text("/sys/devices/system/cpu/online"),
    }
    nodes = []
    base = "/sys/devices/system/node"
    names = sorted((n for n in os.listdir(base) if re.match(r"node\d+$", n)), key=lambda n: int(n[4:])) \
        if os.path.isdir(base) else []
    for name in names:
        meminfo = read_text(os.path.join(base, name, "meminfo"), "") or ""
        match = re.search(r"MemTotal:\s+(\d+) kB", meminfo)
        nodes.append({"id": int(name[4:]),
                      "cpulist": read_text(os.path.join(base, name, "cpulist")),
                      "cpumap": read_text(os.path.join(base, name, "cpumap")),
                      "memory_total_bytes": int(match.group(1)) * 1024 if match else None})
    if not nodes:
        report["missing"].append({"what": "NUMA nodes", "why": "%s is absent (kernel without NUMA)" % base})
    report["numa_nodes"] = nodes
    meminfo = read_text("/proc/meminfo", "") or ""
    match = re.search(r"MemTotal:\s+(\d+) kB", meminfo)
    report["memory_total_bytes"] = int(match.group(1)) * 1024 if match else None


def collect_limits(report):
    # type: (Report) -> None
    def limit(which):
        # type: (int) -> Dict[str, Optional[int]]
        soft, hard = resource.getrlimit(which)
        # None means unlimited (RLIM_INFINITY)
        return {"soft": None if soft == resource.RLIM_INFINITY else soft,
                "hard": None if hard == resource.RLIM_INFINITY else hard}

    report["ulimits"] = {"memlock_bytes": limit(resource.RLIMIT_MEMLOCK), "nofile": limit(resource.RLIMIT_NOFILE)}
    try:
        st = os.statvfs("/dev/shm")
        report["dev_shm"] = {"total_bytes": st.f_blocks * st.f_frsize, "free_bytes": st.f_bavail * st.f_frsize}
    except OSError as exc:
        report["dev_shm"] = None
        report["missing"].append({"what": "/dev/shm", "why": str(exc)})
    report["env"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


# --- PCI -------------------------------------------------------------------------------------

PCI_FILES = ("class", "vendor", "device", "subsystem_vendor", "subsystem_device", "max_link_speed",
             "max_link_width", "current_link_speed", "current_link_width", "numa_node")


def _pci_bus_id_of(device_link):
    # type: (str) -> Optional[str]
    """The PCI address a sysfs ``device`` link resolves to, or None for a virtual device."""
    real = os.path.realpath(device_link)
    if not os.path.exists(device_link) or "/pci" not in real:
        return None
    last = os.path.basename(real)
    return last.lower() if re.match(r"[0-9a-fA-F]{4,}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$", last) else None


def record_pci_path(report, bus_id):
    # type: (Report, str) -> None
    """Record a device's sysfs path and the attributes of every component on it (for NCCL XML)."""
    pci = report["pci"]
    link = "/sys/bus/pci/devices/%s" % bus_id
    if not os.path.exists(link):
        pci.setdefault(bus_id, {"path": None})
        return
    path = os.path.realpath(link)
    parts = path.split("/")
    for depth in range(4, len(parts) + 1):  # /sys/devices/pciDDDD:BB/...
        component = "/".join(parts[:depth])
        name = parts[depth - 1]
        if not re.match(r"[0-9a-fA-F]{4,}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$", name) or name.lower() in pci:
            continue
        entry = {"path": component}  # type: Dict[str, Any]
        for attr in PCI_FILES:
            entry[attr] = read_text(os.path.join(component, attr))
        pci[name.lower()] = entry


# --- GPUs ------------------------------------------------------------------------------------


def nvidia_pci_devices():
    # type: () -> List[str]
    """NVIDIA display/3D controllers in sysfs: tells "no GPU" from "GPU but no driver/tools"."""
    found = []
    base = "/sys/bus/pci/devices"
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        vendor = read_text(os.path.join(base, name, "vendor"))
        klass = read_text(os.path.join(base, name, "class")) or ""
        if vendor == "0x10de" and klass.startswith(("0x0300", "0x0302")):
            found.append(name.lower())
    return found


def _nvml_str(value):
    # type: (Any) -> str
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(errors, key, func):
    # type: (Dict[str, str], str, Callable[[], Any]) -> Any
    try:
        return func()
    except Exception as exc:  # NVML raises NVMLError_NotSupported and friends
        errors[key] = "%s: %s" % (type(exc).__name__, exc)
        return None


THROTTLE_BITS = [(0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"),
                 (0x8, "hw_slowdown"), (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"),
                 (0x40, "hw_thermal_slowdown"), (0x80, "hw_power_brake_slowdown"),
                 (0x100, "display_clock_setting")]


def nvml_gpus(nvml):
    # type: (Any) -> Dict[str, Any]
    nvml.nvmlInit()
    try:
        out = {"driver_version": _nvml_str(nvml.nvmlSystemGetDriverVersion()), "gpus": []}  # type: Dict[str, Any]
        try:
            cuda = nvml.nvmlSystemGetCudaDriverVersion()
            out["cuda_driver_version"] = "%d.%d" % (cuda // 1000, (cuda % 1000) // 10)
        except Exception:  # older drivers have no CUDA driver version call
            out["cuda_driver_version"] = None
        for index in range(nvml.nvmlDeviceGetCount()):
            out["gpus"].append(nvml_gpu(nvml, index))
        return out
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # shutting down is best effort
            pass


def nvml_gpu(nvml, index):
    # type: (Any, int) -> Dict[str, Any]
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    errors = {}  # type: Dict[str, str]
    gpu = {"index": index, "errors": errors}  # type: Dict[str, Any]
    gpu["name"] = _try(errors, "name", lambda: _nvml_str(nvml.nvmlDeviceGetName(handle)))
    gpu["uuid"] = _try(errors, "uuid", lambda: _nvml_str(nvml.nvmlDeviceGetUUID(handle)))
    pci = _try(errors, "pci", lambda: nvml.nvmlDeviceGetPciInfo(handle))
    gpu["pci_bus_id"] = _nvml_str(pci.busId) if pci is not None else None
    mem = _try(errors, "memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    gpu["memory_total_bytes"] = int(mem.total) if mem is not None else None
    gpu["memory_free_bytes"] = int(mem.free) if mem is not None else None
    cc = _try(errors, "compute_capability", lambda: nvml.nvmlDeviceGetCudaComputeCapability(handle))
    gpu["compute_capability"] = "%d.%d" % tuple(cc) if cc is not None else None
    gpu["pcie"] = {
        "max_gen": _try(errors, "pcie.max_gen", lambda: nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
        "max_width": _try(errors, "pcie.max_width", lambda: nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)),
        "cur_gen": _try(errors, "pcie.cur_gen", lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
        "cur_width": _try(errors, "pcie.cur_width", lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)),
    }
    words = ((os.cpu_count() or 64) + 63) // 64
    mask = _try(errors, "cpu_affinity", lambda: nvml.nvmlDeviceGetCpuAffinity(handle, words))
    if mask is not None:
        cpus = [w * 64 + b for w, word in enumerate(mask) for b in range(64) if int(word) >> b & 1]
        gpu["cpu_affinity"] = ",".join(str(c) for c in cpus)
    gpu["nvlinks"] = nvml_links(nvml, handle, errors)
    gpu["ecc"] = nvml_ecc(nvml, handle, errors)
    gpu["retired_pages"] = nvml_retired(nvml, handle, errors)
    rows = _try(errors, "remapped_rows", lambda: nvml.nvmlDeviceGetRemappedRows(handle))
    gpu["remapped_rows"] = None if rows is None else {
        "correctable": rows[0], "uncorrectable": rows[1], "pending": bool(rows[2]), "failure": bool(rows[3])}
    gpu["clocks_mhz"] = {
        "sm": _try(errors, "clock.sm", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
        "mem": _try(errors, "clock.mem", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)),
        "max_sm": _try(errors, "clock.max_sm", lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)),
        "max_mem": _try(errors, "clock.max_mem",
                        lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM)),
    }
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    bits = _try(errors, "throttle_reasons", lambda: reasons(handle)) if reasons else None
    gpu["throttle_mask"] = bits
    gpu["throttle_reasons"] = None if bits is None else [name for bit, name in THROTTLE_BITS if bits & bit]
    gpu["temperature_c"] = _try(errors, "temperature",
                                lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
    procs = _try(errors, "processes", lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle))
    gpu["processes"] = None if procs is None else [
        {"pid": p.pid, "used_memory_bytes": getattr(p, "usedGpuMemory", None),
         "name": read_text("/proc/%d/comm" % p.pid)} for p in procs]
    return gpu


def nvml_links(nvml, handle, errors):
    # type: (Any, Any, Dict[str, str]) -> List[Dict[str, Any]]
    links = []
    remote_types = {0: "gpu", 1: "ibmnpu", 2: "nvswitch"}
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except Exception as exc:  # NotSupported past the GPU's last link
            if link == 0:
                errors["nvlink"] = "%s: %s" % (type(exc).__name__, exc)
            continue
        entry = {"link": link, "active": bool(state)}  # type: Dict[str, Any]
        if state:
            remote = _try(errors, "nvlink%d.remote" % link, lambda: nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link))
            entry["remote_bus_id"] = _nvml_str(remote.busId) if remote is not None else None
            get_type = getattr(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
            kind = _try(errors, "nvlink%d.type" % link, lambda: get_type(handle, link)) if get_type else None
            entry["remote_type"] = remote_types.get(kind) if kind is not None else None
        links.append(entry)
    return links


def nvml_ecc(nvml, handle, errors):
    # type: (Any, Any, Dict[str, str]) -> Optional[Dict[str, Any]]
    mode = _try(errors, "ecc.mode", lambda: nvml.nvmlDeviceGetEccMode(handle))
    if mode is None:
        return None
    out = {"mode": "enabled" if mode[0] else "disabled"}  # type: Dict[str, Any]
    for scope, scope_name in ((nvml.NVML_VOLATILE_ECC, "volatile"), (nvml.NVML_AGGREGATE_ECC, "aggregate")):
        for kind, kind_name in ((nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, "corrected"),
                                (nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected")):
            out["%s_%s" % (scope_name, kind_name)] = _try(
                errors, "ecc.%s_%s" % (scope_name, kind_name),
                lambda: nvml.nvmlDeviceGetTotalEccErrors(handle, kind, scope))
    return out


def nvml_retired(nvml, handle, errors):
    # type: (Any, Any, Dict[str, str]) -> Optional[Dict[str, Any]]
    causes = (("single_bit", getattr(nvml, "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0)),
              ("double_bit", getattr(nvml, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1)))
    out = {}  # type: Dict[str, Any]
    for name, cause in causes:
        pages = _try(errors, "retired_pages." + name, lambda: nvml.nvmlDeviceGetRetiredPages(handle, cause))
        out[name] = None if pages is None else len(pages)
    pending = _try(errors, "retired_pages.pending", lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
    out["pending"] = None if pending is None else bool(pending)
    return out if any(v is not None for v in out.values()) else None


def collect_gpus(report):
    # type: (Report) -> None
    report["gpus"] = []
    report["driver_version"] = None
    report["cuda_driver_version"] = None
    report["nvidia_smi"] = {}
    pci_gpus = nvidia_pci_devices()
    report["nvidia_pci_devices"] = pci_gpus
    proc_version = read_text("/proc/driver/nvidia/version")
    if proc_version:
        match = re.search(r"Kernel Module(?: for \w+)?\s+(\d+\.\d+(?:\.\d+)?)", proc_version)
        report["driver_version"] = match.group(1) if match else None
    why_not_nvml = None
    try:
        import pynvml

        nvml_out = with_deadline(lambda: nvml_gpus(pynvml), NVML_TIMEOUT_S)
        report["gpus"] = nvml_out["gpus"]
        report["driver_version"] = nvml_out["driver_version"]
        report["cuda_driver_version"] = nvml_out.get("cuda_driver_version")
        report["gpu_source"] = "nvml"
    except ImportError:
        why_not_nvml = "pynvml is not importable by %s" % sys.executable
    except Exception as exc:  # NVML init fails without a driver
        why_not_nvml = "NVML failed: %s: %s" % (type(exc).__name__, exc)
    smi = shutil.which("nvidia-smi")
    if why_not_nvml is not None:
        report["missing"].append({"what": "NVML", "why": why_not_nvml})
        if smi is None:
            report["gpu_source"] = "none"
            reason = "no NVIDIA GPU on the PCI bus" if not pci_gpus else \
                "%d NVIDIA PCI device(s) but neither NVML (%s) nor nvidia-smi" % (len(pci_gpus), why_not_nvml)
            report["gpu_source_reason"] = reason
        else:
            query = run_tool([smi, "--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv"])
            if query["exit_code"] != 0 and "not a valid field" in (query["stdout"] + query["stderr"]):
                query = run_tool([smi, "--query-gpu=" + ",".join(QUERY_FIELDS_MINIMAL), "--format=csv"])
            report["nvidia_smi"]["query_gpu"] = query
            report["nvidia_smi"]["q"] = run_tool([smi, "-q"], timeout_s=60.0)
            if query["exit_code"] == 0:
                report["gpu_source"] = "nvidia-smi"
                report["gpu_source_reason"] = why_not_nvml
            else:
                report["gpu_source"] = "none"
                report["gpu_source_reason"] = "nvidia-smi failed: %s" % (
                    query["error"] or (query["stdout"] + query["stderr"]).strip()[:300])
    if smi is not None:
        report["nvidia_smi"]["topo_m"] = run_tool([smi, "topo", "-m"])
    else:
        report["missing"].append({"what": "nvidia-smi topo -m", "why": "nvidia-smi is not on PATH"})
    bus_ids = [g.get("pci_bus_id") for g in report["gpus"] if g.get("pci_bus_id")] or pci_gpus
    for bus_id in bus_ids:
        record_pci_path(report, _sysfs_bus_id(bus_id))


def _sysfs_bus_id(bus_id):
    # type: (str) -> str
    """NVML prints an 8-digit domain (00000000:17:00.0); sysfs uses 4 (0000:17:00.0)."""
    domain, _, rest = bus_id.lower().partition(":")
    return "%04x:%s" % (int(domain, 16), rest) if rest else bus_id.lower()


# --- RDMA ------------------------------------------------------------------------------------


def collect_rdma(report):
    # type: (Report) -> None
    base = "/sys/class/infiniband"
    devices = []
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        path = os.path.join(base, name)
        device_link = os.path.join(path, "device")
        ports = []
        ports_dir = os.path.join(path, "ports")
        for port in sorted(os.listdir(ports_dir), key=int) if os.path.isdir(ports_dir) else []:
            pdir = os.path.join(ports_dir, port)
            ports.append({"port": int(port), "state": read_text(os.path.join(pdir, "state")),
                          "phys_state": read_text(os.path.join(pdir, "phys_state")),
                          "rate": read_text(os.path.join(pdir, "rate")),
                          "link_layer": read_text(os.path.join(pdir, "link_layer"))})
        net_dir = os.path.join(device_link, "net")
        bus_id = _pci_bus_id_of(device_link)
        devices.append({
            "name": name,
            "node_guid": read_text(os.path.join(path, "node_guid")),
            "sys_image_guid": read_text(os.path.join(path, "sys_image_guid")),
            "hca_type": read_text(os.path.join(path, "hca_type")),
            "fw_ver": read_text(os.path.join(path, "fw_ver")),
            "board_id": read_text(os.path.join(path, "board_id")),
            "pci_path": os.path.realpath(device_link) if os.path.exists(device_link) else None,
            "pci_bus_id": bus_id,
            "numa_node": _int(read_text(os.path.join(device_link, "numa_node"))),
            "netdevs": sorted(os.listdir(net_dir)) if os.path.isdir(net_dir) else [],
            "ports": ports,
        })
        if bus_id:
            record_pci_path(report, bus_id)
            # NCCL merges the ports of a multi-port NIC into function 0: record that one too.
            record_pci_path(report, bus_id[:-1] + "0")
    if not devices:
        report["missing"].append({"what": "RDMA devices", "why": "%s is empty or absent" % base})
    modules = (read_text("/proc/modules", "") or "").splitlines()
    loaded = sorted({line.split()[0] for line in modules if line.strip()})
    report["rdma"] = {
        "devices": devices,
        "nvidia_peermem_loaded": "nvidia_peermem" in loaded or "nv_peer_mem" in loaded,
        "kernel_modules": [m for m in loaded if m.startswith(("nvidia", "nv_peer", "mlx5", "mlx4", "ib_", "rdma",
                                                               "gdrdrv", "efa"))],
    }


# --- software --------------------------------------------------------------------------------

SOFTWARE_SNIPPET = r"""
import json, sys
out = {}
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    try:
        out["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception as exc:
        out["nccl_error"] = "%s: %s" % (type(exc).__name__, exc)
except Exception as exc:
    out["torch_error"] = "%s: %s" % (type(exc).__name__, exc)
try:
    from importlib import metadata
    out["deepspeed"] = metadata.version("deepspeed")
except Exception as exc:
    out["deepspeed_error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""


def collect_software(report):
    # type: (Report) -> None
    software = {"python": platform.python_version(), "python_executable": sys.executable}  # type: Dict[str, Any]
    # torch is imported in a child with a deadline: a broken CUDA install must not hang the probe.
    result = run_tool([sys.executable, "-c", SOFTWARE_SNIPPET], timeout_s=SOFTWARE_TIMEOUT_S)
    if result["exit_code"] == 0 and result["error"] is None:
        try:
            found = json.loads(result["stdout"].strip().splitlines()[-1])
        except (ValueError, IndexError):
            found = {"probe_error": "unreadable output: %r" % result["stdout"][-300:]}
        software.update(found)
    else:
        software["probe_error"] = result["error"] or result["stderr"].strip()[-300:]
    report["software"] = software


def collect_tools(report):
    # type: (Report) -> None
    report["tools"] = {t: shutil.which(t) for t in ("nvidia-smi", "ibstat", "ibv_devinfo", "ip", "numactl", "lspci")}


# --- main ------------------------------------------------------------------------------------

SECTIONS = [("host", collect_host), ("interfaces", collect_interfaces), ("cpu", collect_cpu),
            ("limits", collect_limits), ("gpus", collect_gpus), ("rdma", collect_rdma),
            ("software", collect_software), ("tools", collect_tools)]


def main():
    # type: () -> int
    start = time.monotonic()
    report = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "missing": [], "errors": {}, "pci": {},
              "timings_s": {}, "gpus": [], "gpu_source": "none", "gpu_source_reason": None}  # type: Report
    for name, collect in SECTIONS:
        began = time.monotonic()
        try:
            collect(report)
        except Exception as exc:  # one broken section must not lose the others
            report["errors"][name] = "%s: %s" % (type(exc).__name__, exc)
        report["timings_s"][name] = round(time.monotonic() - began, 3)
    if report["gpu_source"] == "nvml" and not report["gpus"]:
        report["gpu_source_reason"] = "NVML reports no GPU"
    report["elapsed_s"] = round(time.monotonic() - start, 3)
    sys.stdout.write(json.dumps(report, sort_keys=True) + "\n")
    sys.stdout.flush()
    # A thread stuck in NVML must not keep the interpreter alive.
    os._exit(0)


if __name__ == "__main__":
    main()
