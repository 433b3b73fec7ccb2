"""Files fstrain writes on this machine and JSON documents it reads from a node.

Every file is written whole or not at all: into a temporary name beside it, then renamed into
place (``os.replace``), so a crash or a full disk never leaves a truncated manifest, record or
page for the next reader. (The scripts that run on the nodes, fstrain/io/remote/, do the same
with their own few lines: they travel as source and import nothing of fstrain.)
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fstrain.core.hosts.hostfile import Host
from fstrain.io.transport.base import Transport


def write_text_atomic(path: Path, text: str) -> None:
    """``text`` as ``path``, whole; the folder is made where missing. OSError on failure, and
    then nothing is left behind but what was there before."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def write_json_atomic(path: Path, document: Mapping[str, Any], indent: int = 2) -> None:
    write_text_atomic(path, json.dumps(document, indent=indent) + "\n")


def write_json_or_warn(path: Path, document: Mapping[str, Any]) -> bool:
    """:func:`write_json_atomic` where losing this machine's copy must not stop anything (a full
    disk): the failure is said once on stderr. Whether it was written."""
    from fstrain.io.localout import describe, warn

    try:
        write_json_atomic(path, document)
    except OSError as exc:
        warn(f"cannot write {path} ({describe(exc)})")
        return False
    return True


def fetch_json(connect: Callable[[Host], Transport], host: Host, path: str,
               timeout_s: float = 60) -> tuple[Any, str | None]:
    """The JSON document at ``path`` on ``host``: (document, None), or (None, why not)."""
    transport = connect(host)
    try:
        result = transport.run(["cat", path], timeout_s=timeout_s)
    finally:
        transport.close()
    if not result.ok:
        return None, result.error or result.stderr.strip() or "cat failed"
    try:
        return json.loads(result.stdout), None
    except ValueError as exc:
        return None, f"unreadable ({exc})"
