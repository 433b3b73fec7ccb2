"""RUN_DIR/manifest.json as a value: what ran where (exact commands, hosts, masked environment,
versions), and how it ended (times, codes, the first failure, a stall's report).

An attached run's launcher writes it at the end; a detached run's client writes it at the start
(``reason`` "detached", no end) and its recovery keeper at the end; a run with a recovery policy
lists its ``attempts`` and says ``reason`` "restarting" between them; the bundled trainer's
``training_summary`` is added once rank 0's summary is fetched. :meth:`Manifest.to_dict` writes
the document with its format version (fstrain/core/formats.py, kind ``manifest``);
:meth:`Manifest.from_dict` checks that version and the fields, naming the file. Pure:
fstrain/io/launch.py builds and writes it, fstrain/io/runs.py reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fstrain.core.formats import WRITER_KEY, check_format, stamped
from fstrain.core.runs import fields
from fstrain.errors import InputError


@dataclass(frozen=True)
class ManifestNode:
    """One node of the run: its command and, once it ran, how it ended."""

    host: str
    node_rank: int
    nproc: int
    argv: tuple[str, ...]
    env: Mapping[str, str]  # masked
    started: float | None = None  # None: the node never ran (a dry run, a detached start)
    ended: float | None = None
    exit_code: int | None = None
    error: str | None = None
    seconds: float | None = None
    last_lines: tuple[str, ...] = ()
    failed_rank: Mapping[str, Any] | None = None  # rank, local_rank, exit_code, signal

    def to_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"host": self.host, "node_rank": self.node_rank, "nproc": self.nproc,
                                 "argv": list(self.argv), "env": dict(self.env)}
        if self.started is not None:
            entry.update(exit_code=self.exit_code, error=self.error, started=self.started, ended=self.ended,
                         seconds=self.seconds, last_lines=list(self.last_lines), failed_rank=self.failed_rank)
        return entry

    @classmethod
    def from_dict(cls, data: Any, where: str) -> ManifestNode:
        if not isinstance(data, Mapping):
            raise InputError(f"a node entry is not an object: {data!r}", fields.HINT, where)
        return cls(
            host=fields.text(data, "host", where),
            node_rank=fields.integer(data, "node_rank", where),
            nproc=fields.integer(data, "nproc", where),
            argv=tuple(str(a) for a in fields.items(data, "argv", where)),
            env=fields.strings(data, "env", where),
            started=fields.number(data, "started", where),
            ended=fields.number(data, "ended", where),
            exit_code=fields.optional_integer(data, "exit_code", where),
            error=None if data.get("error") is None else str(data["error"]),
            seconds=fields.number(data, "seconds", where),
            last_lines=tuple(str(line) for line in fields.items(data, "last_lines", where)),
            failed_rank=fields.mapping(data, "failed_rank", where),
        )


@dataclass(frozen=True)
class Manifest:
    """RUN_DIR/manifest.json."""

    run_id: str
    backend: str
    master_addr: str | None = None
    master_port: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # the user's, masked
    plan: Mapping[str, Any] | None = None  # the plan it trains with
    versions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # per host: hostname, python, ...
    started: float | None = None
    ended: float | None = None  # None: not ended (a detached run's start, between attempts)
    exit_code: int | None = None
    reason: str = ""  # the launcher's: ok, failed, lost, ..., "detached", "restarting", "dry-run"
    stall: Mapping[str, Any] | None = None  # the hang report's summary, when the run stalled
    detail: str | None = None  # what failed, in words
    first_failure_node_rank: int | None = None
    first_failure: Mapping[str, Any] | None = None  # rank, local_rank, exit_code, signal
    nodes: tuple[ManifestNode, ...] = ()
    detached: bool = False
    attempts: tuple[Mapping[str, Any], ...] = ()  # fstrain/core/launch/recovery.py Attempt.to_dict
    training_summary: Mapping[str, Any] | None = None  # the bundled trainer's summary.json
    writer: str = ""  # the fstrain version that wrote the file read (empty for one not read)

    @property
    def failed_host(self) -> str | None:
        """The host of the node the first failure was on."""
        return next((n.host for n in self.nodes if n.node_rank == self.first_failure_node_rank), None)

    def to_dict(self, writer: str) -> dict[str, Any]:
        """The file's document, stamped with ``writer`` (a file read again: its own :attr:`writer`)."""
        document: dict[str, Any] = {
            "run_id": self.run_id, "backend": self.backend, "master_addr": self.master_addr,
            "master_port": self.master_port, "env": dict(self.env), "plan": self.plan,
            "versions": {host: dict(v) for host, v in self.versions.items()}, "started": self.started,
            "ended": self.ended, "exit_code": self.exit_code, "reason": self.reason, "stall": self.stall,
            "detail": self.detail, "first_failure_node_rank": self.first_failure_node_rank,
            "first_failure": self.first_failure, "nodes": [n.to_dict() for n in self.nodes],
        }
        if self.detached:
            document["detached"] = True
        if self.attempts:
            document["attempts"] = [dict(a) for a in self.attempts]
        if self.training_summary is not None:
            document["training_summary"] = self.training_summary
        return stamped(document, "manifest", writer)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Manifest:
        check_format(data, "manifest", where)
        if not isinstance(data, Mapping):
            raise InputError("not a run manifest", fields.HINT, where)
        versions = fields.mapping(data, "versions", where) or {}
        return cls(
            run_id=fields.text(data, "run_id", where),
            backend=str(data.get("backend") or ""),
            master_addr=None if data.get("master_addr") is None else str(data["master_addr"]),
            master_port=fields.optional_integer(data, "master_port", where),
            env=fields.strings(data, "env", where),
            plan=fields.mapping(data, "plan", where),
            versions={str(h): v for h, v in versions.items() if isinstance(v, Mapping)},
            started=fields.number(data, "started", where),
            ended=fields.number(data, "ended", where),
            exit_code=fields.optional_integer(data, "exit_code", where),
            reason=str(data.get("reason") or ""),
            stall=fields.mapping(data, "stall", where),
            detail=None if data.get("detail") is None else str(data["detail"]),
            first_failure_node_rank=fields.optional_integer(data, "first_failure_node_rank", where),
            first_failure=fields.mapping(data, "first_failure", where),
            nodes=tuple(ManifestNode.from_dict(n, where) for n in fields.items(data, "nodes", where)),
            detached=bool(data.get("detached")),
            attempts=tuple(fields.objects(data, "attempts", where)),
            training_summary=fields.mapping(data, "training_summary", where),
            writer=str(data.get(WRITER_KEY) or ""),
        )
