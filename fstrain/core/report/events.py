"""The timeline of a run: its start, each node up, stalls, failures, stops, restarts, its end.

Where the run has an events file (``RUN_DIR/events.jsonl``, fstrain/core/runs/runevents.py,
written live by the process that decided the run), the timeline is that file's events
(:func:`from_run_events`), with each node's start and end from the sources below. Runs
without one (an fstrain that did not write it, a detached run
without a recovery policy) have two sources, one per kind of run:

- a manifest (``RUN_DIR/manifest.json``: an attached run's, a Slurm job's), written at the end
  by the launcher: the run's and each node's start and end, exit codes, the stall;
- a detached run's node views (fstrain/io/remote/runctl.py ``state``): each node's watchdog
  record (its start and end, exit code, failure) and node 0's run record (the verdict, the stall).

Restarts come from the ranks' output: the bundled trainer's "resumed from step N" line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fstrain.core.runs import runevents
from fstrain.core.runs.manifest import Manifest
from fstrain.core.runs.runevents import RunEvent
from fstrain.core.runs.runstate import FINAL, RunState

# The state a run ended in -> the kind of its last event.
_END_KINDS = {"succeeded": "end", "failed": "failure", "lost": "failure", "stopped": "stop", "stalled": "stall"}
KINDS = ("start", "node up", "node end", "first step", "stall", "failure", "blame", "excluded", "stop", "restart",
         "end")
# A run event's kind -> its kind on the timeline (finished: by the state it ended in).
_RUN_EVENT_KINDS = {runevents.STARTED: "start", runevents.FIRST_STEP: "first step", runevents.FAILURE: "failure",
                    runevents.BLAME: "blame", runevents.EXCLUDED: "excluded", runevents.ATTEMPT: "restart",
                    runevents.RESUMED: "restart"}


@dataclass(frozen=True)
class Event:
    time: float | None
    """Unix seconds; None where the source does not say when."""
    kind: str
    where: str
    """The host, or "" for the run as a whole."""
    text: str


def from_manifest(manifest: Manifest | None, state: RunState, started: float | None = None) -> list[Event]:
    """An attached run's (or a Slurm job's) events, as its manifest recorded them (None: it has
    none yet, or never wrote one); ``started``: when this machine knows the run began (its
    record), else the manifest's start."""
    if manifest is None:
        events = [Event(started, "start", "", "run started")]
        return _ordered([*events, _end(state, state.ended, events)] if state.state in FINAL else events)
    events = [Event(started or manifest.started, "start", "", f"run {manifest.run_id} started ({manifest.backend})")]
    for node in manifest.nodes:
        host = node.host or f"node rank {node.node_rank}"
        if node.started is not None:
            events.append(Event(node.started, "node up", host,
                                f"node rank {node.node_rank} started {_processes(node.nproc)}"))
        torn_down = _torn_down(manifest.first_failure_node_rank, node.node_rank)
        events.extend(_node_end(host, node.ended, node.exit_code, node.error, node.failed_rank, torn_down))
    if manifest.stall and state.state != "stalled":  # a stalled run's end is the stall
        events.append(Event(manifest.ended, "stall", "", manifest.detail or "no rank made progress"))
    if state.state in FINAL:
        events.append(_end(state, manifest.ended, events))
    return _ordered(events)


def from_views(started: float | None, names: Sequence[str], views: Sequence[Mapping[str, Any] | None],
               state: RunState) -> list[Event]:
    """A detached run's events from each node's view (None: a node not reached)."""
    events = [Event(started, "start", "", "run started detached")]
    stall = None
    records = [r for v in views if v for r in ((v.get("node") or {}).get("final"), v.get("run")) if r]
    first = next((r["first_failure_node_rank"] for r in records if r.get("first_failure_node_rank") is not None),
                 None)
    for index, view in enumerate(views):
        host = names[index] if index < len(names) else f"node rank {index}"
        if view is None:
            events.append(Event(None, "failure", host, "the node could not be reached for its record"))
            continue
        node = view.get("node") or {}
        if node.get("started") is not None:
            events.append(Event(_number(node.get("started")), "node up", host,
                                f"node rank {index}'s watchdog started {_processes(node.get('nproc'))}"))
        failure = node.get("failure")
        events.extend(_node_end(host, node.get("ended"), node.get("exit_code"), None, failure,
                                _torn_down(first, index)))
        stall = stall or (view.get("run") or {}).get("stall") or (node.get("final") or {}).get("stall")
    if stall and state.state != "stalled":
        events.append(Event(state.ended, "stall", "", state.reason or "no rank made progress"))
    if state.state in FINAL:  # a run still going has no end yet
        events.append(_end(state, state.ended, events))
    return _ordered(events)


