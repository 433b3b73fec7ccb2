"""The control plane of a detached run, simulated at 256 to 4,096 hosts.

    python benchmarks/control_plane_sim.py [--sizes 256,1024,4096] [--window-s 8]

Numbers, not a test. Two halves, each size in a process of its own (so its peak RSS is its own):

- The launching machine's side, through fstrain's real code with a simulated cluster
  (fstrain/io/transport/simulated.py: a connection takes 50 ms, a command a round trip of 20 ms
  plus up to 10 ms of jitter, 1 % of the hosts are slow by 1 s, 0.5 % refuse the connection):
  ``start`` is `launch --detach`'s start of every node (fstrain/io/runs.py start_detached, the
  headers built and sent), ``status`` a detached run's `fstrain status` (fstrain/api/runs.py
  SshRun.status: every view it reads), ``logs`` `fstrain logs RUN --tail 5` (SshRun.outputs:
  each node's output read on that node) and ``stop`` `fstrain stop` (SshRun.stop: the request
  and the reads until the run shows ended: the coordinator has exited by then, so each node is
  asked itself). Per command: wall seconds, the SSH sessions
  (processes started on nodes, each a Python interpreter), connections, bytes sent to the
  nodes, this process's CPU seconds and peak RSS.
- Node 0's side: the real coordinator (fstrain/io/remote/coordinator.py, as tests/coordinators.py
  builds it) in a process of its own on loopback, with N-1 members simulated in this one (one
  socket each, every member's heartbeat at the interval the members use at that size, spread
  over it, each carrying the member's view of NPROC ranks, about 2.5 kB, as `fstrain status`
  reads it there). Measured over ``--window-s`` once every member has joined: the coordinator's CPU
  (user + system) as a fraction of one core, its threads and RSS, the messages it received per
  second, and the longest gap between two heartbeats any member saw from it (what the members'
  heartbeat timeout is compared with).

The slope column is the least-squares fit of each figure against the host count (per 1,000
hosts); ``growth`` divides the last step's cost per host by the first step's (1.0 is linear,
about 4 is quadratic over these sizes).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line  # noqa: E402

from fstrain.io.transport.simulated import script_arguments  # noqa: E402

RUN_ID = "20261205-120000-000000"
NPROC = 8  # ranks per node in the simulated views


# -- the launching machine's side ------------------------------------------------------------------


def node_view(rank: int, ended: bool) -> dict[str, Any]:
    """What one node's runctl ``state`` answers for a run of NPROC ranks (fields as runctl writes)."""
    now = time.time()
    ranks = {str(local): {"last_output_at": now, "last_line": f"[local{local}]: step 120/1000 loss 3.1",
                          "progress_at": now, "progress_line": "", "progress": {"step": 120, "steps": 1000}}
             for local in range(NPROC)}
    final = {"state": "stopped", "exit_code": 143, "reason": "stopped by `fstrain stop` (term)", "ended": now}
    node = {"format": 1, "run_id": RUN_ID, "node_rank": rank, "role": "member" if rank else "coordinator",
            "hostname": f"node{rank}", "watchdog_pid": 1000, "job_pid": 1001, "started": now - 60,
            "ended": now if ended else None, "exit_code": 143 if ended else None, "failure": None, "note": "",
            "final": final if ended else None, "rank_offset": rank * NPROC, "nproc": NPROC, "updated": now,
            "last_output_at": now, "ranks": ranks,
            "last_lines": [f"[local{i % NPROC}]:step 120 line {i}" for i in range(10)],
            "last_lines_at": [now - 1 + i / 10 for i in range(10)], "out_bytes": 65536}
    run = {"format": 1, "run_id": RUN_ID, "state": "running", "exit_code": None, "reason": "",
           "first_failure_node_rank": None, "first_failure_host": None, "first_failure": None,
           "started": now - 60, "ended": None, "nodes": {}, "stall": None}
    return {"node": node, "run": run if rank == 0 else None, "watchdog_alive": not ended,
            "ranks_alive": [] if ended else list(range(rank * NPROC, (rank + 1) * NPROC)), "gpus": {}}


