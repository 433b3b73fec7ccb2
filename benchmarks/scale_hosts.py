"""Detached runs on many real hosts: launch, `status`, `logs --tail`, `stop` and `gc` against the host count.

Numbers, not a test. The namespace cluster (`scripts/testcluster.sh up N`, cluster id
FSTRAIN_TESTCLUSTER_ID or 8, state in a temporary folder, one sshd per host) comes up once at the
largest size; each size then uses its first hosts. Per size, one detached run of a trivial
program (one rank per host through torchrun, the rank writes a marker file and sleeps):

- launch: `fstrain launch --detach` to its return (the run recorded, every node answered), and
  to all started (every rank's marker file written; the hosts share this disk);
- `status RUN --json` (and how many ranks it saw alive), `logs RUN --tail 5`, each once the run
  is all started;
- `stop RUN` to its return, and to no job process left in any host's namespace (sshd aside);
- `gc --older-than 1s` afterwards.

For every command: wall seconds, the client's CPU seconds (user + system of the process and its
children) and peak RSS, and the peak of its open files and threads (sampled every 20 ms). Node
0's coordinator: its CPU share of one core while the run is steady (over --steady-s seconds) and
its CPU seconds from the start to the stop. Processes left after the stop are counted, then
killed. On a 2-core machine every host's torchrun imports torch (about 1.5 CPU-s each), so the
launch's time to all started is bounded below by that work at large sizes.

    python benchmarks/scale_hosts.py [--sizes 4,32,128,200] [--steady-s 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import machine_line, namespace_cluster

from tests.cluster.launch_helpers import job_processes, kill_job_processes  # the cluster tests' own check
from tests.conftest import NamespaceCluster

REPO = Path(__file__).resolve().parent.parent
SLEEPER = """import os, pathlib, sys, time
rank = os.environ["RANK"]
pathlib.Path(sys.argv[1], "rank-" + rank).write_text(str(os.getpid()))
print("FSTBENCH ready rank=" + rank, flush=True)
time.sleep(3600)
"""


@dataclass
class Measured:
    """One command's cost on this machine."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    rss_mb: float = 0.0
    files: int = 0
    threads: int = 0
    stdout: str = ""
    stderr: str = ""
    code: int = 0


@dataclass
class SizeResult:
    hosts: int
    rows: dict[str, Measured] = field(default_factory=dict)
    all_started_s: float = 0.0
    stop_to_empty_s: float = 0.0
    ranks_alive: int = 0
    left: int = 0
    coordinator_steady_pct: float = 0.0
    coordinator_cpu_s: float = 0.0
    note: str = ""


def sample_peaks(pid: int, peaks: dict[str, int], done: threading.Event) -> None:
    """The highest count of open files and threads of ``pid`` seen until ``done``."""
    while not done.is_set():
        try:
            files = len(os.listdir(f"/proc/{pid}/fd"))
            threads = int(next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                               if line.startswith("Threads:")))
        except (OSError, StopIteration, ValueError):
            return
        peaks["files"] = max(peaks["files"], files)
        peaks["threads"] = max(peaks["threads"], threads)
        done.wait(0.02)


