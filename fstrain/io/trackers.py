"""Experiment trackers, from the process that follows a run (docs/observability.md#trackers).

An MLflow tracking server (``launch --mlflow URI``) and Weights & Biases (``launch --wandb
PROJECT``, offline with ``--wandb-offline``) are sent what fstrain/core/track/calls.py makes of
the run: its parameters once, every rank's step numbers as its lines arrive, its events, and its
end.

- :func:`senders` is the preflight: each tracker asked once, before anything starts; one that
  cannot be reached is a TransportError (one line, exit code 2).
- :class:`TrackerSession` sends from a thread of its own, through a bounded queue: the run's
  lines are never held up by a tracker. The run's events come from RUN_DIR/events.jsonl
  (fstrain/io/runevents.py), read every second, whichever process writes them. A tracker that
  fails mid-run is said once on stderr (and once more when it answers again, with what was
  lost); the run goes on. Points that arrive while the queue is full are dropped and counted.

mlflow and wandb are imported here only, and only when their flag is given.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fstrain.core.runs.runevents import EVENTS_FILE, RunEvent
from fstrain.core.track.calls import Point, StepFeed, event_lines, event_tags
from fstrain.errors import FstrainError, TransportError
from fstrain.io.localout import warn
from fstrain.io.runevents import read_events

QUEUE_ITEMS = 10_000  # lines' points waiting to be sent; beyond: dropped and counted
BATCH_POINTS = 1000  # MLflow's most metrics in one log_batch
EVENTS_POLL_S = 1.0  # how often the run's events file is read for new events
FINISH_TIMEOUT_S = 30.0  # the run's end waits this long at most for what is left to be sent
# MLflow's HTTP client retries a failed request 7 times with a growing backoff (about 2 min);
# a tracker that is down should cost the follower seconds. Its client also prints the run's
# address on stdout as the run ends, where `launch --json` has one document: the session says it
# on stderr instead. Set where the user has not.
MLFLOW_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
              "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1", "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
EVENTS_ARTIFACT = "fstrain/events.jsonl"


@dataclass(frozen=True)
class TrackerSettings:
    """Where to log (the launch's ``--mlflow``, ``--wandb`` flags) and which run it is."""

    run_id: str
    run_dir: Path
    mlflow_uri: str | None = None
    mlflow_experiment: str = "fstrain"
    wandb_project: str | None = None
    wandb_offline: bool = False


class Sender(Protocol):
    """One tracker: each call sends, or raises (the session says so and goes on)."""

    name: str

    def open(self, params: Mapping[str, str], tags: Mapping[str, str]) -> str: ...
    def points(self, points: Sequence[Point]) -> None: ...
    def events(self, lines: Sequence[str], tags: Mapping[str, str]) -> None: ...
    def close(self, status: str, tags: Mapping[str, str]) -> None: ...


_ERRNO_RE = re.compile(r"\[Errno -?\d+\] [^'\")\]]+")


def note(line: str) -> None:
    """One line on stderr, for a human (silent if stderr itself is gone)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _why(exc: BaseException) -> str:
    """Why a tracker's client failed, in one bounded line: the operating system's reason where
    the message holds one (MLflow's wraps urllib3's, ``[Errno 111] Connection refused``), else
    its first line."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    reasons = _ERRNO_RE.findall(text)
    if reasons:
        return reasons[-1].strip()
    if "timed out" in text.lower():
        return "timed out"
    return text if len(text) <= 300 else text[:297] + "..."


class MlflowSender:
    """An MLflow run in experiment ``experiment``, named after the fstrain run, through
    ``mlflow.tracking.MlflowClient`` (the server's REST API, or a local store URI)."""

    name = "MLflow"

    def __init__(self, uri: str, experiment: str) -> None:
        for name, value in MLFLOW_ENV.items():
            os.environ.setdefault(name, value)
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.experiment = experiment
        self.client = MlflowClient(tracking_uri=uri)
        self.run_id: str | None = None
        self.experiment_id = ""

    def check(self) -> None:
        self.client.search_experiments(max_results=1)

    def open(self, params: Mapping[str, str], tags: Mapping[str, str]) -> str:
        """The run made, its parameters logged; where it is, in words."""
        from mlflow.entities import Param

        if self.run_id is None:  # a retry after the parameters failed keeps the run it made
            found = self.client.get_experiment_by_name(self.experiment)
            self.experiment_id = found.experiment_id if found is not None else \
                self.client.create_experiment(self.experiment)
            run = self.client.create_run(self.experiment_id, run_name=tags.get("fstrain.run_id"), tags=dict(tags))
            self.run_id = run.info.run_id
        self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in params.items()])
        if self.uri.startswith(("http://", "https://")):
            return f"MLflow: run at {self.uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}"
        return f"MLflow: run {self.run_id} in experiment {self.experiment!r} of {self.uri}"

    def points(self, points: Sequence[Point]) -> None:
        from mlflow.entities import Metric

        assert self.run_id is not None
        metrics = [Metric(p.key, p.value, int(p.time_s * 1000), p.step) for p in points]
        for start in range(0, len(metrics), BATCH_POINTS):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + BATCH_POINTS])

    def events(self, lines: Sequence[str], tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        assert self.run_id is not None
        self.client.log_text(self.run_id, "".join(line + "\n" for line in lines), EVENTS_ARTIFACT)
        self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def close(self, status: str, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        assert self.run_id is not None
        self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        self.client.set_terminated(self.run_id, status)


class WandbSender:
    """A W&B run in ``project``, its id and name the fstrain run's, its files under the local
    run directory (``RUN_DIR/wandb``); offline: nothing leaves this machine until `wandb sync`."""

    name = "W&B"

    def __init__(self, project: str, offline: bool, run_id: str, run_dir: Path) -> None:
        import wandb

        self.wandb = wandb
        self.project = project
        self.offline = offline
        self.run_id = run_id
        self.run_dir = run_dir
        self.run: Any = None

    def check(self) -> None:
        if self.offline:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if not os.access(self.run_dir, os.W_OK):
                raise OSError(f"{self.run_dir} is not writable")
            return
        from urllib.error import HTTPError
        from urllib.request import urlopen

        try:  # W&B's server (its settings' base_url, WANDB_BASE_URL): any HTTP answer is one
            with urlopen(str(self.wandb.Settings().base_url), timeout=10):
                pass
        except HTTPError:
            pass

    def open(self, params: Mapping[str, str], tags: Mapping[str, str]) -> str:
        """The run started, its config the parameters; where it is, in words."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        settings = self.wandb.Settings(console="off", silent=True, x_disable_stats=True)
        self.run = self.wandb.init(project=self.project, id=self.run_id, name=self.run_id, dir=str(self.run_dir),
                                   config=dict(params), tags=["fstrain"],
                                   mode="offline" if self.offline else None, settings=settings, resume="allow")
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        if self.offline:
            return f"W&B: offline run in {self.run.settings.sync_dir} (upload it with `wandb sync`)"
        return f"W&B: run at {self.run.url}"

    def points(self, points: Sequence[Point]) -> None:
        by_step: dict[int, dict[str, float]] = {}
        for p in points:
            by_step.setdefault(p.step, {})[p.key] = p.value
        for step, values in by_step.items():
            self.run.log({"step": step, **values})

    def events(self, lines: Sequence[str], tags: Mapping[str, str]) -> None:
        import json

        self.run.summary.update({**tags, "fstrain/events": [json.loads(line) for line in lines]})

    def close(self, status: str, tags: Mapping[str, str]) -> None:
        self.run.summary.update({**tags, "fstrain/status": status})
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)


def senders(settings: TrackerSettings) -> list[Sender]:
    """The trackers the flags ask for, each asked once whether it answers: the preflight. One
    that does not is a TransportError naming its flag, before anything of the run starts."""
    found: list[Sender] = []
    if settings.mlflow_uri:
        try:
            mlflow = MlflowSender(settings.mlflow_uri, settings.mlflow_experiment)
            mlflow.check()
        except ImportError as exc:
            raise TransportError(f"MLflow is not installed in this Python ({_why(exc)})",
                                 "pip install mlflow (or mlflow-skinny: its client alone)", "--mlflow") from None
        except Exception as exc:  # the client's own errors (MlflowException, requests'): its first line
            raise TransportError(f"the MLflow tracking server at {settings.mlflow_uri} does not answer: {_why(exc)}",
                                 "start it (mlflow server --host ... --port ...), or check the URI; nothing was "
                                 "started", "--mlflow") from None
        found.append(mlflow)
    if settings.wandb_project:
        try:
            wandb = WandbSender(settings.wandb_project, settings.wandb_offline, settings.run_id, settings.run_dir)
            wandb.check()
        except ImportError as exc:
            raise TransportError(f"wandb is not installed in this Python ({_why(exc)})", "pip install wandb",
                                 "--wandb") from None
        except Exception as exc:
            where = f"its run files under {settings.run_dir}" if settings.wandb_offline else "its server"
            raise TransportError(f"W&B cannot be reached ({where}): {_why(exc)}",
                                 "check WANDB_BASE_URL and the network, or log offline with --wandb-offline; "
                                 "nothing was started", "--wandb") from None
        found.append(wandb)
    return found


@dataclass
class _Health:
    """One tracker's failures: said once as it starts failing, once as it answers again."""

    failing: bool = False
    lost_points: int = 0
    opened: bool = False


@dataclass
class TrackerSession:
    """Sends a run to its trackers from a thread of its own; its methods only queue (and
    ``finish`` waits, bounded). The run's events are read from ``events_path`` (RUN_DIR/
    events.jsonl, written by the process that decides the run) every EVENTS_POLL_S and at the
    end. ``say`` hears the lines a human reads (stderr by default)."""

    senders: Sequence[Sender]
    run_id: str
    say: Callable[[str], None] = warn  # a tracker's failures
    tell: Callable[[str], None] = note  # where each tracker's run is
    events_path: Path | None = None
    feed: StepFeed = field(default_factory=StepFeed)
    dropped_points: int = 0

    def __post_init__(self) -> None:
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(QUEUE_ITEMS)
        self._health = {s.name: _Health() for s in self.senders}
        self._events: list[RunEvent] = []
        self._events_read_s = 0.0
        self._opening: tuple[dict[str, str], dict[str, str]] | None = None
        self._thread = threading.Thread(target=self._send_all, daemon=True, name="fstrain-trackers")
        self._thread.start()

    def start(self, params: Mapping[str, str], tags: Mapping[str, str]) -> None:
        """The run begins: its parameters (sent once) and tags."""
        self._queue.put(("open", (dict(params), dict(tags))))

    def line(self, tagged: str) -> None:
        """One of the run's output lines, ``[host rN] text``: the numbers of a step it reports."""
        found = self.feed.line(tagged, time.time())
        if not found:
            return
        try:
            self._queue.put_nowait(("points", found))
        except queue.Full:
            self.dropped_points += len(found)

    def finish(self, status: str, tags: Mapping[str, str], timeout_s: float = FINISH_TIMEOUT_S) -> None:
        """The run's end: its last events, its status and final tags sent, then the thread
        ends; what is not sent within ``timeout_s`` is said and left."""
        self._queue.put(("close", (status, dict(tags))))
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self.say(f"trackers: not everything was sent within {timeout_s:g} s of the run's end; "
                     f"it is left unsent")
        if self.dropped_points:
            self.say(f"trackers: {self.dropped_points} step numbers were not sent (the trackers fell behind)")

    def _send_all(self) -> None:
        pending: tuple[str, Any] | None = None
        while True:
            if time.monotonic() - self._events_read_s >= EVENTS_POLL_S:
                self._read_events()
            try:
                kind, payload = pending or self._queue.get(timeout=EVENTS_POLL_S)
            except queue.Empty:
                continue
            pending = None
            if kind == "points":  # with the points queued behind it, up to a batch
                batch = list(payload)
                while len(batch) < BATCH_POINTS:
                    try:
                        pending = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if pending[0] != "points":
                        break
                    batch += pending[1]
                    pending = None
                self._send("points", batch)
            elif kind == "open":
                self._opening = payload
                self._send("open", payload)
            else:
                self._read_events()
                self._send("close", payload)
                return

    def _read_events(self) -> None:
        """The events written since the last read, sent (all of them, with the tags they sum to)."""
        self._events_read_s = time.monotonic()
        if self.events_path is None:
            return
        try:
            read = read_events(self.events_path)
        except FstrainError as exc:  # a newer format, a file past its bound: said once, then left
            self.say(f"trackers: {exc.one_line()}; the run's events are not sent")
            self.events_path = None
            return
        new = read.events[len(self._events):] if read is not None else ()
        if new:
            self._events += new
            self._send("events", None)

    def _send(self, kind: str, payload: Any) -> None:
        for sender in self.senders:
            health = self._health[sender.name]
            try:
                if not health.opened and self._opening is not None:  # its run, once it answers
                    self.tell(sender.open(*self._opening))
                    health.opened = True
                    if self._events and kind != "events":
                        self._send_events(sender)
                if kind == "points" and health.opened:
                    sender.points(payload)
                elif kind == "events" and health.opened:
                    self._send_events(sender)
                elif kind == "close" and health.opened:
                    sender.close(*payload)
            except Exception as exc:  # any failure of a tracker's client: said, and the run goes on
                if kind == "points":
                    health.lost_points += len(payload)
                if not health.failing:
                    health.failing = True
                    self.say(f"{sender.name}: cannot log run {self.run_id} ({_why(exc)}); the run goes on, "
                             f"and what follows is sent once {sender.name} answers again")
                continue
            if health.failing:
                health.failing = False
                lost = f"; {health.lost_points} step numbers of run {self.run_id} were not logged" \
                    if health.lost_points else ""
                self.say(f"{sender.name} answers again{lost}")
                health.lost_points = 0

    def _send_events(self, sender: Sender) -> None:
        from fstrain import __version__

        sender.events(event_lines(self._events, __version__), event_tags(self._events))


def start_session(settings: TrackerSettings, say: Callable[[str], None] = warn) -> TrackerSession | None:
    """The run's trackers checked (the preflight: :func:`senders`) and a session started, which
    reads the run's events from its run directory; None where no tracker was asked for."""
    found = senders(settings)
    return TrackerSession(found, settings.run_id, say, events_path=settings.run_dir / EVENTS_FILE) if found else None
