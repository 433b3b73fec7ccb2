"""The records this machine keeps of a run, as values: its index entry, a detached run's record,
the recovery keeper of a detached run with a recovery policy, a Slurm run's submission, and the
state last seen.

``~/.fstrain/launched/<run id>.json`` holds an :class:`IndexEntry`, ``RUN_DIR/detached.json`` a
:class:`DetachedRecord`, ``RUN_DIR/keeper.json`` a :class:`KeeperRecord`, ``RUN_DIR/state.json``
(a Slurm job's: in its job folder) a :class:`StateCache`, ``RUN_DIR/slurm.json`` a
:class:`SlurmRecord`. ``to_dict`` writes the
document with its format version (fstrain/core/formats.py); ``from_dict`` checks that version
and the fields, naming the file.
Pure: fstrain/io/runs.py reads and writes the files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fstrain.core.formats import check_format, problem, stamped
from fstrain.core.hosts.hostfile import Host
from fstrain.core.runs.fields import HINT as _HINT
from fstrain.core.runs.fields import integer as _int
from fstrain.core.runs.fields import number as _number
from fstrain.core.runs.fields import optional_integer as _int_or_none
from fstrain.core.runs.fields import optional_text as _optional_text
from fstrain.core.runs.fields import text as _text
from fstrain.core.runs.runstate import RunState
from fstrain.errors import InputError


@dataclass(frozen=True)
class IndexEntry:
    """One run started from this machine: where its local run directory is."""

    run_id: str
    run_dir: str
    detached: bool
    registered: float
    client_pid: int | None = None  # an attached run's launcher, while it runs
    kind: str = ""  # "slurm" for a `launch --slurm` submission
    job_id: str | None = None

    def to_dict(self, writer: str) -> dict[str, Any]:
        return stamped({"run_id": self.run_id, "run_dir": self.run_dir, "detached": self.detached,
                        "registered": self.registered, "client_pid": self.client_pid, "kind": self.kind,
                        "job_id": self.job_id}, "index", writer)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> IndexEntry:
        check_format(data, "index", where)
        return cls(_text(data, "run_id", where), _text(data, "run_dir", where), bool(data.get("detached")),
                   float(_number(data, "registered", where) or 0), _int_or_none(data, "client_pid", where),
                   str(data.get("kind") or ""), None if data.get("job_id") is None else str(data["job_id"]))


@dataclass(frozen=True)
class DetachedNode:
    """One node of a detached run, as `launch --detach` started it."""

    host: Host
    node_rank: int
    nproc: int
    rank_offset: int | None  # global rank of its local rank 0, where known at the start
    run_dir: str  # on the node
    watchdog_pid: int | None
    job_pid: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"host": {"name": self.host.name, "user": self.host.user, "port": self.host.port},
                "node_rank": self.node_rank, "nproc": self.nproc, "rank_offset": self.rank_offset,
                "run_dir": self.run_dir, "watchdog_pid": self.watchdog_pid, "job_pid": self.job_pid}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> DetachedNode:
        if not isinstance(data, Mapping) or not isinstance(data.get("host"), Mapping):
            raise InputError("a node is not a mapping with a host", _HINT, where)
        host = data["host"]
        return cls(Host(_text(host, "name", where), host.get("user"), _int_or_none(host, "port", where)),
                   _int(data, "node_rank", where), _int(data, "nproc", where), _int_or_none(data, "rank_offset", where),
                   _text(data, "run_dir", where), _int_or_none(data, "watchdog_pid", where),
                   _int_or_none(data, "job_pid", where))


@dataclass(frozen=True)
class DetachedRecord:
    """RUN_DIR/detached.json: what `launch --detach` started, where, and how to reach it again."""

    run_id: str
    backend: str
    started: float
    python: str
    grace_s: float
    ssh_config: str | None
    coordinator_address: str
    coordinator_port: int | None
    nodes: tuple[DetachedNode, ...]

    @property
    def hosts(self) -> list[Host]:
        return [node.host for node in self.nodes]

    def to_dict(self, writer: str) -> dict[str, Any]:
        return stamped({"run_id": self.run_id, "backend": self.backend, "started": self.started,
                        "python": self.python, "grace_s": self.grace_s, "ssh_config": self.ssh_config,
                        "coordinator": {"address": self.coordinator_address, "port": self.coordinator_port},
                        "nodes": [node.to_dict() for node in self.nodes]}, "detached", writer)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> DetachedRecord:
        check_format(data, "detached", where)
        coordinator = data.get("coordinator") or {}
        nodes = data.get("nodes")
        if not isinstance(coordinator, Mapping) or not isinstance(nodes, list) or not nodes:
            raise InputError("no coordinator or no nodes recorded", _HINT, where)
        return cls(_text(data, "run_id", where), str(data.get("backend") or ""),
                   float(_number(data, "started", where) or 0), _text(data, "python", where),
                   float(_number(data, "grace_s", where) or 0),
                   None if data.get("ssh_config") is None else str(data["ssh_config"]),
                   str(coordinator.get("address") or ""), _int_or_none(coordinator, "port", where),
                   tuple(DetachedNode.from_dict(node, f"{where}: nodes[{i}]") for i, node in enumerate(nodes)))


@dataclass(frozen=True)
class KeeperRecord:
    """RUN_DIR/keeper.json: the process on this machine that runs a detached run's attempts
    (``launch --detach --on-failure restart|exclude``, docs/recovery.md)."""

    run_id: str
    pid: int
    started: float
    log: str  # its stdout and stderr: RUN_DIR/keeper.log

    def to_dict(self, writer: str) -> dict[str, Any]:
        return stamped({"run_id": self.run_id, "pid": self.pid, "started": self.started, "log": self.log},
                       "keeper", writer)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> KeeperRecord:
        check_format(data, "keeper", where)
        return cls(_text(data, "run_id", where), _int(data, "pid", where),
                   float(_number(data, "started", where) or 0), str(data.get("log") or ""))


@dataclass(frozen=True)
class SlurmRecord:
    """RUN_DIR/slurm.json: a run submitted with `launch --slurm` (claimed before sbatch, with no
    job id yet; the job's own once it answered), or, in a job folder, the record of another job
    of the same script (submitted again by hand)."""

    run_id: str
    job_id: str | None  # None: claimed, sbatch has not answered
    submitted: float
    script: str | None = None
    output: str | None = None  # the job's output file
    grace_s: float | None = None  # the run's --grace, which `fstrain stop` waits for
    stop_requested: float | None = None  # when `fstrain stop` asked for the end (Slurm calls it FAILED)
    by_hand: bool = False  # another job of the same script: its record lives in its job folder

    def to_dict(self, writer: str) -> dict[str, Any]:
        document: dict[str, Any] = {"kind": "slurm", "run_id": self.run_id, "job_id": self.job_id,
                                    "submitted": self.submitted, "script": self.script, "output": self.output,
                                    "grace_s": self.grace_s}
        if self.stop_requested is not None:
            document["stop_requested"] = self.stop_requested
        if self.by_hand:
            document["by_hand"] = True
        return stamped(document, "slurm", writer)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> SlurmRecord:
        check_format(data, "slurm", where)
        if not isinstance(data, Mapping):
            raise InputError("not a Slurm run record", _HINT, where)
        job_id = data.get("job_id")
        stop = _number(data, "stop_requested", where)
        return cls(_text(data, "run_id", where), None if job_id is None else str(job_id),
                   float(_number(data, "submitted", where) or 0), _optional_text(data, "script"),
                   _optional_text(data, "output"), _number(data, "grace_s", where),
                   None if stop is None else float(stop), bool(data.get("by_hand")))


@dataclass(frozen=True)
class StateCache:
    """What this machine last saw of a run, written each time the run is asked about: its state,
    and what the kind of run that saw it adds (a detached run: its nodes and first failure; a
    Slurm run: Slurm's record of the job, whether the end is settled, whether a stop was asked).
    One shape for every kind of run; a cache, so an unreadable one is read as none."""

    state: str
    exit_code: int | None = None
    reason: str = ""
    ended: float | None = None
    at: float = 0.0  # when it was seen
    first_failure: Mapping[str, Any] | None = None  # a detached run's, as `status --json` has it
    nodes: tuple[Mapping[str, Any], ...] = ()  # a detached run's, per node as `status` last saw it
    job: Mapping[str, Any] | None = None  # a Slurm run: scontrol's answer as last seen
    settled: bool = False  # a Slurm run: ended and its manifest read (nothing changes after)
    stop_requested: bool = False  # a Slurm run: `fstrain stop` asked for its end

    def run_state(self) -> RunState:
        return RunState(self.state, self.exit_code, self.reason, self.ended)

    def to_dict(self, writer: str) -> dict[str, Any]:
        return stamped({"state": self.state, "exit_code": self.exit_code, "reason": self.reason, "ended": self.ended,
                        "at": self.at, "first_failure": self.first_failure, "nodes": list(self.nodes),
                        "job": self.job, "settled": self.settled, "stop_requested": self.stop_requested},
                       "state", writer)

    @classmethod
    def from_dict(cls, data: Any) -> StateCache | None:
        """None where it is no state of a format this fstrain reads."""
        if not isinstance(data, Mapping) or problem(data, "state") is not None:
            return None
        if not isinstance(data.get("state"), str):
            return None
        try:
            return cls(data["state"], _int_or_none(data, "exit_code", ""), str(data.get("reason") or ""),
                       _number(data, "ended", ""), float(_number(data, "at", "") or 0.0),
                       data.get("first_failure") if isinstance(data.get("first_failure"), Mapping) else None,
                       tuple(n for n in data.get("nodes") or () if isinstance(n, Mapping)),
                       data.get("job") if isinstance(data.get("job"), Mapping) else None,
                       bool(data.get("settled")), bool(data.get("stop_requested")))
        except InputError:
            return None


