"""One node's ranks as a Prometheus text exposition, for node_exporter's textfile collector.

With ``fstrain launch --metrics-textfile DIR``, each node's watchdog (fstrain/io/remote/watchdog.py)
feeds a :class:`NodeMetrics` every line its ranks print and which ranks are alive, and every few
seconds and at the end writes :meth:`NodeMetrics.render` to ``DIR/<textfile_name>`` (a file
beside it first, then renamed over it: the collector never reads half a file, and it skips
names that do not end in ``.prom``).

Beside the ranks' numbers, the node's own: the time of the write (a watchdog that was killed
stops writing, so the time stops advancing: the one sign of a dead watchdog, whose file still
says its ranks are alive), and once its job has ended, the end (:meth:`NodeMetrics.end`): its
state and exit code, every rank no longer alive.

A rank's numbers come from its metric lines; a rank that prints none but the bundled trainer's
progress line (``step 5/20 loss 3.1 ... tokens/s 12,345``) or a trainer's own step line is read
from that: each line through ``read_step`` of fstrain/core/monitor/metricline.py, and folded
into the rank's latest numbers by its ``newer_reading``, the rule ``status`` keeps them by.
Every sample carries ``run_id``, ``host`` and ``node_rank``; per-rank samples also ``rank``
(global; empty while unknown) and ``local_rank``.

Pure and stdlib only: it travels to the nodes with the watchdog, as does metricline.py, whose
reader and fold are passed in (modules sent to a node cannot import each other).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

INTERVAL_S = 5.0  # how often the watchdog rewrites the file
# A local-rank tag in front of a line: the watchdog's relay ([local3]:) or torchrun's --tee.
_TAG_RE = re.compile(r"^\[(?:default|rank|local)(\d+)\]:")

# (name, type, help, the rank's field it shows); None: computed here.
RANK_METRICS = (
    ("fstrain_step", "gauge", "The last training step the rank reported.", "step"),
    ("fstrain_final_step", "gauge", "The step the rank's training ends at, as it reported it.", "steps"),
    ("fstrain_loss", "gauge", "The loss of the rank's last reported step.", "loss"),
    ("fstrain_learning_rate", "gauge", "The learning rate of the rank's last reported step.", "lr"),
    ("fstrain_tokens_per_second", "gauge",
     "Tokens per second of the last reported step: the whole job's (scope=job) or the rank's (scope=rank).",
     "tokens_per_s"),
    ("fstrain_step_seconds", "gauge", "Wall seconds of the rank's last reported step.", "step_s"),
    ("fstrain_memory_bytes", "gauge", "Peak accelerator memory the rank reported (CPU ranks: peak RSS), in bytes.",
     "memory_bytes"),
    ("fstrain_rank_alive", "gauge", "1 while the rank's process runs, 0 once it is gone or not yet started.", None),
    ("fstrain_last_output_age_seconds", "gauge",
     "Seconds since the rank last printed a line (since the node started, before its first).", None),
)
NODE_METRICS = (
    ("fstrain_restarts_total", "counter", "Restarts of the node's worker group (torchrun --max-restarts).", None),
    ("fstrain_textfile_written_timestamp_seconds", "gauge",
     "Unix seconds when the node's watchdog wrote this file: it stops advancing once the watchdog is gone.", None),
    ("fstrain_run_state", "gauge",
     "1 for the state of the run on this node (running; once its job ended: succeeded, failed or stopped), "
     "0 for the others.", None),
    ("fstrain_exit_code", "gauge", "The exit code of the node's job (its launcher), once it has ended.", None),
)
# fstrain_run_state's states. ``stopped``: the watchdog stopped the job (`fstrain stop`, Ctrl-C,
# SIGTERM, Slurm's scancel, or another node's failure); ``failed``: it exited non-zero by itself.
RUNNING, SUCCEEDED, FAILED, STOPPED = "running", "succeeded", "failed", "stopped"
STATES = (RUNNING, SUCCEEDED, FAILED, STOPPED)


def textfile_name(run_id: str, node_rank: int) -> str:
    """``fstrain_<run id>_node<I>.prom``: one file per node and run, so nodes sharing the
    directory (a shared file system) and runs on one node never overwrite each other."""
    return f"fstrain_{run_id}_node{node_rank}.prom"


@dataclass
class RankSeries:
    local_rank: int
    rank: int | None = None
    reading: Any = None
    """The rank's latest numbers: a metricline.StepReading folded over its lines (None before any)."""
    last_output: float | None = None  # Unix seconds of its last line
    alive: bool = False


