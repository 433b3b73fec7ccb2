"""Runs started from this machine, each behind one handle: its state, status, output, stop and
end, the same calls whatever kind of run it is.

One implementation per backend, never per command:

- ``SshRun``: a detached run; its nodes keep the state (node 0's coordinator), reached over SSH;
- ``AttachedRun``: an attached launch on this machine; its manifest and logs are here, its
  launcher a local process;
- ``SlurmRun``: a job submitted with ``launch --slurm``; Slurm's word (scontrol/squeue), the run
  directory the job's fstrain writes, ``scancel``.

`fstrain runs/status/logs/attach/stop` and the Python API (``fstrain.api``) go through these.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from fstrain.core.launch.supervisor import GIVE_UP, KILL, stop_step
from fstrain.core.runs.runstate import FINAL, STATES, RunState
from fstrain.errors import FstrainError, InputError

if TYPE_CHECKING:
    from fstrain.api.requests import HostRequest
    from fstrain.core.hosts.hostfile import Host
    from fstrain.core.monitor.metricline import StepMetrics
    from fstrain.core.runs.manifest import Manifest
    from fstrain.core.runs.runrecord import KeeperRecord
    from fstrain.io.logs import FileOutputs, NodeOutputs
    from fstrain.io.runevents import EventsRead
    from fstrain.io.runs import FolderGone, RunRecord
    from fstrain.io.transport.base import Transport

STOP_MARGIN_S = 10.0  # Slurm: after the run's --grace, time for the job's fstrain to write its manifest and exit
POLL_S = 1.0


@dataclass(frozen=True)
class Access:
    """How this machine reaches a run's hosts (the run's own settings where it recorded them)."""

    ssh_config: str | None = None
    accept_new_hosts: bool = False
    python: str = "python3"


@dataclass(frozen=True)
class Stopped:
    state: RunState
    already_ended: bool  # nothing was stopped: the run had ended before


class Outputs(Protocol):
    """A run's output, one whole line per item (each ending with a newline), whatever the kind
    of run: the last ``tail`` first, then, on later reads, what came since. ``failed``: hosts
    that could not be read (why)."""

    failed: dict[str, str]

    def read(self, tail: int | None = None, *, views: bool = True) -> Any: ...

    def close(self) -> None: ...


class Backend(Protocol):
    record: RunRecord

    def state(self) -> RunState: ...

    def status(self) -> dict[str, Any]: ...

    def outputs(self, hosts: Sequence[str], rank: int | None, since: float | None, hide: str | None) -> Outputs: ...

    def running(self) -> bool: ...

    def finished(self) -> RunState | None: ...

    def stop(self, force: bool, grace_s: float | None, wait_s: float) -> Stopped: ...


class Run:
    """One run, found by its id (or a unique prefix, or its local run directory)."""

    def __init__(self, record: RunRecord, access: Access | None = None) -> None:
        self.record = record
        self.access = access or Access()
        self.backend: Backend = backend_for(record, self.access)

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def run_dir(self) -> Path:
        return self.record.run_dir

    @property
    def kind(self) -> str:
        """attached, detached or slurm."""
        return "slurm" if self.record.slurm is not None else "detached" if self.record.detached else "attached"

    def state(self) -> RunState:
        """pending, starting, running, stalled, succeeded, failed, stopped or lost; exit code, reason."""
        return self.backend.state()

    def status(self) -> dict[str, Any]:
        """The state and, per node and rank, what is known now (`fstrain status --json`)."""
        return self.backend.status()

    def outputs(self, *, hosts: Sequence[str] = (), rank: int | None = None, since_s: float | None = None,
                metrics: bool = True) -> Outputs:
        """The run's output files, filtered (``since_s``: lines of the last so many seconds;
        only runs whose lines carry their time, the detached ones; ``metrics=False``: without
        the metric lines, ``FSTRAIN_METRICS {...}``, which a ``tail`` then does not count)."""
        from fstrain.core.monitor.metricline import PREFIX

        if since_s is not None and self.kind != "detached":
            kind = "a Slurm run's" if self.kind == "slurm" else "an attached run's"
            raise InputError(f"--since needs the time of each line, and {kind} log lines have none",
                             "use --tail N", "--since")
        return self.backend.outputs(hosts, rank, time.time() - since_s if since_s is not None else None,
                                    None if metrics else PREFIX)

    def logs(self, *, tail: int | None = None, hosts: Sequence[str] = (), rank: int | None = None,
             since_s: float | None = None, metrics: bool = True) -> list[str]:
        """The run's lines now, one item per line (each tagged ``[host rN]`` and ending with a
        newline), the last ``tail`` of them if given. In order: a detached run's merged by time
        across its nodes; an attached or Slurm run's one log file after the other (hosts by
        name), or the Slurm job's output file as written."""
        outputs = self.outputs(hosts=hosts, rank=rank, since_s=since_s, metrics=metrics)
        try:
            lines = list(outputs.read(tail))
        finally:
            outputs.close()
        if outputs.failed:
            names = ", ".join(f"{host} ({why})" for host, why in sorted(outputs.failed.items()))
            raise FstrainError(f"could not read the output of {names}", "check the hosts with `fstrain status`",
                               "logs")
        return lines

    def events(self) -> EventsRead | None:
        """The run's events file as it is now: RUN_DIR/events.jsonl (a Slurm run's job folder's),
        or for a detached run without a recovery policy node 0's, written by its coordinator.
        None where the run has none: a run of an fstrain that did not write it, a launch refused
        before its nodes started, node 0 out of reach."""
        from fstrain.core.runs.runevents import EVENTS_FILE
        from fstrain.io.runevents import fetch_events, read_events

        local = read_events(self.record.job_dir / EVENTS_FILE)
        if local is not None or not isinstance(self.backend, SshRun):
            return local
        node0 = self.backend.detached.nodes[0]
        return fetch_events(self.backend.connect, node0.host, f"{node0.run_dir}/{EVENTS_FILE}")

    def running(self) -> bool:
        """Whether anything of the run still runs (a watchdog, its launcher, the job)."""
        return self.backend.running()

    def finished(self) -> RunState | None:
        """The final state once the run has ended and nothing of it runs any more; else None."""
        return self.backend.finished()

    def stop(self, *, force: bool = False, grace_s: float | None = None, wait_s: float = 60.0) -> Stopped:
        """SIGTERM to every rank (SIGKILL after the grace period; at once with ``force``), then
        wait up to ``wait_s`` for the run to end."""
        return self.backend.stop(force, grace_s, wait_s)

    def wait(self, timeout_s: float | None = None, poll_s: float = 2.0) -> RunState:
        """Block until the run has ended (its final state), or raise after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            state = self.finished()
            if state is not None:
                return state
            if deadline is not None and time.monotonic() > deadline:
                raise FstrainError(f"run {self.run_id} has not ended within {timeout_s:g} s",
                                   "wait longer, or stop it", "wait")
            time.sleep(poll_s)


def open_run(reference: str, access: Access | None = None) -> Run:
    from fstrain.io.runs import find_run

    return Run(find_run(reference), access)


def all_runs(access: Access | None = None) -> list[Run]:
    from fstrain.io.runs import all_runs as records

    return [Run(record, access) for record in records()]


@dataclass(frozen=True)
class Collected:
    """What `gc` did with one run. ``outcome``: ``kept`` (not ended, or its state cannot be
    told), ``would remove`` (a dry run), ``removed`` (every host's folder is gone: its index
    entry went too), ``retry`` (a host's folder is still there: the index entry stays, so a
    later `gc` tries again)."""

    run_id: str
    state: RunState
    outcome: str
    folders: tuple[FolderGone, ...] = ()
    slurm_job: str | None = None  # a Slurm run: only its index entry goes, the job's folders are Slurm's
    run_dir: Path | None = None  # the local run directory (always kept)
    why: str = ""  # kept: why (its state, or the hosts that cannot be reached)

    @property
    def left(self) -> list[FolderGone]:
        """The hosts whose folder could not be removed."""
        return [f for f in self.folders if not f.gone]


def collect(older_than_s: float, *, dry_run: bool = False, access: Access | None = None) -> list[Collected]:
    """`fstrain gc`: for each run started here at least ``older_than_s`` ago that has ended,
    remove its folder on every remote host, then its index entry once no folder is left."""
    from fstrain.io.connect import make_connector
    from fstrain.io.runs import gc_on_nodes, run_state, unregister

    access = access or Access()
    results = []
    for handle in all_runs(access):
        record, backend = handle.record, handle.backend
        if time.time() - record.started < older_than_s:
            continue
        views = backend.views() if isinstance(backend, SshRun) else None
        state = run_state(record, views)
        unreachable = [h.label() for h, v in zip(record.hosts, views or [], strict=False) if v is None]
        if state.state not in FINAL:
            results.append(Collected(record.run_id, state, "kept", why=state.state))
            continue
        if unreachable and not first_final(views or []):  # "lost" only because a host did not answer
            results.append(Collected(record.run_id, state, "kept",
                                     why=f"its state cannot be told: {', '.join(unreachable)} cannot be reached"))
            continue
        slurm_job = str(record.slurm.job_id) if record.slurm is not None else None
        if dry_run:
            results.append(Collected(record.run_id, state, "would remove", slurm_job=slurm_job))
            continue
        folders: tuple[FolderGone, ...] = ()
        if record.slurm is None:
            connect = backend.connect if isinstance(backend, SshRun) else \
                make_connector(access.ssh_config, accept_new_hosts=access.accept_new_hosts)
            folders = tuple(gc_on_nodes(record, connect, backend.python if isinstance(backend, SshRun)
                                        else access.python))
        left = [f for f in folders if not f.gone]
        if not left:
            unregister(record.run_id)
        results.append(Collected(record.run_id, state, "retry" if left else "removed", folders, slurm_job,
                                 record.run_dir))
    return results


def first_final(views: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The run's final record, as the first node that keeps one has it."""
    return next((((v or {}).get("node") or {}).get("final") for v in views
                 if ((v or {}).get("node") or {}).get("final")), None)


