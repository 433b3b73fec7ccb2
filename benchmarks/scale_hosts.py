"""Detached runs on many real hosts: launch, `status`, `logs --tail`, `stop` and `gc` against the host count.

Numbers, not a test. The namespace cluster (`scripts/testcluster.sh up N`, cluster id
FSTRAIN_TESTCLUSTER_ID or 8, state in a temporary folder, one sshd per host) comes up once at the
largest size; each size then uses its first hosts. Per size, a trivial program (one rank per
host, which writes a marker file and sleeps), started by `--backend` (default direct: fstrain's
own rank script; torchrun's agent takes about 150 MB and 1.5 CPU-s per host, so 128 of them do
not fit a 24 GiB machine):

- with --attached: `fstrain launch` (attached) to all started (every rank's marker file written;
  the hosts share this disk), then SIGINT to it, to its exit and to no job process left;
- --runs detached runs, each: `fstrain launch --detach` to its return (the run recorded, every
  node answered) and to all started; then --steady-s seconds of the run left alone (longer than
  the 30 s heartbeat timeout, so a control plane that cannot keep up ends the job there), and
  every rank must still be alive after it;
- with --lost-host: a detached run with `--on-failure exclude --max-restarts 1` whose last host
  (its sshd and every process on it) is killed once all started, timed to the next attempt's
  ranks started on the other hosts (the loss is seen after `--heartbeat-timeout`, 30 s), then
  stopped;
- on the first detached run: `status RUN --json` (and how many ranks it saw alive),
  `logs RUN --tail 5`, and `status RUN --watch --json` to its first refresh (its first line);
- `stop RUN` to its return, and to no job process left in any host's namespace (sshd aside);
- `gc --older-than 1s` afterwards;
- the floor of this machine: `pdsh -R ssh` starting the same program on every host (detached,
  nothing of fstrain), timed to all started. Every host's sshd and program share this machine's
  CPUs, so this time grows with the host count whatever the launcher does; fstrain's launch is
  reported against it.

For every command: wall seconds, the client's CPU seconds (user + system of the process and its
children) and peak RSS, and the peak of its open files and threads (sampled every 20 ms). Node
0's coordinator: its CPU share of one core while the run is steady and its CPU seconds from the
start to the stop. Processes left after each stop are counted, then killed.

    python benchmarks/scale_hosts.py [--sizes 4,32,128,200] [--backend direct|torchrun]
                                     [--runs 1] [--steady-s 40] [--attached] [--lost-host]
                                     [--plain-home]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
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
rank, attempt = os.environ["RANK"], os.environ.get("FSTRAIN_RESTART", "0")
pathlib.Path(sys.argv[1], "a" + attempt + "-rank-" + rank).write_text(str(os.getpid()))
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
class DetachedRun:
    """One detached run: to all started, alive after the steady period, its stop."""

    all_started_s: float = 0.0
    alive_after_steady: int = 0
    stop_to_empty_s: float = 0.0
    left: int = 0


@dataclass
class SizeResult:
    hosts: int
    rows: dict[str, Measured] = field(default_factory=dict)
    runs: list[DetachedRun] = field(default_factory=list)
    ranks_alive: int = 0  # as `status` saw them (first run)
    coordinator_steady_pct: float = 0.0
    coordinator_cpu_s: float = 0.0
    attached_all_started_s: float = 0.0
    attached_exit_s: float = 0.0  # SIGINT to the client's exit
    attached_to_empty_s: float = 0.0  # SIGINT to no job process left
    attached_left: int = 0
    lost_to_restarted_s: float = 0.0  # --lost-host: the last host killed to the next attempt started (-1: never)
    lost_stop_code: int = 0
    lost_left: int = 0
    floor_all_started_s: float = 0.0  # pdsh starting the same program (0: pdsh not installed)
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


class Client:
    """One fstrain command running: its peaks sampled until :meth:`wait` collects it."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        # Closed by wait(), which every Client gets.
        self.out, self.err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115
        self.start = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdout=self.out, stderr=self.err, env=env, cwd=REPO)
        self.peaks = {"files": 0, "threads": 0}
        self.done = threading.Event()
        self.sampler = threading.Thread(target=sample_peaks, args=(self.proc.pid, self.peaks, self.done), daemon=True)
        self.sampler.start()

    def exited(self) -> bool:
        """Whether it has exited, without collecting it (wait() reads its resource use)."""
        return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None

    def wait(self, timeout_s: float = 900) -> Measured:
        """Until it exits (killed past ``timeout_s``): wall, CPU (with children), peak RSS, files, threads."""
        deadline = time.perf_counter() + timeout_s
        while True:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                self.proc.kill()
            time.sleep(0.01)
        wall = time.perf_counter() - self.start
        self.done.set()
        self.sampler.join()
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        texts = []
        for handle in (self.out, self.err):
            handle.seek(0)
            texts.append(handle.read().decode(errors="replace"))
            handle.close()
        return Measured(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, self.peaks["files"],
                        self.peaks["threads"], texts[0], texts[1], self.proc.returncode)