class NodeMetrics:
    """What one node's ranks reported, and the exposition of it.

    ``read_step``: fstrain.core.monitor.metricline.read_step (text -> StepReading or None);
    ``newer_reading``: metricline.newer_reading (held, the line's reading, the line -> the rank's latest).
    ``rank_offset``: the global rank of local rank 0 where the launch knows it."""

    def __init__(self, run_id: str, host: str, node_rank: int, nproc: int, rank_offset: int | None,
                 started: float, read_step: Callable[[str], Any],
                 newer_reading: Callable[[Any, Any, str], Any]) -> None:
        self.labels = {"run_id": run_id, "host": host, "node_rank": str(node_rank)}
        self.rank_offset = rank_offset
        self.started = started
        self.read_step = read_step
        self.newer_reading = newer_reading
        self.restarts = 0
        self.state = RUNNING
        self.exit_code: int | None = None  # the node's job's, once it has ended
        self.ranks = {local: RankSeries(local, None if rank_offset is None else rank_offset + local)
                      for local in range(max(1, nproc))}

    def line(self, local_rank: int | None, text: str, now: float) -> None:
        """One output line of the node: ``local_rank`` where the relay knows whose it is, else
        read from the line's tag; a line no rank can be found for is left out."""
        tag = _TAG_RE.match(text)
        if tag is not None:
            text = text[tag.end():]
            if local_rank is None:
                local_rank = int(tag.group(1))
        reading = self.read_step(text)
        metrics = reading.metrics if reading is not None and reading.from_metric_line else None
        if local_rank is None and metrics is not None and metrics.rank is not None and self.rank_offset is not None:
            local_rank = metrics.rank - self.rank_offset
        if local_rank is None and len(self.ranks) == 1:
            local_rank = next(iter(self.ranks))
        series = self.ranks.get(local_rank) if local_rank is not None else None
        if series is None:
            return
        series.last_output = now
        series.reading = self.newer_reading(series.reading, reading, text)
        if metrics is not None and metrics.rank is not None:
            series.rank = metrics.rank

    def set_alive(self, ranks: Mapping[int, int]) -> None:
        """The ranks whose process runs now: local rank -> global rank."""
        for local, series in self.ranks.items():
            series.alive = local in ranks
            if local in ranks:
                series.rank = ranks[local]

    def end(self, exit_code: int | None, stopped: bool) -> None:
        """The node's job has ended with ``exit_code`` (None: not known), ``stopped`` by the
        watchdog or by itself: no rank is alive any more."""
        self.set_alive({})
        self.exit_code = exit_code
        self.state = STOPPED if stopped else SUCCEEDED if exit_code == 0 else FAILED

    def render(self, now: float) -> str:
        """The exposition text: a HELP and a TYPE line, then the samples, for every metric;
        ``now`` (Unix seconds) is the time of the write."""
        out: list[str] = []
        for name, kind, help_text, source in RANK_METRICS:
            samples = []
            for local in sorted(self.ranks):
                series = self.ranks[local]
                value = self._rank_value(series, name, source, now)
                if value is None:
                    continue
                labels = {**self.labels, "rank": "" if series.rank is None else str(series.rank),
                          "local_rank": str(local)}
                if name == "fstrain_tokens_per_second":
                    labels["scope"] = series.reading.metrics.scope
                samples.append(_sample(name, labels, value))
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]
        for name, kind, help_text, _ in NODE_METRICS:
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *self._node_samples(name, now)]
        return "\n".join(out) + "\n"

    def _node_samples(self, name: str, now: float) -> list[str]:
        if name == "fstrain_restarts_total":
            return [_sample(name, self.labels, self.restarts)]
        if name == "fstrain_textfile_written_timestamp_seconds":
            return [_sample(name, self.labels, now)]
        if name == "fstrain_run_state":
            return [_sample(name, {**self.labels, "state": state}, 1 if state == self.state else 0)
                    for state in STATES]
        return [] if self.exit_code is None else [_sample(name, self.labels, self.exit_code)]

    def _rank_value(self, series: RankSeries, name: str, source: str | None, now: float) -> float | None:
        if source is not None:
            value = None if series.reading is None else getattr(series.reading.metrics, source)
            return None if value is None else float(value)
        if name == "fstrain_rank_alive":
            return 1.0 if series.alive else 0.0
        return max(0.0, now - (series.last_output if series.last_output is not None else self.started))


def _sample(name: str, labels: Mapping[str, str], value: float) -> str:
    body = ",".join(f'{key}="{_escape(text)}"' for key, text in labels.items())
    return f"{name}{{{body}}} {_number(float(value))}"


def _escape(text: str) -> str:
    """A label value as the text format writes it: backslash, double quote and newline escaped."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)
