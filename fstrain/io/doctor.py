"""`fstrain doctor`'s collection: probe every host in parallel and test the network between them.

Per host, in parallel (at most ``fanout`` at once), on one SSH connection each:

1. connect (timed) and read the clock twice (``date +%s.%N``; the second reading, taken on an open
   connection, gives the offset and its uncertainty);
2. the node probe (:func:`fstrain.io.probe.probe_host`) with ``--python``; when that interpreter
   cannot run, again with ``python3`` so the other checks still get their facts;
3. the doctor helper (:mod:`fstrain.io.remote.doctor_host`): working directory, NCCL config
   files, ``NCCL_TOPO_FILE``, ``nvidia-smi -q``; the checkpoint directory; the run records.

Then across hosts: a listener (``netcheck listen``) on every host of the matrix (all of them up to
16 hosts, a spread sample above), the master's on the rendezvous port, and from every host a
``netcheck connect`` to every address of every listener; then the shared-directory marker test.
What this module returns are plain facts; :mod:`fstrain.core.doctor` judges them.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from fstrain.core.doctor.facts import (
    Connection,
    DiskFacts,
    DoctorFacts,
    FileFacts,
    HostFacts,
    Interface,
    PlanNeeds,
    Rendezvous,
    RunRecord,
    SharedDir,
    interfaces_from_report,
)
from fstrain.core.doctor.network import is_loopback, sample_targets
from fstrain.core.hosts.hostfile import Host
from fstrain.core.job.spec import SCRIPT_FLAGS, master_port_candidates
from fstrain.errors import FstrainError
from fstrain.io.connect import is_local
from fstrain.io.fanout import Connector, HostPool
from fstrain.io.launch import REMOTE_STATE
from fstrain.io.listener import Listening, start_listener
from fstrain.io.probe import probe_host
from fstrain.io.remote import source

CONNECT_TIMEOUT_S = 2.0  # per TCP connection of the matrix
Progress = Callable[[str, str], None]  # (host, what it is doing now)
T = TypeVar("T")


@dataclass(frozen=True)
class DoctorOptions:
    stages: frozenset[str]
    python: str = "python3"
    workdir: str | None = None
    checkpoint_dir: str | None = None
    master_port: int | None = None
    plan: PlanNeeds | None = None
    kill_orphans: bool = False
    grace_s: float = 5.0
    write_test_bytes: int = 256 << 20
    probe_timeout_s: float = 180.0
    reached_through: str | None = None  # not SSH: "srun in Slurm job 14" (the connector's path, for the report)


def _parallel(items: Sequence[T], work: Callable[[T], Any], fanout: int) -> list[Any]:
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(fanout, len(items)), thread_name_prefix="fstrain-doctor") as pool:
        return list(pool.map(work, items))


def timed_connector(connect: Connector, seconds: dict[str, float]) -> Connector:
    """``connect`` that opens the connection at once and records how long that took."""

    def open_timed(host: Host) -> Any:
        start = time.monotonic()
        transport = connect(host)
        opener = getattr(transport, "connect", None)
        if callable(opener):
            opener()  # HostPool calls it again: a no-op on an open connection
        seconds[host.label()] = time.monotonic() - start
        return transport

    return open_timed


def load_plan(path: str) -> PlanNeeds:
    """``--plan plan.yaml`` -> what it needs; every failure is one InputError naming the file."""
    from fstrain.core.doctor.plan import plan_needs
    from fstrain.io.render_files import read_plan_file

    return plan_needs(read_plan_file(Path(path)), path)


# --- per host ----------------------------------------------------------------------------------


def _remote_json(pool: HostPool, host: Host, python: str, args: Sequence[str],
                 timeout_s: float) -> tuple[dict[str, Any] | None, str | None]:
    """Run the doctor helper; its JSON, or why there is none."""
    result = pool.run_one(host, [python, "-", *args], stdin=source("doctor_host").encode(), timeout_s=timeout_s)
    if result.error:
        return None, result.error
    if result.exit_code != 0:
        return None, f"exit {result.exit_code}: {result.stderr.strip()[-300:]}"
    try:
        return json.loads(result.stdout.strip().splitlines()[-1]), None
    except (json.JSONDecodeError, IndexError):
        return None, f"unreadable output: {result.stdout[-200:]!r}"


def _clock(pool: HostPool, host: Host) -> tuple[float | None, float | None]:
    before = time.time()
    result = pool.run_one(host, ["date", "+%s.%N"], timeout_s=30)
    after = time.time()
    try:
        remote = float(result.stdout.strip())
    except ValueError:
        return None, None
    return remote - (before + after) / 2, (after - before) / 2


def _probe(pool: HostPool, host: Host, options: DoctorOptions) -> dict[str, Any]:
    """The probe with --python, else with python3: report, errors and which interpreter ran."""
    out: dict[str, Any] = {"python_error": None, "probe_error": None, "report": None, "probe_python": None}
    for python in dict.fromkeys([options.python, "python3"]):
        try:
            out["report"] = dict(probe_host(pool.transport(host), python=python, timeout_s=options.probe_timeout_s))
            out["probe_python"] = python
            return out
        except FstrainError as exc:
            if python == options.python and "not found or not executable" in exc.message:
                out["python_error"] = "not found or not executable"
                continue
            out["probe_error"] = exc.message
            if python == options.python:
                out["python_error"] = exc.message
            return out
    return out


def _interfaces_quick(pool: HostPool, host: Host, python: str) -> tuple[tuple[Interface, ...] | None, str | None]:
    result = pool.run_one(host, [python, "-", "info", ""], stdin=source("netcheck").encode(), timeout_s=60)
    if not result.ok:
        return None, result.error or f"exit {result.exit_code}: {result.stderr.strip()[-200:]}"
    try:
        found = json.loads(result.stdout)["interfaces"]
        return tuple(Interface(i["name"], (i["address"],), i.get("state"), i.get("mtu")) for i in found), None
    except (ValueError, KeyError, TypeError):
        return None, f"unreadable network facts: {result.stdout[-200:]!r}"


def _extras(pool: HostPool, host: Host, python: str, report: dict[str, Any] | None,
            options: DoctorOptions) -> dict[str, Any]:
    env = (report or {}).get("env") or {}
    has_q = ((report or {}).get("nvidia_smi") or {}).get("q") is not None
    params = {"workdir": options.workdir, "files": [env["NCCL_TOPO_FILE"]] if env.get("NCCL_TOPO_FILE") else [],
              "nvidia_smi_q": bool((report or {}).get("gpus")) and not has_q}
    data, error = _remote_json(pool, host, python, ["facts", json.dumps(params)], timeout_s=120)
    if data is None:
        return {"extras_error": error}
    out: dict[str, Any] = {
        "workdir_exists": data.get("workdir_exists") if options.workdir else None,
        "nccl_conf": tuple((str(p), str(t)) for p, t in data.get("nccl_conf") or []),
        "files": {p: FileFacts(p, bool(f.get("readable")), f.get("text"), f.get("error"))
                  for p, f in (data.get("files") or {}).items()},
        "nvidia_smi_q": data.get("nvidia_smi_q"),
        "cap_ipc_lock": data.get("cap_ipc_lock"),
    }
    conf_topo = next((line.partition("=")[2] for _, text in out["nccl_conf"] for line in text.splitlines()
                      if line.startswith("NCCL_TOPO_FILE=")), None)
    if conf_topo and not env.get("NCCL_TOPO_FILE") and conf_topo not in out["files"]:
        more, _ = _remote_json(pool, host, python, ["facts", json.dumps({"files": [conf_topo]})], timeout_s=60)
        for p, f in ((more or {}).get("files") or {}).items():
            out["files"][p] = FileFacts(p, bool(f.get("readable")), f.get("text"), f.get("error"))
    return out


def _disk(pool: HostPool, host: Host, python: str, options: DoctorOptions) -> DiskFacts | None:
    assert options.checkpoint_dir is not None
    data, error = _remote_json(pool, host, python, ["disk", options.checkpoint_dir, str(options.write_test_bytes)],
                               timeout_s=600)
    if data is None:
        return DiskFacts(options.checkpoint_dir, False, options.checkpoint_dir, False, error=error)
    return DiskFacts(options.checkpoint_dir, bool(data.get("exists")), str(data.get("measured_at")),
                     bool(data.get("writable")), data.get("free_bytes"), data.get("total_bytes"),
                     int(data.get("write_bytes") or 0), data.get("write_s"), data.get("error"))


def _runs(pool: HostPool, host: Host, python: str, options: DoctorOptions) -> tuple[RunRecord, ...] | None:
    data, _ = _remote_json(pool, host, python, ["orphans", REMOTE_STATE, "1" if options.kill_orphans else "0",
                                                str(options.grace_s)], timeout_s=options.grace_s + 60)
    if data is None:
        return None
    return tuple(RunRecord(
        run_id=str(r.get("run_id")), node_rank=r.get("node_rank"), record=str(r.get("record")),
        state=str(r.get("state")), watchdog_pid=r.get("watchdog_pid"), job_pid=r.get("job_pid"),
        pids=tuple(r.get("pids") or ()), started=r.get("started"), argv=tuple(map(str, r.get("argv") or ())),
        killed=tuple(r.get("killed") or ()), survivors=tuple(r.get("survivors") or ()),
        removed=bool(r.get("removed")), note=str(r.get("note") or "")) for r in data.get("runs") or [])


def collect_host(pool: HostPool, host: Host, options: DoctorOptions, connect_s: dict[str, float],
                 progress: Progress) -> HostFacts:
    name = host.label()
    progress(name, "connecting")
    first = pool.run_one(host, ["true"], timeout_s=30)
    if first.error is not None:
        progress(name, "unreachable")
        return HostFacts(name, host.num_selected_slots, reach_error=first.error, python=options.python)
    offset, uncertainty = _clock(pool, host)
    values: dict[str, Any] = {"python_error": None, "probe_error": None, "report": None, "probe_python": None}
    interfaces: tuple[Interface, ...] | None = None
    if "probe" in options.stages:
        progress(name, "probing")
        values = _probe(pool, host, options)
        if values["report"] is not None:
            interfaces = interfaces_from_report(values["report"])
    elif "interfaces" in options.stages:
        interfaces, values["python_error"] = _interfaces_quick(pool, host, options.python)
    python = values["probe_python"] or options.python
    runnable = values["probe_python"] is not None or not values["python_error"]
    extras: dict[str, Any] = {}
    if "extras" in options.stages and runnable:
        progress(name, "reading settings")
        extras = _extras(pool, host, python, values["report"], options)
        error = extras.pop("extras_error", None)
        if error and error.startswith(("exit 126", "exit 127")) and values["probe_python"] is None:
            values["python_error"] = "not found or not executable"  # found here when no probe ran
    disk = None
    if "checkpoint" in options.stages and options.checkpoint_dir and runnable:
        progress(name, f"timing writes to {options.checkpoint_dir}")
        disk = _disk(pool, host, python, options)
    runs = None
    if "orphans" in options.stages and runnable:
        progress(name, "ending orphans" if options.kill_orphans else "reading run records")
        runs = _runs(pool, host, python, options)
    progress(name, "done")
    return HostFacts(name, host.num_selected_slots, connect_s=connect_s.get(name), clock_offset_s=offset,
                     clock_uncertainty_s=uncertainty, python=options.python, interfaces=interfaces,
                     disk=disk, runs=runs, **values, **extras)


# --- across hosts: listeners, the matrix, the rendezvous port -----------------------------------


@dataclass
class _Listener:
    host: str
    listening: Listening | None = None
    close_transport: Callable[[], None] | None = None
    error: str | None = None

    @property
    def port(self) -> int | None:
        return self.listening.port if self.listening is not None else None

    @property
    def busy(self) -> tuple[int, ...]:
        return self.listening.busy if self.listening is not None else ()


def _start_listener(connect: Connector, host: Host, python: str, ports: Sequence[int]) -> _Listener:
    """A listener on its own connection (the pool's stays free for commands)."""
    listener = _Listener(host.label())
    try:
        transport = connect(host)
        listener.close_transport = transport.close
        listener.listening = start_listener(transport, python, ports)
    except (FstrainError, ValueError, OSError) as exc:
        listener.error = exc.message if isinstance(exc, FstrainError) else str(exc)
    return listener


def _stop_listener(listener: _Listener) -> None:
    try:
        if listener.listening is not None:
            listener.listening.close()
    finally:
        if listener.close_transport is not None:
            listener.close_transport()


@dataclass(frozen=True)
class _Target:
    host: str
    interface: str
    address: str
    port: int


def _targets_of(facts: HostFacts, port: int, all_local: bool) -> list[_Target]:
    if all_local:
        return [_Target(facts.name, "lo", "127.0.0.1", port)]
    return [_Target(facts.name, i.name, a, port) for i in facts.interfaces or () if i.usable
            for a in i.addresses if not is_loopback(a)]


def _connect_all(pool: HostPool, hosts: Sequence[Host], facts: dict[str, HostFacts],
                 targets: dict[str, list[_Target]], fanout: int) -> list[Connection]:
    def one(host: Host) -> list[Connection]:
        name = facts[host.label()]
        wanted = targets.get(name.name, [])
        if not wanted:
            return []
        python = name.probe_python or name.python
        addresses = dict.fromkeys(f"{t.address}:{t.port}" for t in wanted)
        argv = [python, *SCRIPT_FLAGS, "-", "connect", str(CONNECT_TIMEOUT_S), *addresses]
        result = pool.run_one(host, argv, stdin=source("netcheck").encode(),
                              timeout_s=CONNECT_TIMEOUT_S * len(wanted) + 30)
        try:
            answers = {a["target"]: a for a in json.loads(result.stdout)} if result.ok else {}
        except json.JSONDecodeError:
            answers = {}
        own = {a for i in name.interfaces or () for a in i.addresses}
        out = []
        for t in wanted:
            answer = answers.get(f"{t.address}:{t.port}")
            error = None if answer else (result.error or f"the connection test failed: {result.stderr.strip()[-200:]}")
            out.append(Connection(name.name, t.host, t.interface, t.address, t.port, bool(answer and answer["ok"]),
                                  (answer or {}).get("error") or error, (answer or {}).get("interface"),
                                  t.address in own and not t.address.startswith("127.")))
        return out

    return [c for conns in _parallel(list(hosts), one, fanout) for c in conns]


def collect_network(pool: HostPool, connect: Connector, hosts: Sequence[Host], facts: dict[str, HostFacts],
                    options: DoctorOptions, fanout: int,
                    progress: Progress) -> tuple[tuple[Connection, ...] | None, tuple[str, ...], Rendezvous | None]:
    """Listeners on the matrix targets (the master's on the rendezvous port) and every host's
    connections to them."""
    want_matrix, want_rdv = "matrix" in options.stages, "rendezvous" in options.stages
    able = [h for h in hosts if facts[h.label()].interfaces is not None]
    master = hosts[0]
    all_local = all(is_local(h) for h in hosts)
    names = [h.label() for h in able]
    matrix_targets = sample_targets(names) if want_matrix and len(able) > 1 else []
    listen_on = [h for h in able if h.label() in matrix_targets or (want_rdv and h is master)]
    token = os.urandom(4).hex()
    requested = options.master_port

    def ports_for(host: Host) -> list[int]:
        if host is master and want_rdv:
            candidates = master_port_candidates(f"doctor-{token}")
            return [requested, *candidates] if requested else candidates
        return master_port_candidates(f"doctor-{token}-{host.label()}")

    def start(host: Host) -> _Listener:
        progress(host.label(), "listening")
        python = facts[host.label()].probe_python or options.python
        return _start_listener(connect, host, python, ports_for(host))

    listeners = {lst.host: lst for lst in _parallel(listen_on, start, fanout)}
    try:
        targets: dict[str, list[_Target]] = {}
        for host in able:
            wanted: list[_Target] = []
            for target in listen_on:
                listener = listeners[target.label()]
                if listener.port is None:
                    continue
                to_master = target is master and want_rdv
                if (target.label() != host.label() and target.label() in matrix_targets) or to_master:
                    wanted += _targets_of(facts[target.label()], listener.port, all_local)
            targets[host.label()] = wanted
        for host in able:
            progress(host.label(), "connecting to the other hosts")
        conns = _connect_all(pool, able, facts, targets, fanout)
    finally:
        for listener in listeners.values():
            _stop_listener(listener)
    matrix = tuple(c for c in conns if c.source != c.target and c.target in matrix_targets) if matrix_targets \
        else (() if want_matrix and len(able) <= 1 else None)
    rendezvous = None
    if want_rdv:
        lst = listeners.get(master.label())
        if lst is None:
            reason = facts[master.label()].reach_error or facts[master.label()].python_error or "no interfaces"
            rendezvous = Rendezvous(master.label(), requested, None, error=f"the master could not be used: {reason}")
        else:
            port = lst.port
            rendezvous = Rendezvous(master.label(), requested, port, lst.busy, lst.error,
                                    tuple(c for c in conns if c.target == master.label() and c.port == port))
    return matrix, tuple(matrix_targets), rendezvous


def collect_shared(pool: HostPool, hosts: Sequence[Host], facts: dict[str, HostFacts],
                   fanout: int) -> SharedDir | None:
    """A marker written on the first host, looked for on the others, removed. It goes into the
    checkpoint directory, or its nearest existing parent: the doctor creates no directory."""
    able = [h for h in hosts if (disk := facts[h.label()].disk) is not None and disk.error is None and disk.writable]
    if not able:
        return None
    writer, others = able[0], able[1:]
    directory = facts[writer.label()].disk.measured_at  # type: ignore[union-attr]  # filtered above
    if not others:
        return SharedDir(writer.label(), (), (), {}, directory)  # nobody to share with: write nothing
    name = f".fstrain-doctor-marker-{os.urandom(6).hex()}"

    def python(host: Host) -> str:
        return facts[host.label()].probe_python or facts[host.label()].python

    wrote, error = _remote_json(pool, writer, python(writer), ["marker", "write", directory, name], timeout_s=60)
    if wrote is None or not wrote.get("ok"):
        return SharedDir(writer.label(), (), (), {writer.label(): error or str((wrote or {}).get("error"))}, directory)
    try:
        answers = _parallel(others, lambda h: (h.label(), *_remote_json(
            pool, h, python(h), ["marker", "check", directory, name], timeout_s=60)), fanout)
    finally:
        _remote_json(pool, writer, python(writer), ["marker", "remove", directory, name], timeout_s=60)
    seen = tuple(h for h, data, _ in answers if data and data.get("seen"))
    unseen = tuple(h for h, data, _ in answers if data and data.get("ok") and not data.get("seen"))
    errors = {h: err or str((data or {}).get("error")) for h, data, err in answers if not data or not data.get("ok")}
    return SharedDir(writer.label(), seen, unseen, errors, directory)


def collect(hosts: Sequence[Host], connect: Connector, options: DoctorOptions, *, fanout: int = 64,
            progress: Progress | None = None) -> DoctorFacts:
    """Everything the selected checks need, from every host; unreachable hosts are facts too."""
    report = progress or (lambda host, what: None)
    connect_s: dict[str, float] = {}
    lock = threading.Lock()

    def note(host: str, what: str) -> None:
        with lock:
            report(host, what)

    with HostPool(hosts, timed_connector(connect, connect_s), fanout=fanout) as pool:
        per_host = _parallel(list(hosts), lambda h: collect_host(pool, h, options, connect_s, note), fanout)
        by_name = {f.name: f for f in per_host}
        matrix: tuple[Connection, ...] | None = None
        targets: tuple[str, ...] = ()
        rendezvous: Rendezvous | None = None
        if {"matrix", "rendezvous"} & options.stages and hosts:
            matrix, targets, rendezvous = collect_network(pool, connect, hosts, by_name, options, fanout, note)
        shared = None
        if "shared" in options.stages and options.checkpoint_dir:
            shared = collect_shared(pool, hosts, by_name, fanout)
    for host in hosts:
        note(host.label(), "done")
    return DoctorFacts(hosts=tuple(per_host), python=options.python, workdir=options.workdir,
                       checkpoint_dir=options.checkpoint_dir, plan=options.plan, matrix=matrix,
                       matrix_targets=targets, rendezvous=rendezvous, shared=shared,
                       reached_through=options.reached_through)
