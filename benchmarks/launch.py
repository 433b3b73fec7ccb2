"""Launch: `fstrain launch` (torchrun and deepspeed backends) against DeepSpeed's own launcher.

Numbers, not a test. On the real namespace cluster (`scripts/testcluster.sh up N`, cluster id 7
in a temporary state folder, so other sessions' clusters are untouched), each tool launches
the same trivial program on N hosts x P processes:

- start-up: from starting the launcher to the moment the last rank's marker line (the
  program's first action prints `FSTBENCH ready rank=R`) appears on the launcher's output;
- teardown after a failure: once every marker has been seen, the last rank exits 3 while the
  others sleep; from that exit to the launcher having exited and no job process (sshd aside)
  being left in any host's namespace, found as `ip netns pids` finds them.

The tools are `fstrain launch --backend torchrun`, `fstrain launch --backend deepspeed` and
`deepspeed --hostfile F` (its default pdsh runner). DeepSpeed's ssh calls (its ssh check, the
`hostname -I` for the master address, pdsh's ssh) reach the cluster through an `ssh` shim first
on its PATH that adds `-F <cluster ssh_config>`; ~/.ssh is not touched. A launcher that has not
finished the teardown within --observe-s is recorded as "did not stop", with the job processes
still in each namespace; the benchmark then kills them by pid (SIGKILL, so DeepSpeed's signal
handler never runs its `pkill -f`, which on this machine's shared PID space could hit other
sessions' jobs). Tools alternate run by run (ABBA) after one warm-up each; results are medians
and ratios to DeepSpeed's launcher. Needs root, openssh-server, pdsh and deepspeed.

On a 2-core machine a full run takes 3 to 4 minutes (12 launches, 3 of them warm-ups, plus
--observe-s for every DeepSpeed run that does not stop): every per-node launcher (torchrun,
deepspeed.launcher.launch) and DeepSpeed's runner itself import torch, several seconds each.

    python benchmarks/launch.py [--hosts 2] [--nproc-per-node 2] [--rounds 3] [--grace 5] [--observe-s 20]
                                [--plain-home]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, median, namespace_cluster

REPO = Path(__file__).resolve().parent.parent
# Namespaces fst<id>-node1.., subnet 198.18.<id>.0/24: apart from other sessions' clusters
# (FSTRAIN_TESTCLUSTER_ID picks another id, as for the tests).
CLUSTER_ID = os.environ.get("FSTRAIN_TESTCLUSTER_ID") or "7"
TOOLS = ("fstrain launch --backend torchrun", "fstrain launch --backend deepspeed", "deepspeed --hostfile (pdsh)")
BASELINE = TOOLS[2]
MARKER_RE = re.compile(rb"FSTBENCH ready rank=(\d+)")
RUN_ID_RE = re.compile(rb"^run (\S+): ")  # fstrain, once preflight and rendezvous are done
PDSH_CMD_RE = re.compile(rb"\] cmd = pdsh ")  # DeepSpeed's runner, just before it starts pdsh
SSHD_NAMES = ("sshd", "sshd-session")  # the hosts' own servers, not job processes
START_TIMEOUT_S = 120.0

# The job: print the marker first; then the last rank waits for the benchmark's "go" (every
# marker seen), records the time and exits 3, while every other rank sleeps.
PROGRAM = """\
import os, sys, time
rank = int(os.environ["RANK"])
os.write(1, f"FSTBENCH ready rank={rank}\\n".encode())  # one write: ranks share the node's pipe
shared = [arg for arg in sys.argv[1:] if not arg.startswith("--local_rank")][0]  # DeepSpeed adds it first
if rank == int(os.environ["WORLD_SIZE"]) - 1:
    deadline = time.monotonic() + 300
    while not os.path.exists(os.path.join(shared, "go")) and time.monotonic() < deadline:
        time.sleep(0.005)
    with open(os.path.join(shared, "failed.tmp"), "w") as handle:
        handle.write(repr(time.monotonic()))
    os.replace(os.path.join(shared, "failed.tmp"), os.path.join(shared, "failed"))
    os._exit(3)
