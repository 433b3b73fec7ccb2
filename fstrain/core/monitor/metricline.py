"""The metric line: one line a rank prints to report a training step's numbers.

Any program fstrain launches can report its steps by printing, on stdout or stderr, a line
that starts with ``FSTRAIN_METRICS `` followed by one JSON object on the same line::

    FSTRAIN_METRICS {"v": 1, "step": 120, "loss": 2.314, "tokens_per_s": 51234.5, "step_s": 0.81}

Only ``step`` (an integer >= 0) is required; every other field is optional and may be null.
Nothing from fstrain needs to be installed on the nodes to print it. The bundled trainer prints
it on every rank for every logged step (fstrain.train). The watchdog, ``status``, the
Prometheus textfile and ``fstrain report`` read it from the ranks' output.

Fields (units in the names): ``v`` the format version (absent: 1), ``step``, ``steps`` (the
final step), ``loss``, ``lr``, ``tokens_per_s`` (this rank's share of the step's tokens per
second or the whole job's, as ``scope`` says: "rank" or "job"), ``step_s`` (wall seconds of the
step), ``memory_bytes`` (peak bytes the rank's accelerator allocator reserved), ``rank``,
``time`` (Unix seconds when the step ended). Unknown fields are kept in ``extra``.

A rank that prints no metric line may still say its step in the bundled trainer's progress line
(fstrain/train/loop.py), ``[fstrain.train] step 5/20 loss 3.1234 lr ... tokens/s 12,345 ...``.
:func:`read_step` is the one reader of a rank's step from a line of its output, whichever of the
two it is: the watchdog's Prometheus textfile, ``status`` and its live view, ``fstrain report``,
the launch's progress and the recovery loop all read through it. :func:`newer_step` keeps a
rank's latest numbers across its lines (a metric line, once printed, wins over progress lines).

Pure and stdlib only: the node-side watchdog sends this module with itself.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PREFIX = "FSTRAIN_METRICS "
METRIC_LINE_VERSION = 1
SCOPES = ("rank", "job")
_FLOATS = ("loss", "lr", "tokens_per_s", "step_s", "time")
_INTS = ("steps", "memory_bytes", "rank")
_KNOWN = frozenset(("v", "step", "scope", *_FLOATS, *_INTS))
MAX_LINE_BYTES = 64 * 1024  # a longer line is not a metric line
# The bundled trainer's progress line: its mark, and its numbers (what follows "step N/M" is optional).
PROGRESS_MARK = "[fstrain.train] step "
_PROGRESS_RE = re.compile(r"\bstep (\d+)(?:/(\d+))?(?:.*?\bloss ([0-9.eE+-]+|nan|inf))?(?:.*?\btokens/s ([0-9,.]+))?")
METRIC_LINE = "metric line"
PROGRESS_LINE = "progress line"


@dataclass(frozen=True)
class StepMetrics:
    """One step's numbers as one rank reported them; None where the line left a field out."""

    step: int
    steps: int | None = None
    loss: float | None = None
    lr: float | None = None
    tokens_per_s: float | None = None
    scope: str = "job"
    step_s: float | None = None
    memory_bytes: int | None = None
    rank: int | None = None
    time: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The line's JSON object: the version, then every field that is set."""
        out: dict[str, Any] = {"v": METRIC_LINE_VERSION, "step": self.step}
        for name in ("steps", "loss", "lr", "tokens_per_s", "step_s", "memory_bytes", "rank", "time"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.tokens_per_s is not None:
            out["scope"] = self.scope
        out.update({k: v for k, v in self.extra.items() if k not in _KNOWN})
        return out


def format_metric_line(metrics: StepMetrics) -> str:
    """The line (without its newline): the prefix and compact JSON (non-finite numbers as null)."""
    body = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.as_dict().items()}
    return PREFIX + json.dumps(body, separators=(",", ":"), allow_nan=False)