def measure(argv: list[str], env: dict[str, str], timeout_s: float = 900) -> Measured:
    """Run ``argv`` once: wall, CPU (with children), peak RSS, peak open files and threads."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=REPO)
        peaks = {"files": 0, "threads": 0}
        done = threading.Event()
        sampler = threading.Thread(target=sample_peaks, args=(proc.pid, peaks, done), daemon=True)
        sampler.start()
        deadline = start + timeout_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
            time.sleep(0.01)
        wall = time.perf_counter() - start
        done.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Measured(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, peaks["files"],
                        peaks["threads"], out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                        proc.returncode)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(predicate, timeout_s: float, step_s: float = 0.2) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return bool(predicate())


def one_size(hosts: int, state: Path, work: Path, cluster_id: str, steady_s: float,
             run_ids: list[str]) -> SizeResult:
    result = SizeResult(hosts)
    home, run_dir, markers = work / f"home-{hosts}", work / f"run-{hosts}", work / f"markers-{hosts}"
    for folder in (home, markers):
        folder.mkdir(parents=True)
    script = work / "sleeper.py"
    script.write_text(SLEEPER)
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("FSTRAIN_DEBUG", None)
    fstrain = [sys.executable, "-m", "fstrain"]
    cluster = NamespaceCluster(state, hosts, cluster_id)  # its first ``hosts`` hosts
    launch = measure([*fstrain, "launch", "--detach", "--ssh-config", str(state / "ssh_config"),
                      "--hosts", f"node[1-{hosts}]", "--nproc-per-node", "1", "--grace", "5",
                      "--run-dir", str(run_dir), "--", "python3", str(script), str(markers)], env)
    result.rows["launch --detach"] = launch
    if launch.code != 0:
        result.note = f"launch failed ({launch.code}): {launch.stderr.strip().splitlines()[-1:]}"
        kill_job_processes(cluster)
        return result
    run_id = launch.stdout.strip()
    run_ids.append(run_id)
    started = time.perf_counter() - launch.wall_s
    wait_for(lambda: len(list(markers.iterdir())) >= hosts, 900, 0.1)
    result.all_started_s = time.perf_counter() - started
    detached = json.loads((run_dir / "detached.json").read_text())
    coordinator = detached["nodes"][0].get("watchdog_pid")
    if coordinator:
        before = cpu_seconds(coordinator)
        time.sleep(steady_s)
        result.coordinator_steady_pct = 100 * (cpu_seconds(coordinator) - before) / steady_s
    status = measure([*fstrain, "status", run_id, "--json", "--ssh-config", str(state / "ssh_config")], env)
    result.rows["status --json"] = status
    if status.code == 0:
        result.ranks_alive = sum(len(n.get("ranks_alive", [])) for n in json.loads(status.stdout)["nodes"])
    result.rows["logs --tail 5"] = measure([*fstrain, "logs", run_id, "--tail", "5", "--ssh-config",
                                            str(state / "ssh_config")], env)
    if coordinator:
        result.coordinator_cpu_s = cpu_seconds(coordinator)
    stop = measure([*fstrain, "stop", run_id, "--ssh-config", str(state / "ssh_config")], env)
    result.rows["stop"] = stop
    stop_began = time.perf_counter() - stop.wall_s
    wait_for(lambda: not job_processes(cluster), 300, 0.5)
    result.stop_to_empty_s = time.perf_counter() - stop_began
    result.left = sum(len(found) for found in kill_job_processes(cluster).values())  # counted, then killed
    result.rows["gc"] = measure([*fstrain, "gc", "--older-than", "1s", "--ssh-config", str(state / "ssh_config")],
                                env)
    return result


def print_report(results: list[SizeResult]) -> None:
    print(f"machine: {machine_line()}")
    print("\n| hosts | launch returns (s) | all started (s) | status (s) | ranks alive | logs --tail 5 (s) "
          "| stop returns (s) | stop to 0 left (s) | gc (s) | left | coordinator steady (% of a core) "
          "| coordinator CPU (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        w = {name: (f"{m.wall_s:.1f}" if m.code == 0 else f"exit {m.code}") for name, m in r.rows.items()}
        print(f"| {r.hosts} | {w.get('launch --detach', '-')} | {r.all_started_s:.1f} | {w.get('status --json', '-')} "
              f"| {r.ranks_alive} of {r.hosts} | {w.get('logs --tail 5', '-')} | {w.get('stop', '-')} "
              f"| {r.stop_to_empty_s:.1f} | {w.get('gc', '-')} | {r.left} | {r.coordinator_steady_pct:.1f} "
              f"| {r.coordinator_cpu_s:.1f} |")
    print("\nThe client per command (CPU seconds, peak RSS MB, peak open files, peak threads):\n")
    print("| hosts | command | CPU (s) | RSS (MB) | files | threads |")
    print("|---|---|---|---|---|---|")
    for r in results:
        for name, m in r.rows.items():
            print(f"| {r.hosts} | {name} | {m.cpu_s:.1f} | {m.rss_mb:.0f} | {m.files} | {m.threads} |")
    for r in results:
        failed = [f"{name}: {m.stderr.strip().splitlines()[-1:]}" for name, m in r.rows.items() if m.code]
        for line in ([r.note] if r.note else []) + failed:
            print(f"\n{r.hosts} hosts: {line}")
    if len(results) > 1:
        base = next((r for r in results if r.hosts == 32), results[0])
        print(f"\nRatios to {base.hosts} hosts (launch to all started; stop to 0 left):")
        for r in results:
            if base.all_started_s and base.stop_to_empty_s:
                print(f"- {r.hosts} hosts: {r.all_started_s / base.all_started_s:.2f}x; "
                      f"{r.stop_to_empty_s / base.stop_to_empty_s:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4,32,128,200", help="host counts, comma-separated (each <= 245)")
    parser.add_argument("--steady-s", type=float, default=10.0, help="seconds to sample the coordinator's CPU")
    args = parser.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    if os.geteuid() != 0 or not shutil.which("sshd", path="/usr/sbin:" + os.environ.get("PATH", "")):
        print("needs root and openssh-server (the namespace cluster)", file=sys.stderr)
        return 2
    cluster_id = os.environ.get("FSTRAIN_TESTCLUSTER_ID", "8")
    with tempfile.TemporaryDirectory(prefix="fstrain-scale-") as tmp:
        work = Path(tmp)
        results: list[SizeResult] = []
        run_ids: list[str] = []  # their folders on the hosts go with the cluster, whatever gc did
        with namespace_cluster(max(sizes), work, cluster_id, run_ids) as state:
            for hosts in sizes:
                print(f"# {hosts} hosts ...", file=sys.stderr, flush=True)
                results.append(one_size(hosts, state, work, cluster_id, args.steady_s, run_ids))
        print_report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