time.sleep(300)
"""


@dataclass
class Run:
    tool: str
    startup_s: float
    prelaunch_s: float  # until the launcher's checks were done (fstrain's run line, DeepSpeed's pdsh command)
    teardown_s: float | None  # None: not finished within --observe-s
    exit_code: int | None  # None: the launcher was still running
    leftovers: dict[str, list[str]] = field(default_factory=dict)  # namespace -> "pid role" still there


@dataclass
class Setup:
    work: Path
    hostfile: Path
    ssh_config: Path
    program: Path
    namespaces: list[str]
    world_size: int
    args: argparse.Namespace
    run_ids: list[str]  # fstrain's runs, whose folders its watchdogs made under ~/.fstrain/runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--grace", type=float, default=5.0, help="fstrain's --grace (SIGTERM to SIGKILL)")
    parser.add_argument("--observe-s", type=float, default=20.0,
                        help="how long after the failure a launcher may take before it counts as 'did not stop'")
    parser.add_argument("--log-dir", help="keep every run's launcher output here")
    parser.add_argument("--plain-home", action="store_true",
                        help="the hosts' sessions get an empty HOME: none runs this machine's ~/.bashrc")
    args = parser.parse_args()
    problems = [f"{tool} is not installed" for tool in ("pdsh", "ip") if shutil.which(tool) is None]
    problems += ["deepspeed is not installed"] if deepspeed_script() is None else []
    problems += ["must run as root (network namespaces)"] if os.geteuid() != 0 else []
    if problems:
        print(f"launch benchmark: {'; '.join(problems)}", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="fstrain-bench-launch-"))
    load_before = os.getloadavg()
    run_ids: list[str] = []
    try:
        with namespace_cluster(args.hosts, base, CLUSTER_ID, run_ids, plain_home=args.plain_home) as state:
            runs = compare(prepare(base, state, args, run_ids))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report(runs, args, load_before, os.getloadavg())
    return 0


def deepspeed_script() -> str | None:
    """DeepSpeed's `deepspeed` entry point beside this interpreter (not a pyenv shim, which adds its own start-up)."""
    beside = Path(sys.executable).parent / "deepspeed"
    return str(beside) if beside.exists() else shutil.which("deepspeed")


def prepare(base: Path, state: Path, args: argparse.Namespace, run_ids: list[str]) -> Setup:
    work = base / "work"
    (work / "bin").mkdir(parents=True)
    hostfile = work / "hostfile"
    hostfile.write_text("".join(f"node{i} slots={args.nproc_per_node}\n" for i in range(1, args.hosts + 1)))
    program = work / "fstbench_job.py"
    program.write_text(PROGRAM)
    # DeepSpeed calls plain `ssh HOST ...` (and pdsh execs `ssh`): the shim gives them the cluster's config.
    shim = work / "bin" / "ssh"
    shim.write_text(f"#!/bin/sh\nexec {shutil.which('ssh')} -F {shlex.quote(str(state / 'ssh_config'))} \"$@\"\n")
    shim.chmod(0o755)
    namespaces = [f"fst{CLUSTER_ID}-node{i}" for i in range(1, args.hosts + 1)]
    return Setup(work, hostfile, state / "ssh_config", program, namespaces, args.hosts * args.nproc_per_node, args,
                 run_ids)


def command(setup: Setup, tool: str, run_dir: Path, shared: Path) -> tuple[list[str], dict[str, str]]:
    """argv and environment of one run; every rank runs this interpreter on the job file."""
    job = [sys.executable, str(setup.program), str(shared)]
    if tool == BASELINE:
        script = deepspeed_script()
        assert script is not None
        path = f"{setup.work / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
        return [sys.executable, script, "--hostfile", str(setup.hostfile), *job[1:]], {**os.environ, "PATH": path}
    backend = tool.split()[-1]
    return [sys.executable, "-m", "fstrain", "launch", "--backend", backend,
            "--ssh-config", str(setup.ssh_config), "--hostfile", str(setup.hostfile),
            "--nproc-per-node", str(setup.args.nproc_per_node), "--grace", f"{setup.args.grace:g}",
            "--python", sys.executable, "--run-dir", str(run_dir), "--", *job], dict(os.environ)