def until_first_line(argv: list[str], env: dict[str, str], timeout_s: float = 300) -> Measured:
    """Run ``argv`` until it has printed its first line on stdout (a command that goes on, as
    `status --watch --json` does), then SIGINT it: wall to that line, CPU to its exit."""
    client = Client(argv, env)
    wait_for(lambda: b"\n" in os.pread(client.out.fileno(), 1 << 16, 0) or client.exited(), timeout_s, 0.02)
    wall = time.perf_counter() - client.start
    if not client.exited():
        os.kill(client.proc.pid, signal.SIGINT)
    measured = client.wait()
    measured.wall_s = wall
    if measured.stdout.strip():  # it answered: ended by the SIGINT, not failed
        measured.code = 0
    return measured


def measure(argv: list[str], env: dict[str, str], timeout_s: float = 900) -> Measured:
    """Run ``argv`` once: wall, CPU (with children), peak RSS, peak open files and threads."""
    return Client(argv, env).wait(timeout_s)


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


@dataclass(frozen=True)
class Setup:
    """What every command of one size shares."""

    hosts: int
    state: Path
    work: Path
    cluster: NamespaceCluster
    env: dict[str, str]
    backend: str
    python: str = "python3"  # the hosts' interpreter (--python)

    def fstrain(self, command: str, *args: str) -> list[str]:
        return [sys.executable, "-m", "fstrain", command, "--ssh-config", str(self.state / "ssh_config"), *args]

    def launch_args(self, markers: Path, run_dir: Path, *extra: str) -> list[str]:
        return self.fstrain("launch", *extra, "--hosts", f"node[1-{self.hosts}]", "--nproc-per-node", "1",
                            "--backend", self.backend, "--python", self.python, "--grace", "5", "--run-dir",
                            str(run_dir), "--",
                            "python3", str(self.work / "sleeper.py"), str(markers))


def markers_written(markers: Path, attempt: int = 0) -> int:
    """Ranks of ``attempt`` (FSTRAIN_RESTART) that have started."""
    return len(list(markers.glob(f"a{attempt}-rank-*")))


def alive_ranks(markers: Path) -> int:
    """Ranks of the first attempt whose process (the pid in its marker) still runs."""
    return sum(Path(f"/proc/{marker.read_text()}").exists() for marker in markers.glob("a0-rank-*"))


def until_none_left(setup: Setup, since: float) -> tuple[float, int]:
    """Wait until no job process is left in any host's namespace (sshd aside; 300 s at most):
    the seconds from ``since`` (a perf_counter time) to then, and how many were still left,
    counted, then killed."""
    wait_for(lambda: not job_processes(setup.cluster), 300, 0.5)
    seconds = time.perf_counter() - since
    return seconds, sum(len(found) for found in kill_job_processes(setup.cluster).values())


def attached_run(setup: Setup, result: SizeResult) -> None:
    """An attached launch to all started; SIGINT to its exit and to no job process left."""
    markers = setup.work / f"markers-{setup.hosts}-attached"
    markers.mkdir()
    client = Client(setup.launch_args(markers, setup.work / f"run-{setup.hosts}-attached"), setup.env)
    wait_for(lambda: markers_written(markers) >= setup.hosts or client.exited(), 900, 0.1)
    result.attached_all_started_s = time.perf_counter() - client.start
    interrupted = time.perf_counter()
    os.kill(client.proc.pid, signal.SIGINT)  # not Popen.send_signal, which collects an exited child
    measured = client.wait()
    result.rows["launch (attached)"] = measured
    result.attached_exit_s = time.perf_counter() - interrupted
    result.attached_to_empty_s, result.attached_left = until_none_left(setup, interrupted)
    if measured.code not in (0, 130):
        result.note = f"attached launch ended {measured.code}: {measured.stderr.strip().splitlines()[-1:]}"


