"""Line integrity: every line of every rank, once and whole, per backend and mode, and the
relay's throughput.

Numbers, not a test (tests/cluster/test_line_integrity.py is the test). On the namespace cluster
(`scripts/testcluster.sh up 2` in a temporary state folder, cluster id FSTRAIN_TESTCLUSTER_ID or
7, so other sessions' clusters are untouched), or on this machine alone with --localhost (one
node, no SSH), `fstrain launch` runs the line-integrity writer (tests/cluster/programs/lines.py)
on every rank: --lines lines each, plain ones, ones written in two writes, ones on stderr, ones
with invalid UTF-8 bytes, and one in --long-every of 64 KiB. Attached, `fstrain launch`'s stdout
is read as it comes; detached, `fstrain logs RUN --follow`, then each node's `node<I>.out` (the
bytes as the watchdog relayed them). Every path is counted against what the writer wrote
(tests/integrity.py): lines checked, whole, lost, duplicated, broken (split or glued).

Throughput: the ranks' lines (and the bytes the writer wrote) over the time from the first rank
line to the last as they came out of the relay (attached: read on fstrain's stdout; detached:
the times `node<I>.out` records as the node relays them; `logs --follow` reads once a second and
has no pace of its own), so the launchers' start-up is left out. The
writer writes as fast as it can (no pause in two-part lines): the figure is the slower of the
ranks' writing and the relay. Needs root for the cluster (network namespaces), torch and
deepspeed.

    python benchmarks/line_integrity.py [--localhost] [--lines 200000] [--nproc-per-node 2]
        [--long-every 1000] [--backends torchrun,deepspeed] [--modes attached,detached]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the writer's lines: tests/integrity.py
from common import machine_line, namespace_cluster

from tests.integrity import LineReport, check_lines, node_out_lines, rank_line, shown_lines, writer_launch_args

REPO = Path(__file__).resolve().parent.parent
CLUSTER_ID = os.environ.get("FSTRAIN_TESTCLUSTER_ID") or "7"
HOSTS = 2


@dataclass
class Result:
    backend: str
    mode: str
    path: str
    report: LineReport
    seconds: float | None  # first rank line to last, as the relay wrote them (None: not a relay's pace)


@dataclass
class Setup:
    work: Path
    host_args: list[str]
    nodes: int
    args: argparse.Namespace
    run_ids: list[str]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--localhost", action="store_true", help="one node, this machine, no SSH")
    parser.add_argument("--lines", type=int, default=200_000, help="lines per rank")
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--long-every", type=int, default=1000, help="one 64 KiB line in this many")
    parser.add_argument("--backends", default="torchrun,deepspeed")
    parser.add_argument("--modes", default="attached,detached")
    args = parser.parse_args()
    if not args.localhost and os.geteuid() != 0:
        print("line integrity benchmark: the cluster needs root (network namespaces); or give --localhost",
              file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="fstrain-bench-lines-"))
    load_before = os.getloadavg()
    setup = Setup(base / "work", [], 1, args, [])
    setup.work.mkdir()
    results: list[Result] = []
    cluster = contextlib.nullcontext(None) if args.localhost else namespace_cluster(HOSTS, base, CLUSTER_ID,
                                                                                    setup.run_ids)
    try:
        with cluster as state:
            if state is not None:
                setup.host_args = ["--ssh-config", str(state / "ssh_config"), "--hosts", f"node[1-{HOSTS}]"]
                setup.nodes = HOSTS
            for backend in args.backends.split(","):
                for mode in args.modes.split(","):
                    results.extend(one_run(setup, backend, mode))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report(results, setup, load_before, os.getloadavg())
    return 0 if all(r.report.ok for r in results) else 1


def fstrain(setup: Setup, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HOME": str(setup.work / "home"), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "fstrain", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=REPO)


def read_timed(proc: subprocess.Popen[bytes]) -> tuple[bytes, float, bytes]:
    """All of ``proc``'s stdout, the seconds from its first rank line to its last, and its stderr."""
    assert proc.stdout is not None and proc.stderr is not None
    errors: list[bytes] = []
    drain = threading.Thread(target=lambda: errors.append(proc.stderr.read() if proc.stderr else b""), daemon=True)
    drain.start()
    chunks, first, last = [], 0.0, 0.0
    for line in iter(proc.stdout.readline, b""):
        if line.startswith(b"[") and b" r" in line.split(b"]", 1)[0]:
            last = time.monotonic()
            first = first or last
        chunks.append(line)
    proc.wait()
    drain.join()
    return b"".join(chunks), last - first, b"".join(errors)


