"""`fstrain doctor`'s host-side helper (stdlib only; sent as ``python3 - MODE ARGS`` on stdin).

Modes, each printing one JSON object:

- ``facts PARAMS``: PARAMS is JSON ``{"workdir", "files": [paths], "nvidia_smi_q": bool}``; reports
  whether the working directory exists, the NCCL config files NCCL would read (``NCCL_CONF_FILE``
  or ``~/.nccl.conf``, then ``/etc/nccl.conf``), the named files (readable, first MiB), the text
  of ``nvidia-smi -q``, and whether the session holds CAP_IPC_LOCK;
- ``disk DIR BYTES``: free space of DIR (or its nearest existing parent) and a timed write of
  BYTES with fsync (the file is removed);
- ``marker write|check|remove DIR NAME``: the shared-directory test;
- ``orphans STATE_DIR KILL GRACE_S``: the launcher watchdog's run records, each classified by
  checking the recorded pids (a job pid counts only if its environment carries the record's
  ``FSTRAIN_RUN_ID``); with KILL=1 the orphans' job and its descendants are ended (SIGTERM, SIGKILL
  after GRACE_S) and their records removed. Nothing is ever looked up or killed by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

FILE_LIMIT = 1 << 20
CHUNK = 4 << 20
CAP_IPC_LOCK = 14


def read_head(path: str, limit: int = FILE_LIMIT) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit)
    except OSError as exc:
        return {"readable": False, "error": exc.strerror or str(exc)}
    return {"readable": True, "text": data.decode("utf-8", "replace")}


def cap_ipc_lock() -> bool | None:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
    except (OSError, ValueError):
        return None
    return None


def facts(params: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"time": time.time()}
    workdir = params.get("workdir")
    if workdir:
        out["workdir_exists"] = os.path.isdir(os.path.expanduser(workdir))
    user_conf = os.environ.get("NCCL_CONF_FILE") or os.path.join(os.environ.get("HOME", "/"), ".nccl.conf")
    out["nccl_conf"] = []
    for path in (user_conf, "/etc/nccl.conf"):
        head = read_head(path, 64 << 10)
        if head["readable"]:
            out["nccl_conf"].append([path, head["text"]])
    out["files"] = {path: read_head(path) for path in params.get("files") or []}
    if params.get("nvidia_smi_q") and shutil.which("nvidia-smi"):
        try:
            done = subprocess.run(["nvidia-smi", "-q"], capture_output=True, timeout=60,
                                  check=False)
            out["nvidia_smi_q"] = done.stdout.decode("utf-8", "replace") if done.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            out["nvidia_smi_q"] = None
    out["cap_ipc_lock"] = cap_ipc_lock()
    return out


def disk(directory: str, nbytes: int) -> dict[str, Any]:
    path = os.path.abspath(os.path.expanduser(directory))
    probe = path
    while not os.path.isdir(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    out: dict[str, Any] = {"path": directory, "exists": os.path.isdir(path), "measured_at": probe,
                           "writable": os.access(probe, os.W_OK)}
    try:
        st = os.statvfs(probe)
        out["free_bytes"] = st.f_bavail * st.f_frsize
        out["total_bytes"] = st.f_blocks * st.f_frsize
    except OSError as exc:
        out["error"] = exc.strerror
        return out
    if not out["writable"] or nbytes <= 0:
        return out
    name = os.path.join(probe, f".fstrain-doctor-write-{os.getpid()}")
    block = os.urandom(min(CHUNK, nbytes))  # random: compressing file systems would flatter zeros
    try:
        start = time.monotonic()
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            written = 0
            while written < nbytes:
                written += os.write(fd, block[: nbytes - written])
            os.fsync(fd)
        finally:
            os.close(fd)
        out["write_s"] = time.monotonic() - start
        out["write_bytes"] = written
    except OSError as exc:
        out["error"] = exc.strerror or str(exc)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name)
    return out


def marker(action: str, directory: str, name: str) -> dict[str, Any]:
    path = os.path.join(os.path.expanduser(directory), name)
    try:
        if action == "write":
            with open(path, "w") as handle:
                handle.write(name)
                handle.flush()
                os.fsync(handle.fileno())
            return {"ok": True}
        if action == "check":
            return {"ok": True, "seen": os.path.exists(path)}
        os.unlink(path)
        return {"ok": True}
    except OSError as exc:
        return {"ok": False, "error": exc.strerror or str(exc)}


# --- orphans ---------------------------------------------------------------------------------


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name; None if gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return None if not fields or fields[0] in ("Z", "X") else fields


def started_at(pid: int) -> float | None:
    """When the process started (epoch seconds), from its start time in clock ticks since boot."""
    fields = proc_stat(pid)
    if fields is None:
        return None
    try:
        with open("/proc/stat") as handle:
            boot = next(float(line.split()[1]) for line in handle if line.startswith("btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def has_run_id(pid: int, run_id: str) -> bool | None:
    """Whether the process's environment carries FSTRAIN_RUN_ID=run_id (None: cannot read it)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            entries = handle.read().split(b"\0")
    except PermissionError:
        return None
    except OSError:
        return False
    return f"FSTRAIN_RUN_ID={run_id}".encode() in entries