def detached_run(setup: Setup, result: SizeResult, index: int, steady_s: float, run_ids: list[str]) -> bool:
    """One detached run; the first one also measures status, logs and the coordinator. False
    where the launch failed (said in the note)."""
    markers, run_dir = setup.work / f"markers-{setup.hosts}-{index}", setup.work / f"run-{setup.hosts}-{index}"
    markers.mkdir()
    launch = measure(setup.launch_args(markers, run_dir, "--detach"), setup.env)
    first = index == 0
    if first:
        result.rows["launch --detach"] = launch
    if launch.code != 0:
        result.note = f"run {index + 1}: launch failed ({launch.code}): {launch.stderr.strip().splitlines()[-1:]}"
        kill_job_processes(setup.cluster)
        return False
    run = DetachedRun()
    result.runs.append(run)
    run_id = launch.stdout.strip()
    run_ids.append(run_id)
    started = time.perf_counter() - launch.wall_s
    wait_for(lambda: markers_written(markers) >= setup.hosts, 900, 0.1)
    run.all_started_s = time.perf_counter() - started
    coordinator = json.loads((run_dir / "detached.json").read_text())["nodes"][0].get("watchdog_pid")
    before = cpu_seconds(coordinator) if coordinator else 0.0
    time.sleep(steady_s)
    if coordinator and first:
        result.coordinator_steady_pct = 100 * (cpu_seconds(coordinator) - before) / steady_s
    run.alive_after_steady = alive_ranks(markers)
    if first:
        status = measure(setup.fstrain("status", run_id, "--json"), setup.env)
        result.rows["status --json"] = status
        if status.code == 0:
            result.ranks_alive = sum(len(n.get("ranks_alive", [])) for n in json.loads(status.stdout)["nodes"])
        result.rows["logs --tail 5"] = measure(setup.fstrain("logs", run_id, "--tail", "5"), setup.env)
        result.rows["status --watch (first refresh)"] = until_first_line(
            setup.fstrain("status", run_id, "--watch", "--json"), setup.env)
        if coordinator:
            result.coordinator_cpu_s = cpu_seconds(coordinator)
    stop = measure(setup.fstrain("stop", run_id), setup.env)
    if first:
        result.rows["stop"] = stop
    stop_began = time.perf_counter() - stop.wall_s
    run.stop_to_empty_s, run.left = until_none_left(setup, stop_began)
    return True


def lost_host_run(setup: Setup, result: SizeResult, run_ids: list[str]) -> None:
    """`--on-failure exclude`: once all started, the last host's sshd and every process on it
    are killed; timed to the run's next attempt started on the other hosts, then stopped."""
    markers, run_dir = setup.work / f"markers-{setup.hosts}-lost", setup.work / f"run-{setup.hosts}-lost"
    markers.mkdir()
    launch = measure(setup.launch_args(markers, run_dir, "--detach", "--on-failure", "exclude",
                                       "--max-restarts", "1"), setup.env)
    if launch.code != 0:
        result.note = f"lost host: launch failed ({launch.code}): {launch.stderr.strip().splitlines()[-1:]}"
        kill_job_processes(setup.cluster)
        return
    run_id = launch.stdout.strip()
    run_ids.append(run_id)
    wait_for(lambda: markers_written(markers) >= setup.hosts, 900, 0.1)
    lost_at = time.perf_counter()
    setup.cluster.script("stop-sshd", str(setup.hosts))
    restarted = wait_for(lambda: markers_written(markers, 1) >= setup.hosts - 1, 600, 0.2)
    result.lost_to_restarted_s = time.perf_counter() - lost_at if restarted else -1.0
    if not restarted:  # why, in the recovery keeper's own words
        keeper_log = run_dir / "keeper.log"
        said = keeper_log.read_text(errors="replace").strip().splitlines() if keeper_log.exists() else []
        result.note = f"lost host: no next attempt; keeper.log ends: {said[-3:]}"
    stop = measure(setup.fstrain("stop", run_id), setup.env)
    result.lost_stop_code = stop.code
    _, result.lost_left = until_none_left(setup, time.perf_counter())
    setup.cluster.script("start-sshd", str(setup.hosts))  # the larger sizes need it


