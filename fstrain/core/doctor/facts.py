"""What `fstrain doctor` collects, as plain values: the checks are pure functions of these.

The edge (:mod:`fstrain.io.doctor`) fills them in from SSH, the node probe and small remote
helpers; tests build them from captured probe reports and tool output. A ``None`` means "not
collected" (a stage that was not run, a host that could not be reached), never "fine".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Report = Mapping[str, Any]


@dataclass(frozen=True)
class Interface:
    """An IPv4 interface of a host (addresses without prefix length)."""

    name: str
    addresses: tuple[str, ...]
    state: str | None = None  # "up", "down", "unknown" (sysfs operstate)
    mtu: int | None = None

    @property
    def usable(self) -> bool:
        """Up (or "unknown", as virtual links report) with an address that is not loopback."""
        return self.state in ("up", "unknown", None) and any(not a.startswith("127.") for a in self.addresses)


@dataclass(frozen=True)
class FileFacts:
    """A file a setting names (``NCCL_TOPO_FILE``), as the host sees it."""

    path: str
    readable: bool
    text: str | None = None  # the first MiB, when readable
    error: str | None = None


@dataclass(frozen=True)
class DiskFacts:
    """The checkpoint directory on one host: space and a timed write with fsync."""

    path: str
    exists: bool
    measured_at: str  # the directory (or its nearest existing parent) that was measured
    writable: bool
    free_bytes: int | None = None
    total_bytes: int | None = None
    write_bytes: int = 0
    write_s: float | None = None
    error: str | None = None

    @property
    def write_mb_per_s(self) -> float | None:
        if not self.write_s or not self.write_bytes:
            return None
        return self.write_bytes / self.write_s / 1e6


@dataclass(frozen=True)
class RunRecord:
    """One ``~/.fstrain/active/<run>.node<N>.json`` left by the launcher's watchdog.

    ``state``: ``running`` (its watchdog lives), ``orphan`` (the watchdog is gone, the job lives
    and is verified to be that run's process), ``stale`` (nothing of the run is left) or
    ``unverified`` (a process has the job's pid but is not that run's, or cannot be read).
    """

    run_id: str
    node_rank: int | None
    record: str
    state: str
    watchdog_pid: int | None = None
    job_pid: int | None = None
    pids: tuple[int, ...] = ()  # the job and its descendants, verified
    started: float | None = None
    argv: tuple[str, ...] = ()
    killed: tuple[int, ...] = ()
    survivors: tuple[int, ...] = ()
    removed: bool = False  # the record file was deleted (after a kill, or stale)
    note: str = ""


@dataclass(frozen=True)
class HostFacts:
    """Everything collected on one host. ``reach_error`` set: nothing else was collected."""

    name: str
    slots: int | None = None
    reach_error: str | None = None
    connect_s: float | None = None
    clock_offset_s: float | None = None  # remote clock minus this machine's, midpoint-corrected
    clock_uncertainty_s: float | None = None  # half the round trip of the clock reading
    python: str = "python3"  # the interpreter asked for (--python)
    python_error: str | None = None  # it could not run there
    probe_python: str | None = None  # the interpreter the probe ran with (python3 when --python failed)
    report: Report | None = None  # the validated probe report
    probe_error: str | None = None
    interfaces: tuple[Interface, ...] | None = None
    workdir_exists: bool | None = None
    nccl_conf: tuple[tuple[str, str], ...] = ()  # (path, text), the highest precedence first
    files: Mapping[str, FileFacts] = field(default_factory=dict)
    nvidia_smi_q: str | None = None  # `nvidia-smi -q` text, for what the probe does not record
    cap_ipc_lock: bool | None = None  # processes may lock memory regardless of ulimit -l
    disk: DiskFacts | None = None
    runs: tuple[RunRecord, ...] | None = None

    @property
    def reachable(self) -> bool:
        return self.reach_error is None


@dataclass(frozen=True)
class Connection:
    """One TCP connection attempt from ``source`` to an address of ``target``."""

    source: str
    target: str
    interface: str  # the target's interface that has ``address``
    address: str
    port: int
    ok: bool
    error: str | None = None
    via: str | None = None  # the source's interface the connection left by
    self_address: bool = False  # the address is also one of the source's own: proves nothing


@dataclass(frozen=True)
class Rendezvous:
    """The temporary listener on the master and every host's connection to it."""

    master: str
    requested_port: int | None  # --master-port, or None (the launcher's candidates were tried)
    port: int | None  # the port the listener got; None: none was free, or it could not start
    busy: tuple[int, ...] = ()
    error: str | None = None
    connections: tuple[Connection, ...] = ()


@dataclass(frozen=True)
class SharedDir:
    """Whether a marker written in the checkpoint directory on ``writer`` is seen elsewhere."""

    writer: str
    seen_by: tuple[str, ...]
    not_seen_by: tuple[str, ...]
    errors: Mapping[str, str] = field(default_factory=dict)
    path: str = ""  # where the marker was written (the directory, or its nearest existing parent)


@dataclass(frozen=True)
class PlanNeeds:
    """What a plan (``--plan plan.yaml``) asks of the cluster."""

    source: str
    gpu_memory_bytes: int | None  # predicted peak per GPU
    checkpoint_bytes: int | None  # weights + master copy + optimizer states, all ranks
    world_size: int
    num_nodes: int
    gpus_per_node: int
    gpu: str


@dataclass(frozen=True)
class DoctorFacts:
    """The whole collection. ``matrix``/``rendezvous``/``shared`` are None when not run."""

    hosts: tuple[HostFacts, ...]
    python: str = "python3"
    workdir: str | None = None
    checkpoint_dir: str | None = None
    plan: PlanNeeds | None = None
    matrix: tuple[Connection, ...] | None = None
    matrix_targets: tuple[str, ...] = ()  # hosts that had a listener (all, or a sample)
    rendezvous: Rendezvous | None = None
    shared: SharedDir | None = None
    reached_through: str | None = None  # how the hosts were reached when not over SSH: "srun in Slurm job 14"

    @property
    def reached(self) -> list[HostFacts]:
        return [h for h in self.hosts if h.reachable]

    @property
    def probed(self) -> list[HostFacts]:
        """Hosts with a probe report."""
        return [h for h in self.hosts if h.report is not None]

    def host(self, name: str) -> HostFacts:
        return next(h for h in self.hosts if h.name == name)


def interfaces_from_report(report: Report) -> tuple[Interface, ...]:
    """The probe's interfaces as :class:`Interface` values (IPv4 addresses only)."""
    found = []
    for entry in report.get("interfaces") or []:
        if not isinstance(entry, Mapping) or not entry.get("name"):
            continue
        v4 = tuple(str(a).split("/")[0] for a in entry.get("addresses") or [] if ":" not in str(a))
        found.append(Interface(str(entry["name"]), v4, entry.get("state"), entry.get("mtu")))
    return tuple(found)


def merged_env(host: HostFacts) -> dict[str, tuple[str, str]]:
    """``NAME -> (value, where)`` as NCCL sees it: the environment wins over ``NCCL_CONF_FILE`` (or
    ``~/.nccl.conf``), which wins over ``/etc/nccl.conf`` (NCCL's ``initEnv``, setenv without
    overwrite). Lines are ``KEY=VALUE`` with nothing trimmed; ``#`` comments only at column 0."""
    env: dict[str, tuple[str, str]] = {}
    for key, value in ((host.report or {}).get("env") or {}).items():
        env[str(key)] = (str(value), "environment")
    for path, text in host.nccl_conf:
        for line in text.splitlines():
            line = line.rstrip("\r")
            if not line or line.startswith("#") or "=" not in line:
                continue
            key, _, value = line.partition("=")
            env.setdefault(key, (value, path))
    return env


def software(host: HostFacts) -> Mapping[str, Any]:
    sw = (host.report or {}).get("software")
    return sw if isinstance(sw, Mapping) else {}


def host_names(hosts: Sequence[HostFacts]) -> tuple[str, ...]:
    return tuple(h.name for h in hosts)