def one_run(setup: Setup, backend: str, mode: str) -> list[Result]:
    args = setup.args
    run_dir = setup.work / f"run-{backend}-{mode}"
    launch = ["launch", *setup.host_args, "--nproc-per-node", str(args.nproc_per_node), "--grace", "3",
              "--run-dir", str(run_dir), *(["--detach"] if mode == "detached" else []),
              *writer_launch_args(backend, args.lines, args.long_every, 0.0)]
    count = {"ranks": setup.nodes * args.nproc_per_node, "count": args.lines, "long_every": args.long_every}
    started = fstrain(setup, *launch)
    out, seconds, err = read_timed(started)
    if started.returncode != 0:
        raise RuntimeError(f"{backend} {mode}: fstrain launch exited {started.returncode}: {err[-2000:].decode()}")
    if mode == "attached":
        return [Result(backend, mode, "fstrain launch", check_lines(shown_lines(out), decoded=True, **count),
                       seconds)]
    run_id = out.decode().strip()
    setup.run_ids.append(run_id)
    followed, _, _ = read_timed(fstrain(setup, "logs", run_id, "--follow"))  # read once a second: no pace
    detached = json.loads((run_dir / "detached.json").read_text())
    on_nodes, stamps = [], []
    for node in detached["nodes"]:
        raw = Path(node["run_dir"], f"node{node['node_rank']}.out").read_bytes()
        on_nodes += node_out_lines(raw, node["node_rank"] * args.nproc_per_node)
        stamps += [float(line.split(b" ", 1)[0]) for line in raw.split(b"\n") if b" [local" in line[:40]]
    return [Result(backend, mode, "node<I>.out", check_lines(on_nodes, decoded=False, **count),
                   max(stamps) - min(stamps) if stamps else 0.0),
            Result(backend, mode, "logs --follow", check_lines(shown_lines(followed), decoded=True, **count),
                   None)]


def report(results: list[Result], setup: Setup, load_before: tuple[float, ...], load_after: tuple[float, ...]) -> None:
    args = setup.args
    ranks = setup.nodes * args.nproc_per_node
    payload = sum(len(rank_line(r, n, args.long_every)) + 1 for r in range(ranks) for n in range(args.lines))
    where = "localhost" if args.localhost else f"the namespace cluster, {setup.nodes} hosts"
    print(f"{machine_line()}; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"{where} x {args.nproc_per_node} ranks, {args.lines:,} lines per rank (one 64 KiB line in "
          f"{args.long_every:,}), {payload / 1e6:.1f} MB written in all\n")
    print("| backend | mode | read from | lines checked | whole | lost | duplicated | broken | lines/s | MB/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        pace = f"{r.report.checked / r.seconds:,.0f} | {payload / r.seconds / 1e6:.1f}" if r.seconds else "- | -"
        print(f"| {r.backend} | {r.mode} | {r.path} | {r.report.checked:,} | {r.report.whole:,} | {r.report.lost:,} "
              f"| {r.report.duplicated:,} | {r.report.broken:,} | {pace} |")
    for r in results:
        if not r.report.ok:
            print(f"{r.backend} {r.mode} {r.path}: {r.report.summary()}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