def floor_run(setup: Setup, result: SizeResult) -> None:
    """`pdsh -R ssh` starting the sleeper detached on every host (one ssh process a host, 256 at
    a time), timed to all started; then every job process killed."""
    if shutil.which("pdsh") is None:
        return
    markers = setup.work / f"markers-{setup.hosts}-pdsh"
    markers.mkdir()
    # pdsh's %n: the host's index in the list, so each rank's marker file is its own.
    program = f"RANK=%n setsid python3 {setup.work / 'sleeper.py'} {markers} </dev/null >/dev/null 2>&1 &"
    env = {**setup.env, "PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS": f"-F {setup.state / 'ssh_config'} -a -x -l%u %h"}
    began = time.perf_counter()
    pdsh = measure(["pdsh", "-f", "256", "-w", f"node[1-{setup.hosts}]", program], env, timeout_s=300)
    if pdsh.code == 0 and wait_for(lambda: markers_written(markers) >= setup.hosts, 300, 0.05):
        result.floor_all_started_s = time.perf_counter() - began
    else:
        result.note = f"pdsh start failed ({pdsh.code}): {pdsh.stderr.strip().splitlines()[-1:]}"
    wait_for(lambda: not kill_job_processes(setup.cluster), 30, 0.5)


def one_size(hosts: int, state: Path, work: Path, cluster_id: str, options: argparse.Namespace,
             run_ids: list[str]) -> SizeResult:
    result = SizeResult(hosts)
    home = work / f"home-{hosts}"
    home.mkdir(parents=True)
    (work / "sleeper.py").write_text(SLEEPER)
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("FSTRAIN_DEBUG", None)
    setup = Setup(hosts, state, work, NamespaceCluster(state, hosts, cluster_id), env, options.backend,
                  sys.executable if options.plain_home else "python3")
    floor_run(setup, result)
    if options.attached:
        attached_run(setup, result)
    for index in range(options.runs):
        if not detached_run(setup, result, index, options.steady_s, run_ids):
            break
    if options.lost_host:
        lost_host_run(setup, result, run_ids)
    result.rows["gc"] = measure(setup.fstrain("gc", "--older-than", "1s"), env)
    return result


