"""Runs that outlive the launcher: start them detached, find them again, read their state and
logs, stop them, remove their folders.

Where things live:

- ``~/.fstrain/launched/<run id>.json`` on this machine: one entry per run started here (its
  local run directory, attached or detached), so any later command finds it;
- ``RUN_DIR/detached.json`` (local): the hosts, each node's run directory, rank offset and
  watchdog pid, and the coordinator's address, as `launch --detach` started them;
- on every node, in its run directory: ``node<I>.out`` (the job's output, each line with the
  time in front), ``node<I>.json`` (its watchdog's state), and on node 0 ``run.json`` (the run's
  state, kept by the coordinator) and ``coordinator.json`` (its port and the run's secret, mode
  0600). See fstrain/io/remote/coordinator.py.

A run submitted with ``fstrain launch --slurm`` (detached or followed) has ``RUN_DIR/slurm.json``
(its job id, submit time, script and output file) and an index entry of kind ``slurm``. Inside
the allocation the job's own ``fstrain launch`` writes, in the job's folder ``RUN_DIR/job-<job
id>/``, ``logs/``, ``summary.json`` and, at its end, ``manifest.json`` (so the same script
submitted again by hand keeps every job's records; a job id of such a job finds it too). That
inner launch has a run id of its own and would register itself too: the Slurm record wins
(:func:`register` leaves a folder with ``slurm.json``, or a job folder in one, to it, and
:func:`all_runs` lists a run directory once), so one job is one run, under the id
``launch --slurm`` printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fstrain import __version__
from fstrain.core.formats import check_format
from fstrain.core.hosts.hostfile import Host
from fstrain.core.progress import Event
from fstrain.core.runs.manifest import Manifest
from fstrain.core.runs.runrecord import (
    DetachedNode,
    DetachedRecord,
    IndexEntry,
    KeeperRecord,
    SlurmRecord,
    StateCache,
)
from fstrain.core.runs.runstate import FINAL, RunState, first_failure, from_manifest, from_nodes, with_keeper
from fstrain.core.slurm.job import JOB_DIR_PREFIX, TIME_LIMIT_MARKER, job_dir_name
from fstrain.errors import FstrainError, InputError
from fstrain.io.remote import as_line, line_script, source

# Starting, asking and stopping runs import the launch machinery where they need it: `logs` and
# `status` of an attached run only find the run's folder here, and start faster without it.
if TYPE_CHECKING:
    from fstrain.core.job.spec import NodeLaunch
    from fstrain.io.fanout import HostPool
    from fstrain.io.launch import Rendezvous, RunOptions, RunSetup
from fstrain.io.documents import fetch_json, write_json_atomic, write_json_or_warn
from fstrain.io.fanout import DEFAULT_FANOUT
from fstrain.io.localproc import process_alive
from fstrain.io.transport.base import Transport

INDEX = (".fstrain", "launched")  # under this machine's home
SLURM_RECORD = "slurm.json"  # in the run directory of a `launch --slurm` run
START_TIMEOUT_S = 120.0


def index_dir() -> Path:
    return Path.home().joinpath(*INDEX)


# -- starting -----------------------------------------------------------------------------------


def start_detached(launches: Sequence[NodeLaunch], connect: Callable[[Host], Transport], python: str,
                   options: RunOptions, rendezvous: Rendezvous,
                   coordinator_started: Callable[[list[dict[str, Any]]], None] = lambda answers: None,
                   banner: str = "", events: bool = False, fanout: int = DEFAULT_FANOUT) -> list[dict[str, Any]]:
    """Start node 0's watchdog as the coordinator, then every other node's as a member, at most
    ``fanout`` at a time; return each node's answer (pids, the coordinator's port) once all of
    them started.
    ``coordinator_started`` gets the answers as soon as node 0's is in (the others' empty);
    ``banner``, the attempt's first line in every node's output (a recovering run); ``events``:
    the coordinator writes the run's events (RUN_DIR/events.jsonl on node 0: a run without a
    recovery keeper)."""
    from fstrain.core.job.spec import secret_values
    from fstrain.io.launch import LaunchError, watchdog_header

    secret = secrets.token_hex(16)
    core = Path(__file__).resolve().parent.parent / "core"  # pure, stdlib-only modules the nodes run too
    modules = {"coordinator": source("coordinator"), "runctl": source("runctl"),  # a node's view, for status
               "rankexit": (core / "monitor" / "rankexit.py").read_text(),
               "analysis": (core / "monitor" / "stacks.py").read_text(),
               "supervisor": (core / "launch" / "supervisor.py").read_text(),
               "metricline": (core / "monitor" / "metricline.py").read_text()}  # each rank's numbers, for status

    def header(launch: NodeLaunch, detach: dict[str, Any]) -> bytes:
        document = watchdog_header(launch, options)
        document["modules"] = {**document.get("modules", {}), **modules}
        document["detach"] = {"secret": secret, "nnodes": len(launches), "redact": secret_values(launch.env),
                              **detach}
        if banner:
            document["detach"]["banner"] = banner
        return (json.dumps(document) + "\n").encode()

    total, lock = len(launches), threading.Lock()
    report = options.progress or (lambda event: None)
    report(Event("start", 0, total, "node 0 (the coordinator)"))
    first = _start_one(launches[0], connect, python,
                       header(launches[0], {"role": "coordinator", "bind": rendezvous.master_addr,
                                            # the hosts' names: node 0's alone (in every header, N^2 bytes)
                                            "names": [other.host.name for other in launches],
                                            **({"events": __version__} if events else {})}))
    answers: list[dict[str, Any]] = [first] + [{}] * (len(launches) - 1)
    coordinator_started(list(answers))
    started = [launches[0].host.label()]
    report(Event("start", 1, total, started[0]))
    member = {"role": "member", "coordinator": [rendezvous.master_addr, first["port"]]}

    def one(index: int) -> None:
        try:
            answers[index] = _start_one(launches[index], connect, python, header(launches[index], member))
        except FstrainError as exc:
            answers[index] = {"error": exc.message}
        with lock:
            started.append(launches[index].host.label())
            report(Event("start", len(started), total, started[-1]))

    with ThreadPoolExecutor(max_workers=max(1, min(fanout, len(launches) - 1)),
                            thread_name_prefix="fstrain-start") as pool:
        list(pool.map(one, range(1, len(launches))))
    failed = [f"{launches[i].host.label()}: {a['error']}" for i, a in enumerate(answers) if "error" in a]
    report(Event("start", total - len(failed), total, f"{len(failed)} failed" if failed else "", ended=True,
                 failed=bool(failed)))
    if failed:  # the coordinator tears the others down when they do not join; do it now
        stop_on_node(connect, launches[0].host, python, watchdog_header(launches[0], options)["run_dir"], "term")
        raise LaunchError("the detached run could not start: " + "; ".join(failed),
                          "see the node's output in its run directory (node<I>.out)", "launch --detach")
    return answers


def _start_one(launch: NodeLaunch, connect: Callable[[Host], Transport], python: str, header: bytes) -> dict[str, Any]:
    from fstrain.io.launch import LaunchError, start_watchdog

    transport = connect(launch.host)
    try:
        running = start_watchdog(transport, python, header, close_stdin=True)
        answer: dict[str, Any] | None = None
        deadline = time.monotonic() + START_TIMEOUT_S
        errors: list[str] = []
        for stream, line in running.lines():
            if stream == "stdout" and line.startswith("{"):
                answer = json.loads(line)
                break
            errors.append(line)
            if time.monotonic() > deadline:
                break
        running.wait()
        running.close()
    finally:
        transport.close()
    if answer is None:
        raise LaunchError(f"{launch.host.label()}: the watchdog did not start: {' '.join(errors)[-300:]}", "",
                          "launch --detach")
    if "error" in answer:
        raise LaunchError(f"{launch.host.label()}: {answer['error']}", "", "launch --detach")
    return answer


def record_detached(folder: Path, setup: RunSetup, run_dirs: Sequence[str], answers: Sequence[dict[str, Any]],
                    options: RunOptions, reach: tuple[str | None, str], started: float) -> DetachedRecord:
    """RUN_DIR/detached.json (each node's run directory and its start answer; ``reach``: the
    SSH config and interpreter later commands use), and this machine's index entry. Written
    before any node starts (no answers yet: every node's folder is known, so `runs` lists the
    run and `stop` reaches node 0's coordinator even if this process dies while starting
    them), again once node 0 has answered, and once every node has; each time whole (a
    temporary file renamed over the last)."""
    ssh_config, python = reach
    assert setup.rendezvous is not None
    record = DetachedRecord(
        setup.run_id, setup.backend, started, python, options.limits.grace_s,
        str(Path(ssh_config).resolve()) if ssh_config else None, setup.rendezvous.master_addr, answers[0].get("port"),
        tuple(DetachedNode(Host(launch.host.name, launch.host.user, launch.host.port), launch.node_rank, launch.nproc,
                           launch.rank_offset, run_dir, answer.get("pid"), answer.get("job_pid"))
              for launch, run_dir, answer in zip(setup.launches, run_dirs, answers, strict=True)))
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / "detached.json", record.to_dict(__version__))
    register(setup.run_id, folder, detached=True)
    return record


def register(run_id: str, folder: Path, *, detached: bool, launching: bool = True) -> None:
    """This machine's index entry for a run, so `fstrain runs` finds it from anywhere, with this
    process's pid while it is ``launching`` the run. A run directory that a Slurm submission
    owns (``slurm.json``, written before the job starts) is already registered under the
    submission's id: the job's own launch adds no second entry."""
    owner = read_json(folder / SLURM_RECORD)
    if owner is None and folder.name.startswith(JOB_DIR_PREFIX):  # a job's folder in a Slurm run directory
        owner = read_json(folder.parent / SLURM_RECORD)
    if isinstance(owner, dict) and owner.get("run_id") not in (None, run_id):  # read loosely: only its owner
        return
    entry = IndexEntry(run_id, str(folder.resolve()), detached, time.time(), os.getpid() if launching else None)
    write_json_atomic(index_dir() / f"{run_id}.json", entry.to_dict(__version__))


def write_batch_script(folder: Path, script: str, env_text: str | None) -> tuple[Path, list[Path]]:
    """RUN_DIR/sbatch.sh (executable) and, with ``env_text``, RUN_DIR/launch.env (readable by
    the user only: values stay off the script and the command lines). The script's path, and
    what was made that was not there before (the folder itself, or the files), for
    :func:`forget_submission`."""
    names = ["launch.env", "sbatch.sh"] if env_text is not None else ["sbatch.sh"]
    made = [folder] if not folder.exists() else [folder / n for n in names if not (folder / n).exists()]
    folder.mkdir(parents=True, exist_ok=True)
    if env_text is not None:
        fd = os.open(folder / "launch.env", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(env_text)
    path = folder / "sbatch.sh"
    path.write_text(script)
    path.chmod(0o755)
    return path, made


def forget_submission(folder: Path, made: Sequence[Path]) -> None:
    """A refused submission leaves nothing behind: what it made, and the folder's claim."""
    for path in [*made, folder / SLURM_RECORD]:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def record_slurm(folder: Path, *, run_id: str, job_id: str, script: Path, output: Path,
                 grace_s: float | None) -> SlurmRecord:
    """RUN_DIR/slurm_job_id, RUN_DIR/slurm.json and this machine's index entry for a submitted
    batch job."""
    (folder / "slurm_job_id").write_text(job_id + "\n")
    record = SlurmRecord(run_id, job_id, time.time(), str(script), str(output), grace_s)
    write_slurm(folder / SLURM_RECORD, record)
    entry = IndexEntry(run_id, str(folder.resolve()), True, record.submitted, kind="slurm", job_id=job_id)
    write_json_atomic(index_dir() / f"{run_id}.json", entry.to_dict(__version__))
    return record