def compare(setup: Setup) -> list[Run]:
    runs: list[Run] = []
    for index, tool in enumerate(TOOLS):  # warm-up: page cache, pyc files, host keys; not counted
        one_run(setup, tool, f"warmup{index}")
    for round_index in range(setup.args.rounds):
        order = TOOLS if round_index % 2 == 0 else tuple(reversed(TOOLS))
        for index, tool in enumerate(order):
            runs.append(one_run(setup, tool, f"r{round_index}-{index}"))
            print(f"  {tool}: {describe_run(runs[-1])}", file=sys.stderr, flush=True)
    return runs


def describe_run(run: Run) -> str:
    teardown = f"{run.teardown_s:.2f} s" if run.teardown_s is not None else "did not stop"
    return f"start-up {run.startup_s:.2f} s, teardown {teardown}, exit {run.exit_code}"


class Launcher:
    """One launcher process: its output read line by line, marker times and exit time noted."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, world_size: int) -> None:
        self.world_size = world_size
        self.ready: dict[int, float] = {}
        self.all_ready = threading.Event()
        self.exited_at: float | None = None
        self.output: deque[tuple[float, bytes]] = deque(maxlen=4000)  # (monotonic time, line)
        self.run_id = ""
        self.prelaunch_at: float | None = None
        self.started_at = time.monotonic()
        # Own session, so that a leftover launcher can be killed as a group without signalling us.
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        self.readers = [threading.Thread(target=self._read, args=(stream,), daemon=True)
                        for stream in (self.proc.stdout, self.proc.stderr)]
        for reader in self.readers:
            reader.start()
        threading.Thread(target=self._wait, daemon=True).start()

    def _read(self, stream: IO[bytes] | None) -> None:
        assert stream is not None
        for line in stream:
            now = time.monotonic()
            self.output.append((now, line))
            for rank in map(int, MARKER_RE.findall(line)):  # findall: another rank may share the line
                if rank not in self.ready:
                    self.ready[rank] = now
            if len(self.ready) == self.world_size:
                self.all_ready.set()
            run_id = RUN_ID_RE.match(line)
            if run_id:
                self.run_id = run_id.group(1).decode()
            if (run_id or PDSH_CMD_RE.search(line)) and self.prelaunch_at is None:
                self.prelaunch_at = now

    def wait_all_ready(self, timeout_s: float) -> bool:
        """True once every rank's marker is in; False on timeout or if the launcher exits first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.exited_at is None:
            if self.all_ready.wait(0.1):
                return True
        return self.all_ready.is_set()

    def _wait(self) -> None:
        self.proc.wait()
        self.exited_at = time.monotonic()

    def tail(self, lines: int = 30) -> str:
        return b"".join(line for _, line in list(self.output)[-lines:]).decode(errors="replace")


def one_run(setup: Setup, tool: str, label: str) -> Run:
    run_dir = setup.work / f"run-{label}"
    shared = run_dir / "shared"
    shared.mkdir(parents=True)
    argv, env = command(setup, tool, run_dir, shared)
    launcher = Launcher(argv, env, setup.work, setup.world_size)
    failed_at: float | None = None
    try:
        if not launcher.wait_all_ready(START_TIMEOUT_S):
            when = f"before it exited {launcher.proc.returncode}" if launcher.exited_at else \
                f"within {START_TIMEOUT_S:.0f} s"
            raise RuntimeError(f"{tool}: saw the markers of ranks {sorted(launcher.ready)} of {setup.world_size} "
                               f"{when}; its output ends with:\n{launcher.tail()}")
        startup_s = max(launcher.ready.values()) - launcher.started_at
        prelaunch_s = (launcher.prelaunch_at or float("nan")) - launcher.started_at
        (shared / "go").touch()
        failed_at = wait_for_failure(shared / "failed", launcher, tool)
        teardown_s, leftovers = watch_teardown(launcher, setup.namespaces, failed_at, setup.args.observe_s)
        return Run(tool, startup_s, prelaunch_s, teardown_s, launcher.proc.poll(), leftovers)
    finally:
        clean_up(launcher, setup.namespaces)
        if launcher.run_id:
            setup.run_ids.append(launcher.run_id)
        save_log(setup.args.log_dir, label, tool, launcher, failed_at)