def print_report(results: list[SizeResult], options: argparse.Namespace) -> None:
    print(f"machine: {machine_line()}")
    print(f"backend {options.backend}; {options.runs} detached run(s) per size, each left alone {options.steady_s:g} s "
          "once all started; the hosts' HOME " + ("empty (--plain-home)" if options.plain_home else "this machine's"))
    print("\n| hosts | launch returns (s) | all started (s) | pdsh: all started (s) | status (s) | ranks alive "
          "| logs --tail 5 (s) | watch: first refresh (s) "
          "| stop returns (s) | stop to 0 left (s) | gc (s) | left | coordinator steady (% of a core) "
          "| coordinator CPU (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        w = {name: (f"{m.wall_s:.1f}" if m.code == 0 else f"exit {m.code}") for name, m in r.rows.items()}
        first = r.runs[0] if r.runs else DetachedRun()
        floor = f"{r.floor_all_started_s:.1f}" if r.floor_all_started_s else "-"
        print(f"| {r.hosts} | {w.get('launch --detach', '-')} | {first.all_started_s:.1f} | {floor} "
              f"| {w.get('status --json', '-')} | {r.ranks_alive} of {r.hosts} | {w.get('logs --tail 5', '-')} "
              f"| {w.get('status --watch (first refresh)', '-')} "
              f"| {w.get('stop', '-')} | {first.stop_to_empty_s:.1f} | {w.get('gc', '-')} | {first.left} "
              f"| {r.coordinator_steady_pct:.1f} | {r.coordinator_cpu_s:.1f} |")
    if options.runs > 1:
        print("\nEvery detached run (all started s / ranks alive after the steady period / stop to 0 left s / left):\n")
        print("| hosts | runs started and kept running | per run |")
        print("|---|---|---|")
        for r in results:
            kept = sum(run.alive_after_steady == r.hosts for run in r.runs)
            each = "; ".join(f"{run.all_started_s:.1f} / {run.alive_after_steady} / {run.stop_to_empty_s:.1f} / "
                             f"{run.left}" for run in r.runs)
            print(f"| {r.hosts} | {kept} of {options.runs} | {each} |")
    if options.attached:
        print("\n| hosts | attached: all started (s) | SIGINT to exit (s) | SIGINT to 0 left (s) | left |")
        print("|---|---|---|---|---|")
        for r in results:
            print(f"| {r.hosts} | {r.attached_all_started_s:.1f} | {r.attached_exit_s:.1f} "
                  f"| {r.attached_to_empty_s:.1f} | {r.attached_left} |")
    if options.lost_host:
        print("\n| hosts | `--on-failure exclude`: last host killed to the next attempt started on the rest (s) "
              "| stop's exit | left |")
        print("|---|---|---|---|")
        for r in results:
            restarted = f"{r.lost_to_restarted_s:.1f}" if r.lost_to_restarted_s >= 0 else "never"
            print(f"| {r.hosts} | {restarted} | {r.lost_stop_code} | {r.lost_left} |")
    print("\nThe client per command (CPU seconds, peak RSS MB, peak open files, peak threads):\n")
    print("| hosts | command | CPU (s) | RSS (MB) | files | threads |")
    print("|---|---|---|---|---|---|")
    for r in results:
        for name, m in r.rows.items():
            print(f"| {r.hosts} | {name} | {m.cpu_s:.1f} | {m.rss_mb:.0f} | {m.files} | {m.threads} |")
    for r in results:
        failed = [f"{name}: {m.stderr.strip().splitlines()[-1:]}" for name, m in r.rows.items()
                  if m.code and not (name == "launch (attached)" and m.code == 130)]
        for line in ([r.note] if r.note else []) + failed:
            print(f"\n{r.hosts} hosts: {line}")
    base = next((r for r in results if r.hosts == 32 and r.runs), None)
    if base is not None and len(results) > 1:
        print(f"\nRatios to {base.hosts} hosts (launch to all started; stop to 0 left; first detached run; "
              "pdsh starting the same program):")
        for r in results:
            if r.runs and base.runs[0].all_started_s and base.runs[0].stop_to_empty_s:
                floor = (f"; pdsh {r.floor_all_started_s / base.floor_all_started_s:.2f}x"
                         if r.floor_all_started_s and base.floor_all_started_s else "")
                print(f"- {r.hosts} hosts: {r.runs[0].all_started_s / base.runs[0].all_started_s:.2f}x; "
                      f"{r.runs[0].stop_to_empty_s / base.runs[0].stop_to_empty_s:.2f}x{floor}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4,32,128,200",
                        help="host counts, comma-separated (each <= 200, the test cluster's most)")
    parser.add_argument("--backend", default="direct", choices=("direct", "torchrun"),
                        help="how each host starts its rank (torchrun: about 150 MB per host)")
    parser.add_argument("--runs", type=int, default=1, help="detached runs per size")
    parser.add_argument("--steady-s", type=float, default=40.0,
                        help="seconds each detached run is left alone once all started (past the heartbeat timeout)")
    parser.add_argument("--attached", action="store_true", help="also an attached launch per size")
    parser.add_argument("--plain-home", action="store_true",
                        help="the hosts' sessions get an empty HOME, not this machine's (whose ~/.bashrc every "
                             "SSH session runs), and --python is this interpreter's path (no pyenv shim per start)")
    parser.add_argument("--lost-host", action="store_true",
                        help="also a run with --on-failure exclude whose last host is killed once all started")
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
        with namespace_cluster(max(sizes), work, cluster_id, run_ids, args.plain_home) as state:
            for hosts in sizes:
                print(f"# {hosts} hosts ...", file=sys.stderr, flush=True)
                results.append(one_size(hosts, state, work, cluster_id, args, run_ids))
        print_report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
