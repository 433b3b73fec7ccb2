"""Stacks of a node's live ranks, for hang reports, and the first rank to exit non-zero: stdlib
only, run inside the watchdog.

The watchdog loads this module (sent in its header) when the launch asks for stack reports:

- ``install_hook`` puts a ``sitecustomize.py`` first on the job's ``PYTHONPATH``. Every Python
  process of a rank (one with ``RANK`` in its environment) then registers SIGUSR1 with
  ``faulthandler``: a C-level handler, so it answers even while the rank is blocked inside a
  collective, writing every thread's stack to ``STACKS_DIR/rank<R>.pid<P>.txt``. The hook then
  imports any ``sitecustomize`` that it shadows, so a site's own still runs.
- ``collect`` finds the ranks among the watchdog's descendants (by ``RANK`` in their
  ``/proc/<pid>/environ``), runs ``py-spy dump`` on each where py-spy is installed, and sends
  SIGUSR1 only to processes whose hook file exists: a Python process that never registered the
  handler would die of it. NCCL's flight recorder files (``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``,
  pointed into the run directory) are listed where present.
- With torch's flight recorder on (``TORCH_FR_BUFFER_SIZE``, or ``TORCH_NCCL_TRACE_BUFFER_SIZE``
  as ``fstrain render`` sets it; it records gloo's collectives as well as NCCL's), the hook also
  starts a thread that answers a request file with the recorder's JSON dump
  (``_dump_fr_trace_json``); ``collect`` asks for it and returns each rank's last entries and
  per-process-group status.
- ``FirstFailedRank`` watches the ranks' own processes for the first one that exits non-zero,
  read from ``/proc/<pid>/stat`` while it is a zombie (its launcher has not collected it yet):
  DeepSpeed's launcher exits with that rank's code but never says which rank it was.
- ``write_report`` writes the hang report into the same folder: a detached run's coordinator
  calls it on node 0, the attached launcher (fstrain/io/stall.py) on this machine.
Collecting never raises: what cannot be read is reported as missing.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import subprocess
import time
from typing import Any

HOOK = '''# Written by fstrain: lets the launcher ask this rank for its Python stacks (SIGUSR1).
import os as _os
import sys as _sys


def _fstrain_register():
    folder = _os.environ.get("FSTRAIN_STACKS_DIR")
    rank = _os.environ.get("RANK")
    if not folder or rank is None:
        return
    try:
        import faulthandler
        import signal

        handle = open(_os.path.join(folder, "rank%s.pid%d.txt" % (rank, _os.getpid())), "a")
        faulthandler.register(signal.SIGUSR1, file=handle, all_threads=True)
        _sys.__fstrain_stacks_file__ = handle
    except (OSError, ValueError, RuntimeError):
        pass


def _fstrain_chain():
    """Import the sitecustomize this one shadows, if any."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    rest = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    saved, _sys.path[:] = list(_sys.path), rest
    this = _sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401
    except ImportError:
        if this is not None:
            _sys.modules["sitecustomize"] = this
    finally:
        _sys.path[:] = saved


