"""``fstrain bench``'s result on disk: node 0's ``bench.json`` fetched and checked, saved and
read back (the run itself is a job of the run driver: fstrain/api/bench.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fstrain.core.bench.report import check_document
from fstrain.core.hosts.hostfile import Host
from fstrain.errors import FstrainError, InputError
from fstrain.io.transport.base import Transport

DOCUMENT = "bench.json"


class BenchError(FstrainError):
    """The benchmark ran but left no result to read."""


def fetch_document(host: Host, node_run_dir: str, connect: Callable[[Host], Transport],
                   local_run_dir: Path) -> dict[str, Any]:
    """Node 0's bench.json, checked, and kept in the local run directory."""
    transport = connect(host)
    try:
        result = transport.run(["cat", f"{node_run_dir}/{DOCUMENT}"], timeout_s=60)
    finally:
        transport.close()
    where = f"{host.label()}:{node_run_dir}/{DOCUMENT}"
    if not result.ok:
        raise BenchError(f"the benchmark finished but left no result: {result.error or result.stderr.strip()}",
                         "see the logs in the run directory", where)
    try:
        document = check_document(json.loads(result.stdout), where)
    except json.JSONDecodeError as exc:
        raise BenchError(f"unreadable result: {exc}", "see the logs in the run directory", where) from None
    save_document(local_run_dir / DOCUMENT, document)
    return document


def save_document(path: Path, document: Mapping[str, Any]) -> None:
    """Write a document whole, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=1) + "\n")
    tmp.replace(path)


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
