"""The remote watchdog: runs one node's job in its own session and never leaves a process behind.

Sent as source over SSH (stdlib only, Python >= 3.8) and started by ``BOOTSTRAP``, which reads
one JSON header line from stdin: ``argv`` (``{run_dir}`` in an argument becomes the run
directory, ``{{run_dir}}`` the text ``{run_dir}``), ``env``, ``workdir``, ``files`` (written
into ``run_dir`` with mode 0600), ``grace_s``, ``heartbeat_timeout_s``, ``run_id``,
``node_rank``, ``state_dir``, ``rank_log_dir`` (where the launcher writes each rank's output to
files, relayed as whole tagged lines by ``RankLogTailer``), ``cleanup`` (folders under ``run_dir``
removed when the job is over: those per-rank files, which may hold secrets the program
printed). Values travel on stdin, never on the command line.

With ``prewarm`` (the launcher's command up to its module: ``[python, "-m",
"torch.distributed.run"]``), this first header comes before fstrain has checked the hosts and
the rendezvous, and holds only ``workdir``, the user's ``env`` and the run's ids: the watchdog
starts the job's Python at once in the working directory, importing that module (torch:
seconds), and waits for the full header as one more line. Its command's arguments after the
prefix and its whole environment then go to the waiting interpreter, which runs the module as
``python -m`` would; a command with another prefix is started afresh instead. End of file,
``term`` or ``kill`` before the full header ends the waiting interpreter.

After the header (under ``prewarm``, the full header), stdin is the control line from the
launcher:

- ``hb``: the launcher is alive; with ``answer_heartbeats`` in the header, the watchdog answers
  each with an event line (``{"hb": true}``): where the transport has no link check of its own
  (an srun step), the launcher takes a node whose answers stop for ``heartbeat_timeout_s`` as lost;
- ``term``: SIGTERM the job, SIGKILL whatever is left after ``grace_s`` (as a Slurm task that
  Slurm itself sent SIGTERM, the job has it already: no second one, see ``main``);
- ``kill``: SIGKILL the job now;
- end of file (the SSH channel closed: launcher killed, network cut) or no ``hb`` for
  ``heartbeat_timeout_s``: as ``term``.

The watchdog makes itself a child subreaper, so processes that the job's own children
orphan (torchrun starts its workers in new sessions) are re-parented to it and still found:
teardown walks /proc for every descendant and signals them by pid. Nothing is killed by name.
The job's launcher is started with a parent-death signal (SIGTERM), and a reaper outlives the
watchdog: a second small process (forked from the watchdog as it starts, in a session of its
own, deaf to SIGTERM, SIGHUP and SIGINT) that notes the job's processes every
``REAPER_POLL_S`` and holds the read end of a pipe only the watchdog writes to. When that pipe ends
without the watchdog's ``done`` (SIGKILL, the OOM killer), the reaper SIGTERMs every process of the
job it knew (each checked by its start time, so a reused pid is never hit) and whatever they
started, and SIGKILLs what is left after ``grace_s``: a watchdog that can clean nothing up still
leaves nothing behind.
The watchdog exits with the job's exit code (128+signal for a signal death).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from typing import Any

# What an interpreter reads once, as it starts: a prewarmed one whose final environment differs
# in any of these is not used (the command starts afresh).
STARTUP_VARS = ("PYTHONUNBUFFERED", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "PYTHONOPTIMIZE",
                "PYTHONWARNINGS", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED",
                "PYTHONMALLOC", "PYTHONFAULTHANDLER", "LD_PRELOAD", "LD_LIBRARY_PATH")
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
POLL_S = 0.1
# The longest the supervisor sleeps between looks at the heartbeat clock: the job's exit and a
# stop request wake it at once (Wakeup), so an idle node's watchdog wakes once a second, not ten times.
SUPERVISE_MAX_SLEEP_S = 1.0
EVENT_PREFIX = "fstrain-watchdog-event: "  # a JSON report for the launcher, not job output
# The format versions this file reads and writes (fstrain/core/formats.py KINDS, read there by
# name: this file runs alone on the node). A header of a newer format is refused: one line on
# stderr, exit EXIT_FORMAT, nothing started.
HEADER_FORMAT = 1
NODE_FORMAT = 1  # the record in state_dir (~/.fstrain/active)
EXIT_FORMAT = 125

BOOTSTRAP = (
    "import sys,json;h=json.loads(sys.stdin.readline());s=h.pop('source');"
    "exec(compile(s,'fstrain-watchdog','exec'),{'__name__':'__fstrain_watchdog__','HEADER':h,'SOURCE':s})"
)
REAPER_POLL_S = 0.5  # how old the reaper's list of the job's processes may be

# The job's interpreter under ``prewarm``: import the launcher's module while fstrain checks the
# rendezvous, then run it as ``python -m MODULE ARGS`` once its order (arguments, environment)
# arrives: runpy, with sys.argv[0] the module's file and sys.path[0] the working directory, as
# -m sets them. An import error is left to that run, which reports it as the plain command would.
PREWARM = "\n".join([
    "import importlib, json, os, runpy, sys",
    "if sys.path and sys.path[0] == '':",
    "    sys.path[0] = os.getcwd()",
    "module = sys.argv[1]",
    "try:",
    "    importlib.import_module(module)",
    "except BaseException:",
    "    pass",
    "sys.modules.pop(module, None)",  # run afresh as __main__ (its imports stay loaded)
    "line = sys.stdin.readline()",
    "if not line:",
    "    os._exit(0)",
    "order = json.loads(line)",
    "null = os.open(os.devnull, os.O_RDONLY)",
    "os.dup2(null, 0)",
    "os.close(null)",
    "os.environ.clear()",
    "os.environ.update(order['env'])",
    "sys.argv = [module, *order['args']]",
    "runpy.run_module(module, run_name='__main__', alter_sys=True)",
])


# The watchdog is the only writer of its stdout and stderr (the launcher's output comes through
# pipes it reads, the ranks' through their files), and one lock orders its threads' writes: a
# line goes out whole, however long, with no other line's bytes inside it (a pipe keeps a write
# whole only up to PIPE_BUF, 4 KiB, and only against other writers' writes).
OUTPUT_LOCK = threading.RLock()


def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd`` (os.write may write part of it); the caller holds OUTPUT_LOCK."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def log(message: str) -> None:
    with OUTPUT_LOCK:
        write_all(2, f"fstrain-watchdog: {message}\n".encode())


def relay_pipe(source: Any, fd: int, observe: Any = None) -> None:
    """The launcher's own output (a pipe) to the watchdog's ``fd``, line by line, each line whole;
    read to its end even when ``fd`` is gone, so the launcher never blocks on a full pipe.
    ``observe(None, line)`` sees each line (ranks that share the launcher's pipe print there)."""
    with source:
        for line in source:
            with contextlib.suppress(OSError), OUTPUT_LOCK:
                write_all(fd, line if line.endswith(b"\n") else line + b"\n")
            if observe is not None:
                observe(None, line)


def become_subreaper() -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def dies_with_parent() -> Any:
    """A ``preexec_fn`` that has the job's launcher SIGTERMed when the watchdog dies, even by
    SIGKILL (``PR_SET_PDEATHSIG``), so a job never outlives its supervisor; None where prctl
    cannot be had. Resolved before the fork: the child only makes two system calls."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the watchdog died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def slurm_task() -> bool:
    """Whether srun started this process as the task of a job step (its parent is slurmstepd)."""
    if not os.environ.get("SLURM_STEP_ID"):
        return False
    try:
        with open(f"/proc/{os.getppid()}/comm") as handle:
            return handle.read().strip() == "slurmstepd"
    except OSError:
        return False


def stat_fields(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (the state first, field 3); None once
    the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def descendants(*roots: int) -> list[int]:
    """Every live descendant of ``roots`` (children before grandchildren), from each process's
    ``/proc/PID/task/TID/children``: the cost grows with the job, not with the host's process
    count (for a job of 3 processes on a host running 224: 0.06 ms of CPU, against 3.5 ms for a
    scan of all of /proc; the reaper and the rank watch ask three times a second). Kernels
    without those files get the scan."""
    found: list[int] = []
    frontier = list(roots)
    while frontier:
        pid = frontier.pop(0)
        children = children_of(pid)
        if children is None:
            return descendants_by_scan(*roots)
        for child in children:
            fields = stat_fields(child)
            if fields and fields[0] != "Z":
                found.append(child)
                frontier.append(child)
    return found


def children_of(pid: int) -> list[int] | None:
    """``pid``'s children, from the children file of each of its threads ([] once it is gone);
    None where the kernel has no such files (CONFIG_PROC_CHILDREN)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return [] if os.path.exists(f"/proc/self/task/{os.getpid()}/children") else None
    children: list[int] = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                children.extend(int(word) for word in handle.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{task}"):
                continue  # the thread ended
            return None
        except OSError:
            continue
    return children


def descendants_by_scan(*roots: int) -> list[int]:
    """:func:`descendants` from a scan of every process in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(entry)
        if fields and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    frontier = list(roots)
    while frontier:
        pid = frontier.pop(0)
        for child in children.get(pid, []):
            found.append(child)
            frontier.append(child)
    return found


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def start_time(pid: int) -> str | None:
    """When ``pid`` started (``starttime``, field 22 of /proc/PID/stat, clock ticks since boot),
    None once it is gone or a zombie: the same pid with another start time is another process."""
    fields = stat_fields(pid)
    return fields[19] if fields and len(fields) > 19 and fields[0] != "Z" else None


class Reaper:
    """The watchdog's end of its reaper: the child's pid and the pipe only the watchdog writes to."""

    def __init__(self, pid: int, pipe_fd: int) -> None:
        self.pid = pid
        self.pipe_fd = pipe_fd

    def done(self) -> None:
        """The watchdog ends on its own: the reaper exits without touching anything."""
        with contextlib.suppress(OSError):
            write_all(self.pipe_fd, b"done\n")
        with contextlib.suppress(OSError):
            os.close(self.pipe_fd)

    def wait(self, timeout_s: float) -> bool:
        """Whether the reaper has exited (collected here, or already by :func:`reap`)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                pid, _ = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


def start_reaper(grace_s: float) -> Reaper | None:
    """The reaper of this watchdog's job (see the module's text), forked from this process: no
    second interpreter to start and no source to compile again (at 200 nodes on one machine
    that start was seconds of CPU). None where it cannot start (the job's parent-death signal
    is then the only guard), or where this is no watchdog started by BOOTSTRAP."""
    if not globals().get("SOURCE"):
        return None
    watchdog = os.getpid()
    try:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
    except OSError as exc:
        log(f"could not start the reaper ({exc}); a SIGKILLed watchdog leaves its job to the parent-death signal")
        return None
    if pid == 0:  # the reaper: only this thread lives on, and it takes no lock the others held
        try:
            os.setsid()
            os.dup2(read_fd, 0)
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 1)
            os.dup2(null, 2)
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the job's pipes and the SSH channel's are not its to hold
            reaper_main({"watchdog_pid": watchdog, "grace_s": grace_s})
        finally:
            os._exit(0)
    os.close(read_fd)
    return Reaper(pid, write_fd)


def stop_reaper(reaper: Reaper | None) -> None:
    """The watchdog ends on its own: its reaper has nothing to do."""
    if reaper is None:
        return
    reaper.done()
    if not reaper.wait(2.0):
        with contextlib.suppress(OSError):
            os.kill(reaper.pid, signal.SIGKILL)
        reaper.wait(5.0)


def reaper_main(options: dict[str, Any]) -> None:
    """The reaper: note the watchdog's processes until its pipe ends; then, unless it said
    ``done``, end every one of them and what they started (SIGTERM, SIGKILL after the grace)."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)  # a signal for the watchdog's session is not for us
    watchdog, grace_s, me = int(options["watchdog_pid"]), float(options["grace_s"]), os.getpid()
    known: dict[int, str] = {}
    said = b""
    while True:
        ready, _, _ = select.select([0], [], [], REAPER_POLL_S)
        if ready:
            data = os.read(0, 4096)
            said += data
            if b"done" in said:
                os._exit(0)
            if not data:
                break
        known = noted(known, descendants(watchdog), me)
    end_orphans(known, grace_s, me)
    os._exit(0)


def noted(known: dict[int, str], pids: list[int], me: int) -> dict[int, str]:
    """``known`` (pid -> start time) less the processes gone, plus ``pids`` (not ``me``)."""
    found = {pid: started for pid, started in known.items() if start_time(pid) == started}
    for pid in pids:
        if pid == me or pid in found:
            continue
        started = start_time(pid)
        if started is not None:
            found[pid] = started
    return found


def end_orphans(known: dict[int, str], grace_s: float, me: int) -> None:
    """SIGTERM ``known`` and their descendants, wait up to ``grace_s`` for them, SIGKILL the rest."""
    alive = noted(known, descendants(*known), me)
    signal_all(list(alive), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        time.sleep(POLL_S)
        alive = noted(alive, descendants(*alive), me)
    for _ in range(20):
        alive = noted(alive, descendants(*alive), me)
        if not alive:
            return
        signal_all(list(alive), signal.SIGKILL)
        time.sleep(0.05)


def expand(text: str, run_dir: str) -> str:
    """``{run_dir}`` -> the run directory; ``{{run_dir}}`` -> the text ``{run_dir}``."""
    parts = text.split("{{run_dir}}")
    return "{run_dir}".join(part.replace("{run_dir}", run_dir) for part in parts)


class Wakeup:
    """A sleep that ends early when :meth:`set` is called: a pipe, so that a signal handler may
    call it (no lock taken) and a thread blocked on the job's exit may too."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)

    def set(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # full: a wake-up is pending already
            os.write(self.write_fd, b"!")

    def wait(self, timeout_s: float) -> None:
        """Up to ``timeout_s``, or until :meth:`set` (those since the last wait included)."""
        ready, _, _ = select.select([self.read_fd], [], [], max(0.0, timeout_s))
        if ready:
            os.read(self.read_fd, 4096)


def wake_on_exit(pid: int, wakeup: Wakeup) -> None:
    """Block until ``pid`` (a child) has exited, without collecting its status (Popen does), then
    ``wakeup``."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    wakeup.set()


def reap() -> None:
    """Collect exit statuses of re-parented orphans so they do not linger as zombies."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def has_unread_bytes(fd: int) -> bool:
    """Whether ``fd`` holds bytes (or its end) this process has not read yet. A heartbeat source
    whose words wait there has spoken: only this process, starved of CPU on a loaded node, has not
    read them yet, which is fstrain's slowness and never a reason to stop a healthy job."""
    try:
        readable, _, _ = select.select([fd], [], [], 0)
    except (OSError, ValueError):
        return False
    return bool(readable)


class Watchdog:
    heartbeat_source = "the launcher"  # whose heartbeats keep the job running (a detached member's: the coordinator)
    heartbeat_fd = 0  # where they arrive: the launcher's control lines (a detached member's: its coordinator link)
    has_unread_bytes = staticmethod(has_unread_bytes)  # for the coordinator, sent along with this script

    def __init__(self, header: dict[str, Any]) -> None:
        self.header = header
        self.configure()
        self.last_heartbeat = time.monotonic()
        self.stop_requested: str | None = None  # "term" or "kill"
        self.lock = threading.Lock()
        self.wakeup = Wakeup()  # the supervisor's sleep, ended by a stop request or the job's exit
        self.child: subprocess.Popen[bytes] | None = None
        self.state_file = ""
        self.modules: dict[str, Any] = {}
        self.full_header: dict[str, Any] | None = None  # under prewarm, once fstrain sends it
        self.full_header_ready = threading.Event()
        self.startup_env: dict[str, str] = {}  # under prewarm: what the waiting interpreter started with
        self.startup_workdir: str | None = None  # and where
        self.relays: list[threading.Thread] = []  # the launcher's stdout and stderr, copied out
        self.textfile: MetricsTextfile | None = None  # --metrics-textfile: this node's .prom file
        self.reaper: Reaper | None = None  # ends the job if this process is killed

    def configure(self) -> None:
        self.grace_s = float(self.header.get("grace_s", 15))
        self.heartbeat_timeout_s = float(self.header.get("heartbeat_timeout_s", 30))

    def prepare(self) -> dict[str, str]:
        header = self.header
        run_dir = os.path.expanduser(header.get("run_dir") or "")
        if run_dir:
            os.makedirs(run_dir, mode=0o700, exist_ok=True)
            for name, content in sorted((header.get("files") or {}).items()):
                # Write then rename: on a shared file system another node's rank may be
                # reading the same file while this node writes it.
                path = os.path.join(run_dir, name)
                partial = f"{path}.{os.getpid()}.partial"
                fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as handle:
                    handle.write(content)
                os.replace(partial, path)
        env = dict(os.environ)
        env.update(header.get("env") or {})
        env["FSTRAIN_RUN_ID"] = str(header.get("run_id", ""))
        env["FSTRAIN_NODE_RANK"] = str(header.get("node_rank", 0))
        env["FSTRAIN_GRACE_S"] = f"{self.grace_s:g}"  # SIGTERM to SIGKILL: what a save on SIGTERM may take
        if run_dir:
            env["FSTRAIN_RUN_DIR"] = run_dir
        if run_dir and header.get("stacks"):  # hang reports: see stacks.py
            self.module("stacks").install_hook(run_dir, env)
        if header.get("metrics_textfile"):
            folder = expand(os.path.expanduser(str(header["metrics_textfile"])), run_dir)
            self.textfile = MetricsTextfile(header, folder, self.module("promfile"), self.module("metricline"),
                                            self.module("stacks"))
        return env

    def observe_line(self, local_rank: int | None, line: bytes) -> None:
        """A line of the job's output (a rank's file, or the launcher's pipe), for the textfile."""
        if self.textfile is not None:
            self.textfile.line(local_rank, line)

    def report_draw(self, local_rank: int, fd: int, text: bytes) -> None:
        """The newest draws of a rank's bar (a line still being written, see RankLogTailer): an
        event for the launcher's step readers (never written to the logs), and the textfile's."""
        self.event({"draw": {"local": local_rank, "fd": fd, "text": text.decode("utf-8", "replace")}})
        self.observe_line(local_rank, text)

    def module(self, name: str) -> Any:
        """A helper module sent in the header (``modules``), loaded once."""
        if name not in self.modules:
            # Registered, so that dataclasses in it can resolve their own module.
            module = types.ModuleType(f"fstrain_remote_{name}")
            sys.modules[module.__name__] = module
            exec(compile(self.header["modules"][name], f"fstrain-{name}", "exec"), module.__dict__)
            self.modules[name] = module
        return self.modules[name]

    def report_stacks(self) -> None:
        """Every live rank's stacks, as one event line for the launcher."""
        run_dir = os.path.expanduser(self.header.get("run_dir") or "")
        report = self.module("stacks").collect(run_dir, descendants(os.getpid()))
        self.event({"stacks": report})

    def event(self, payload: dict[str, Any]) -> None:
        with OUTPUT_LOCK:
            write_all(1, (EVENT_PREFIX + json.dumps(payload) + "\n").encode())

    def watch_ranks(self) -> None:
        """Report ranks whose process ended while the job runs on (``ranks_gone``; ``ranks_ended``
        once every rank of the node has): the launcher's finish timeout starts there, as torchrun
        waits for every node before it exits, and its stall clock stops once no node has a rank."""
        seen: set[int] = set()
        ever: set[int] = set()
        nproc = int(self.header.get("nproc") or 1)
        while self.child is not None and self.child.poll() is None:
            live = set(self.module("stacks").rank_processes(descendants(os.getpid())))
            gone = seen - live
            ever |= live
            if gone:
                # ranks_ended: none is left of all the node's ranks; the job is its launcher exiting
                self.event({"ranks_gone": sorted(gone), "ranks_ended": not live and len(ever) >= nproc})
            seen = (seen - gone) | live
            time.sleep(1.0)

    def watch_rank_exits(self) -> None:
        """Report the first rank that exits non-zero (``rank_exit``), for launchers that exit
        with its code but do not say which rank it was (DeepSpeed's)."""
        watch = self.module("stacks").FirstFailedRank(int(self.header.get("nproc") or 1))
        last_scan = 0.0
        while self.child is not None and self.child.poll() is None and self.stop_requested is None:
            scan = watch.needs_scan() or time.monotonic() - last_scan > 5.0
            if scan:
                last_scan = time.monotonic()
            failure = watch.poll(descendants(os.getpid()) if scan else None)
            if failure is not None:
                self.event({"rank_exit": failure})
                return
            time.sleep(POLL_S)

    def write_state(self) -> None:
        """Record this run's pids so `fstrain doctor --orphans` can find them by id, not by name."""
        state_dir = os.path.expanduser(self.header.get("state_dir") or "")
        if not state_dir or self.child is None:
            return
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        name = f"{self.header.get('run_id')}.node{self.header.get('node_rank')}.json"
        self.state_file = os.path.join(state_dir, name)
        partial = f"{self.state_file}.{os.getpid()}.partial"
        with open(partial, "w") as handle:  # whole or not at all: `doctor --orphans` may read it any time
            json.dump({"format": NODE_FORMAT, "run_id": self.header.get("run_id"),
                       "node_rank": self.header.get("node_rank"),
                       "watchdog_pid": os.getpid(), "job_pid": self.child.pid, "started": time.time(),
                       "argv": self.header.get("argv")}, handle)
        os.replace(partial, self.state_file)

    def control_loop(self) -> None:
        """Read the launcher's control lines; end of file means the launcher is gone."""
        for raw in sys.stdin:
            word = raw.strip()
            if word.startswith("{") and not self.full_header_ready.is_set():
                self.full_header = json.loads(word)
                self.last_heartbeat = time.monotonic()
                self.full_header_ready.set()
            elif word == "hb":
                self.last_heartbeat = time.monotonic()
                if self.header.get("answer_heartbeats"):
                    self.event({"hb": True})
            elif word in ("term", "kill"):
                self.request(word)
            elif word == "stacks":
                threading.Thread(target=self.report_stacks, daemon=True).start()
        self.request("term")

    def request(self, how: str) -> None:
        """``term``, ``kill``, or ``signalled`` (Slurm has sent SIGTERM to the whole job: stop as
        ``term`` without a SIGTERM of our own, which a later ``term`` does not add)."""
        with self.lock:
            if self.stop_requested == "kill" or (self.stop_requested == "signalled" and how == "term"):
                return
            self.stop_requested = how
        self.wakeup.set()

    def run(self) -> int:
        if not become_subreaper():
            log("could not become a child subreaper; orphans of the job are found through /proc only")
        self.reaper = start_reaper(self.grace_s)
        try:
            return self.run_job()
        finally:
            stop_reaper(self.reaper)

    def run_job(self) -> int:
        threading.Thread(target=self.control_loop, daemon=True).start()
        prefix = self.header.get("prewarm")
        if prefix:
            code = self.prewarm(list(prefix))
            if code is not None:
                return code
        env = self.prepare()
        workdir = self.header.get("workdir")
        if workdir:
            try:
                os.chdir(os.path.expanduser(workdir))
            except OSError as exc:
                log(f"working directory {workdir!r}: {exc.strerror}")
                self.sweep()
                return 2
        run_dir = env.get("FSTRAIN_RUN_DIR", "")
        argv = [expand(arg, run_dir) for arg in self.header["argv"]]
        code = self.hand_over(list(prefix or []), argv, env) if self.child is not None else self.start(argv, env)
        if code is not None:
            return code
        tail_dir = expand(str(self.header.get("rank_log_dir") or ""), run_dir)
        observe = self.observe_line if self.textfile is not None else None  # no cost per line without it
        tailer = RankLogTailer(tail_dir, int(self.header.get("nproc") or 1),
                               self.header.get("rank_offset"), observe, self.report_draw) if tail_dir else None
        if tailer is not None:
            threading.Thread(target=tailer.follow, daemon=True).start()
        if self.textfile is not None:
            threading.Thread(target=self.textfile.follow, args=(self.child, tailer), daemon=True).start()
        if self.header.get("stacks"):
            threading.Thread(target=self.watch_ranks, daemon=True).start()
        if self.header.get("watch_rank_exits"):
            threading.Thread(target=self.watch_rank_exits, daemon=True).start()
        exit_code = None  # the job's, for the textfile's end
        try:
            exit_code = self.supervise()
            return exit_code
        finally:
            for relay in self.relays:  # the job is gone: its pipes end (unless something escaped)
                relay.join(5.0)
            if tailer is not None:
                tailer.finish()
            if self.textfile is not None:
                self.textfile.finish(tailer, exit_code, self.stop_requested is not None)
            self.clean_up(run_dir)
            if self.state_file:
                with contextlib.suppress(OSError):
                    os.unlink(self.state_file)

    def start(self, argv: list[str], env: dict[str, str]) -> int | None:
        """The job, in a session of its own; an exit code where it cannot start."""
        try:
            self.child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, start_new_session=True,
                                          preexec_fn=dies_with_parent())
        except OSError as exc:
            log(f"cannot start {argv[0]!r}: {exc.strerror}")
            return 127
        self.relay_launcher()
        self.write_state()
        return None

    def relay_launcher(self) -> None:
        """The job's own stdout and stderr (pipes) to the watchdog's, whole lines (see OUTPUT_LOCK)."""
        assert self.child is not None
        for source, fd in ((self.child.stdout, 1), (self.child.stderr, 2)):
            relay = threading.Thread(target=relay_pipe, args=(source, fd, self.observe_line), daemon=True)
            relay.start()
            self.relays.append(relay)

    def prewarm(self, prefix: list[str]) -> int | None:
        """Start the launcher's interpreter in the working directory now (it imports the
        module), then wait for the full header; an exit code where the launcher gave up first."""
        env = dict(os.environ)
        env.update(self.header.get("env") or {})
        # As the job's own environment will (/proc/PID/environ keeps what a process started with):
        # `doctor --orphans` and the stack collection find the launcher by them.
        env["FSTRAIN_RUN_ID"] = str(self.header.get("run_id", ""))
        env["FSTRAIN_NODE_RANK"] = str(self.header.get("node_rank", 0))
        self.startup_env = env
        self.startup_workdir = self.header.get("workdir")
        at = prefix.index("-m")
        try:
            os.chdir(os.path.expanduser(self.header.get("workdir") or "."))
            self.child = subprocess.Popen([*prefix[:at], "-c", PREWARM, prefix[at + 1]], env=env,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          start_new_session=True, preexec_fn=dies_with_parent())
            self.relay_launcher()
        except OSError:
            self.child = None  # the full header's own start reports what is wrong
        self.write_state()
        deadline = time.monotonic() + float(self.header.get("prewarm_timeout_s") or 600)
        while not self.full_header_ready.wait(POLL_S):
            with self.lock:
                stopping = self.stop_requested is not None
            if stopping or time.monotonic() > deadline:  # the launcher gave up before the start
                self.end_prewarmed()
                if self.state_file:
                    with contextlib.suppress(OSError):
                        os.unlink(self.state_file)
                return 0
        self.header = self.full_header or {}
        self.configure()
        return None

    def hand_over(self, prefix: list[str], argv: list[str], env: dict[str, str]) -> int | None:
        """Give the prewarmed interpreter its arguments and environment; start ``argv`` afresh
        if it has another prefix, another working directory or start-up variable, or the
        interpreter is gone."""
        assert self.child is not None and self.child.stdin is not None
        same_start = all(env.get(k) == self.startup_env.get(k) for k in STARTUP_VARS) \
            and self.header.get("workdir") == self.startup_workdir
        if argv[:len(prefix)] == prefix and same_start and self.child.poll() is None:
            try:
                self.child.stdin.write((json.dumps({"args": argv[len(prefix):], "env": env}) + "\n").encode())
                self.child.stdin.close()
                self.write_state()
                return None
            except OSError:
                pass
        self.end_prewarmed()
        return self.start(argv, env)

    def end_prewarmed(self) -> None:
        """The waiting interpreter (and anything it started) is not used: SIGKILL, collect it."""
        if self.child is not None and self.child.stdin is not None:
            with contextlib.suppress(OSError):
                self.child.stdin.close()
        self.sweep()
        if self.child is not None:
            with contextlib.suppress(ChildProcessError):
                self.child.wait()

    def clean_up(self, run_dir: str) -> None:
        """Remove the ``cleanup`` folders, only ever inside the run directory."""
        if not run_dir:
            return
        root = os.path.realpath(run_dir)
        for pattern in self.header.get("cleanup") or []:
            path = os.path.realpath(expand(str(pattern), run_dir))
            if path.startswith(root + os.sep):
                shutil.rmtree(path, ignore_errors=True)
        for leftover in ("ranklogs",):  # the parent of the per-node rank log folders, once empty
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(root, leftover))

    def supervise(self) -> int:
        assert self.child is not None
        threading.Thread(target=wake_on_exit, args=(self.child.pid, self.wakeup), daemon=True).start()
        while True:
            code = self.child.poll()
            if code is not None:
                self.sweep()  # the job is done: nothing it started may outlive it
                return code if code >= 0 else 128 - code
            if time.monotonic() - self.last_heartbeat > self.heartbeat_timeout_s:
                if has_unread_bytes(self.heartbeat_fd):  # the source spoke; this process read late
                    self.last_heartbeat = time.monotonic()
                else:
                    log(f"no heartbeat from {self.heartbeat_source} for {self.heartbeat_timeout_s:g} s: "
                        "stopping the job")
                    self.request("term")
            with self.lock:
                how = self.stop_requested
            if how is not None:
                return self.teardown(how)
            silent_s = time.monotonic() - self.last_heartbeat
            self.wakeup.wait(min(SUPERVISE_MAX_SLEEP_S, self.heartbeat_timeout_s - silent_s + 0.01))

    def teardown(self, how: str) -> int:
        assert self.child is not None
        if how in ("term", "signalled"):
            if how == "term":
                self.signal_job(signal.SIGTERM)
            deadline = time.monotonic() + self.grace_s
            while time.monotonic() < deadline and self.child.poll() is None:
                with self.lock:
                    if self.stop_requested == "kill":
                        break
                time.sleep(POLL_S)
        if self.child.poll() is None:
            if how != "kill" and self.stop_requested != "kill":
                log(f"the job did not end within the {self.grace_s:g} s grace period: SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                self.child.kill()
            self.child.wait()  # its own status, before the sweep collects every orphan's
        self.sweep()
        code = self.child.wait()
        return code if code >= 0 else 128 - code

    def signal_job(self, sig: int) -> None:
        """``sig`` once to every process of the job: its process group, then each descendant
        outside that group (a second SIGTERM reads as "force quit" to some launchers)."""
        assert self.child is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child.pid, sig)
        outside = []
        for pid in self.job_processes():
            try:
                if os.getpgid(pid) != self.child.pid:
                    outside.append(pid)
            except (ProcessLookupError, PermissionError):
                continue
        signal_all(outside, sig)

    def job_processes(self) -> list[int]:
        """Every descendant of the watchdog but its reaper."""
        reaper = self.reaper.pid if self.reaper is not None else None
        return [pid for pid in descendants(os.getpid()) if pid != reaper]

    def sweep(self) -> None:
        """SIGKILL every descendant until none is left."""
        for _ in range(100):
            pids = self.job_processes()
            if not pids:
                break
            signal_all(pids, signal.SIGKILL)
            time.sleep(0.05)
            reap()
        reap()