def is_watchdog(pid: int, started: float | None) -> bool:
    """The recorded watchdog, not a later process that reused its pid."""
    if not isinstance(pid, int) or proc_stat(pid) is None:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read()
    except OSError:
        return False
    began = started_at(pid)
    return b"fstrain-watchdog" in cmdline and (started is None or began is None or began <= started + 2)


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = proc_stat(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    frontier = [root]
    while frontier:
        for child in children.get(frontier.pop(0), []):
            found.append(child)
            frontier.append(child)
    return found


def run_processes(run_id: str) -> list[int]:
    """Live processes whose environment carries the run's id: what a job that died without its
    watchdog left behind (its children, re-parented away)."""
    found = []
    for entry in os.listdir("/proc"):
        pid = int(entry) if entry.isdigit() else 0
        if pid and pid != os.getpid() and proc_stat(pid) is not None and has_run_id(pid, run_id):
            found.append(pid)
    return sorted(found)


def end_run(job: int, run_id: str, grace_s: float, victims: list[int] | None = None) -> tuple[list[int], list[int]]:
    """SIGTERM the job and its descendants (or ``victims``), SIGKILL what is left after ``grace_s``."""
    victims = victims if victims is not None else [job, *descendants(job)]
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(proc_stat(p) is not None for p in victims):
        time.sleep(0.1)
    # still the run's processes? (a pid freed during the grace period may belong to someone else now)
    alive = [p for p in victims if proc_stat(p) is not None and has_run_id(p, run_id)]
    alive += [p for p in (descendants(job) if proc_stat(job) is not None else []) if p not in alive]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    survivors = [p for p in alive if proc_stat(p) is not None]
    return [p for p in victims if p not in survivors], survivors


def classify(path: str, record: dict[str, Any], kill: bool, grace_s: float) -> dict[str, Any]:
    run_id = str(record.get("run_id"))
    job, watchdog, started = record.get("job_pid"), record.get("watchdog_pid"), record.get("started")
    out: dict[str, Any] = {"record": path, "run_id": run_id, "node_rank": record.get("node_rank"),
                           "watchdog_pid": watchdog, "job_pid": job, "started": started,
                           "argv": record.get("argv") or [], "pids": [], "killed": [], "survivors": [],
                           "removed": False, "note": ""}
    job_alive = isinstance(job, int) and proc_stat(job) is not None
    verified = has_run_id(job, run_id) if job_alive and isinstance(job, int) else False
    if isinstance(watchdog, int) and is_watchdog(watchdog, started):
        out["state"] = "running"
    elif job_alive and verified:
        out["state"] = "orphan"
    elif job_alive:
        out["state"] = "unverified"
        out["note"] = f"pid {job} cannot be read" if verified is None else f"pid {job} is not that run's process"
    else:  # the job is gone (its watchdog's death takes it along); what it started may not be
        left = run_processes(run_id)
        out["state"] = "orphan" if left else "stale"
        out["pids"] = left
        if left:
            out["note"] = f"the job (pid {job}) is gone; processes it started are left"
    if out["state"] in ("running", "orphan") and isinstance(job, int) and job_alive and verified:
        out["pids"] = [job, *descendants(job)]
    if kill and out["state"] == "orphan" and isinstance(job, int):
        out["killed"], out["survivors"] = end_run(job, run_id, grace_s, None if job_alive else out["pids"])
    if kill and (out["state"] == "stale" or (out["state"] == "orphan" and not out["survivors"])):
        try:
            os.unlink(path)
            out["removed"] = True
        except OSError:
            pass
    return out


def orphans(state_dir: str, kill: bool, grace_s: float) -> dict[str, Any]:
    folder = os.path.expanduser(state_dir)
    runs = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        path = os.path.join(folder, name)
        if not name.endswith(".json"):
            continue
        try:
            with open(path) as handle:
                record = json.load(handle)
        except (OSError, ValueError) as exc:
            runs.append({"record": path, "run_id": name, "state": "unverified", "note": f"unreadable: {exc}"})
            continue
        if isinstance(record, dict):
            runs.append(classify(path, record, kill, grace_s))
    return {"runs": runs}


def main(argv: list[str]) -> int:
    mode = argv[0] if argv else ""
    if mode == "facts":
        result = facts(json.loads(argv[1]))
    elif mode == "disk":
        result = disk(argv[1], int(argv[2]))
    elif mode == "marker":
        result = marker(argv[1], argv[2], argv[3])
    elif mode == "orphans":
        result = orphans(argv[1], argv[2] == "1", float(argv[3]))
    else:
        print(f"doctor_host: unknown mode {mode!r}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
