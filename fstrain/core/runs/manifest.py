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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fstrain.core.formats import WRITER_KEY, check_format, stamped
from fstrain.errors import InputError

_HINT = "the file was changed by hand or cut short: start the run again, or remove the run folder"


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
            raise InputError(f"a node entry is not an object: {data!r}", _HINT, where)
        return cls(
            host=_text(data, "host", where),
            node_rank=_int(data, "node_rank", where),
            nproc=_int(data, "nproc", where),
            argv=tuple(str(a) for a in _list(data, "argv", where)),
            env=_strings(data, "env", where),
            started=_number(data, "started", where),
            ended=_number(data, "ended", where),
            exit_code=_optional_int(data, "exit_code", where),
            error=None if data.get("error") is None else str(data["error"]),
            seconds=_number(data, "seconds", where),
            last_lines=tuple(str(line) for line in _list(data, "last_lines", where)),
            failed_rank=_mapping(data, "failed_rank", where),
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
            raise InputError("not a run manifest", _HINT, where)
        versions = _mapping(data, "versions", where) or {}
        return cls(
            run_id=_text(data, "run_id", where),
            backend=str(data.get("backend") or ""),
            master_addr=None if data.get("master_addr") is None else str(data["master_addr"]),
            master_port=_optional_int(data, "master_port", where),
            env=_strings(data, "env", where),
            plan=_mapping(data, "plan", where),
            versions={str(h): v for h, v in versions.items() if isinstance(v, Mapping)},
            started=_number(data, "started", where),
            ended=_number(data, "ended", where),
            exit_code=_optional_int(data, "exit_code", where),
            reason=str(data.get("reason") or ""),
            stall=_mapping(data, "stall", where),
            detail=None if data.get("detail") is None else str(data["detail"]),
            first_failure_node_rank=_optional_int(data, "first_failure_node_rank", where),
            first_failure=_mapping(data, "first_failure", where),
            nodes=tuple(ManifestNode.from_dict(n, where) for n in _list(data, "nodes", where)),
            detached=bool(data.get("detached")),
            attempts=tuple(_objects(data, "attempts", where)),
            training_summary=_mapping(data, "training_summary", where),
            writer=str(data.get(WRITER_KEY) or ""),
        )


def _text(data: Mapping[str, Any], key: str, where: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise InputError(f"manifest field {key} must be non-empty text, got {value!r}", _HINT, where)
    return value


def _int(data: Mapping[str, Any], key: str, where: str) -> int:
    value = _optional_int(data, key, where)
    if value is None:
        raise InputError(f"manifest field {key} must be a whole number, got nothing", _HINT, where)
    return value


def _optional_int(data: Mapping[str, Any], key: str, where: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"manifest field {key} must be a whole number, got {value!r}", _HINT, where)
    return value


def _number(data: Mapping[str, Any], key: str, where: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"manifest field {key} must be a number, got {value!r}", _HINT, where)
    return float(value)


def _mapping(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any] | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InputError(f"manifest field {key} must be an object, got {value!r}", _HINT, where)
    return value


def _strings(data: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in (_mapping(data, key, where) or {}).items()}


def _list(data: Mapping[str, Any], key: str, where: str) -> Sequence[Any]:
    value = data.get(key)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InputError(f"manifest field {key} must be a list, got {value!r}", _HINT, where)
    return value


def _objects(data: Mapping[str, Any], key: str, where: str) -> list[Mapping[str, Any]]:
    values = _list(data, key, where)
    if not all(isinstance(v, Mapping) for v in values):
        raise InputError(f"manifest field {key} must be a list of objects", _HINT, where)
    return list(values)