class MetricsTextfile:
    """``--metrics-textfile DIR``: this node's ranks as ``DIR/fstrain_<run id>_node<I>.prom``
    (Prometheus text format, for node_exporter's textfile collector), rewritten every
    ``metrics_interval_s`` and once more at the end, each time into a ``.tmp`` file beside it
    that is then renamed over it. The numbers come from the lines the relays see
    (fstrain/core/monitor/promfile.py); alive ranks from /proc (stacks.py); each write carries its
    time (``clock``), the last one the job's end. A folder that cannot be written is said once on
    stderr: the job runs on."""

    def __init__(self, header: dict[str, Any], folder: str, promfile: Any, metricline: Any, stacks: Any,
                 clock: Any = time.time) -> None:
        self.folder = folder
        self.path = os.path.join(self.folder, promfile.textfile_name(header.get("run_id", ""),
                                                                       int(header.get("node_rank") or 0)))
        self.interval_s = float(header.get("metrics_interval_s") or promfile.INTERVAL_S)
        self.metrics = promfile.NodeMetrics(str(header.get("run_id", "")), os.uname().nodename,
                                            int(header.get("node_rank") or 0), int(header.get("nproc") or 1),
                                            header.get("rank_offset"), clock(), metricline.read_step,
                                            metricline.newer_reading)
        self.clock = clock
        self.max_line_bytes = int(metricline.MAX_LINE_BYTES)
        self.stacks = stacks
        self.lock = threading.Lock()
        self.failed = False
        self.done = threading.Event()

    def line(self, local_rank: int | None, line: bytes) -> None:
        text = line[:self.max_line_bytes + 1].decode("utf-8", "replace").rstrip("\r\n")
        with self.lock:
            self.metrics.line(local_rank, text, self.clock())

    def follow(self, child: Any, tailer: RankLogTailer | None) -> None:
        """Write now, then every interval while the job runs."""
        while child is not None and child.poll() is None:
            self.write(self.stacks.local_ranks(descendants(os.getpid())), tailer, final=False)
            if self.done.wait(self.interval_s):
                return

    def finish(self, tailer: RankLogTailer | None, exit_code: int | None = None, stopped: bool = False) -> None:
        """The job is over (``exit_code``: its own, None where it is not known; ``stopped``: by
        the watchdog): every rank gone, the end and the last numbers written."""
        self.done.set()
        with self.lock:
            self.metrics.end(exit_code, stopped)
        self.write({}, tailer, final=True)

    def write(self, alive: dict[int, int], tailer: RankLogTailer | None, final: bool) -> None:
        """Under the lock from the numbers to the rename: a late periodic write never replaces the final one."""
        with self.lock:
            if self.done.is_set() and not final:
                return
            self.metrics.set_alive(alive)
            if tailer is not None:
                self.metrics.restarts = tailer.latest_attempt
            text = self.metrics.render(self.clock())
            partial = f"{self.path}.{os.getpid()}.tmp"  # not *.prom: the collector skips it
            try:
                os.makedirs(self.folder, exist_ok=True)
                with open(partial, "w") as handle:
                    handle.write(text)
                os.chmod(partial, 0o644)  # node_exporter often runs as a user of its own
                os.replace(partial, self.path)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.unlink(partial)
                if not self.failed:
                    self.failed = True
                    log(f"--metrics-textfile: cannot write {self.path}: {exc.strerror or exc}; the job goes on")


