"""The report of one run as values: series, step times, memory, events, the table "planned vs
measured", and a failed run's failing rank with its last lines; :func:`as_document` is what
``fstrain report --json`` prints.

The planned numbers are the plan's prediction as the run folder keeps it (the manifest's
``plan.predicted``, from ``fstrain plan --out`` and ``launch --plan``); a plan pinned from the
launch's flags has none, and the table says so. The measured ones are the bundled trainer's
``summary.json``: tokens/s over the timed steps (the first left out), the step time as the step's
tokens over that rate, and the peak memory over all ranks: the allocator's reserved bytes on GPUs
(what the planner's peak models), the process's peak RSS on CPUs.

The memory is labelled by what the data says was measured (:func:`measured_device`): the
summary's device, else the memory figure the trainer's progress lines print (the allocator's
peak on a GPU, ``max_rss_bytes`` on a CPU), else a plan the launch pinned on hosts without a
GPU. Where nothing says (a program's own metric lines, no summary), the label names no device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from fstrain.core.report.events import Event
from fstrain.core.report.excerpt import FailureExcerpt
from fstrain.core.report.series import MEMORY_DEVICES, RankSeries, RankSteps, step_times
from fstrain.core.runs.runstate import RunState

SCHEMA = "fstrain.report/1"
GPU_MEMORY_KEY = "max_reserved_bytes"
CPU_MEMORY_KEY = "max_rss_bytes"
MEMORY_LABELS = {"cuda": "GPU memory reserved by the allocator (peak)",
                 "cpu": "CPU peak RSS (each process's resident memory, max_rss_bytes)"}


@dataclass(frozen=True)
class Comparison:
    """One row of "planned vs measured"; ``error`` = measured / planned - 1 where both are known."""

    name: str
    unit: str
    planned: float | None
    measured: float | None
    error: float | None
    measured_from: str
    planned_from: str


@dataclass(frozen=True)
class RankMemory:
    rank: int | None
    """None: the maximum over all ranks (summary.json)."""
    host: str
    peak_bytes: int


@dataclass(frozen=True)
class Report:
    run_id: str
    kind: str
    state: RunState
    device: str | None
    """``cuda``, ``cpu``: where the run trained, as its data says (:func:`measured_device`);
    None where nothing says."""
    memory_label: str
    card_bytes: int | None
    planned_memory_bytes: int | None
    series: tuple[RankSeries, ...]
    steps: tuple[RankSteps, ...]
    memory: tuple[RankMemory, ...]
    events: tuple[Event, ...]
    table: tuple[Comparison, ...]
    summary: Mapping[str, Any] | None
    notes: tuple[str, ...] = field(default_factory=tuple)
    failure: FailureExcerpt | None = None
    """A failed run's failing rank and its last lines (fstrain/core/report/excerpt.py)."""
    world_size: int | None = None
    """The ranks the run started (its manifest's nodes' processes); None where it names none."""


def build(run_id: str, kind: str, state: RunState, *, series: Sequence[RankSeries], events: Sequence[Event],
          plan: Mapping[str, Any] | None, summary: Mapping[str, Any] | None,
          failure: FailureExcerpt | None = None, world_size: int | None = None) -> Report:
    """The report from what was gathered: the series from the output, the events, the plan as
    the manifest keeps it (None: no manifest), the trainer's summary (None: none written), the
    failing rank's last lines (None: no failure recorded) and the ranks the run started (None:
    not known)."""
    notes: list[str] = []
    predicted = (plan or {}).get("predicted") or {}
    cluster = (plan or {}).get("cluster") or {}
    device = measured_device(summary, series, cluster)
    on_cpu = device == "cpu"
    memory_label = memory_title(device)
    card = cluster.get("gpu_memory_bytes")
    card_bytes = int(card) if isinstance(card, (int, float)) and card > 0 and not on_cpu else None
    planned_peak = ((predicted.get("memory") or {}).get("peak"))
    if not predicted:
        notes.append("the plan has no prediction (it was pinned from the launch's flags): launch with "
                     "--plan from `fstrain plan --out plan.yaml` to compare with one")
    elif on_cpu:
        notes.append(f"the plan predicts {cluster.get('gpu', 'GPU')} GPUs; the run trained on CPUs, so the "
                     "errors compare unlike things")
    if summary is None:
        notes.append("no summary.json: the training did not finish, or its program is not the bundled trainer")
    table = _table(predicted, summary, on_cpu)
    memory = _memory(series, summary, on_cpu)
    return Report(run_id, kind, state, device, memory_label, card_bytes,
                  int(planned_peak) if isinstance(planned_peak, (int, float)) else None, tuple(series),
                  tuple(step_times(series)), tuple(memory), tuple(events), tuple(table), summary, tuple(notes),
                  failure, world_size)


