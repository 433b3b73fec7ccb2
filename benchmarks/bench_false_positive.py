"""`fstrain bench` false positives: how often a healthy but loaded cluster gets a host named.

    scripts/testcluster.sh up 4          # as root; FSTRAIN_TESTCLUSTER_ID=K for a cluster of its own
    python benchmarks/bench_false_positive.py [--runs 20] [--shaped-runs 20] [--load 4] [--nice 0]
                                              [--suite pairs] [--shaped 2] [--max-minutes M]

While ``--load`` busy-loop processes (``nice -n NICE python3 -c 'while True: pass'``) keep the
machine's CPUs busy, it runs ``fstrain bench --suite SUITE --json`` on every host of the namespace
test cluster ``--runs`` times and counts the runs that name any host (every host is healthy).
Then it shapes the way into host ``--shaped`` (``tc qdisc ... tbf rate 200mbit`` on its root-side
veth, as tests/cluster/test_bench.py does) and counts, over ``--shaped-runs`` runs, those that
name that host and those that name any other. ``--max-minutes`` stops starting runs after that
long and reports how many ran. Needs root (tc) and the cluster up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import machine_line

from tests.cluster.test_bench import shaped_link
from tests.conftest import NamespaceCluster

REPO = Path(__file__).resolve().parent.parent


def cluster_dir() -> Path:
    cluster_id = os.environ.get("FSTRAIN_TESTCLUSTER_ID", "")
    default = f"/tmp/fstrain-testcluster-{cluster_id}" if cluster_id else "/tmp/fstrain-testcluster"
    return Path(os.environ.get("FSTRAIN_TESTCLUSTER_DIR") or default)


@contextmanager
def cpu_load(processes: int, nice: int) -> Iterator[None]:
    """``processes`` busy loops until the block ends."""
    loops = [subprocess.Popen(["nice", "-n", str(nice), sys.executable, "-c", "while True: pass"])
             for _ in range(processes)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def bench_once(args: argparse.Namespace, run_dir: Path) -> tuple[int, list[str], float]:
    """One `fstrain bench`: its exit code, the hosts it named, and its wall seconds."""
    nodes = int((cluster_dir() / "num_hosts").read_text())
    argv = [sys.executable, "-m", "fstrain", "bench", "--ssh-config", str(cluster_dir() / "ssh_config"),
            "--hosts", f"node[1-{nodes}]", "--suite", args.suite, "--workdir", str(REPO),
            "--run-dir", str(run_dir), "--json"]
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    seconds = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"fstrain bench exited {proc.returncode}: {proc.stderr[-3000:]}")
    return proc.returncode, list(json.loads(proc.stdout)["analysis"].get("outlier_hosts", [])), seconds


def series(args: argparse.Namespace, label: str, runs: int, deadline: float, root: Path) -> list[list[str]]:
    """The hosts named by each of up to ``runs`` runs (fewer once ``deadline`` has passed)."""
    named: list[list[str]] = []
    for run in range(runs):
        if time.monotonic() > deadline:
            break
        code, hosts, seconds = bench_once(args, root / f"{label}{run}")
        named.append(hosts)
        print(f"{label} run {run + 1}: exit {code}, named {hosts or 'nobody'} ({seconds:.0f} s)", flush=True)
    return named


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="healthy runs")
    parser.add_argument("--shaped-runs", type=int, default=20, help="runs with one host's way in shaped")
    parser.add_argument("--load", type=int, default=4, help="busy-loop processes during every run")
    parser.add_argument("--nice", type=int, default=0, help="niceness of the busy loops")
    parser.add_argument("--suite", default="pairs", help="the suites `fstrain bench` runs")
    parser.add_argument("--shaped", type=int, default=2, help="the host whose way in is shaped")
    parser.add_argument("--max-minutes", type=float, default=0, help="start no run after this long (0: no limit)")
    parser.add_argument("--run-root", type=Path, default=Path("/tmp/fstrain-bench-false-positive"))
    args = parser.parse_args()
    if not (cluster_dir() / "ssh_config").is_file():
        print(f"error: no test cluster in {cluster_dir()} (hint: scripts/testcluster.sh up 4, as root)",
              file=sys.stderr)
        return 2
    deadline = time.monotonic() + (args.max_minutes * 60 if args.max_minutes else float("inf"))
    with cpu_load(args.load, args.nice):
        healthy = series(args, "healthy", args.runs, deadline, args.run_root)
        cluster = NamespaceCluster(state=cluster_dir(), num_hosts=int((cluster_dir() / "num_hosts").read_text()),
                                   cluster_id=os.environ.get("FSTRAIN_TESTCLUSTER_ID", ""))
        with shaped_link(cluster, args.shaped):
            limited = series(args, "shaped", args.shaped_runs, deadline, args.run_root)
    target = f"node{args.shaped}"
    print(f"machine: {machine_line()}")
    print(f"command: python benchmarks/bench_false_positive.py --runs {args.runs} --shaped-runs {args.shaped_runs} "
          f"--load {args.load} --nice {args.nice} --suite {args.suite} --shaped {args.shaped}"
          + (f" --max-minutes {args.max_minutes:g}" if args.max_minutes else ""))
    print(f"healthy: {sum(1 for h in healthy if h)} of {len(healthy)} runs named a host")
    print(f"shaped {target}: {sum(1 for h in limited if target in h)} of {len(limited)} runs named it; "
          f"{sum(1 for h in limited if set(h) - {target})} of {len(limited)} named another host")
    return 0


if __name__ == "__main__":
    sys.exit(main())