def _fstrain_flight_recorder():
    """With torch's flight recorder on (TORCH_FR_BUFFER_SIZE, or TORCH_NCCL_TRACE_BUFFER_SIZE as
    fstrain render sets it), a daemon thread answers the launcher's request file by writing the
    recorder's JSON dump: a thread, because a rank waiting in a collective has released the GIL
    but would not run a Python signal handler until the collective returns."""
    folder = _os.environ.get("FSTRAIN_STACKS_DIR")
    rank = _os.environ.get("RANK")
    if not folder or rank is None:
        return
    if not (_os.environ.get("TORCH_FR_BUFFER_SIZE") or _os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")):
        return
    import threading
    import time

    request = _os.path.join(folder, "flight-recorder.request")
    target = _os.path.join(folder, "rank%s.pid%d.flight-recorder.json" % (rank, _os.getpid()))

    def dump():
        dist = _sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return
        from torch._C._distributed_c10d import _dump_fr_trace_json

        dumped = _dump_fr_trace_json(includeCollectives=True, onlyActive=False)  # JSON, as bytes
        with open(target + ".tmp", "wb") as handle:
            handle.write(dumped if isinstance(dumped, bytes) else dumped.encode())
        _os.replace(target + ".tmp", target)

    def watch():
        seen = None
        while True:
            time.sleep(0.25)
            try:
                stamp = _os.stat(request).st_mtime_ns
            except OSError:
                continue
            if stamp != seen:
                seen = stamp
                try:
                    dump()
                except Exception:
                    pass

    threading.Thread(target=watch, name="fstrain-flight-recorder", daemon=True).start()


_fstrain_register()
try:
    _fstrain_flight_recorder()
except Exception:
    pass
_fstrain_chain()
'''

HOOK_DIR = "hooks"
STACKS_DIR = "stacks"
NCCL_TRACE_PREFIX = "nccl_trace_rank_"


def install_hook(run_dir: str, env: dict[str, str]) -> None:
    """Write the hook into ``run_dir/hooks`` and point the job's environment at it."""
    hooks = os.path.join(run_dir, HOOK_DIR)
    stacks = os.path.join(run_dir, STACKS_DIR)
    try:
        os.makedirs(hooks, mode=0o700, exist_ok=True)
        os.makedirs(stacks, mode=0o700, exist_ok=True)
        with open(os.path.join(hooks, "sitecustomize.py"), "w") as handle:
            handle.write(HOOK)
    except OSError:
        return
    env["PYTHONPATH"] = hooks + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["FSTRAIN_STACKS_DIR"] = stacks
    if env.get("TORCH_NCCL_TRACE_BUFFER_SIZE"):
        env.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", os.path.join(run_dir, NCCL_TRACE_PREFIX))
        env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")


FR_REQUEST = "flight-recorder.request"
FR_KEEP_ENTRIES = 200  # the last collectives of each rank's dump that travel back with the report


def _records_collectives(env: dict[str, str]) -> bool:
    """Whether a rank runs with torch's flight recorder on (so its hook thread will dump)."""
    return bool(env.get("TORCH_FR_BUFFER_SIZE") or env.get("TORCH_NCCL_TRACE_BUFFER_SIZE"))


def _read_flight_recorder(path: str) -> dict[str, Any] | None:
    """A rank's flight recorder dump, cut to its last entries: ``{"pg_status": {pg: {...}},
    "entries": [...], "path": path}``; None until the file is there and whole."""
    try:
        with open(path) as handle:
            document = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict):
        return None
    entries = document.get("entries")
    kept = entries[-FR_KEEP_ENTRIES:] if isinstance(entries, list) else []
    return {"pg_status": document.get("pg_status") or {}, "entries": kept, "path": path}


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (``[0]`` is the state, field 3);
    None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split() or None


def _parent(pid: int) -> int:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields and len(fields) > 1 else 0


def _rank_envs(pids: list[int]) -> dict[int, tuple[int, dict[str, str]]]:
    """Global rank -> (pid, environment) of the rank's own process (not its children, which
    inherit RANK)."""
    ranks: dict[int, tuple[int, dict[str, str]]] = {}
    envs = {pid: _environ(pid) for pid in pids}
    for pid, env in envs.items():
        rank = env.get("RANK")
        if rank is None or not rank.isdigit():
            continue
        parent = _parent(pid)
        if parent in envs and envs[parent].get("RANK") == rank:
            continue  # a data loader worker or other child of the rank
        ranks[int(rank)] = (pid, env)
    return ranks


def rank_processes(pids: list[int]) -> dict[int, int]:
    """Global rank -> pid of the rank's own process (not its children, which inherit RANK)."""
    return {rank: pid for rank, (pid, _) in _rank_envs(pids).items()}


def local_ranks(pids: list[int]) -> dict[int, int]:
    """Local rank -> global rank of every rank process alive (its LOCAL_RANK and RANK)."""
    found = {}
    for rank, (_, env) in _rank_envs(pids).items():
        local = env.get("LOCAL_RANK", "")
        if local.isdigit():
            found[int(local)] = rank
    return found


def _wait_status(fields: list[str]) -> int | None:
    """A zombie's wait status (``exit_code``, field 52), else None."""
    return int(fields[49]) if fields[0] == "Z" and len(fields) > 49 and fields[49].isdigit() else None


def zombie_wait_status(pid: int) -> int | None:
    """The wait status of ``pid`` if it has exited and is not yet collected by its parent
    (state Z; ``exit_code``, field 52 of ``/proc/<pid>/stat``), else None."""
    fields = _stat_fields(pid)
    return _wait_status(fields) if fields else None


class FirstFailedRank:
    """Poll with the watchdog's descendants; ``failure`` becomes ``{"rank", "local_rank",
    "exit_code"}`` (a signal as 128 + its number) for the first rank seen exiting non-zero.

    A rank is caught in the window between its exit and its launcher's wait (DeepSpeed's
    launcher looks once a second), so a poll every 0.1 s sees it; when several are seen at
    once, one that was not killed (SIGTERM/SIGKILL, the launcher's teardown) is the cause."""

    def __init__(self, nproc: int) -> None:
        self.nproc = nproc
        self.known: dict[int, tuple[int, int | None]] = {}  # pid -> (rank, local rank)
        self.failure: dict[str, Any] | None = None

    def poll(self, pids: list[int] | None) -> dict[str, Any] | None:
        """``pids``: live descendants, or None to check only the ranks already known."""
        if pids is not None:
            for rank, (pid, env) in _rank_envs(pids).items():
                local = env.get("LOCAL_RANK", "")
                self.known.setdefault(pid, (rank, int(local) if local.isdigit() else None))
        failed = []
        for pid, (rank, local_rank) in list(self.known.items()):
            fields = _stat_fields(pid)
            status = _wait_status(fields) if fields else None
            if status is None:
                if fields is None:  # gone (collected) before it was seen as a zombie
                    del self.known[pid]
                continue
            del self.known[pid]
            code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            if code != 0:
                failed.append({"rank": rank, "local_rank": local_rank, "exit_code": code})
        if failed and self.failure is None:
            killed = (128 + signal.SIGTERM, 128 + signal.SIGKILL)
            failed.sort(key=lambda f: (f["exit_code"] in killed, f["rank"]))
            self.failure = failed[0]
            return self.failure
        return None

    def needs_scan(self) -> bool:
        return len(self.known) < self.nproc


def _py_spy(pid: int) -> str | None:
    tool = shutil.which("py-spy")
    if tool is None:
        return None
    try:
        done = subprocess.run([tool, "dump", "--pid", str(pid)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.decode(errors="replace")


def collect(run_dir: str, pids: list[int], wait_s: float = 3.0) -> dict[str, Any]:
    """Every live rank's stacks: ``{"ranks": {rank: {"pid", "faulthandler", "py_spy"}},
    "nccl_traces": [paths], "flight_recorder": {rank: {"pg_status", "entries", "path"}}}``; a rank
    whose stack could not be read has empty texts, one whose flight recorder did not answer is
    left out."""
    stacks = os.path.join(run_dir, STACKS_DIR)
    envs = _rank_envs(pids)
    ranks = {rank: pid for rank, (pid, _) in envs.items()}
    found: dict[str, Any] = {}
    sizes: dict[int, int] = {}
    recording = {rank: pid for rank, (pid, env) in envs.items() if _records_collectives(env)}
    if recording:
        for rank, pid in recording.items():  # a dump from an earlier request is not this one's
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(stacks, f"rank{rank}.pid{pid}.flight-recorder.json"))
        with contextlib.suppress(OSError), open(os.path.join(stacks, FR_REQUEST), "a"):
            os.utime(os.path.join(stacks, FR_REQUEST))
    for rank, pid in sorted(ranks.items()):
        entry: dict[str, Any] = {"pid": pid, "faulthandler": "", "py_spy": _py_spy(pid) or ""}
        found[str(rank)] = entry
        path = os.path.join(stacks, f"rank{rank}.pid{pid}.txt")
        if os.path.exists(path):
            sizes[rank] = os.path.getsize(path)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + wait_s
    pending = dict(sizes)
    flight_recorder: dict[str, Any] = {}
    waiting_fr = dict(recording)
    while (pending or waiting_fr) and time.monotonic() < deadline:
        for rank, pid in list(waiting_fr.items()):
            dumped = _read_flight_recorder(os.path.join(stacks, f"rank{rank}.pid{pid}.flight-recorder.json"))
            if dumped is not None:
                flight_recorder[str(rank)] = dumped
                del waiting_fr[rank]
        time.sleep(0.1)
        for rank, size in list(pending.items()):
            path = os.path.join(stacks, f"rank{rank}.pid{ranks[rank]}.txt")
            with contextlib.suppress(OSError):
                if os.path.getsize(path) > size:
                    time.sleep(0.2)  # let faulthandler finish the dump
                    with open(path) as handle:
                        handle.seek(size)
                        found[str(rank)]["faulthandler"] = handle.read()
                    del pending[rank]
    traces = sorted(glob.glob(os.path.join(run_dir, NCCL_TRACE_PREFIX + "*")))
    return {"ranks": found, "nccl_traces": traces, "flight_recorder": flight_recorder}


def write_report(run_dir: str, document: dict[str, Any], files: dict[str, str]) -> dict[str, Any]:
    """The hang report in ``RUN_DIR/stacks/``: every file of ``files`` (a rank's stacks, its flight
    recorder), then ``report.json``, the document with that folder named in it, written beside
    and renamed over (a reader never sees half of it); the document and files are
    fstrain/core/monitor/stacks.py's ``hang_report``. Raises OSError: whether a report that cannot
    be written ends anything is for the caller to say."""
    folder = os.path.join(run_dir, STACKS_DIR)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    for name, text in files.items():
        with open(os.path.join(folder, name), "w") as handle:
            handle.write(text)
    document["folder"] = folder
    partial = os.path.join(folder, f"report.json.{os.getpid()}.partial")
    with open(partial, "w") as handle:
        handle.write(json.dumps(document, indent=2) + "\n")
    os.replace(partial, os.path.join(folder, "report.json"))
    return document
