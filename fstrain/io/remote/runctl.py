"""Look at, stop or remove a run on one node: stdlib only, sent over SSH by `fstrain status`,
`fstrain runs`, `fstrain stop` and `fstrain gc` (fstrain need not be installed on the node).

    python3 -c LINE_BOOTSTRAP state RUN_DIR NODE_RANK RUN_ID   -> one JSON document
    python3 -c LINE_BOOTSTRAP stop RUN_DIR term|kill           -> the coordinator's answer
    python3 -c LINE_BOOTSTRAP views RUN_DIR                    -> every node's state, from the coordinator
                                                                  (once it has exited, from ended-views.json)
    python3 -c LINE_BOOTSTRAP gc RUN_DIR                       -> {"removed": bool, "why": ...}
    python3 -c LINE_BOOTSTRAP list RUNS_DIR                    -> the detached runs found there
    python3 -c LINE_BOOTSTRAP live-slurm JOB_ID NODE           -> the job's live ranks on NODE, the GPUs
    python3 -c LINE_BOOTSTRAP lines RUN_DIR NODE_RANK REQUEST  -> node<I>.out's lines (`fstrain logs`)

Never raises: what cannot be read is reported as missing.

``lines`` reads the node's output file as `fstrain logs` asks (REQUEST, a JSON object): from byte
``offset`` on, at most about ``limit_bytes`` of it, or with ``tail`` the last N lines read
backwards from the end; only global rank ``rank``'s lines (``rank_offset`` turns local ranks
into global ones), only lines from Unix time ``since`` on, none that carries the text ``hide``
(`logs --no-metrics`: the metric lines). It writes the lines as they are in the file (bytes,
invalid UTF-8 included) on stdout, and one JSON line on stderr: the byte offset just after the
last whole line it read and whether more is left, or the error. It reads with
fstrain/core/monitor/logtail.py, sent as stdin's second line.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from typing import Any

# The format versions this file writes and reads (fstrain/core/formats.py KINDS, read there by
# name: this file runs alone on the node).
MESSAGE_FORMAT = 1  # the stop request to the coordinator
COORDINATOR_FORMAT = 1  # coordinator.json
ENDED_VIEWS_FORMAT = 1  # ended-views.json


def _read_json(path: str) -> Any:
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _environ(pid: str) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0"))
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, sep, v in pairs if sep}


def watchdog_alive(pid: Any) -> bool:
    """The pid is alive and is still a watchdog (pids are reused)."""
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as handle:
            return b"fstrain-watchdog" in handle.read()
    except (OSError, TypeError, ValueError):
        return False


def ranks_alive(match: dict[str, str], pids: list[int] | None = None) -> list[int]:
    """Global ranks whose process lives with every ``match`` item in its environment (RANK, and
    this run's FSTRAIN_RUN_ID and this node's FSTRAIN_NODE_RANK; for a Slurm run its SLURM_JOB_ID
    and this node's SLURMD_NODENAME): a node's own ranks even where hosts share a PID space.
    ``pids``: only these processes (a watchdog's own job), not every one in /proc."""
    found = set()
    for entry in os.listdir("/proc") if pids is None else [str(pid) for pid in pids]:
        if entry.isdigit() and int(entry) != os.getpid():
            env = _environ(entry)
            if all(env.get(k) == v for k, v in match.items()) and env.get("RANK", "").isdigit():
                found.add(int(env["RANK"]))
    return sorted(found)


# fstrain/core/monitor/gpuusage.py USAGE_QUERY (this file runs alone on the node): read by name there.
GPU_QUERY = ["--query-gpu=index,memory.used,memory.total,utilization.gpu", "--format=csv"]


def gpus() -> dict[str, Any]:
    """NVML's memory and utilisation per GPU, as nvidia-smi prints them (the client parses the
    CSV); {} where the node has no nvidia-smi, {"error": ...} where it fails."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return {}
    try:
        done = subprocess.run([tool, *GPU_QUERY], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"nvidia-smi: {exc}"}
    if done.returncode != 0:
        why = (done.stdout + done.stderr).decode(errors="replace").strip().splitlines()
        return {"error": f"nvidia-smi exited {done.returncode}" + (f": {why[-1]}" if why else "")}
    return {"csv": done.stdout.decode(errors="replace")}


def live(match: dict[str, str]) -> dict[str, Any]:
    """What lives on this node now: the run's ranks and the GPUs."""
    return {"ranks_alive": ranks_alive(match), "gpus": gpus()}


def state(run_dir: str, node_rank: str, run_id: str) -> dict[str, Any]:
    node = _read_json(os.path.join(run_dir, f"node{node_rank}.json"))
    return {
        "node": node,
        "run": _read_json(os.path.join(run_dir, "run.json")) if node_rank == "0" else None,
        "watchdog_alive": watchdog_alive((node or {}).get("watchdog_pid")),
        **live({"FSTRAIN_RUN_ID": run_id, "FSTRAIN_NODE_RANK": node_rank}),
    }


def stop(run_dir: str, how: str, grace_s: str | None) -> dict[str, Any]:
    return ask_coordinator(run_dir, {"control": "stop", "how": how, "grace_s": float(grace_s) if grace_s else None})


def ask_coordinator(run_dir: str, request: dict[str, Any]) -> dict[str, Any]:
    """One request to the run's coordinator (node 0: this node), its one-line answer."""
    info = _read_json(os.path.join(run_dir, "coordinator.json"))
    if not info:
        return {"error": f"no coordinator record in {run_dir}"}
    found = info.get("format", 1)
    if not isinstance(found, int) or isinstance(found, bool) or not 1 <= found <= COORDINATOR_FORMAT:
        return {"refused": f"coordinator.json is format {found!r}, this fstrain reads format {COORDINATOR_FORMAT}: "
                           "the run was started by a newer fstrain", "hint": "upgrade fstrain"}
    try:
        with socket.create_connection((info["address"], int(info["port"])), timeout=10) as sock:
            sock.settimeout(60)  # every node's view, at 4,096 nodes some megabytes
            sock.sendall((json.dumps({"format": MESSAGE_FORMAT, "secret": info["secret"], **request}) + "\n").encode())
            answer = sock.makefile("rb").readline()
    except OSError as exc:
        return {"error": f"the coordinator does not answer ({exc}): the run has ended or was lost"}
    try:
        parsed: dict[str, Any] = json.loads(answer)
        return parsed
    except ValueError:
        return {"error": "the coordinator closed the connection"}


def views(run_dir: str) -> dict[str, Any]:
    """Every node's view from the coordinator; once it has exited, node 0's own state and the
    members its ended-views.json knows to be gone (None for the others: the client asks them)."""
    answer = ask_coordinator(run_dir, {"control": "views"})
    if "error" not in answer:
        return answer
    ended = _read_json(os.path.join(run_dir, "ended-views.json"))
    found = ended.get("format") if isinstance(ended, dict) else None
    if not isinstance(found, int) or isinstance(found, bool) or not 1 <= found <= ENDED_VIEWS_FORMAT \
            or not isinstance(ended.get("views"), dict) or not isinstance(ended.get("nnodes"), int):
        return answer  # an older or newer coordinator's run, or one that did not end: each node is asked
    gone = ended["views"]
    own = state(run_dir, "0", str(ended.get("run_id") or ""))
    return {"format": MESSAGE_FORMAT, "views": [own, *[gone.get(str(rank)) for rank in range(1, ended["nnodes"])]]}


def gc(run_dir: str) -> dict[str, Any]:
    """Remove a finished run's folder: never one whose watchdog still runs."""
    if not os.path.isdir(run_dir):
        return {"removed": False, "why": "not there"}
    for name in os.listdir(run_dir):
        if name.startswith("node") and name.endswith(".json"):
            node = _read_json(os.path.join(run_dir, name)) or {}
            if watchdog_alive(node.get("watchdog_pid")):
                return {"removed": False, "why": "its watchdog still runs"}
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"removed": not os.path.exists(run_dir), "why": ""}


def list_runs(runs_dir: str) -> dict[str, Any]:
    """Every detached run with a node record under ``runs_dir`` (``~/.fstrain/runs``)."""
    found = []
    try:
        names = sorted(os.listdir(runs_dir))
    except OSError:
        names = []
    for name in names:
        folder = os.path.join(runs_dir, name)
        try:
            files = sorted(f for f in os.listdir(folder) if f.startswith("node") and f.endswith(".json"))
        except OSError:
            continue
        nodes = [n for n in (_read_json(os.path.join(folder, f)) for f in files) if isinstance(n, dict)]
        if nodes:
            found.append({"run_id": name, "run_dir": folder, "run": _read_json(os.path.join(folder, "run.json")),
                          "nodes": [{**n, "watchdog_alive": watchdog_alive(n.get("watchdog_pid"))} for n in nodes]})
    return {"runs": found}


def _logtail() -> Any:
    """fstrain/core/monitor/logtail.py, sent as stdin's second line (a JSON string)."""
    import types

    module = types.ModuleType("fstrain_logtail")
    exec(compile(json.loads(sys.stdin.readline()), "fstrain-logtail", "exec"), module.__dict__)
    return module


def lines(run_dir: str, node_rank: str, request: dict[str, Any], logtail: Any, out: Any) -> dict[str, Any]:
    """Write the requested lines of node<I>.out to ``out``; the offset after them."""
    offset = int(request.get("offset") or 0)
    try:
        handle = open(os.path.join(run_dir, f"node{node_rank}.out"), "rb")  # noqa: SIM115 (closed below)
    except FileNotFoundError:  # not written yet (or removed by gc): nothing to read
        return {"offset": offset, "more": False}
    with handle:
        keep = logtail.node_filter(request.get("rank_offset"), request.get("rank"), request.get("since"),
                                   request.get("hide"))
        if request.get("tail") is not None:
            fd = handle.fileno()
            found, end = logtail.last_lines(lambda start, size: os.pread(fd, size, start), os.fstat(fd).st_size,
                                            int(request["tail"]), keep)
            out.write(b"".join(line + b"\n" for line in found))
            return {"offset": end, "more": False}
        handle.seek(offset)
        limit, first = int(request.get("limit_bytes") or 0), offset
        chunk_bytes = min(limit, logtail.CHUNK_BYTES) if limit else logtail.CHUNK_BYTES
        for piece, offset in logtail.forward_chunks(handle.read, first, chunk_bytes):
            if keep is None:
                out.write(piece)
            else:
                out.write(b"".join(line + b"\n" for line in logtail.whole_lines(piece)[0] if keep(line)))
            if limit and offset - first >= limit:
                return {"offset": offset, "more": True}
        return {"offset": offset, "more": False}


def main(argv: list[str]) -> None:
    command, run_dir = argv[0], os.path.expanduser(argv[1])
    if command == "lines":
        try:
            answer = lines(run_dir, argv[2], json.loads(argv[3]), _logtail(), sys.stdout.buffer)
            sys.stdout.flush()
        except (OSError, ValueError) as exc:
            answer = {"error": f"{run_dir}/node{argv[2]}.out: {getattr(exc, 'strerror', None) or exc}"}
        sys.stderr.write(json.dumps(answer) + "\n")
        return
    if command == "state":
        result = state(run_dir, argv[2], argv[3])
    elif command == "live-slurm":
        result = live({"SLURM_JOB_ID": argv[1], "SLURMD_NODENAME": argv[2]})
    elif command == "list":
        result = list_runs(run_dir)
    elif command == "stop":
        result = stop(run_dir, argv[2], argv[3] if len(argv) > 3 else None)
    elif command == "views":
        result = views(run_dir)
    else:
        result = gc(run_dir)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