def backend_for(record: RunRecord, access: Access) -> Backend:
    if record.slurm is not None:
        return SlurmRun(record, access)
    if record.detached is not None:
        return SshRun(record, access)
    return AttachedRun(record, access)


# -- detached runs over SSH ---------------------------------------------------------------------


class SshRun:
    def __init__(self, record: RunRecord, access: Access) -> None:
        from fstrain.io.connect import make_connector

        assert record.detached is not None
        self.record = record
        self.detached = record.detached
        self.python = self.detached.python or access.python
        self.connect: Callable[[Host], Transport] = make_connector(access.ssh_config or self.detached.ssh_config,
                                                                    accept_new_hosts=access.accept_new_hosts)

    def views(self) -> list[dict[str, Any] | None]:
        from fstrain.io.runs import node_views, read_detached

        if self.keeper() is not None:  # each attempt of a recovering run writes detached.json anew
            self.record.detached = self.detached = read_detached(self.record.run_dir) or self.detached
        return node_views(self.record, self.connect, self.python)

    def keeper(self) -> KeeperRecord | None:
        """The recovery keeper that runs the attempts (``launch --detach --on-failure ...``)."""
        from fstrain.io.runs import read_keeper

        return read_keeper(self.record.run_dir)

    def keeper_alive(self) -> bool:
        from fstrain.io.localproc import process_alive

        keeper = self.keeper()
        return keeper is not None and process_alive(keeper.pid)

    def state(self) -> RunState:
        from fstrain.io.runs import run_state

        return run_state(self.record, self.views())

    def running(self) -> bool:
        return any((view or {}).get("watchdog_alive") for view in self.views()) or self.keeper_alive()

    def finished(self) -> RunState | None:
        from fstrain.io.runs import run_state

        views = self.views()
        state = run_state(self.record, views)
        ended = state.state in FINAL and not any((v or {}).get("watchdog_alive") for v in views)
        return state if ended and not self.keeper_alive() else None

    def status(self) -> dict[str, Any]:
        document = status_document(self.record, self.views())
        keeper = self.keeper()
        if keeper is not None:
            document["keeper"] = {"pid": keeper.pid, "alive": self.keeper_alive(), "log": keeper.log}
        return document

    def outputs(self, hosts: Sequence[str], rank: int | None, since: float | None, hide: str | None) -> NodeOutputs:
        from fstrain.io.logs import NodeFile, NodeOutputs

        known = {h.name for h in self.record.hosts} | {h.label() for h in self.record.hosts}
        for name in hosts:
            if name not in known:
                raise InputError(f"{name!r} is not one of the run's hosts", f"use one of {', '.join(sorted(known))}",
                                 "--host")
        from fstrain.io.runs import coordinator_views

        nodes = [NodeFile(n.host, n.run_dir, n.node_rank, n.rank_offset) for n in self.detached.nodes
                 if not hosts or n.host.name in hosts or n.host.label() in hosts]
        return NodeOutputs(nodes, self.connect, self.python, rank=rank, since=since, hide=hide,
                           views=lambda: coordinator_views(self.record, self.connect, self.python))

    def training_summary(self) -> dict[str, Any] | None:
        """The bundled trainer's rank-0 summary (node 0's run directory), copied into the local one."""
        from fstrain.io.runs import copy_training_summary

        node0 = self.detached.nodes[0]
        return copy_training_summary(self.connect, node0.host, node0.run_dir, self.record.run_dir)[0]

    def stop(self, force: bool, grace_s: float | None, wait_s: float) -> Stopped:
        """Ask the coordinator (through node 0 itself) to stop the run, then wait for its end."""
        from fstrain.io.runs import stop_on_node

        keeper = self.keeper()
        signalled = keeper is not None and stop_keeper(keeper.pid)  # first: no further attempt may start
        node0 = self.detached.nodes[0]
        answer = stop_on_node(self.connect, node0.host, self.python, node0.run_dir, "kill" if force else "term",
                              grace_s)
        if "error" in answer and not signalled:  # between attempts the keeper ends the run itself
            state = self.state()
            if state.state in FINAL:
                return Stopped(state, True)
            raise FstrainError(f"could not reach run {self.record.run_id}'s coordinator on {node0.host.label()}: "
                               f"{answer['error']}", f"check {node0.host.label()} with `fstrain status`", "stop")
        deadline = time.monotonic() + wait_s
        while True:
            ended = self.finished()
            if ended is not None:
                return Stopped(ended, False)
            if time.monotonic() > deadline:
                raise FstrainError(f"run {self.record.run_id} has not ended {wait_s:g} s after the stop",
                                   "check with `fstrain status`; `fstrain stop --force` skips the grace period",
                                   "stop")
            time.sleep(POLL_S)


