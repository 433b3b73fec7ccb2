"""A launch as an experiment tracker sees it (docs/observability.md#trackers), as values.

- :func:`launch_params`: the run's parameters, logged once as its first attempt starts: the
  launch (backend, nodes, processes per node, world size, hosts, program) and, where the run
  trains with a plan, the plan's knobs (strategy, dp/tp/pp, micro-batch, accumulation, ...).
- :class:`StepFeed`: every rank's steps, read from its tagged output lines (``[host rN] text``,
  as the run's logs hold them) by fstrain/core/monitor/metricline.py's ``newer_step``, the reader
  of `status` and its live view: the metric line, a trainer's own step line, or a progress
  line. Each number of a rank's step is sent once, as a :class:`Point` keyed
  ``rank<R>/<name>``, and rank 0's also as ``<name>``: one chart per number for the run, one
  per rank beside it.
- :func:`event_tags`: the run's events (RUN_DIR/events.jsonl, fstrain/core/runs/runevents.py)
  summed up as tags (attempts, failures, hosts excluded, the last event, the end); the events
  themselves go out whole, as their file's lines (:func:`event_lines`).
- :func:`tracker_status`: how the run ended, in the trackers' words.

Pure: values in, values out; fstrain/io/trackers.py sends them.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fstrain.core.monitor.metricline import StepMetrics, StepReading, newer_step
from fstrain.core.report.series import split_tag
from fstrain.core.runs.runevents import EXCLUDED, FAILURE, FINISHED, RunEvent

# A step's numbers, as the metric line names them; tokens/s counted per rank (scope "rank") goes
# out as ``tokens_per_s_rank``, so that one key never means both.
STEP_FIELDS = ("loss", "lr", "tokens_per_s", "step_s", "memory_bytes")
RANK_TOKENS = "tokens_per_s_rank"
PRIMARY_RANK = 0  # whose numbers are also logged without the rank's prefix
MAX_PARAM_CHARS = 500  # MLflow before 2.x held 500 characters a value; W&B has no bound worth meeting
# The knobs of a plan that are logged: the plan's section holds only values (numbers, names, flags).
TRACKER_STATUSES = ("FINISHED", "FAILED", "KILLED")
STOPPED_REASONS = frozenset(("interrupted", "terminated", "cancelled", "stopped"))


@dataclass(frozen=True)
class Point:
    """One number of one step: ``key`` (``loss``, ``rank3/loss``), its value, the step, and
    when it was measured (Unix seconds)."""

    key: str
    value: float
    step: int
    time_s: float


def launch_params(run_id: str, backend: str, hosts: Sequence[str], nprocs: Sequence[int], program: Sequence[str],
                  plan: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The run's parameters, each a string: the launch's, then the plan's (``plan`` as the
    manifest keeps it: its ``model`` and ``plan`` sections), a value cut to MAX_PARAM_CHARS."""
    per_node = sorted(set(nprocs))
    params: dict[str, Any] = {
        "run_id": run_id, "backend": backend, "nodes": len(hosts),
        "nproc_per_node": per_node[0] if len(per_node) == 1 else ",".join(map(str, nprocs)),
        "world_size": sum(nprocs), "hosts": ",".join(hosts), "program": shlex.join(program),
    }
    if plan is not None:
        params["model"] = (plan.get("model") or {}).get("name")
        params.update({name: value for name, value in (plan.get("plan") or {}).items()
                       if isinstance(value, (str, int, float, bool)) and name not in params})
    return {name: _cut(str(value)) for name, value in params.items() if value is not None and value != ""}


def _cut(text: str) -> str:
    return text if len(text) <= MAX_PARAM_CHARS else text[:MAX_PARAM_CHARS - 3] + "..."