def rank_source(relative: str, nproc: int, rank_offset: int | None = None) -> tuple[int, int, int] | None:
    """A launcher's per-rank log file, by its path under the rank log folder -> (local rank, the
    watchdog's descriptor it goes to: 1 stdout, 2 stderr, restart attempt); None for any other file.

    - DeepSpeed (``--enable_each_rank_log``): ``<run id>_rank<R>.log``, global rank R, the rank's
      stdout and stderr in one file; local rank R - ``rank_offset`` (the node's first global rank:
      nodes may run different numbers of ranks), else R mod ``nproc`` (the line is relayed either way);
    - torchrun (``--redirects 3 --log-dir``): ``<run id>_<random>/attempt_<A>/<L>/stdout.log`` and
      ``stderr.log``, local rank L, a new ``attempt_<A>`` folder for each restart.
    """
    parts = relative.split(os.sep)
    name = parts[-1]
    if len(parts) == 1 and name.endswith(".log") and "_rank" in name:
        digits = name.rsplit("_rank", 1)[1][:-4]
        if not digits.isdigit():
            return None
        local = int(digits) - rank_offset if rank_offset is not None else -1
        return (local if 0 <= local < max(1, nproc) else int(digits) % max(1, nproc), 1, 0)
    if len(parts) >= 3 and name in ("stdout.log", "stderr.log") and parts[-2].isdigit() \
            and parts[-3].startswith("attempt_") and parts[-3][8:].isdigit():
        return int(parts[-2]), 1 if name == "stdout.log" else 2, int(parts[-3][8:])
    return None