def wait_for_failure(path: Path, launcher: Launcher, tool: str) -> float:
    """The failing rank's own monotonic clock at its exit (CLOCK_MONOTONIC is machine-wide)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if path.exists():
            return float(path.read_text())
        time.sleep(0.005)
    raise RuntimeError(f"{tool}: the failing rank never exited; output ends with:\n{launcher.tail()}")


def watch_teardown(launcher: Launcher, namespaces: Sequence[str], failed_at: float,
                   observe_s: float) -> tuple[float | None, dict[str, list[str]]]:
    """Seconds from the failure until the launcher is gone and every namespace is empty (sshd aside)."""
    while time.monotonic() - failed_at < observe_s:
        if launcher.exited_at is not None and not any(job_processes(namespaces).values()):
            return time.monotonic() - failed_at, {}
        time.sleep(0.02)
    return None, {ns: [describe_process(pid) for pid in pids] for ns, pids in job_processes(namespaces).items()}


def job_processes(namespaces: Sequence[str]) -> dict[str, list[int]]:
    """Per namespace, the pids whose network namespace it is, sshd excluded: what `ip netns pids`
    lists (it compares the same inodes), read in-process so polling every 20 ms stays cheap."""
    wanted: dict[tuple[int, int], str] = {}
    for ns in namespaces:
        ns_file = os.stat(f"/run/netns/{ns}")
        wanted[(ns_file.st_dev, ns_file.st_ino)] = ns
    found: dict[str, list[int]] = {ns: [] for ns in namespaces}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ns_stat = os.stat(f"/proc/{entry}/ns/net")
        except OSError:  # gone, or a zombie: not running
            continue
        owner = wanted.get((ns_stat.st_dev, ns_stat.st_ino))
        if owner is not None and comm(int(entry)) not in SSHD_NAMES:
            found[owner].append(int(entry))
    return found


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def describe_process(pid: int) -> str:
    """``pid role``: a rank of the job, a per-node launcher, or the command's name."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"{pid} (gone)"
    for marker, role in ((b"deepspeed.launcher.launch", "deepspeed.launcher.launch"),
                         (b"torch.distributed.run", "torchrun"), (b"fstbench_job.py", "rank")):
        if any(marker in arg for arg in argv):
            return f"{pid} {role}"
    return f"{pid} {comm(pid)}"


def descendants(root: int) -> list[int]:
    """Every live descendant of ``root``: pdsh puts its ssh clients in sessions of their own."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rfind(")") + 2:].split()[1]), []).append(int(entry))
    found, frontier = [], [root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            found.append(child)
            frontier.append(child)
    return found


def clean_up(launcher: Launcher, namespaces: Sequence[str]) -> None:
    """SIGKILL by pid whatever a run left: the launcher and its children, then the job processes
    in every namespace. SIGKILL on purpose: SIGTERM would make DeepSpeed's runner run
    `pdsh ... pkill -f <python> -u -m deepspeed.launcher.launch`, by pattern, on every host."""
    pids = [launcher.proc.pid, *descendants(launcher.proc.pid)] if launcher.proc.poll() is None else []
    for pid in pids:
        signal_pid(pid)
    launcher.proc.wait()
    for reader in launcher.readers:
        reader.join(timeout=5)
    for _ in range(100):
        leftover = [pid for pids in job_processes(namespaces).values() for pid in pids]
        if not leftover:
            break
        for pid in leftover:
            signal_pid(pid)
        time.sleep(0.05)
    confirm_clean(namespaces)


def signal_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def confirm_clean(namespaces: Sequence[str]) -> None:
    """The check the launch tests use, `ip netns pids`, after the in-process one said clean."""
    for ns in namespaces:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=True).stdout.split()
        jobs = [describe_process(int(pid)) for pid in pids if comm(int(pid)) not in (*SSHD_NAMES, "?")]
        if jobs:
            raise RuntimeError(f"{ns} still has job processes after clean-up: {jobs}")


def save_log(log_dir: str | None, label: str, tool: str, launcher: Launcher, failed_at: float | None) -> None:
    """The launcher's output, each line with its arrival time in seconds since the launcher started."""
    if not log_dir:
        return
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    name = f"{label}-{tool.split()[0]}-{tool.split()[-1].strip('()')}.log"
    lines = [(at - launcher.started_at, line.decode(errors="replace")) for at, line in launcher.output]
    if failed_at is not None:
        lines.append((failed_at - launcher.started_at, "=== the failing rank exits 3 ===\n"))
    if launcher.exited_at is not None:
        code = launcher.proc.returncode
        how = f"exited {code}" if code >= 0 else "killed by the benchmark (SIGKILL)"
        lines.append((launcher.exited_at - launcher.started_at, f"=== launcher {how} ===\n"))
    with (Path(log_dir) / name).open("w") as handle:
        handle.writelines(f"{offset:8.3f} {text}" for offset, text in sorted(lines, key=lambda pair: pair[0]))


