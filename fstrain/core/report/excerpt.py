"""The last lines of a failed run's failing rank: what it printed before it ended, for the report.

Two sources, as for the timeline (events.py):

- a manifest (an attached run's, a Slurm job's, a recovering detached run's once its keeper
  wrote one): the node of the first failure keeps ``last_lines``, the failed rank's own where
  the launcher knew which rank failed (fstrain/io/launch.py ``last_lines``), else the node's;
- a detached run's node views: each node's record keeps the node's last lines, every rank's,
  each tagged ``[localN]:`` (fstrain/io/remote/coordinator.py); the failed rank's are picked out
  and tagged ``[host rN]`` as `fstrain logs` tags them.

A run whose records name no failure (it succeeded, runs, was stopped) has no excerpt. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fstrain.core.monitor.logtail import split_rank_prefix
from fstrain.core.runs.manifest import Manifest
from fstrain.core.runs.runstate import first_failure

# A line of one rank as the launcher tags it: "[node2 r3] text".
_RANK_TAG_RE = re.compile(r"^\[\S+ r(\d+)\]")


@dataclass(frozen=True)
class FailureExcerpt:
    """The failing rank's last lines, oldest first (none where its node recorded none)."""

    host: str
    node_rank: int | None
    rank: int | None
    """The global rank that failed; None where the record does not name it."""
    exit_code: int | None
    signal: str | None
    lines: tuple[str, ...]
    own: bool
    """True: the rank's own lines; False: its node's last lines, every rank's (the failed
    rank's own were not told apart)."""

    @property
    def heading(self) -> str:
        """``rank 3 on node2 (exit 7) failed; its last lines``, as the page and the command line say it."""
        who = f"rank {self.rank}" if self.rank is not None else "a rank"
        how = f"signal {self.signal}" if self.signal else f"exit {self.exit_code}" if self.exit_code is not None \
            else ""
        said = f"{who} on {self.host}" + (f" ({how})" if how else "")
        if not self.lines:
            return f"{said} failed; no line of its output was recorded"
        return f"{said} failed; its last lines" if self.own else \
            f"{said} failed; the last lines of node rank {self.node_rank} (all its ranks')"


def from_manifest(manifest: Manifest | None) -> FailureExcerpt | None:
    """The first failure's lines as the manifest recorded them (None: no failure recorded)."""
    if manifest is None or manifest.first_failure_node_rank is None:
        return None
    node = next((n for n in manifest.nodes if n.node_rank == manifest.first_failure_node_rank), None)
    if node is None:
        return None
    recorded, own_record = manifest.first_failure or {}, node.failed_rank or {}
    rank = _integer(recorded.get("rank"), own_record.get("rank"))
    tagged = {match.group(1) for match in map(_RANK_TAG_RE.match, node.last_lines) if match}
    own = bool(node.last_lines) and len(tagged) == 1 and all(_RANK_TAG_RE.match(line) for line in node.last_lines)
    if rank is None and own:
        rank = int(tagged.pop())
    return FailureExcerpt(node.host, node.node_rank, rank,
                          _integer(recorded.get("exit_code"), own_record.get("exit_code"), node.exit_code),
                          _text(recorded.get("signal") or own_record.get("signal")), node.last_lines, own)


def from_views(names: Sequence[str], views: Sequence[Mapping[str, Any] | None]) -> FailureExcerpt | None:
    """A detached run's first failure and the failed rank's lines among its node's last lines
    (None: no node recorded a failure, or that node was not reached)."""
    failure = first_failure(views) if views else None
    if failure is None or not isinstance(failure.get("node_rank"), int):
        return None
    index = failure["node_rank"]
    view = views[index] if 0 <= index < len(views) else None
    if view is None:
        return None
    node = view.get("node") or {}
    host = str(failure.get("host") or (names[index] if index < len(names) else f"node rank {index}"))
    local = _integer(failure.get("local_rank"), (node.get("failure") or {}).get("local_rank"))
    offset = _integer(node.get("rank_offset"))
    rank = _integer(failure.get("rank"), local + offset if local is not None and offset is not None else None)
    lines = [str(line) for line in node.get("last_lines") or []]
    own = [f"[{host} r{rank if rank is not None else local}] {text}"
           for line_local, text in map(split_rank_prefix, lines) if local is not None and line_local == local]
    return FailureExcerpt(host, index, rank, _integer(failure.get("exit_code"), node.get("exit_code")),
                          _text(failure.get("signal")), tuple(own or [_tagged(host, line, offset) for line in lines]),
                          bool(own))


def _tagged(host: str, line: str, offset: int | None) -> str:
    """A node's line tagged as `fstrain logs` tags it: ``[host rN] text``, ``[host] text``."""
    local, text = split_rank_prefix(line)
    if local is None:
        return f"[{host}] {line}"
    return f"[{host} r{local + (offset or 0)}] {text}"


def _integer(*values: Any) -> int | None:
    """The first of ``values`` that is an integer (not a bool)."""
    return next((v for v in values if isinstance(v, int) and not isinstance(v, bool)), None)


def _text(value: Any) -> str | None:
    return str(value) if value else None