def claim_for_slurm(folder: Path, run_id: str) -> None:
    """Before sbatch: mark the run directory as the submission's, so that a job starting at
    once finds it claimed (the job id is added by :func:`record_slurm`)."""
    write_slurm(folder / SLURM_RECORD, SlurmRecord(run_id, None, time.time()))


def read_summary(path: Path) -> dict[str, Any] | None:
    """The trainer's summary.json; None where there is none (the training did not finish)."""
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the trainer's summary: {exc}", "remove the file, or run again",
                         str(path)) from None
    if not isinstance(document, dict):
        return None
    check_format(document, "summary", str(path))
    return document


def copy_training_summary(connect: Callable[[Host], Transport], host: Host, run_dir: str,
                          folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The bundled trainer's rank-0 summary.json from node 0's run directory, copied into the
    local ``folder``: (summary, None), or (None, why not). A summary that cannot be copied is
    still returned (the copy's failure is said as a warning)."""
    summary, error = fetch_json(connect, host, f"{run_dir}/summary.json", timeout_s=30)
    if not isinstance(summary, dict):
        return None, error or "not a JSON object"
    write_json_or_warn(folder / "summary.json", summary)
    return summary, None


# -- finding ------------------------------------------------------------------------------------


@dataclass
class RunRecord:
    run_id: str
    run_dir: Path
    detached: DetachedRecord | None
    manifest: Manifest | None
    entry: IndexEntry | None  # None: found by its run directory, not in this machine's index
    slurm: SlurmRecord | None = None  # RUN_DIR/slurm.json of a `launch --slurm` run

    @property
    def job_dir(self) -> Path:
        """Where a Slurm run's job keeps its manifest, logs and summary: RUN_DIR/job-<job id>, or
        the run directory itself for a job of an fstrain that did not make job folders."""
        job_id = self.slurm.job_id if self.slurm is not None else None
        if not job_id:
            return self.run_dir
        folder = self.run_dir / job_dir_name(str(job_id))
        return folder if folder.is_dir() or not (self.run_dir / "manifest.json").is_file() else self.run_dir

    @property
    def slurm_path(self) -> Path:
        """A Slurm run's record: RUN_DIR/slurm.json for the job `launch --slurm` submitted, the
        job folder's own for another job of the same script (submitted by hand)."""
        return self.job_dir / SLURM_RECORD if self.slurm is not None and self.slurm.by_hand \
            else self.run_dir / SLURM_RECORD

    @property
    def hosts(self) -> list[Host]:
        if self.slurm is not None and not (self.manifest and self.manifest.nodes):  # still running: Slurm's nodes
            cached = read_state_cache(self.job_dir / "state.json")
            return [Host(name) for name in ((cached.job if cached else None) or {}).get("hosts", [])]
        if self.detached:
            return self.detached.hosts
        return [Host(n.host) for n in self.manifest.nodes] if self.manifest is not None else []

    @property
    def started(self) -> float:
        return float((self.detached.started if self.detached else 0) or (self.slurm.submitted if self.slurm else 0)
                     or (self.manifest.started if self.manifest else 0) or (self.entry.registered if self.entry else 0))

    @property
    def client_pid(self) -> int:
        """An attached run's launcher (0: not known)."""
        return (self.entry.client_pid if self.entry else None) or 0


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_manifest(path: Path) -> Manifest | None:
    """A run's manifest: None where it is missing or no JSON object, an InputError naming the
    file where this fstrain cannot read it."""
    document = read_json(path)
    return Manifest.from_dict(document, str(path)) if isinstance(document, dict) else None


def read_slurm(path: Path) -> SlurmRecord | None:
    """A Slurm run's record; None where there is none, an InputError naming the file where it
    cannot be read."""
    document = read_json(path)
    return SlurmRecord.from_dict(document, str(path)) if isinstance(document, dict) else None


def write_slurm(path: Path, record: SlurmRecord) -> None:
    write_json_atomic(path, record.to_dict(__version__))


def read_state_cache(path: Path) -> StateCache | None:
    """RUN_DIR/state.json, what this machine last saw of a run: None where it is missing or of a
    format this fstrain cannot read (a cache: it is written again)."""
    return StateCache.from_dict(read_json(path))


def write_state_cache(path: Path, cache: StateCache) -> None:
    write_json_atomic(path, cache.to_dict(__version__))


def launched_record(run_id: str, folder: Path, *, detached: bool) -> RunRecord:
    """The record of a run this process has just launched, from its run directory (not from
    the index: inside a Slurm job the directory is the submission's, indexed under its id)."""
    entry = IndexEntry(run_id, str(folder.resolve()), detached, time.time(), os.getpid())
    return RunRecord(run_id, folder, read_detached(folder) if detached else None,
                     read_manifest(folder / "manifest.json"), entry)


def read_keeper(folder: Path) -> KeeperRecord | None:
    """RUN_DIR/keeper.json (a detached run with a recovery policy), None where there is none."""
    document = read_json(folder / "keeper.json")
    return KeeperRecord.from_dict(document, str(folder / "keeper.json")) if document is not None else None


def read_detached(folder: Path) -> DetachedRecord | None:
    """RUN_DIR/detached.json, None where there is none."""
    document = read_json(folder / "detached.json")
    return DetachedRecord.from_dict(document, str(folder / "detached.json")) if document is not None else None


def all_runs(skipped: Callable[[str, InputError], None] | None = None) -> list[RunRecord]:
    """Every run this machine started, oldest first (entries whose folder is gone are skipped).
    A run whose files this fstrain cannot read (a newer format) is left out and given to
    ``skipped`` with its id (by default a warning on stderr): one such run hides none of the
    others."""
    records = []
    folder = index_dir()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = _indexed_run(path)
        except InputError as exc:
            (skipped or _warn_skipped)(path.stem, exc)
            continue
        if record is not None:
            records.append(record)
    return sorted(records, key=lambda r: r.started)


def _warn_skipped(run_id: str, exc: InputError) -> None:
    from fstrain.io.localout import warn

    warn(f"run left out: {exc.one_line()}")


def _indexed_run(path: Path) -> RunRecord | None:
    raw = read_json(path)
    if not isinstance(raw, dict) or "run_dir" not in raw:
        return None
    entry = IndexEntry.from_dict(raw, str(path))
    run_dir = Path(entry.run_dir)
    slurm = read_slurm(run_dir / SLURM_RECORD)
    if slurm is not None and slurm.run_id != entry.run_id:
        return None  # the job's own launch inside a Slurm run: the submission's entry stands for it
    record = RunRecord(entry.run_id, run_dir, read_detached(run_dir), None, entry, slurm)
    record.manifest = read_manifest(record.job_dir / "manifest.json")
    return record


def _slurm_job(runs: Sequence[RunRecord], job_id: str) -> list[RunRecord]:
    """The Slurm run whose submitted job is ``job_id``, else the one whose script ran as that job
    too (submitted again by hand: its folder RUN_DIR/job-<job id>), as a record of that job."""
    submitted = [r for r in runs if r.slurm is not None and r.slurm.job_id == job_id]
    if submitted or not job_id.isdigit():
        return submitted
    found = []
    for run in runs:
        folder = run.run_dir / job_dir_name(job_id)
        if run.slurm is not None and folder.is_dir():
            own = read_slurm(folder / SLURM_RECORD)  # where a stop of it was recorded
            slurm = own or replace(run.slurm, job_id=job_id, by_hand=True, submitted=folder.stat().st_mtime,
                                   output=str(run.run_dir / f"slurm-{job_id}.out"), stop_requested=None)
            found.append(RunRecord(run.run_id, run.run_dir, None, read_manifest(folder / "manifest.json"),
                                   run.entry, slurm))
    return found


def find_run(reference: str) -> RunRecord:
    """A run by id, by a unique prefix of its id, by its Slurm job id, or by its local run directory
    (the index's record where this machine started it, else what the folder holds). A run whose
    files this fstrain cannot read is named with that error."""
    unreadable: dict[str, InputError] = {}
    runs = all_runs(lambda run_id, exc: unreadable.__setitem__(run_id, exc))
    exact = [r for r in runs if r.run_id == reference] or _slurm_job(runs, reference)
    matches = exact or [r for r in runs if r.run_id.startswith(reference)]
    if len(matches) == 1:
        return matches[0]
    path = Path(reference)
    indexed = _indexed_folder(runs, path) if not matches else None
    if indexed is not None:
        return indexed
    slurm = read_slurm(path / SLURM_RECORD) if not matches else None
    if slurm is not None and slurm.job_id:
        record = RunRecord(slurm.run_id, path, None, None, None, slurm)
        record.manifest = read_manifest(record.job_dir / "manifest.json")
        return record
    detached = read_detached(path) if not matches and (path / "detached.json").is_file() else None
    if detached is not None:
        return RunRecord(detached.run_id, path, detached, read_manifest(path / "manifest.json"), None)
    manifest = read_manifest(path / "manifest.json") if not matches else None
    if manifest is not None and not manifest.detached:  # an attached run's folder
        return RunRecord(manifest.run_id, path, None, manifest, None)
    if matches:
        raise InputError(f"{reference!r} matches {len(matches)} runs", "give more of the run id", "RUN")
    for run_id, error in unreadable.items():
        if run_id.startswith(reference):
            raise error
    raise InputError(f"no run {reference!r} was started from this machine",
                     "`fstrain runs --all` lists them (or give the run's local directory)", "RUN")


def _indexed_folder(runs: Sequence[RunRecord], path: Path) -> RunRecord | None:
    """The run started here whose run directory ``path`` is, as the index has it (its launcher's
    pid included): an attached run still going has no final manifest there yet. The latest,
    where a folder was given to several runs."""
    if not path.is_dir():
        return None
    folder = path.resolve()
    same = [r for r in runs if r.run_dir.resolve() == folder]
    return same[-1] if same else None


# -- looking ------------------------------------------------------------------------------------


def node_views(record: RunRecord, connect: Callable[[Host], Transport], python: str) -> list[dict[str, Any] | None]:
    """Each node's state (fstrain/io/remote/runctl.py), None where the node cannot be asked.

    Node 0 first, in one SSH session: while the run lives its coordinator holds every node's
    view (each member sends its own with its heartbeats), so a live run of any size costs one
    session. The nodes it has no view of (all of them once the coordinator has exited) are then
    asked themselves, ``--fanout`` at a time."""
    from fstrain.io.fanout import HostPool

    assert record.detached is not None
    nodes = record.detached.nodes
    place = {id(node.host): index for index, node in enumerate(nodes)}  # not hosts.index(h): N^2 at 4,096
    with HostPool([node.host for node in nodes], connect) as pool:
        views = _coordinator_views(pool, record, python)
        missing = [node.host for node, view in zip(nodes, views, strict=True) if view is None]
        results = pool.run_all(
            lambda h: line_script(python, "state", nodes[place[id(h)]].run_dir,
                                  str(nodes[place[id(h)]].node_rank), record.run_id),
            stdin=as_line("runctl"), timeout_s=60, only=missing)
    for host, result in zip(missing, results, strict=True):
        with contextlib.suppress(ValueError):  # not a view: that node stays None
            views[place[id(host)]] = json.loads(result.stdout) if result.ok else None
    for node, view in zip(nodes, views, strict=True):
        check_view(view, f"{node.host.label()}:{node.run_dir}", node.node_rank)
    return views


def coordinator_views(record: RunRecord, connect: Callable[[Host], Transport], python: str) -> dict[int, Any]:
    """Node rank -> its view as node 0's coordinator holds it (nothing for a node it has none
    of, nor when it does not answer): one SSH session, to node 0."""
    from fstrain.io.fanout import HostPool

    assert record.detached is not None
    with HostPool([record.detached.nodes[0].host], connect) as pool:
        views = _coordinator_views(pool, record, python)
    return {node.node_rank: view for node, view in zip(record.detached.nodes, views, strict=True) if view}


def _coordinator_views(pool: HostPool, record: RunRecord, python: str) -> list[dict[str, Any] | None]:
    """Every node's view as node 0's coordinator holds it (runctl.py ``views``); None for each
    node it has none of, and for all when it does not answer (the run ended, an older fstrain)."""
    assert record.detached is not None
    nodes = record.detached.nodes
    node0 = nodes[0]
    result = pool.run_one(node0.host, line_script(python, "views", node0.run_dir),
                          stdin=as_line("runctl"), timeout_s=60)
    try:
        answer = json.loads(result.stdout) if result.ok else {}
    except ValueError:
        answer = {}
    found = answer.get("views") if isinstance(answer, dict) else None
    if not isinstance(found, list) or len(found) != len(nodes):
        return [None] * len(nodes)
    check_format(answer, "message", f"{node0.host.label()}:{node0.run_dir}")
    return [view if isinstance(view, dict) else None for view in found]


def runs_on_hosts(hosts: Sequence[Host], connect: Callable[[Host], Transport],
                  python: str) -> list[list[dict[str, Any]]]:
    """The run records in each host's ``~/.fstrain/runs`` (fstrain/io/remote/runctl.py ``list``),
    by host; an empty list where the host could not be read."""
    from fstrain.io.fanout import HostPool
    from fstrain.io.launch import REMOTE_RUNS

    with HostPool(list(hosts), connect) as pool:
        results = pool.run_all(line_script(python, "list", f"~/{REMOTE_RUNS}"),
                               stdin=as_line("runctl"), timeout_s=60)
    found = []
    for result in results:
        try:
            runs = json.loads(result.stdout)["runs"] if result.ok else []
        except (ValueError, KeyError):
            runs = []
        found.append(runs if isinstance(runs, list) else [])
    return found


def check_view(view: dict[str, Any] | None, where: str, node_rank: int) -> None:
    """The node's own files in its view (runctl.py ``state``) are of formats this fstrain reads:
    a node may run an older or newer fstrain's watchdog than this one."""
    for key, kind, name in (("node", "node", f"node{node_rank}.json"), ("run", "run", "run.json")):
        document = (view or {}).get(key)
        if document is not None:
            check_format(document, kind, f"{where}/{name}")


def slurm_live_views(record: RunRecord, job_id: str, hosts: Sequence[str], python: str) -> list[dict[str, Any] | None]:
    """For a running Slurm job, each node's live ranks and GPUs, asked by a step of the job
    itself (``srun --jobid=J --overlap``, fstrain/io/remote/runctl.py ``live-slurm``); None
    where the step could not run."""
    from fstrain.io.fanout import HostPool
    from fstrain.io.slurm import srun_connector

    nodes = [Host(name) for name in hosts]
    with HostPool(nodes, srun_connector(extra=[f"--jobid={job_id}"])) as pool:
        results = pool.run_all(lambda h: line_script(python, "live-slurm", job_id, h.name),
                               stdin=as_line("runctl"), timeout_s=60)
    views: list[dict[str, Any] | None] = []
    for result in results:
        try:
            views.append(json.loads(result.stdout) if result.ok else None)
        except ValueError:
            views.append(None)
    return views


def run_state(record: RunRecord, views: Sequence[dict[str, Any] | None] | None) -> RunState:
    """The run's state: the manifest for an attached run, the nodes' views for a detached one
    (with its recovery keeper, if it has one), Slurm's word and the manifest for a Slurm one."""
    if record.slurm is not None:
        return slurm_state(record, strict=False)[0]
    if record.detached is None:
        if record.manifest is not None and record.manifest.ended:
            return from_manifest(record.manifest)
        alive = process_alive(record.client_pid)
        return RunState("running" if alive else "lost", None, "" if alive else "its launcher is gone")
    keeper = read_keeper(record.run_dir)
    if keeper is not None:  # the keeper writes the manifest as attempts end, and this attempt's detached.json
        record.manifest = read_manifest(record.run_dir / "manifest.json")
        record.detached = read_detached(record.run_dir) or record.detached
    if views is None:  # not asked: what this machine last saw
        cached = read_state_cache(record.run_dir / "state.json")
        state = cached.run_state() if cached else RunState("running", None, "not asked")
        return with_keeper(state, record.manifest, process_alive(keeper.pid)) if keeper is not None else state
    state = from_nodes(views, [h.label() for h in record.hosts])
    seen = any((v or {}).get("node") or (v or {}).get("run") or (v or {}).get("watchdog_alive") for v in views)
    if state.state == "lost" and record.detached.nodes[0].watchdog_pid is None and not seen:
        state = _unanswered_start(record)
    if keeper is not None:
        state = with_keeper(state, record.manifest, process_alive(keeper.pid))
    nodes = [{k: (v.get("node") or {}).get(k) for k in ("node_rank", "hostname", "watchdog_pid", "job_pid", "started",
                                                         "ended", "exit_code", "failure", "last_lines")}
             | {"reachable": True, "watchdog_alive": v.get("watchdog_alive")} if v else {"reachable": False}
             for v in views]
    write_state_cache(record.run_dir / "state.json",
                      StateCache(state.state, state.exit_code, state.reason, state.ended, time.time(),
                                 first_failure(views), tuple(nodes)))
    return state


def _unanswered_start(record: RunRecord) -> RunState:
    """A detached run whose node 0 has not answered its start, and shows nothing of it yet:
    still being started while the launching fstrain lives, else lost."""
    assert record.detached is not None
    node0 = record.detached.hosts[0].label()
    if process_alive(record.client_pid):
        return RunState("starting", None, f"fstrain (pid {record.client_pid}) is starting {node0}'s watchdog")
    return RunState("lost", None, f"the launch ended before {node0}'s watchdog answered")


def slurm_state(record: RunRecord, *, strict: bool = True) -> tuple[RunState, dict[str, Any]]:
    """A Slurm run's state and its job as last seen (id, Slurm state, nodes, run time), from
    ``scontrol show job`` and the run directory's manifest; cached in RUN_DIR/state.json. Not
    ``strict``: scontrol missing or failing gives the last state seen instead of an error."""
    from fstrain.core.hosts.hostfile import expand_hostlist
    from fstrain.core.slurm.state import slurm_run_state
    from fstrain.io.slurm import job_status

    assert record.slurm is not None
    fresh = read_slurm(record.slurm_path)  # another `fstrain stop` may have marked it
    if fresh is not None and fresh.job_id == record.slurm.job_id:
        record.slurm = fresh
    stop_requested = record.slurm.stop_requested is not None
    job_dir = record.job_dir
    cached = read_state_cache(job_dir / "state.json")
    job_seen: dict[str, Any] = dict((cached.job if cached else None) or {"job_id": record.slurm.job_id})
    if cached is not None and cached.state in FINAL and cached.settled and cached.stop_requested == stop_requested:
        return cached.run_state(), job_seen  # nothing changes after the end
    record.manifest = read_manifest(job_dir / "manifest.json")
    try:
        job = job_status(str(record.slurm.job_id), "RUN")
    except FstrainError:
        if strict:
            raise
        return (cached.run_state() if cached else RunState("running", None, "scontrol failed")), job_seen
    if job is not None:
        try:
            hosts = expand_hostlist(job.nodes, "NodeList") if job.nodes else []
        except InputError:
            hosts = [job.nodes]
        job_seen = {"job_id": job.job_id, "state": job.state, "reason": job.reason, "nodes": job.nodes,
                    "hosts": hosts, "exit_code": job.exit_code, "signal": job.signal, "run_time_s": job.run_time_s,
                    "time_limit": job.time_limit}
    else:
        last = job_seen.get("last_state") if job_seen.get("forgotten") else job_seen.get("state")
        job_seen = {**job_seen, "state": "UNKNOWN", "last_state": last, "forgotten": True}
    state = slurm_run_state(job, record.manifest, stop_requested=stop_requested,
                            time_limit_reached=(job_dir / TIME_LIMIT_MARKER).is_file(),
                            time_limit=str(job_seen.get("time_limit") or ""))
    # Settled: ended, and the manifest read (or never coming: Slurm forgot the job, or it never
    # started: cancelled while pending).
    settled = state.state in FINAL and (record.manifest is not None or job is None or not job_seen.get("nodes"))
    write_state_cache(job_dir / "state.json",
                      StateCache(state.state, state.exit_code, state.reason, state.ended, time.time(), job=job_seen,
                                 settled=settled, stop_requested=stop_requested))
    return state, job_seen


def mark_stop_requested(record: RunRecord, requested: bool = True) -> None:
    """RUN_DIR/slurm.json records that `fstrain stop` ends the run (Slurm calls it FAILED);
    ``requested=False`` takes that back (the signal could not be sent)."""
    assert record.slurm is not None
    record.slurm = replace(record.slurm, stop_requested=time.time() if requested else None)
    write_slurm(record.slurm_path, record.slurm)


def stop_on_node(connect: Callable[[Host], Transport], host: Host, python: str, run_dir: str,
                 how: str, grace_s: float | None = None) -> dict[str, Any]:
    """Ask the coordinator (through node 0 itself) to stop the run."""
    transport = connect(host)
    extra = [] if grace_s is None else [str(grace_s)]
    try:
        result = transport.run(line_script(python, "stop", run_dir, how, *extra),
                               stdin=as_line("runctl"), timeout_s=60)
    finally:
        transport.close()
    if not result.ok:
        return {"error": result.error or result.stderr.strip()[-300:]}
    try:
        answer: dict[str, Any] = json.loads(result.stdout)
    except ValueError:
        return {"error": result.stdout.strip()[-300:]}
    where = f"{host.label()}:{run_dir}"
    if "refused" in answer:  # the coordinator, or its record, is of another fstrain's format
        raise InputError(str(answer["refused"]), str(answer.get("hint") or ""), where)
    if "error" not in answer:
        check_format(answer, "message", where)
    return answer


@dataclass(frozen=True)
class FolderGone:
    """What `gc` found of a run's folder on one host: ``removed``, ``already gone`` (another
    node sharing the home removed it, or it never existed) or ``kept`` (``why``: the host could
    not be reached or refused, or the run's watchdog still runs there)."""

    host: str
    folder: str
    verdict: str
    why: str = ""

    @property
    def gone(self) -> bool:
        return self.verdict != "kept"


def gc_on_nodes(record: RunRecord, connect: Callable[[Host], Transport], python: str) -> list[FolderGone]:
    """Remove the run's folder on every remote host (never a node's whose watchdog runs)."""
    from fstrain.io.connect import is_local
    from fstrain.io.fanout import HostPool
    from fstrain.io.launch import REMOTE_RUNS

    if record.detached is not None:
        pairs = [(n.host, n.run_dir) for n in record.detached.nodes]
    else:  # an attached run: the watchdogs' folders under the hosts' homes
        pairs = [(h, f"~/{REMOTE_RUNS}/{record.run_id}") for h in record.hosts]
    pairs = [(h, d) for h, d in pairs if not is_local(h)]  # never the local run directory
    if not pairs:
        return []
    hosts = [h for h, _ in pairs]
    folders = dict(pairs)
    with HostPool(hosts, connect) as pool:
        results = pool.run_all(
            lambda h: line_script(python, "gc", folders[h]),
            stdin=as_line("runctl"), timeout_s=60)
    out = []
    for host, result in zip(hosts, results, strict=True):
        try:
            answer = json.loads(result.stdout) if result.ok else {"removed": False, "why": result.error or ""}
        except ValueError:
            answer = {"removed": False, "why": result.stdout[-200:]}
        if answer.get("removed"):
            out.append(FolderGone(host.label(), folders[host], "removed"))
        elif answer.get("why") == "not there":
            out.append(FolderGone(host.label(), folders[host], "already gone"))
        else:
            why = str(answer.get("why") or result.stderr.strip()[-200:] or f"exit {result.exit_code}")
            out.append(FolderGone(host.label(), folders[host], "kept", why))
    return out


def unregister(run_id: str) -> None:
    """Remove the run's index entry here (its local run directory stays)."""
    (index_dir() / f"{run_id}.json").unlink(missing_ok=True)