def report(runs: list[Run], args: argparse.Namespace, load_before: tuple[float, ...],
           load_after: tuple[float, ...]) -> None:
    if not runs:
        return
    by_tool = {tool: [run for run in runs if run.tool == tool] for tool in TOOLS}
    print(f"machine: {machine_line()}")
    print(f"load average (1 min) before/after: {load_before[0]:.2f} / {load_after[0]:.2f}")
    print(f"command: {shlex.join(['python', 'benchmarks/launch.py', *sys.argv[1:]])}")
    print(f"cluster: {args.hosts} hosts x {args.nproc_per_node} processes; fstrain --grace {args.grace:g}; "
          f"teardown observed for {args.observe_s:g} s after the failure\n")
    base_startup = median([run.startup_s for run in by_tool[BASELINE]])
    base_teardown = median([teardown_or_inf(run) for run in by_tool[BASELINE]])
    print("| launcher | start-up: every rank running (s) | ratio | of which until the checks are done (s) | "
          "teardown after a failure (s) | ratio | exit code |")
    print("|---|---|---|---|---|---|---|")
    for tool, tool_runs in by_tool.items():
        startup = median([run.startup_s for run in tool_runs])
        teardown = median([teardown_or_inf(run) for run in tool_runs])
        codes = sorted({str(run.exit_code) if run.exit_code is not None else "still running" for run in tool_runs})
        print(f"| {tool} | {startup:.2f} | {startup / base_startup:.2f} | "
              f"{median([run.prelaunch_s for run in tool_runs]):.2f} | {show_teardown(teardown, args.observe_s)} | "
              f"{teardown_ratio(teardown, base_teardown, args.observe_s)} | {', '.join(codes)} |")
    print("\nmedians of the runs; ratio: the launcher's median / DeepSpeed's launcher's median "
          "(below 1: faster than DeepSpeed's)")
    for tool, tool_runs in by_tool.items():
        print(f"runs, {tool}: start-up {', '.join(f'{run.startup_s:.2f}' for run in tool_runs)}; "
              f"teardown {', '.join(show_teardown(teardown_or_inf(run), args.observe_s) for run in tool_runs)}")
    for run in runs:
        if run.leftovers:
            counts = ", ".join(f"{ns}: {len(pids)}" + (f" ({'; '.join(pids)})" if pids else "")
                               for ns, pids in run.leftovers.items())
            state = "launcher still running" if run.exit_code is None else f"launcher exited {run.exit_code}"
            print(f"left {args.observe_s:g} s after the failure, {run.tool}: {state}; job processes {counts}")


def teardown_or_inf(run: Run) -> float:
    """A run that did not stop counts as infinitely slow, so the median never flatters a tool."""
    return run.teardown_s if run.teardown_s is not None else math.inf


def show_teardown(seconds: float, observe_s: float) -> str:
    return f"{seconds:.2f}" if math.isfinite(seconds) else f"did not stop (> {observe_s:g})"


def teardown_ratio(teardown: float, base: float, observe_s: float) -> str:
    if not math.isfinite(teardown):
        return "n/a"
    if not math.isfinite(base):  # DeepSpeed had not stopped when observation ended: only a bound is known
        return f"< {teardown / observe_s:.2f}"
    return f"{teardown / base:.2f}"


if __name__ == "__main__":
    sys.exit(main())