def stop_keeper(pid: int) -> bool:
    """SIGTERM to a recovery keeper (fstrain/api/keeper.py), if it still runs; whether it was sent."""
    from fstrain.io.localproc import terminate_if_ours

    return terminate_if_ours(pid, b"fstrain.api.keeper")


def status_document(record: RunRecord, views: list[dict[str, Any] | None] | None) -> dict[str, Any]:
    """The state and per node and rank: reachable, watchdog alive, exit, last output, progress, GPUs."""
    from fstrain.core.monitor.gpuusage import from_node
    from fstrain.core.runs.runstate import first_failure
    from fstrain.io.runs import run_state

    state = run_state(record, views)
    failure = first_failure(views) if views else _manifest_failure(record.manifest)
    nodes: list[dict[str, Any]] = []
    if record.detached is None:
        nodes = attached_nodes(record)
    for index, host in enumerate(record.hosts if record.detached else []):
        view = views[index] if views else None
        node = (view or {}).get("node") or {}
        offset = record.detached.nodes[index].rank_offset if record.detached else None
        alive = set((view or {}).get("ranks_alive") or [])
        ranks = []
        for local, entry in sorted((node.get("ranks") or {}).items(), key=lambda kv: int(kv[0])):
            rank = int(local) + offset if offset is not None else int(local)
            ranks.append({"rank": rank, "local_rank": int(local), "alive": rank in alive,
                          "last_output_at": entry.get("last_output_at"), "last_line": entry.get("last_line"),
                          "progress": node_progress(entry)})
        gpus, gpus_error = from_node((view or {}).get("gpus"), host.label())
        nodes.append({"host": host.label(), "node_rank": index, "reachable": view is not None,
                      "watchdog_alive": (view or {}).get("watchdog_alive"), "exit_code": node.get("exit_code"),
                      "failure": node.get("failure"), "last_output_at": node.get("last_output_at"),
                      "ranks_alive": sorted(alive), "ranks": ranks, "gpus": gpus, "gpus_error": gpus_error,
                      "last_lines": node.get("last_lines") or []})
    return {"run_id": record.run_id, "state": state.state, "exit_code": state.exit_code, "reason": state.reason,
            "first_failure": failure, "detached": bool(record.detached), "started": record.started, "nodes": nodes,
            "attempts": _attempts(record)}