def measured_device(summary: Mapping[str, Any] | None, series: Sequence[RankSeries],
                    cluster: Mapping[str, Any]) -> str | None:
    """Where the run trained, as what it left says: the trainer's summary (``cuda``, ``cpu``);
    else the memory figure its progress lines print (an allocator's peak on a GPU, the RSS on a
    CPU); else the plan's cluster where the launch pinned it on hosts with no GPU (``cpu``). A
    plan file's GPU says where the run was planned for, not where it ran: None then."""
    if summary and summary.get("device"):
        return str(summary["device"])
    devices = {MEMORY_DEVICES[one.memory_key] for one in series if one.memory_key in MEMORY_DEVICES}
    if len(devices) == 1:
        return devices.pop()
    return "cpu" if cluster.get("gpu") == "cpu" else None


def memory_title(device: str | None) -> str:
    """The memory chart's title: what was measured on ``device`` (None: not known)."""
    if device is None:
        return "peak memory per rank, as the ranks reported it (the output does not say of which device)"
    return MEMORY_LABELS.get(device, f"peak memory per rank ({device})")


def _table(predicted: Mapping[str, Any], summary: Mapping[str, Any] | None, on_cpu: bool) -> list[Comparison]:
    summary = summary or {}
    rate = _positive(summary.get("tokens_per_s"))
    per_step = _positive(summary.get("tokens_per_step"))
    peaks = summary.get("peak_memory_max_over_ranks") or {}
    key = CPU_MEMORY_KEY if on_cpu else GPU_MEMORY_KEY
    rows = [
        ("memory", "bytes", _positive((predicted.get("memory") or {}).get("peak")), _positive(peaks.get(key)),
         f"summary.json peak_memory_max_over_ranks.{key}", "plan predicted.memory.peak (per GPU)"),
        ("tokens/s", "tokens/s", _positive(predicted.get("tokens_per_s")), rate, "summary.json tokens_per_s",
         "plan predicted.tokens_per_s"),
        ("step time", "s", _positive(predicted.get("step_time_s")), per_step / rate if per_step and rate else None,
         "summary.json tokens_per_step / tokens_per_s", "plan predicted.step_time_s"),
    ]
    return [Comparison(name, unit, planned, measured, measured / planned - 1 if planned and measured else None,
                       measured_from, planned_from)
            for name, unit, planned, measured, measured_from, planned_from in rows]


def _memory(series: Sequence[RankSeries], summary: Mapping[str, Any] | None, on_cpu: bool) -> list[RankMemory]:
    out = []
    for one in series:
        values = [p.memory_bytes for p in one.points if p.memory_bytes is not None]
        if values:
            out.append(RankMemory(one.rank, one.host, max(values)))
    peak = _positive(((summary or {}).get("peak_memory_max_over_ranks") or {}).get(
        CPU_MEMORY_KEY if on_cpu else GPU_MEMORY_KEY))
    if peak is not None:
        out.append(RankMemory(None, "", int(peak)))
    return out


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)


def as_document(report: Report) -> dict[str, Any]:
    """``fstrain report --json``: the same numbers the page plots."""
    return {
        "schema": SCHEMA,
        "run_id": report.run_id,
        "kind": report.kind,
        "state": asdict(report.state),
        "device": report.device,
        "memory_label": report.memory_label,
        "card_bytes": report.card_bytes,
        "planned_memory_bytes": report.planned_memory_bytes,
        "world_size": report.world_size,
        "planned_vs_measured": [asdict(row) for row in report.table],
        "ranks": [{"rank": s.rank, "host": s.host, "source": s.source, "read_from": s.read_from,
                   "memory_key": s.memory_key, "tokens_scope": s.tokens_scope,
                   "points": [asdict(p) for p in s.points]} for s in report.series],
        "step_times": [asdict(s) for s in report.steps],
        "memory": [asdict(m) for m in report.memory],
        "events": [asdict(e) for e in report.events],
        "summary": dict(report.summary) if report.summary is not None else None,
        "notes": list(report.notes),
        "failure": _failure_document(report.failure),
    }


def _failure_document(failure: FailureExcerpt | None) -> dict[str, Any] | None:
    if failure is None:
        return None
    return {**asdict(failure), "lines": list(failure.lines), "heading": failure.heading}