class SimNodes:
    """Every simulated node's answers: the watchdog's start, runctl's commands; ended once stopped."""

    def __init__(self, hosts: list[str]) -> None:
        self.rank = {name: index for index, name in enumerate(hosts)}
        self.stopped = False

    def __call__(self, host: str, argv: Any, stdin: bytes) -> tuple[int, str, str]:
        argv = list(argv)
        rank = self.rank[host]
        command = (script_arguments(argv) or ["start"])[0]  # runctl's command; the watchdog's start has none
        if command == "stop":
            self.stopped = True
            return 0, json.dumps({"format": 1, "ok": True, "state": node_view(0, True)["node"]["final"]}) + "\n", ""
        if command == "state":
            return 0, json.dumps(node_view(rank, self.stopped)) + "\n", ""
        if command == "views":  # node 0 asked for every node's view through the coordinator
            if self.stopped:  # it has ended the run and exited: the nodes are asked themselves
                return 0, json.dumps({"error": "the coordinator does not answer: the run has ended"}) + "\n", ""
            return 0, json.dumps({"format": 1, "views": [node_view(i, self.stopped) for i in range(len(self.rank))]}) \
                + "\n", ""
        if command == "lines":  # `logs --tail`: the node's last lines of node<I>.out, then runctl's answer
            text = "".join(f"{time.time():.3f} [local{local}]:step 120 rank {local}\n" for local in range(NPROC))
            return 0, text, json.dumps({"offset": 4096, "more": False}) + "\n"
        if command == "start":  # the watchdog, detached: its answer once the job started
            return 0, json.dumps({"pid": 1000, "job_pid": 1001, "port": 40000}) + "\n", ""
        return 1, "", f"unknown command {command}"


def simulated_cluster(count: int) -> tuple[Any, list[Any], SimNodes]:
    from fstrain.core.hosts.hostfile import Host
    from fstrain.io.transport.simulated import SimulatedCluster

    hosts = [Host(f"node{i:05d}") for i in range(count)]
    names = [h.name for h in hosts]
    nodes = SimNodes(names)
    slow = frozenset(names[7::100])  # 1 %
    failing = frozenset(names[53::200])  # 0.5 %, never node 0
    cluster = SimulatedCluster(nodes, latency_s=0.020, jitter_s=0.010, connect_s=0.050, slow=slow, slow_s=1.0,
                               failing=failing)
    return cluster, hosts, nodes


def detached_record(hosts: list[Any], run_dir: Path) -> Any:
    from fstrain.core.runs.runrecord import DetachedNode, DetachedRecord
    from fstrain.io.runs import RunRecord

    nodes = tuple(DetachedNode(h, i, NPROC, i * NPROC, f"~/.fstrain/runs/{RUN_ID}", 1000, 1001)
                  for i, h in enumerate(hosts))
    detached = DetachedRecord(RUN_ID, "torchrun", time.time(), "python3", 15.0, None, "10.0.0.1", 40000, nodes)
    return RunRecord(RUN_ID, run_dir, detached, None, None)