def attached_nodes(record: RunRecord) -> list[dict[str, Any]]:
    """An attached run's nodes: the hosts its last attempt started (its manifest's once it
    ended, with each node's exit), and each rank's last line, last output time and latest
    numbers from the log the launcher writes here as the rank prints
    (RUN_DIR/logs/<host>.r<rank>.log). Whether a rank lives is not asked of its node: ``alive``
    is None while the run goes on, False once it ended."""
    from fstrain.core.runs.runevents import EVENTS_FILE, attempt_hosts
    from fstrain.io.logs import logged_hosts
    from fstrain.io.runevents import read_events

    folder = record.run_dir / "logs"
    ended = {n.host: n for n in (record.manifest.nodes if record.manifest else ())}
    if ended:
        hosts = list(ended)
    else:
        recorded = read_events(record.run_dir / EVENTS_FILE)
        hosts = list(attempt_hosts(recorded.events) if recorded is not None else ()) or logged_hosts(folder)
    nodes = []
    for index, host in enumerate(hosts):
        node = ended.get(host)
        ranks = rank_files(folder, host)
        for rank in ranks:
            rank["alive"] = False if ended else None
        nodes.append({"host": host, "node_rank": node.node_rank if node else index,
                      "exit_code": node.exit_code if node else None, "error": node.error if node else None,
                      "last_lines": list(node.last_lines) if node else [], "ranks": ranks})
    return nodes


