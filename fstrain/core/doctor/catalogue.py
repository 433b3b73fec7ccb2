"""The catalogue: every check, what it looks at, and which collection stages it needs.

Stages (what :mod:`fstrain.io.doctor` runs; only those a selected check needs):
``connect`` (always), ``clock``, ``probe`` (the node probe), ``interfaces`` (the probe's, or a
quick read without it), ``extras`` (working directory, NCCL config files, ``NCCL_TOPO_FILE``,
``nvidia-smi -q``), ``matrix`` (listeners and connections between hosts), ``rendezvous`` (the
temporary listener on the master), ``checkpoint`` (free space and a timed write), ``shared``
(the marker test), ``orphans`` (the watchdog's run records).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fstrain.core.doctor import gpus, ncclenv, network, nvlink, orphans, rdma, reach, software, system
from fstrain.core.doctor.facts import DoctorFacts
from fstrain.core.doctor.result import CheckResult
from fstrain.errors import InputError

STAGES = ("connect", "clock", "probe", "interfaces", "extras", "matrix", "rendezvous", "checkpoint", "shared",
          "orphans")


@dataclass(frozen=True)
class Check:
    id: str
    title: str  # what it looks at, one line (shown by --list and in docs/doctor.md)
    needs: tuple[str, ...]
    run: Callable[[DoctorFacts], list[CheckResult]]

    @property
    def family(self) -> str:
        return self.id.split(".")[0]


P = ("probe",)
CHECKS: tuple[Check, ...] = (
    Check("ssh.connect", "SSH connect and authentication per host, and the time it takes (inside a Slurm "
          "allocation: the srun path)", (), reach.check_connect),
    Check("clock.skew", "clock offsets between hosts", ("clock",), reach.check_clock),
    Check("net.hostname", "each host's hostname resolves to its own, non-loopback address", P,
          network.check_hostname),
    Check("net.reachability", "which interfaces of each host every other host reaches (TCP)",
          ("interfaces", "matrix"), network.check_reachability),
    Check("net.virtual_interfaces", "container/virtual interfaces NCCL might pick", ("probe", "extras", "matrix"),
          network.check_virtual_interfaces),
    Check("net.socket_ifname", "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME name existing, reachable interfaces",
          ("probe", "extras", "matrix", "rendezvous"), network.check_socket_ifname),
    Check("net.mtu", "the MTU of every host's data interface", ("probe", "rendezvous"), network.check_mtu),
    Check("net.rendezvous_port", "the master port is free on the master and reachable from every host",
          ("interfaces", "rendezvous"), network.check_rendezvous),
    Check("sw.interpreter", "the program's interpreter (--python) runs on every host", P,
          software.check_interpreter),
    Check("sw.workdir", "the working directory (--workdir) exists on every host", ("extras",), software.check_workdir),
    Check("sw.python", "the same Python on every host", P, software.check_python),
    Check("sw.torch", "the same torch on every host", P, software.check_torch),
    Check("sw.cuda_runtime", "the same CUDA runtime (torch's build) on every host", P, software.check_cuda_runtime),
    Check("sw.nccl", "the same NCCL (the library torch loads) on every host", P, software.check_nccl),
    Check("sw.deepspeed", "the same deepspeed on every host", P, software.check_deepspeed),
    Check("sw.driver", "the same NVIDIA driver on every host", P, software.check_driver),
    Check("sw.cuda_driver", "torch's CUDA build is supported by the driver", ("probe", "extras"),
          software.check_cuda_driver),
    Check("sw.nccl_version", "NCCL is 2.19 or newer", P, software.check_nccl_version),
    Check("gpu.count", "GPUs found equal the slots (and the plan's GPUs per node)", P, gpus.check_count),
    Check("gpu.type", "the same GPU model and memory everywhere", P, gpus.check_type),
    Check("gpu.ecc", "uncorrectable ECC errors, pending page retirement, row remapping failures", P,
          gpus.check_ecc),
    Check("gpu.clocks", "clocks throttled for thermal or power reasons", P, gpus.check_clocks),
    Check("gpu.persistence", "persistence mode", ("probe", "extras"), gpus.check_persistence),
    Check("gpu.processes", "other processes holding GPU memory", P, gpus.check_processes),
    Check("gpu.memory", "free GPU memory vs what the plan needs (--plan)", P, gpus.check_memory),
    Check("gpu.pcie", "PCIe links below their width or generation", ("probe", "extras"), gpus.check_pcie),
    Check("topo.nvlink", "every NVLink the GPUs have is up", P, nvlink.check_nvlink),
    Check("topo.identical", "hosts with the same GPUs have the same topology (shape hash)", P,
          nvlink.check_identical),
    Check("rdma.ports", "RDMA devices present, ports ACTIVE at the expected rate", ("probe", "extras"),
          rdma.check_ports),
    Check("rdma.ib_hca", "NCCL_IB_HCA names devices that exist", ("probe", "extras"), rdma.check_ib_hca),
    Check("rdma.peermem", "nvidia_peermem loaded where GPUs and RDMA meet (GPUDirect RDMA)", P,
          rdma.check_peermem),
    Check("rdma.memlock", "ulimit -l lets NCCL register memory with the HCA", ("probe", "extras"),
          rdma.check_memlock),
    Check("env.unknown", "NCCL_* names NCCL does not read (typos, with a did-you-mean)", ("probe", "extras"),
          ncclenv.check_unknown),
    Check("env.deprecated", "deprecated names (NCCL_ASYNC_ERROR_HANDLING -> TORCH_NCCL_...)", ("probe", "extras"),
          ncclenv.check_deprecated),
    Check("env.values", "values NCCL rejects or silently ignores (NCCL_P2P_LEVEL, NCCL_DEBUG, ...)",
          ("probe", "extras"), ncclenv.check_values),
    Check("env.topo_file", "NCCL_TOPO_FILE exists, is readable and parses", ("probe", "extras"),
          ncclenv.check_topo_file),
    Check("env.consistency", "the same variable set the same way on every host", ("probe", "extras"),
          ncclenv.check_consistency),
    Check("sys.shm", "/dev/shm size", P, system.check_shm),
    Check("sys.nofile", "ulimit -n", P, system.check_nofile),
    Check("ckpt.space", "free space of --checkpoint-dir vs the plan's checkpoint size", ("checkpoint",),
          system.check_ckpt_space),
    Check("ckpt.throughput", "write throughput of --checkpoint-dir", ("checkpoint",), system.check_ckpt_throughput),
    Check("ckpt.shared", "whether --checkpoint-dir is shared between hosts (a marker test)", ("shared",),
          system.check_ckpt_shared),
    Check("proc.orphans", "processes left by an earlier fstrain run", ("orphans",), orphans.check_orphans),
)
IDS = tuple(c.id for c in CHECKS)
FAMILIES = tuple(dict.fromkeys(c.family for c in CHECKS))


def _tokens(text: str | None, flag: str) -> list[str]:
    tokens = [t.strip() for t in (text or "").split(",") if t.strip()]
    for token in tokens:
        if token not in IDS and token not in FAMILIES:
            close = difflib.get_close_matches(token, IDS + FAMILIES, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else "see `fstrain doctor --list`"
            raise InputError(f"unknown check {token!r}", hint, flag)
    return tokens


def select(only: str | None = None, skip: str | None = None) -> tuple[Check, ...]:
    """The checks ``--only``/``--skip`` leave (ids like ``gpu.ecc`` or families like ``gpu``)."""
    wanted, unwanted = _tokens(only, "--only"), _tokens(skip, "--skip")

    def hit(check: Check, tokens: Sequence[str]) -> bool:
        return check.id in tokens or check.family in tokens

    chosen = tuple(c for c in CHECKS if (not wanted or hit(c, wanted)) and not hit(c, unwanted))
    if not chosen:
        raise InputError("no check is left to run", "loosen --only/--skip", "--only/--skip")
    return chosen


def stages(checks: Sequence[Check]) -> frozenset[str]:
    """The collection stages the checks need (``connect`` always)."""
    return frozenset({"connect", *(s for c in checks for s in c.needs)})


def run_checks(facts: DoctorFacts, checks: Sequence[Check] = CHECKS) -> list[CheckResult]:
    """Every selected check's rows, in catalogue order."""
    results: list[CheckResult] = []
    for check in checks:
        results.extend(check.run(facts))
    return results