def step_points(rank: int, metrics: StepMetrics, time_s: float) -> list[Point]:
    """The step's numbers as points: ``rank<R>/<name>`` for each number the step carries
    (:data:`STEP_FIELDS`, then the numbers a trainer's line adds, ``grad_norm``...), and for rank
    0 also ``<name>``. Non-finite numbers (a NaN loss) and non-numbers are left out: a tracker
    stores numbers."""
    values: dict[str, float] = {}
    for name in STEP_FIELDS:
        value = getattr(metrics, name)
        if name == "tokens_per_s" and metrics.scope == "rank":
            name = RANK_TOKENS
        if _number(value):
            values[name] = float(value)
    for name, value in metrics.extra.items():
        if _number(value) and name not in values and _key_ok(name):
            values[name] = float(value)
    at = metrics.time if metrics.time is not None and math.isfinite(metrics.time) else time_s
    points = [Point(f"rank{rank}/{name}", value, metrics.step, at) for name, value in values.items()]
    if rank == PRIMARY_RANK:
        points += [Point(name, value, metrics.step, at) for name, value in values.items()]
    return points


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _key_ok(name: str) -> bool:
    """A key both trackers take: MLflow's characters (letters, digits, ``_-. /``), and short."""
    return 0 < len(name) <= 64 and all(c.isalnum() or c in "_-. /" for c in name)


@dataclass
class StepFeed:
    """Every rank's step numbers from the run's tagged output lines, in the order written; each
    number of a rank's step sent once (two lines of one step add up, as DeepSpeed's two do)."""

    held: dict[int, StepReading] = field(default_factory=dict)  # per rank, newer_step's fold
    sent: dict[int, tuple[int, frozenset[str]]] = field(default_factory=dict)  # per rank: the step, its keys sent

    def line(self, tagged: str, time_s: float) -> list[Point]:
        """The points one more line adds (none for a line that says no step): ``tagged`` as
        the logs hold it, ``[host rN] text``; the rank a metric line names wins over the tag's.
        A line without a rank (a launcher's own) says no rank's step."""
        _, tagged_rank, text = split_tag(tagged)
        if tagged_rank is None and "FSTRAIN_METRICS " not in text:
            return []
        held = self.held.get(tagged_rank) if tagged_rank is not None else None
        reading = newer_step(held, text)
        if reading is None or reading is held:
            return []
        rank = reading.metrics.rank if reading.metrics.rank is not None else tagged_rank
        if rank is None:
            return []
        if tagged_rank is not None:
            self.held[tagged_rank] = reading
        points = step_points(rank, reading.metrics, time_s)
        step, keys = self.sent.get(rank, (-1, frozenset()))
        if step != reading.metrics.step:
            keys = frozenset()
        fresh = [p for p in points if p.key not in keys]
        self.sent[rank] = (reading.metrics.step, keys | {p.key for p in fresh})
        return fresh


def tracker_status(exit_code: int | None, reason: str) -> str:
    """``FINISHED`` for a run that succeeded, ``KILLED`` for one stopped (Ctrl-C, SIGTERM,
    `fstrain stop`, Slurm's scancel), else ``FAILED``: MLflow's run statuses, which W&B's exit
    code follows (0 for FINISHED, else 1)."""
    if exit_code == 0:
        return "FINISHED"
    return "KILLED" if reason in STOPPED_REASONS else "FAILED"


def event_lines(events: Sequence[RunEvent], writer: str = "") -> list[str]:
    """The events as their file holds them, one JSON document a line (format stamped)."""
    import json

    return [json.dumps(event.to_dict(writer), sort_keys=False) for event in events]


def event_tags(events: Sequence[RunEvent]) -> dict[str, str]:
    """The run's events so far as tags: ``fstrain.attempts`` (the latest attempt's number),
    ``fstrain.failures``, ``fstrain.excluded`` (hosts, in order), ``fstrain.last_event`` (its
    text), and once the run has finished ``fstrain.state`` and ``fstrain.exit_code``."""
    if not events:
        return {}
    tags = {"fstrain.attempts": str(max(e.attempt for e in events)),
            "fstrain.failures": str(sum(e.kind == FAILURE for e in events)),
            "fstrain.last_event": _cut(events[-1].text or events[-1].kind)}
    excluded = [e.host for e in events if e.kind == EXCLUDED and e.host]
    if excluded:
        tags["fstrain.excluded"] = _cut(",".join(excluded))
    ended = [e for e in events if e.kind == FINISHED]
    if ended:
        tags["fstrain.state"] = ended[-1].state or ""
        if ended[-1].exit_code is not None:
            tags["fstrain.exit_code"] = str(ended[-1].exit_code)
    return tags