NODE_KINDS = ("node up", "node end")


def from_run_events(events: Sequence[RunEvent], nodes: Sequence[Event] = ()) -> list[Event]:
    """The timeline as the run's events file recorded it, one entry per event, with ``nodes``:
    each node's start and end as the manifest or the node views have them (the file records
    the run's decisions, not every node's start and end). Node 0's coordinator records the run's
    start once it runs, and its end before the last node has said its own: the run began by its
    first node's start and ended with its last node's end, and the timeline says so."""
    node_events = [event for event in nodes if event.kind in NODE_KINDS]
    ups = [event.time for event in node_events if event.kind == "node up" and event.time is not None]
    ends = [event.time for event in node_events if event.kind == "node end" and event.time is not None]
    decided: list[Event] = []
    finished: list[Event] = []
    for event in events:
        kind = _END_KINDS.get(event.state or "", "end") if event.kind == runevents.FINISHED \
            else _RUN_EVENT_KINDS[event.kind]
        where = event.host or "" if event.kind in (runevents.FAILURE, runevents.EXCLUDED) else ""
        time = event.time
        if time is not None and kind == "start" and ups:
            time = min(time, *ups)
        if time is not None and event.kind == runevents.FINISHED and ends:
            time = max(time, *ends)
        (finished if event.kind == runevents.FINISHED else decided).append(Event(time, kind, where, event.text))
    # In this order, so that at equal times the start comes before the nodes and the end after them.
    return _ordered([*decided, *node_events, *finished])


def restarts(resumed: Sequence[tuple[str, int]]) -> list[Event]:
    """A restart event per resume of the trainer (no time: the lines carry none)."""
    return [Event(None, "restart", host, f"training resumed from the checkpoint of step {step}")
            for host, step in resumed]


def _torn_down(first_failure_node_rank: Any, node_rank: Any) -> str:
    """Why a node that did not fail itself ended: another node failed first ("": none did)."""
    if first_failure_node_rank is None or first_failure_node_rank == node_rank:
        return ""
    return f"stopped by the teardown after node rank {first_failure_node_rank}'s failure"


def _node_end(host: str, ended: Any, exit_code: Any, error: Any, failure: Any, torn_down: str = "") -> list[Event]:
    if ended is None and exit_code is None and not error:
        return []
    if exit_code == 0 and not error:
        return [Event(_number(ended), "node end", host, "exited 0")]
    said = f"exit {exit_code}" if exit_code is not None else "no exit code"
    if torn_down and not failure and not error:
        return [Event(_number(ended), "node end", host, f"{said}: {torn_down}")]
    if isinstance(failure, Mapping) and failure.get("rank") is not None:
        said += f": rank {failure['rank']} " + (f"exited with {failure['exit_code']}" if failure.get("exit_code")
                                                 is not None else f"died of signal {failure.get('signal')}")
    elif isinstance(failure, int):
        said += f": rank {failure} failed"
    if error:
        said += f" ({error})"
    return [Event(_number(ended), "failure", host, said)]


def _end(state: RunState, ended: float | None, events: Sequence[Event]) -> Event:
    """The run's last event: its verdict, at the later of when it was recorded and when the last
    node ended (a detached run's record may be written while a node still tears its job down)."""
    kind = _END_KINDS.get(state.state, "end")
    ended = max([t for t in (ended, *(e.time for e in events if e.kind in ("node end", "failure"))) if t is not None],
                default=None)
    text = f"{state.state}" + (f", exit {state.exit_code}" if state.exit_code is not None else "")
    said = state.reason if state.reason not in ("", "ok", state.state) else ""
    return Event(ended, kind, "", text + (f" ({said})" if said else ""))


def _ordered(events: list[Event]) -> list[Event]:
    """By time; events without one keep their place after the timed event before them."""
    last = float("-inf")
    keyed = []
    for index, event in enumerate(events):
        if event.time is not None:
            last = max(last, event.time)
        keyed.append(((event.time if event.time is not None else last), index, event))
    return [event for _, _, event in sorted(keyed, key=lambda item: (item[0], item[1]))]


def _processes(count: Any) -> str:
    return "1 process" if count == 1 else f"{count or '?'} processes"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
