"""Each rank's step numbers over the run, from the run's output lines.

A line is read as the run's logs show it, tagged ``[host rN] text`` (``[host] text`` where the
launcher does not say the rank). Two forms carry numbers:

- the metric line (fstrain/core/monitor/metricline.py), which any program may print on every
  rank: step, loss, tokens/s, step time, memory;
- the bundled trainer's rank-0 progress line, ``[fstrain.train] step 5/20 loss 3.12 lr ...
  tokens/s 12,345 max_reserved_bytes=812.0MiB``: the step time is the step's tokens over its
  tokens/s, the memory the allocator's reserved peak (the process's peak RSS on CPU).

A trainer's own step line (DeepSpeed's, torchtitan's, Megatron-LM's: metricline.TRAINER_FORMATS)
counts as a progress line, with the step time and memory it gives where it gives them. A line
of transformers' Trainer holds its bar's draws of many steps: each step drawn is a point. Its
log dicts (loss, learning rate, tokens/s) end a bar's line where stdout and stderr are one
stream; in files of their own (torchrun's ``--redirects 3``) they come on lines of their own,
and each is given the step its bar was cleared at for it
(metricline.transformers_written_steps), where the rank has exactly one such clear per dict (a
mismatch, e.g. a first attempt's bar lost, leaves them unread rather than misplaced).
Where a rank prints metric lines, its progress lines are left out (they say the same once more).
All are read by fstrain/core/monitor/metricline.py's ``read_step``.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fstrain.core.monitor.metricline import (
    METRIC_LINE,
    PROGRESS_LINE,
    TRANSFORMERS,
    StepMetrics,
    filled,
    read_step,
    transformers_bar_written,
    transformers_logged,
    transformers_steps,
    transformers_written_steps,
    with_logged,
)
from fstrain.core.monitor.stragglers import stragglers

TAG_RE = re.compile(r"^\[([^\]\s]+)(?: r(\d+))?\] ?(.*)$")
RESUMED_MARK = "[fstrain.train] resumed from step "
_MEMORY_RE = re.compile(r"\b(max_(?:reserved|allocated|rss)_bytes)=([0-9.]+)MiB")
# The progress line's memory, most telling first: what the allocator holds, what tensors use, the RSS.
_MEMORY_KEYS = ("max_reserved_bytes", "max_allocated_bytes", "max_rss_bytes")
# What each of them is measured on (fstrain/train/runtime.py peak_memory).
MEMORY_DEVICES = {"max_reserved_bytes": "cuda", "max_allocated_bytes": "cuda", "max_rss_bytes": "cpu"}


@dataclass(frozen=True)
class Point:
    step: int
    loss: float | None = None
    tokens_per_s: float | None = None
    step_s: float | None = None
    memory_bytes: int | None = None


@dataclass(frozen=True)
class RankSeries:
    rank: int
    host: str
    source: str
    """``metric line`` or ``progress line``."""
    points: tuple[Point, ...]
    memory_key: str | None = None
    """What the rank's progress lines call its memory (``max_reserved_bytes``: a GPU allocator's
    peak, ``max_rss_bytes``: a CPU process's peak RSS), also where its metric lines win; None
    where they give none (a metric line's ``memory_bytes`` does not say of which device)."""
    read_from: str = ""
    """The form its points were read from: ``metric line``, ``progress line`` or a trainer
    format's name (metricline.TRAINER_FORMATS: ``torchtitan``, ...), its last line's."""
    tokens_scope: str | None = None
    """Whose tokens its tokens/s count: ``job`` (the whole job's) or ``rank`` (this rank's, as
    torchtitan's ``tps``); None where no point has a tokens/s."""


@dataclass(frozen=True)
class RankSteps:
    """One rank's step times (the first logged step left out: it includes one-time work)."""

    rank: int
    host: str
    step_s: tuple[float, ...]
    median_s: float
    p90_s: float
    max_s: float
    straggler: bool


def split_tag(line: str) -> tuple[str, int | None, str]:
    """(host, rank or None, text) of a tagged line; ("", None, line) for an untagged one."""
    match = TAG_RE.match(line.rstrip("\r\n"))
    if match is None:
        return "", None, line.rstrip("\r\n")
    return match.group(1), int(match.group(2)) if match.group(2) else None, match.group(3)


def progress_point(found: StepMetrics, text: str, tokens_per_step: int | None) -> Point:
    """A point from the bundled trainer's progress line ``text``, or a trainer's own step line
    (metricline.TRAINER_FORMATS), ``found`` as read_step read it: the step time and memory the
    line gives, else the step time from the job's tokens/s and the memory from the progress
    line's own figures."""
    rate = found.tokens_per_s
    memory = {key: float(value) for key, value in _MEMORY_RE.findall(text)}
    key = memory_key(text)
    step_s = found.step_s
    if step_s is None and tokens_per_step and rate and found.scope == "job":  # a rank's tokens/s is not the job's
        step_s = tokens_per_step / rate
    memory_bytes = found.memory_bytes
    if memory_bytes is None and key is not None:
        memory_bytes = round(memory[key] * 2**20)
    return Point(step=found.step, loss=found.loss, tokens_per_s=rate, step_s=step_s, memory_bytes=memory_bytes)


def memory_key(text: str) -> str | None:
    """Which of the progress line's memory figures is its memory, the most telling first
    (``max_reserved_bytes``, ``max_allocated_bytes``, ``max_rss_bytes``); None for none."""
    found = {key for key, _ in _MEMORY_RE.findall(text)}
    return next((key for key in _MEMORY_KEYS if key in found), None)


def rank_series(lines: Iterable[str], tokens_per_step: int | None = None) -> list[RankSeries]:
    """Every rank's points in step order (the last report of a step wins: a resumed run logs
    the steps after its checkpoint again; a number it leaves out is kept from the one before),
    ranks in order."""
    metric: dict[int, dict[int, Point]] = {}
    progress: dict[int, dict[int, Point]] = {}
    memory_keys: dict[int, str] = {}
    hosts: dict[int, str] = {}
    read_from: dict[tuple[int, bool], str] = {}  # (rank, from a metric line) -> the form of its last line
    scopes: dict[tuple[int, bool], str] = {}  # the same -> the scope of its last tokens/s
    # rank -> a Trainer's log dicts alone on their lines that its bar wrote, in order (None: the
    # final dict, which has no step's numbers)
    logged: dict[int, list[StepMetrics | None]] = {}
    written: dict[int, list[StepMetrics]] = {}  # rank -> the steps its Trainer bar was cleared at for one
    for line in lines:
        host, tagged_rank, text = split_tag(line)
        reading = read_step(text)
        if reading is None:
            if transformers_bar_written(text):
                logged.setdefault(tagged_rank if tagged_rank is not None else 0, []).append(transformers_logged(text))
            continue
        metrics = reading.metrics
        if reading.from_metric_line:
            rank = metrics.rank if metrics.rank is not None else tagged_rank
            if rank is None:
                continue
            metric.setdefault(rank, {})[metrics.step] = Point(metrics.step, metrics.loss, metrics.tokens_per_s,
                                                              metrics.step_s, metrics.memory_bytes)
        else:
            rank = tagged_rank if tagged_rank is not None else 0  # the trainer prints it on rank 0 only
            if reading.source == TRANSFORMERS:
                written.setdefault(rank, []).extend(transformers_written_steps(text))
            for found in transformers_steps(text) if reading.source == TRANSFORMERS else [metrics]:
                point = progress_point(found, text, tokens_per_step)
                held = progress.setdefault(rank, {}).get(found.step)
                if held is not None:  # a transformers bar redrawn at a logged step says the step again, not its loss
                    point = filled(point, held)
                progress[rank][found.step] = point
            key = memory_key(text)
            if key is not None:
                memory_keys[rank] = key
        hosts.setdefault(rank, host)
        read_from[rank, reading.from_metric_line] = reading.source
        if metrics.tokens_per_s is not None:
            scopes[rank, reading.from_metric_line] = metrics.scope
    for rank, dicts in logged.items():
        if rank in progress and len(dicts) == len(written.get(rank, ())):
            for at, numbers in zip(written[rank], dicts, strict=True):
                if numbers is None:
                    continue
                point = progress_point(with_logged(at, numbers), "", tokens_per_step)
                held = progress[rank].get(at.step)
                progress[rank][at.step] = point if held is None else filled(point, held)
                if numbers.tokens_per_s is not None:
                    scopes[rank, False] = "job"
    out = []
    for rank in sorted(set(metric) | set(progress)):
        source, points = (METRIC_LINE, metric[rank]) if rank in metric else (PROGRESS_LINE, progress[rank])
        which = (rank, rank in metric)
        out.append(RankSeries(rank, hosts.get(rank, ""), source, tuple(points[s] for s in sorted(points)),
                              memory_keys.get(rank), read_from[which], scopes.get(which)))
    return out


def resumed_steps(lines: Iterable[str]) -> list[tuple[str, int]]:
    """(host, step) for each time the bundled trainer resumed from a checkpoint."""
    found = []
    for line in lines:
        host, _, text = split_tag(line)
        at = text.find(RESUMED_MARK)
        if at >= 0:
            digits = re.match(r"\d+", text[at + len(RESUMED_MARK):])
            if digits:
                found.append((host, int(digits.group())))
    return found


def step_times(series: Sequence[RankSeries]) -> list[RankSteps]:
    """Each rank's step-time distribution, stragglers marked by their median step time
    (fstrain/core/monitor/stragglers.py: the rule `status --watch` uses too)."""
    timed = []
    for one in series:
        values = tuple(p.step_s for p in one.points if p.step_s is not None)
        values = values[1:] if len(values) > 1 else values
        if values:
            timed.append((one, values))
    medians = [statistics.median(values) for _, values in timed]
    slow = set(stragglers({one.rank: median for (one, _), median in zip(timed, medians, strict=True)}))
    out = []
    for (one, values), median in zip(timed, medians, strict=True):
        ordered = sorted(values)
        out.append(RankSteps(one.rank, one.host, values, median, quantile(ordered, 0.9), ordered[-1],
                             one.rank in slow))
    return out


def quantile(ordered: Sequence[float], fraction: float) -> float:
    """The value at ``fraction`` of sorted values (the nearest rank; 0 for none)."""
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))] if ordered else 0.0


def differ(series: Sequence[RankSeries], field: str) -> bool:
    """Whether the ranks report different values of ``field`` at any step (then each is plotted)."""
    by_step: dict[int, set[float]] = {}
    for one in series:
        for point in one.points:
            value = getattr(point, field)
            if value is not None:
                by_step.setdefault(point.step, set()).add(round(float(value), 6))
    return any(len(values) > 1 for values in by_step.values())