def parse_metric_line(line: str | bytes) -> StepMetrics | None:
    """The step's numbers from one output line; None when the line is not a metric line, or is
    one this fstrain cannot read (bad JSON, no integer step, a newer version, a wrong type).
    Text before the prefix (a launcher's "[rank 3]: " tag) is allowed."""
    if isinstance(line, bytes):
        if len(line) > MAX_LINE_BYTES:
            return None
        line = line.decode("utf-8", "replace")
    elif len(line) > MAX_LINE_BYTES:
        return None
    at = line.find(PREFIX)
    if at < 0:
        return None
    try:
        body = json.loads(line[at + len(PREFIX):].strip())
    except ValueError:
        return None
    return from_mapping(body)


def from_mapping(body: Any) -> StepMetrics | None:
    """A metric line's object (also one line of a metrics.jsonl file) as values; None when unreadable."""
    if not isinstance(body, Mapping):
        return None
    version = body.get("v", 1)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= METRIC_LINE_VERSION:
        return None
    step = body.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return None
    values: dict[str, Any] = {}
    for name in _FLOATS:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        values[name] = float(value)
    for name in _INTS:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            return None
        values[name] = value
    scope = body.get("scope", "job")
    if scope not in SCOPES:
        return None
    extra = {k: v for k, v in body.items() if k not in _KNOWN}
    return StepMetrics(step=step, scope=scope, extra=extra, **values)


def parse_metrics_jsonl(text: str) -> list[StepMetrics]:
    """The steps a metrics.jsonl holds (``RUN_DIR/metrics/rank<R>.jsonl``), in file order; a line
    that is not a readable object (a run killed while writing its last line) is left out."""
    found = []
    for line in text.splitlines():
        try:
            metrics = from_mapping(json.loads(line))
        except ValueError:
            continue
        if metrics is not None:
            found.append(metrics)
    return found


@dataclass(frozen=True)
class StepReading:
    """What one output line says of a rank's step: its numbers (a progress line gives ``step``,
    ``steps``, ``loss`` and ``tokens_per_s`` at most) and the form that said them."""

    metrics: StepMetrics
    source: str
    """``metric line`` or ``progress line``."""

    @property
    def from_metric_line(self) -> bool:
        """A metric line carries more than a progress line: where a rank prints both, it wins."""
        return self.source == METRIC_LINE


def read_step(line: str, any_program: bool = False) -> StepReading | None:
    """A rank's step from one line of its output: the metric line where the line holds one, else
    the progress line (:func:`read_progress`, ``any_program`` as there); None for any other line.
    Text before either (a host, rank or launcher tag) is allowed."""
    metrics = parse_metric_line(line)
    if metrics is not None:
        return StepReading(metrics, METRIC_LINE)
    progress = read_progress(line, any_program)
    return StepReading(progress, PROGRESS_LINE) if progress is not None else None


def newer_step(held: StepReading | None, line: str) -> StepReading | None:
    """A rank's latest numbers once one more line of its output is read, ``held`` being those
    of its lines before: the line's (:func:`read_step`, any program's ``step N`` included),
    unless it is a progress line and the rank has printed a metric line (which carries more:
    step time, memory); else ``held``. Folded over a rank's lines in the order written, it gives
    what ``status``, its live view and the detached nodes' per-rank records show."""
    reading = read_step(line, any_program=True)
    if reading is None or (held is not None and held.from_metric_line and not reading.from_metric_line):
        return held
    return reading


def read_progress(line: str, any_program: bool = False) -> StepMetrics | None:
    """Step, final step, loss and tokens/s from a progress line: the bundled trainer's, read from
    its ``[fstrain.train] step`` on; with ``any_program``, also any line that says ``step N``
    (a program's own ``rank 3 step 4/10 loss 2.5``, which ``status`` and the recovery loop
    read). A number that does not read as one is left out (None)."""
    if any_program:
        at = 0 if "step " in line else -1
    else:
        at = line.find(PROGRESS_MARK)
        at = at + len(PROGRESS_MARK) - len("step ") if at >= 0 else -1
    match = _PROGRESS_RE.search(line, at) if at >= 0 else None
    if match is None:
        return None
    step, total, loss, rate = match.groups()
    return StepMetrics(step=int(step), steps=int(total) if total else None, loss=_float(loss),
                       tokens_per_s=_float(rate.replace(",", "")) if rate else None)


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:  # "loss -" or "tokens/s ." in a line that only looks like a progress line
        return None