class RankLogTailer:
    """Relays the ranks' own log files (see :func:`rank_source`) to the watchdog's stdout, a rank's
    stderr file to its stderr, as whole lines tagged ``[local<L>]:``. Ranks that share a pipe
    split each other's lines, and a launcher's relay of their pipes (torchrun's ``--tee``) forwards
    half lines; here every rank writes a file of its own, and only this relay writes the lines.

    Bytes go out as read, never decoded. A line goes out once its newline is on disk, whatever its
    length, in order, tag and line in one write where they fit in one; the relay keeps at most a
    chunk in memory, never a line still being written: a file's offset, counted in bytes read,
    stays at that line's start, and the line is read again once whole. A file of an earlier restart
    attempt is complete once a later attempt exists: its last line, if it has no newline, goes out
    then, with one; every other file's at :meth:`finish`, once.

    A "\r" ends no line here: a tqdm bar redrawn with "\r" (the transformers and Lightning
    trainers' bars) stays one line, relayed once its newline comes, bytes as written. Its draws
    go to the step readers as they come instead: where a line still being written holds a
    "\r", ``on_draw(local rank, descriptor, text)`` gets its last DRAW_BYTES from its first
    "\r" on (the newest draws; the last may be half written, and the readers take only whole
    ones), at most every DRAW_INTERVAL_S per file and once more when the file stops growing."""

    CHUNK_BYTES = 1 << 20
    # Lines go out joined in writes of up to PIPE_BUF bytes (a longer line alone): few system
    # calls, and a pipe takes such a write whole even from processes that share it (the launcher).
    BATCH_BYTES = 4096
    DRAW_BYTES = 2048  # of a line still being written, what its newest draws are read from
    DRAW_INTERVAL_S = 0.5
    IDLE_POLL_MAX_S = 0.5  # the longest wait between looks once the files stopped growing
    FOLDER_SETTLED_S = 2.0  # a folder's mtime younger than this may hide a file added in its tick

    def __init__(self, folder: str, nproc: int, rank_offset: int | None = None, observe: Any = None,
                 on_draw: Any = None) -> None:
        self.folder = folder
        self.observe = observe  # observe(local rank, line): each whole line relayed, without its newline
        self.on_draw = on_draw  # on_draw(local rank, fd, text): the newest draws of a line being written
        self.unfinished: dict[str, bytes] = {}  # file -> the last DRAW_BYTES of its line being written
        self.drawn: dict[str, tuple[float, bytes]] = {}  # file -> when its draws went out, and which
        self.latest_attempt = 0  # torchrun's restart attempts seen so far
        self.nproc = max(1, nproc)
        self.rank_offset = rank_offset  # the node's first global rank (DeepSpeed's files name global ranks)
        self.start: dict[str, int] = {}  # file -> offset of its first byte not relayed (a line's start)
        self.scanned: dict[str, int] = {}  # file -> offset up to which it holds no newline after start
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.listing: list[tuple[int, int, int, str]] = []  # sources() as last walked
        self.folder_stamps: dict[str, int] = {}  # each folder walked -> its mtime (ns) then; {}: walk again

    def follow(self) -> None:
        """Poll every POLL_S while the files grow; after each look that found nothing new the
        wait doubles, up to IDLE_POLL_MAX_S: an idle node's relay wakes twice a second, not ten
        times, and a line after a quiet spell is relayed within that."""
        wait_s = POLL_S
        while not self.done.is_set():
            wait_s = POLL_S if self.poll(final=False) else min(self.IDLE_POLL_MAX_S, wait_s * 2)
            self.done.wait(wait_s)

    def finish(self) -> None:
        self.done.set()
        self.poll(final=True)

    def sources(self) -> list[tuple[int, int, int, str]]:
        """(attempt, local rank, descriptor, path) of every rank log file now in the folder: walked
        again only where a folder's mtime changed since (a file or folder added, renamed or
        removed), or is too recent to tell: a file's creation within the same tick of the
        filesystem's clock leaves the mtime as it was, so a stamp younger than
        FOLDER_SETTLED_S is not trusted (as git treats racy index entries)."""
        if self.listing_current():
            return self.listing
        stamps: dict[str, int] = {}
        found = []
        walk_time_ns = time.time_ns()
        pending = [self.folder]
        while pending:  # os.walk's order and choices (symbolic links to folders not followed)
            root = pending.pop(0)
            try:
                stamps[root] = os.stat(root).st_mtime_ns  # before the listing: a later change shows
                entries = sorted(os.scandir(root), key=lambda entry: entry.name)
            except OSError:
                continue
            for entry in entries:
                if entry.is_dir():
                    if not entry.is_symlink():
                        pending.append(entry.path)
                    continue
                source = rank_source(os.path.relpath(entry.path, self.folder), self.nproc, self.rank_offset)
                if source is not None:
                    found.append((source[2], source[0], source[1], entry.path))
        settled = all(walk_time_ns - stamp > self.FOLDER_SETTLED_S * 1e9 for stamp in stamps.values())
        self.folder_stamps = stamps if stamps and settled else {}
        self.listing = sorted(found)
        return self.listing

    def listing_current(self) -> bool:
        """Whether no folder walked last has changed since (a folder added shows in its parent)."""
        if not self.folder_stamps:
            return False
        for folder, stamp in self.folder_stamps.items():
            try:
                if os.stat(folder).st_mtime_ns != stamp:
                    return False
            except OSError:
                return False
        return True

    def unread(self, path: str, complete: bool) -> bool:
        """Whether ``path`` holds bytes past what was read of it (or, ``complete``, a last line
        not yet relayed): a file that has not grown is not opened again."""
        start = self.start.get(path, 0)
        scanned = self.scanned.get(path, start)
        return os.stat(path).st_size > scanned or (complete and scanned > start)

    def poll(self, final: bool) -> bool:
        """Relay what the files hold; whether any had bytes not read before."""
        grew = False
        with self.lock:
            sources = self.sources()
            latest = max((attempt for attempt, *_ in sources), default=0)
            self.latest_attempt = max(self.latest_attempt, latest)
            for attempt, local, fd, path in sources:
                complete = final or attempt < latest
                try:
                    if self.unread(path, complete):
                        grew = True
                        self.relay(path, b"[local%d]:" % local, fd, complete, local)
                except OSError as exc:  # the file went away, or the output did: nothing to relay to
                    if not isinstance(exc, FileNotFoundError):
                        return grew
                if self.on_draw is not None and not final and attempt == latest:
                    self.draw(path, local, fd)
        return grew

    def draw(self, path: str, local: int, fd: int) -> None:
        """The newest draws of ``path``'s line being written to ``on_draw``, where they changed
        and the last went out DRAW_INTERVAL_S ago or more."""
        pending = self.unfinished.get(path, b"")
        first = pending.find(b"\r")
        if first < 0:
            return
        text = pending[first:]
        now = time.monotonic()
        last_s, last_text = self.drawn.get(path, (-self.DRAW_INTERVAL_S, b""))
        if text != last_text and now - last_s >= self.DRAW_INTERVAL_S:
            self.drawn[path] = (now, text)
            self.on_draw(local, fd, text)

    def relay(self, path: str, tag: bytes, fd: int, complete: bool, local: int = 0) -> None:
        """The whole lines ``path`` holds past its offset; its last partial line too if ``complete``."""
        start = self.start.get(path, 0)
        scanned = self.scanned.get(path, start)
        with open(path, "rb") as handle:
            handle.seek(scanned)
            while True:
                chunk = handle.read(self.CHUNK_BYTES)
                if not chunk:
                    break
                newline = chunk.rfind(b"\n")
                if newline < 0:
                    scanned += len(chunk)
                    if self.on_draw is not None:  # each byte of a line being written is read here once
                        self.unfinished[path] = (self.unfinished.get(path, b"") + chunk)[-self.DRAW_BYTES:]
                    continue
                end = scanned + newline + 1
                self.copy(handle, start, end, tag, fd, local)
                start = scanned = end
                self.unfinished.pop(path, None)
                handle.seek(end)
            if complete and scanned > start:
                self.copy(handle, start, scanned, tag, fd, local)
                start = scanned
                self.unfinished.pop(path, None)
        self.start[path], self.scanned[path] = start, scanned

    def copy(self, handle: Any, start: int, end: int, tag: bytes, fd: int, local: int = 0) -> None:
        """Bytes ``start`` to ``end`` of the file, ``start`` a line's start, as tagged lines (a
        newline added at the end where the last has none), in writes of whole lines where they fit;
        each line that fits in a chunk also to ``observe`` (a longer one is no metric line)."""
        handle.seek(start)
        left = end - start
        batch: list[bytes] = []
        size = 0
        in_line = False  # the chunk before ended inside a line: its next piece gets no tag
        observed: list[bytes] = []
        with OUTPUT_LOCK:
            while left > 0:
                chunk = handle.read(min(self.CHUNK_BYTES, left))
                if not chunk:
                    break
                left -= len(chunk)
                pieces = chunk.split(b"\n")
                last = pieces.pop()
                if last:
                    pieces.append(last)
                for number, piece in enumerate(pieces):
                    whole = number < len(pieces) - 1 or not last  # its newline is in this chunk
                    if self.observe is not None and not in_line:
                        observed.append(piece)
                    item = (piece if in_line else tag + piece) + (b"\n" if whole else b"")
                    if batch and size + len(item) > self.BATCH_BYTES:
                        write_all(fd, b"".join(batch))
                        batch, size = [], 0
                    batch.append(item)
                    size += len(item)
                    in_line = not whole
            if in_line:
                batch.append(b"\n")
            if batch:
                write_all(fd, b"".join(batch))
        for line in observed:
            self.observe(local, line)


