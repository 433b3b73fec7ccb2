"""``fstrain bench``'s result on disk: node 0's ``bench.json`` fetched and checked, saved and
read back (the run itself is a job of the run driver: fstrain/api/bench.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fstrain.core.bench.report import check_document
from fstrain.core.hosts.hostfile import Host
from fstrain.errors import FstrainError, InputError
from fstrain.io.documents import fetch_json, write_json_atomic
from fstrain.io.transport.base import Transport

DOCUMENT = "bench.json"


FETCH_ATTEMPTS = 3
"""Reads of a node's bench.json before the next node's copy is tried (a read can come back short)."""


class BenchError(FstrainError):
    """The benchmark ran but its result could not be read: a failure to measure (exit 3)."""

    exit_code = 3


def fetch_document(hosts: Sequence[Host], node_run_dirs: Sequence[str], connect: Callable[[Host], Transport],
                   local_run_dir: Path) -> dict[str, Any]:
    """The result document, checked, and kept in the local run directory: node 0's bench.json,
    read again when a read comes back short or unreadable, else another node's copy (every
    node's first rank writes one)."""
    problems: list[str] = []
    for host, node_run_dir in zip(hosts, node_run_dirs, strict=True):
        where = f"{host.label()}:{node_run_dir}/{DOCUMENT}"
        for _ in range(FETCH_ATTEMPTS):
            try:
                document = _read_remote(host, f"{node_run_dir}/{DOCUMENT}", connect, where)
            except FstrainError as error:
                problems.append(error.message)
                continue
            save_document(local_run_dir / DOCUMENT, document)
            return document
    first = f"{hosts[0].label()}:{node_run_dirs[0]}/{DOCUMENT}"
    raise BenchError(f"the benchmark finished but its result could not be read ({problems[-1]})",
                     f"copy {first} here and print its report with `fstrain bench --from {DOCUMENT}`",
                     first)


def _read_remote(host: Host, path: str, connect: Callable[[Host], Transport], where: str) -> dict[str, Any]:
    document, error = fetch_json(connect, host, path)
    if error is not None:
        raise BenchError(f"{where}: {error}")
    return check_document(document, where)


def save_document(path: Path, document: Mapping[str, Any]) -> None:
    """Write a document whole, then rename it into place."""
    write_json_atomic(path, document, indent=1)


def read_json(path: str) -> Any:
    """A JSON file, or one InputError naming it."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError("file not found", "check the path", path) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read JSON: {exc}", "give a file fstrain wrote", path) from None


def read_document(path: str) -> dict[str, Any]:
    """A bench document from a file (for ``doctor --bench-file`` and tests)."""
    return check_document(read_json(path), path)