def client_phase(phase: str, count: int) -> dict[str, Any]:
    cluster, hosts, _ = simulated_cluster(count)
    run_dir = Path(tempfile.mkdtemp(prefix="fstrain-sim-"))
    cpu0, start = time.process_time(), time.perf_counter()
    if phase == "start":
        from fstrain.core.job.spec import NodeLaunch
        from fstrain.io.launch import Rendezvous, RunOptions
        from fstrain.io.runs import start_detached

        live = [h for h in hosts if h.name not in cluster.failing]  # a launch starts checked hosts only
        launches = [NodeLaunch(h, i, NPROC, ("python3", "-m", "torch.distributed.run", "train.py"))
                    for i, h in enumerate(live)]
        start_detached(launches, cluster.transport, "python3", RunOptions(RUN_ID, run_dir),
                       Rendezvous("10.0.0.1", 29500, ()))
    else:
        from fstrain.api.runs import Access, SshRun

        run = SshRun(detached_record(hosts, run_dir), Access())
        run.connect = cluster.transport
        if phase == "status":
            document = run.status()
            assert len(document["nodes"]) == count, document["state"]
        elif phase == "logs":
            outputs = run.outputs([], None, None, None)
            try:
                assert len(list(outputs.read(tail=5))) == 5
            finally:
                outputs.close()
        else:
            stopped = run.stop(False, None, 60.0)
            assert stopped.state.state == "stopped", stopped.state
    wall = time.perf_counter() - start
    return {"phase": phase, "hosts": count, "wall_s": wall, "cpu_s": time.process_time() - cpu0,
            "sessions": cluster.counts.commands, "connections": cluster.counts.connections,
            "sent_mb": cluster.counts.bytes_sent / 1e6, "in_flight_max": cluster.counts.in_flight_max,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


# -- node 0's side -----------------------------------------------------------------------------------


def serve_coordinator(count: int, window_s: float) -> None:
    """The child: a coordinator for ``count`` nodes on loopback; its port, then its figures."""
    from tests.coordinators import make_coordinator

    run_dir = Path(tempfile.mkdtemp(prefix="fstrain-sim-coord-"))
    coordinator = make_coordinator(run_dir, nnodes=count, names=[f"node{i:05d}" for i in range(count)])
    port = coordinator.listen("127.0.0.1")
    threading.Thread(target=coordinator.tick, daemon=True).start()
    print(json.dumps({"port": port}), flush=True)
    deadline = time.monotonic() + 300
    while coordinator.run.state == "starting" and time.monotonic() < deadline:
        time.sleep(0.1)
    sys.stdin.readline()  # the members are in and beating: measure from here
    cpu0, wall0 = os.times(), time.monotonic()
    time.sleep(window_s)
    cpu1, wall1 = os.times(), time.monotonic()
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    with open("/proc/self/status") as handle:
        status = dict(line.split(":", 1) for line in handle if ":" in line)
    print(json.dumps({"cpu_core": cpu / (wall1 - wall0), "threads": int(status["Threads"]),
                      "rss_mb": int(status["VmRSS"].split()[0]) / 1024, "state": coordinator.run.state}), flush=True)


def member_interval_s(count: int) -> float:
    """The heartbeat interval the members of a run of ``count`` nodes use."""
    from fstrain.io.remote import coordinator

    interval = getattr(coordinator, "heartbeat_interval_s", None)
    return float(interval(count, 30.0)) if interval else coordinator.HEARTBEAT_S


def coordinator_phase(count: int, window_s: float, views: bool = True) -> dict[str, Any]:
    from tests.coordinators import SECRET

    child = subprocess.Popen([sys.executable, __file__, "--serve-coordinator", str(count), "--window-s",
                              str(window_s)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    assert child.stdin is not None and child.stdout is not None
    port = json.loads(child.stdout.readline())["port"]
    interval = member_interval_s(count)
    selector = selectors.DefaultSelector()
    members: list[socket.socket] = []
    last_hb: dict[int, float] = {}
    gaps: dict[int, float] = {}
    for rank in range(1, count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall((json.dumps({"format": 1, "hello": rank, "secret": SECRET}) + "\n").encode())
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, rank)
        members.append(sock)
        if rank % 256 == 0:  # the members in keep beating while the others join
            for member in members:
                member.sendall(b'{"format": 1, "hb": 0}\n')
    # Each beat carries the member's view, as one whose ranks printed since its last beat sends it.
    beats = [(json.dumps({"format": 1, "hb": time.time(), "output_age_s": 0.4,
                          **({"view": node_view(rank, False)} if views else {})}) + "\n").encode()
             for rank in range(1, count)]
    sent = 0
    measuring_from: float | None = None
    stop_at = time.monotonic() + 3.0 + window_s  # the child measures the last window_s of it
    slot_s = 0.01
    per_slot = max(1, round(len(members) * slot_s / interval))
    cursor = 0
    next_slot = time.monotonic()
    buffers: dict[int, bytes] = {}
    while time.monotonic() < stop_at:
        now = time.monotonic()
        if measuring_from is None and now > stop_at - window_s:
            measuring_from = now
            sent = 0
            gaps.clear()
            child.stdin.write("go\n")
            child.stdin.flush()
        if now >= next_slot:  # this slot's members beat
            for index, sock in enumerate(members[cursor:cursor + per_slot], start=cursor):
                try:
                    sock.send(beats[index])
                    sent += 1
                except OSError:  # a full buffer: this beat is late, as a loaded member's would be
                    pass
            cursor = (cursor + per_slot) % len(members)
            next_slot += slot_s * (per_slot * interval / (len(members) * slot_s))
        for key, _ in selector.select(timeout=0.002):
            rank = key.data
            try:
                data = key.fileobj.recv(65536)  # type: ignore[union-attr]
            except OSError:
                continue
            buffers[rank] = buffers.get(rank, b"") + data
            if b'"hb"' in buffers[rank]:
                seen = time.monotonic()
                if rank in last_hb and measuring_from is not None:
                    gaps[rank] = max(gaps.get(rank, 0.0), seen - last_hb[rank])
                last_hb[rank] = seen
            buffers[rank] = buffers[rank][buffers[rank].rfind(b"\n") + 1:]
    end = time.monotonic()
    for rank in range(1, count):  # a member still waiting at the end has waited that long at least
        gaps[rank] = max(gaps.get(rank, 0.0), end - max(last_hb.get(rank, 0.0), measuring_from or end))
    figures = json.loads(child.stdout.readline())
    measured_s = end - (measuring_from or end)
    for sock in members:
        sock.close()
    child.wait(30)
    return {"phase": "coordinator", "hosts": count, "interval_s": interval, "received_per_s": sent / measured_s,
            "max_hb_gap_s": max(gaps.values(), default=float("nan")),
            "p50_hb_gap_s": sorted(gaps.values())[len(gaps) // 2] if gaps else float("nan"),
            "unheard": sum(1 for rank in range(1, count) if last_hb.get(rank, 0.0) < (measuring_from or end)),
            **figures}


# -- the table ---------------------------------------------------------------------------------------


def slope_per_1000(xs: list[int], ys: list[float]) -> float:
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    return 1000 * sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def growth(xs: list[int], ys: list[float]) -> float:
    """The last step's cost per host over the first step's (1.0 linear)."""
    if len(xs) < 3:
        return float("nan")
    first = (ys[1] - ys[0]) / (xs[1] - xs[0])
    last = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return last / first if first > 0 else float("nan")


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    sizes = [r["hosts"] for r in rows]
    out = ["| hosts | " + " | ".join(columns) + " |", "|---:|" + "---:|" * len(columns)]
    for row in rows:
        out.append(f"| {row['hosts']:,} | " + " | ".join(f"{row[c]:,}" if isinstance(row[c], int) else f"{row[c]:,.3g}"
                                                   for c in columns) + " |")
    out.append("| slope /1000 hosts | " + " | ".join(f"{slope_per_1000(sizes, [r[c] for r in rows]):,.3g}"
                                                   for c in columns) + " |")
    out.append("| growth | " + " | ".join(f"{growth(sizes, [r[c] for r in rows]):.2f}" for c in columns) + " |")
    return "\n".join(out)


def run_child(args: list[str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="256,1024,4096")
    parser.add_argument("--window-s", type=float, default=8.0)
    parser.add_argument("--phases", default="start,status,logs,stop,coordinator")
    parser.add_argument("--no-views", action="store_true",
                        help="members' heartbeats without their views (as before status read them there)")
    parser.add_argument("--one", nargs=2, metavar=("PHASE", "HOSTS"), help=argparse.SUPPRESS)
    parser.add_argument("--serve-coordinator", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_coordinator:
        serve_coordinator(args.serve_coordinator, args.window_s)
        return 0
    if args.one:
        phase, count = args.one[0], int(args.one[1])
        result = coordinator_phase(count, args.window_s, not args.no_views) if phase == "coordinator" \
            else client_phase(phase, count)
        print(json.dumps(result))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"# {machine_line()}")
    print(f"# python benchmarks/control_plane_sim.py --sizes {args.sizes} --window-s {args.window_s:g}"
          + (" --no-views" if args.no_views else ""))
    for phase in args.phases.split(","):
        rows = [run_child(["--one", phase, str(n), "--window-s", str(args.window_s),
                           *(["--no-views"] if args.no_views else [])]) for n in sizes]
        print(f"\n## {phase}")
        if phase == "coordinator":
            print(table(rows, ["interval_s", "received_per_s", "cpu_core", "threads", "rss_mb", "p50_hb_gap_s",
                               "max_hb_gap_s", "unheard"]))
        else:
            print(table(rows, ["wall_s", "sessions", "connections", "sent_mb", "cpu_s", "rss_mb", "in_flight_max"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