def main(header: dict[str, Any]) -> None:
    found = header.get("format", 1)
    if not isinstance(found, int) or isinstance(found, bool) or not 1 <= found <= HEADER_FORMAT:
        sys.stderr.write(f"fstrain watchdog: the header is format {found!r}, this watchdog reads format "
                         f"{HEADER_FORMAT}: send both from one fstrain\n")
        sys.stderr.flush()
        os._exit(EXIT_FORMAT)
    if header.get("detach"):  # a detached run: the watchdogs supervise each other (coordinator.py)
        Watchdog(header).module("coordinator").main(header, Watchdog)
    watchdog = Watchdog(header)
    # A signal to the watchdog itself (sshd's SIGHUP on a lost channel, a kill by hand) tears
    # the job down like a lost launcher; it never leaves the job running without a watchdog.
    # As a Slurm task, its SIGTERM is Slurm's (scancel, the time limit), sent to every process
    # of the step at once: the job has it already, and a second one makes torchrun abandon its
    # own shutdown. The watchdog then waits for the job within the grace period, SIGKILLs the rest.
    on_term = "signalled" if slurm_task() else "term"
    signal.signal(signal.SIGTERM, lambda *_: watchdog.request(on_term))
    signal.signal(signal.SIGHUP, lambda *_: watchdog.request("term"))
    signal.signal(signal.SIGINT, lambda *_: watchdog.request("term"))
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    code = watchdog.run()
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__fstrain_watchdog__":
    main(HEADER)  # type: ignore[name-defined]  # noqa: F821