def node_progress(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """A rank's ``progress`` in status from its node's record: the numbers the node read from
    its lines and its bar's draws (``progress``), else those of the line they came from (a node
    of an earlier fstrain records only that line)."""
    from fstrain.core.monitor.metricline import from_mapping

    found = from_mapping(entry.get("progress"))
    return progress_of([entry.get("progress_line") or ""]) if found is None else progress_numbers(found)


def progress_of(lines: Iterable[str]) -> dict[str, Any] | None:
    """A rank's ``progress`` in status: step, final step, loss and tokens/s of its latest numbers
    among ``lines`` (oldest first), as the live view reads them (metricline.newer_step): its
    last metric line once it printed one, else its last progress line (the trainer's, or a
    program's own ``step N/M loss L``); None where no line says a step."""
    from fstrain.core.monitor.metricline import newer_step

    held = None
    for line in lines:
        held = newer_step(held, line)
    return None if held is None else progress_numbers(held.metrics)


def progress_numbers(found: StepMetrics) -> dict[str, Any]:
    """The numbers of a rank's ``progress`` in status (what the live view shows of a rank)."""
    return {"step": found.step, "steps": found.steps, "loss": found.loss, "tokens_per_s": found.tokens_per_s,
            "step_s": found.step_s, "memory_bytes": found.memory_bytes}


RUN_STATES = ("pending", *STATES)  # what `fstrain runs --state` filters by (pending: a Slurm job not started)


def run_rows(include_ended: bool, access: Access, on_hosts: HostRequest | None = None,
             states: Sequence[str] = ()) -> list[dict[str, Any]]:
    """`fstrain runs`: a row per run started from this machine (state, exit code, duration,
    nodes, attempts, first failure, step and ETA), live ones only unless ``include_ended`` or
    ``states`` (then only those states, ended or not); with ``on_hosts``, also the detached
    runs whose records are on those hosts."""
    from fstrain.io.runs import run_state

    check_states(states)

    def shown(state: str) -> bool:
        return state in states if states else include_ended or state not in FINAL

    rows: list[dict[str, Any]] = []
    for run in all_runs(access):
        record = run.record
        if isinstance(run.backend, SlurmRun):  # Slurm's word, asked of scontrol here
            row = run.backend.row()
            if shown(row["state"]):
                rows.append({**row, **row_progress(run, row["state"])})
            continue
        cached = run_state(record, None)
        # Ask the nodes only while it may still run.
        state = run.state() if run.kind == "detached" and cached.state not in FINAL else cached
        if not shown(state.state):
            continue
        rows.append({"run_id": record.run_id, "state": state.state, "exit_code": state.exit_code,
                     "reason": state.reason, "detached": bool(record.detached), "started": record.started,
                     "seconds": round((state.ended or time.time()) - record.started, 1) if record.started else None,
                     "nodes": [h.label() for h in record.hosts], "run_dir": str(record.run_dir),
                     "first_failure": recorded_failure(record),
                     "attempts": _attempts(record), **row_progress(run, state.state)})
    if on_hosts is not None:  # and the detached runs found on those hosts
        known = {row["run_id"] for row in rows}
        rows += [{**row, "step": None, "steps": None, "eta_s": None} for row in rows_on_hosts(on_hosts, access.python)
                 if row["run_id"] not in known and shown(row["state"])]
    return rows


def check_states(states: Sequence[str]) -> None:
    """`runs --state`: each one a state a run can be in."""
    for state in states:
        if state not in RUN_STATES:
            raise InputError(f"unknown run state {state!r}", f"use one of {', '.join(RUN_STATES)}", "--state")


def row_progress(run: Run, state: str) -> dict[str, Any]:
    """A `runs` row's step, final step and ETA (None where not known, an ended run's ETA
    among them), from each rank's newest numbers (as `status --watch` reads them: from the
    status where node 0 holds every node's, else from a bounded tail of the ranks' output) and
    the rate since the last attempt's first step (its events file), else since the run's
    start. A detached run that has ended is not asked: its nodes may be gone."""
    from fstrain.core.monitor.watch import (
        TAIL_LINES_MAX,
        latest_samples,
        numbers_in_status,
        progress_from,
        status_samples,
    )
    from fstrain.core.runs.runevents import FIRST_STEP

    if run.kind == "detached" and state in FINAL:
        return {"step": None, "steps": None, "eta_s": None}
    document = run.status() if run.kind == "detached" else None
    if document is not None and numbers_in_status(document):
        samples = status_samples(document)
    else:
        outputs = run.outputs()
        try:
            lines = [text for chunk in outputs.read(TAIL_LINES_MAX) for text in chunk.splitlines()]
        finally:
            outputs.close()
        samples = list(latest_samples(lines).values())
    recorded = run.events()
    firsts = [e for e in recorded.events if e.kind == FIRST_STEP] if recorded is not None else []
    since = (firsts[-1].time, firsts[-1].step or 0) if firsts else (run.record.started, 0) \
        if run.record.started else None
    progress = progress_from(samples, time.time(), since)
    eta = None if state in FINAL or progress.eta_s is None else round(progress.eta_s, 1)
    return {"step": progress.step, "steps": progress.steps, "eta_s": eta}


def rows_on_hosts(request: HostRequest, python: str) -> list[dict[str, Any]]:
    """Detached runs whose node records are in the hosts' ``~/.fstrain/runs``, merged per run."""
    from fstrain.api.hosts import connector, select
    from fstrain.core.runs.runstate import first_failure, from_host_records
    from fstrain.io.runs import check_view, runs_on_hosts

    selection = select(request)
    merged: dict[str, dict[str, Any]] = {}
    for host, found in zip(selection.hosts, runs_on_hosts(selection.hosts, connector(None, request), python),
                           strict=True):
        for run in found:
            entry = merged.setdefault(run["run_id"], {"run": None, "nodes": {}, "hosts": []})
            entry["run"] = entry["run"] or run.get("run")
            entry["hosts"].append(host.label())
            for node in run["nodes"]:  # hosts that share a home see every node's record
                check_view({"run": run.get("run"), "node": node}, f"{host.label()}:{run.get('run_dir')}",
                           node.get("node_rank"))
                entry["nodes"][node.get("node_rank")] = node
    rows = []
    for run_id, entry in sorted(merged.items()):
        nodes = [entry["nodes"][k] for k in sorted(entry["nodes"], key=lambda k: (k is None, k))]
        state = from_host_records(entry["run"], nodes)
        started = min((n.get("started") or 0 for n in nodes), default=0)
        rows.append({"run_id": run_id, "state": state.state, "exit_code": state.exit_code, "reason": state.reason,
                     "detached": True, "started": started,
                     "seconds": round((state.ended or time.time()) - started, 1) if started else None,
                     "nodes": sorted({str(n.get("hostname")) for n in nodes}), "run_dir": None,
                     "mode": "found on hosts",
                     "first_failure": first_failure([{"node": n, "run": entry["run"]} for n in nodes])})
    return rows


def recorded_failure(record: RunRecord) -> dict[str, Any] | None:
    """The run's first failure as this machine last saw it, without asking any host: a
    detached run's from RUN_DIR/state.json (written whenever its nodes are asked), any other
    run's from its manifest."""
    from fstrain.io.runs import read_state_cache

    if record.detached is not None:
        cached = read_state_cache(record.run_dir / "state.json")
        failure = cached.first_failure if cached else None
        return failure if isinstance(failure, dict) else None
    return _manifest_failure(record.manifest)


def _manifest_failure(manifest: Manifest | None) -> dict[str, Any] | None:
    """An attached run's first failure, as its manifest recorded it, with its host."""
    if manifest is None or manifest.first_failure_node_rank is None:
        return None
    return {**(manifest.first_failure or {}), "node_rank": manifest.first_failure_node_rank,
            "host": manifest.failed_host, "reason": manifest.reason}


def _attempts(record: RunRecord) -> list[dict[str, Any]]:
    """A run with a recovery policy: its attempts as the manifest lists them (none before it has one)."""
    return [dict(a) for a in record.manifest.attempts] if record.manifest else []


# -- attached runs on this machine ---------------------------------------------------------------


class AttachedRun:
    def __init__(self, record: RunRecord, access: Access) -> None:
        self.record = record

    def refresh(self) -> None:
        """The manifest as it is now: the launcher writes it at the run's end."""
        from fstrain.io.runs import read_manifest

        self.record.manifest = read_manifest(self.record.run_dir / "manifest.json")

    def state(self) -> RunState:
        from fstrain.io.runs import run_state

        self.refresh()
        return run_state(self.record, None)

    def running(self) -> bool:
        """Its launcher lives and has not written the run's end (a launcher in this very
        process, the API's, lives on after its run)."""
        from fstrain.io.localproc import process_alive

        self.refresh()
        ended = bool(self.record.manifest and self.record.manifest.ended)
        return not ended and process_alive(self.record.client_pid)

    def finished(self) -> RunState | None:
        from fstrain.io.runs import run_state

        if self.running():
            return None
        return run_state(self.record, None)  # running() has just read the manifest again

    def status(self) -> dict[str, Any]:
        self.refresh()  # asked again and again (`status --watch`): the launcher writes the end
        return status_document(self.record, None)

    def outputs(self, hosts: Sequence[str], rank: int | None, since: float | None, hide: str | None) -> FileOutputs:
        """The launcher's own log files: one per host (``<host>.log``) or per rank (``.r<R>``)."""
        from fstrain.io.logs import FileOutputs, log_files

        folder = self.record.run_dir / "logs"

        def chosen() -> list[Path]:
            return log_files(folder, hosts, rank)

        return FileOutputs(chosen, hide)

    def stop(self, force: bool, grace_s: float | None, wait_s: float) -> Stopped:
        """SIGTERM to its launcher, as Ctrl-C would (a second one, with ``force``, skips the
        grace period)."""
        from fstrain.io.localproc import terminate_if_ours, wait_gone
        from fstrain.io.runs import run_state

        pid = self.record.client_pid
        state = self.state()
        if state.state != "running":
            return Stopped(state, True)
        if not terminate_if_ours(pid, b"fstrain", times=2 if force else 1):  # gone, or the pid was reused
            raise InputError(f"run {self.record.run_id}'s launcher (pid {pid}) is gone", "", "RUN")
        if not wait_gone(pid, wait_s):
            raise FstrainError(f"run {self.record.run_id}'s launcher has not exited {wait_s:g} s after SIGTERM",
                               "`fstrain stop --force` skips the grace period", "stop")
        self.refresh()
        return Stopped(run_state(self.record, None), False)


# -- runs submitted to Slurm -------------------------------------------------------------------


class SlurmRun:
    def __init__(self, record: RunRecord, access: Access) -> None:
        assert record.slurm is not None
        self.record = record
        self.slurm = record.slurm
        self.python = access.python

    def state(self) -> RunState:
        from fstrain.io.runs import slurm_state

        return slurm_state(self.record)[0]

    def running(self) -> bool:
        return self.state().state not in FINAL

    def finished(self) -> RunState | None:
        state = self.state()
        return state if state.state in FINAL else None

    def row(self) -> dict[str, Any]:
        """One `fstrain runs` row: Slurm's word, asked of scontrol here."""
        from fstrain.io.runs import slurm_state

        record = self.record
        state, job = slurm_state(record, strict=False)
        seconds = job.get("run_time_s")
        manifest = record.manifest
        if seconds is None and manifest is not None and manifest.ended and manifest.started:
            seconds = manifest.ended - manifest.started
        return {"run_id": record.run_id, "state": state.state, "exit_code": state.exit_code, "reason": state.reason,
                "detached": True, "started": record.started, "seconds": round(seconds, 1) if seconds is not None
                else round(time.time() - record.started, 1), "nodes": [h.label() for h in record.hosts]
                or ([job["nodes"]] if job.get("nodes") else []), "run_dir": str(record.run_dir),
                "mode": f"slurm {job.get('job_id')}", "job_id": job.get("job_id"), "slurm_state": job.get("state"),
                "first_failure": _manifest_failure(record.manifest)}

    def status(self) -> dict[str, Any]:
        """The state, the job, and per node and per rank what the job's fstrain wrote in the run
        directory (RUN_DIR/logs/<host>.r<rank>.log; the manifest's codes once it ended). While the
        job runs, a step of it on every node (``srun --jobid --overlap``) adds which ranks live
        there and the node's GPU memory and utilisation."""
        from fstrain.core.monitor.gpuusage import from_node
        from fstrain.io.runs import slurm_live_views, slurm_state

        record = self.record
        state, job = slurm_state(record)
        ended = {n.host: n for n in (record.manifest.nodes if record.manifest else ())}
        hosts = [h.name for h in record.hosts]
        views: list[dict[str, Any] | None] = [None] * len(hosts)
        asked = state.state == "running" and job.get("state") == "RUNNING" and bool(hosts)
        if asked:
            try:
                views = slurm_live_views(record, str(job["job_id"]), hosts, self.python)
            except FstrainError:  # srun missing here: the files still tell most of it
                asked = False
        nodes = []
        for index, host in enumerate(hosts):
            node, view = ended.get(host), views[index]
            ranks = rank_files(record.job_dir / "logs", host)
            alive = set((view or {}).get("ranks_alive") or [])
            for rank in ranks:
                rank["alive"] = (rank["rank"] in alive) if view is not None else None
            gpus, gpus_error = from_node((view or {}).get("gpus"), host)
            nodes.append({"host": host, "node_rank": index, "exit_code": node.exit_code if node else None,
                          "error": node.error if node else None, "reachable": view is not None if asked else None,
                          "ranks": ranks, "gpus": gpus, "gpus_error": gpus_error})
        return {"run_id": record.run_id, "state": state.state, "exit_code": state.exit_code, "reason": state.reason,
                "detached": True, "kind": "slurm", "started": record.started, "job": job,
                "output": self.slurm.output, "nodes": nodes}

    def log_files(self, hosts: Sequence[str], rank: int | None) -> list[Path]:
        """The job's output file (every tagged line and fstrain's summary) unless a host or rank
        is asked for; then RUN_DIR/job-<job id>/logs/<host>[.r<rank>].log."""
        from fstrain.io.logs import logged_hosts

        record = self.record
        if not hosts and rank is None:
            return [Path(self.slurm.output or record.run_dir / f"slurm-{self.slurm.job_id}.out")]
        folder = record.job_dir / "logs"
        known = logged_hosts(folder)
        for name in hosts:
            if known and name not in known:
                raise InputError(f"{name!r} is not one of the run's hosts", f"use one of {', '.join(known)}",
                                 "--host")
        chosen = list(hosts) or known
        if rank is None:
            return [folder / f"{host}.log" for host in chosen]
        return [folder / f"{host}.r{rank}.log" for host in chosen]

    def outputs(self, hosts: Sequence[str], rank: int | None, since: float | None, hide: str | None) -> FileOutputs:
        from fstrain.io.logs import FileOutputs

        self.log_files(hosts, rank)  # checked now: a wrong --host is an error before any read
        return FileOutputs(lambda: self.log_files(hosts, rank), hide)

    def stop(self, force: bool, grace_s: float | None, wait_s: float) -> Stopped:
        """SIGTERM to every process of the job (``scancel --signal=TERM --full``), so its fstrain
        stops every rank within the run's --grace and writes its manifest; if the job is still
        there ``grace_s`` later, or at once with ``force``, SIGKILL to every srun step (each
        node's watchdog, launcher and ranks) and Slurm's own cancellation (``scancel``) for what
        is left. A job still pending is simply cancelled."""
        from fstrain.io.runs import mark_stop_requested, slurm_state
        from fstrain.io.slurm import SlurmError, signal_job

        record = self.record
        job_id = str(self.slurm.job_id)
        state, job = slurm_state(record)
        if job.get("forgotten") and state.state == "lost":
            raise SlurmError(f"Slurm does not know job {job_id} (run {record.run_id}) and its run directory "
                             f"{record.run_dir} holds no final manifest", "is SLURM_CONF the cluster it was "
                             "submitted to? `squeue -u $USER` lists your jobs", "stop")
        if state.state in FINAL:
            return Stopped(state, True)
        # Marked first: whoever reads the end (another `logs --follow`) must know it was a stop.
        mark_stop_requested(record)
        try:
            if state.state == "pending":  # no process yet: Slurm's cancellation alone
                error = signal_job(job_id, None)
            elif force:
                error = None
                kill_job(job_id)
            else:
                error = signal_job(job_id, "TERM")
        except BaseException:
            mark_stop_requested(record, False)
            raise
        if error is not None:
            mark_stop_requested(record, False)
            state, _ = slurm_state(record)
            if state.state in FINAL:
                return Stopped(state, True)
            raise SlurmError(f"scancel of job {job_id} failed: {error}", f"check the job with `squeue -j {job_id}`",
                             "stop")
        grace = grace_s if grace_s is not None else float(self.slurm.grace_s or 15.0) + STOP_MARGIN_S
        started = time.monotonic()
        killed = force or state.state == "pending"
        while state.state not in FINAL:
            elapsed = time.monotonic() - started
            next_step = stop_step(elapsed, grace, wait_s, killed)
            if next_step == KILL:
                kill_job(job_id)
                killed = True
            elif next_step == GIVE_UP:
                raise SlurmError(f"job {job_id} has not ended {elapsed:.0f} s after the stop",
                                 f"check it with `squeue -j {job_id}`; `scancel {job_id}` leaves it to Slurm", "stop")
            time.sleep(POLL_S)
            state, _ = slurm_state(record)
        return Stopped(state, False)


def kill_job(job_id: str) -> None:
    """SIGKILL to every srun step, then Slurm's cancellation for the batch script (its complaint,
    the job being gone already, is no error: the end is what `stop` waits for next)."""
    from fstrain.io.slurm import kill_steps, signal_job

    kill_steps(job_id)
    signal_job(job_id, None)


def rank_files(folder: Path, host: str) -> list[dict[str, Any]]:
    """Each rank's last line, last output time and latest numbers (:func:`progress_of`), from its log file."""
    from fstrain.io.logs import rank_log_ends

    ranks = []
    for end in rank_log_ends(folder, host):
        texts = [line.split("] ", 1)[-1] for line in end.lines]
        ranks.append({"rank": end.rank, "last_output_at": end.modified_at,
                      "last_line": texts[-1] if texts else None, "progress": progress_of(texts)})
    return sorted(ranks, key=lambda r: r["rank"])
