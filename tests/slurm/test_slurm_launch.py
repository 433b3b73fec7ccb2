"""fstrain on a real Slurm (scripts/testslurm.sh): inside an allocation through srun with no SSH
server on the nodes, and submitted with sbatch from the login node: follow, detach, a failing
rank, scancel, and the doctor through srun."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fstrain.core.slurm.job import JobStatus, parse_scontrol_job
from tests.cluster.launch_helpers import namespace_processes, wait_until_none
from tests.helpers import REPO, interruptible
from tests.slurm.conftest import SlurmCluster

pytestmark = pytest.mark.slurm

RANK_LINE = re.compile(r"^\[(node\d)(?: r\d)?\] \[fstrain\.train\] rank (\d)/(\d+) local (\d) on (node\d) ")
# A rank that says it is ready, then: rank 3 exits FAULT_CODE after a moment, or every rank sleeps.
RANK_PROGRAM = ("import os,sys,time; r=int(os.environ['RANK']); "
                "print(f'ready rank={r} world={os.environ[\"WORLD_SIZE\"]}', flush=True); time.sleep(3); "
                "c=int(os.environ.get('FAULT_CODE','0')); sys.exit(c) if c and r==3 else time.sleep(600)")


READY_LINE = re.compile(r"^\[node\d(?: r\d)?\] ready rank=\d world=4$", re.MULTILINE)


def fstrain(slurm: SlurmCluster, home: Path, *args: str, prefix: tuple[str, ...] = (), timeout: float = 600,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, sys.executable, "-m", "fstrain", *args], capture_output=True, text=True,
                          env={**slurm.env(home), **(extra_env or {})}, cwd=home, timeout=timeout, check=False)


def scontrol_job(slurm: SlurmCluster, home: Path, job_id: str) -> JobStatus:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True,
                         env=slurm.env(home), timeout=60).stdout
    return parse_scontrol_job(out)


def cancel_left_job(slurm: SlurmCluster, home: Path, run_dir: Path) -> None:
    """A test that failed half-way leaves no job behind: it would hold the nodes, and every later
    test's allocation would wait for them (its ranks sleep for minutes)."""
    ids = run_dir / "slurm_job_id"
    if ids.is_file() and ids.read_text().strip():
        subprocess.run(["scancel", ids.read_text().strip()], env=slurm.env(home), timeout=60, check=False,
                       capture_output=True)


def wait_for_job(slurm: SlurmCluster, home: Path, job_id: str, timeout: float = 300) -> JobStatus:
    deadline = time.monotonic() + timeout
    status = scontrol_job(slurm, home, job_id)
    while not status.final and time.monotonic() < deadline:
        time.sleep(1)
        status = scontrol_job(slurm, home, job_id)
    return status


DAEMONS = ("slurmd", "sshd")


def node_processes(slurm: SlurmCluster) -> dict[str, list[str]]:
    """Processes in the nodes' namespaces other than the daemons (slurmd, sshd)."""
    namespaces = [slurm.namespace(index) for index in range(1, slurm.num_nodes + 1)]
    return namespace_processes(namespaces, lambda pid: Path(f"/proc/{pid}/comm").read_text().strip() in DAEMONS)


def assert_nodes_idle(slurm: SlurmCluster, within_s: float) -> None:
    wait_until_none(lambda: node_processes(slurm), within_s)


def sshd_running(slurm: SlurmCluster, index: int) -> bool:
    pids = subprocess.run(["ip", "netns", "pids", slurm.namespace(index)], capture_output=True, text=True,
                          check=False).stdout.split()
    names = []
    for pid in pids:
        try:
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        except OSError:
            continue
    return "sshd" in names


def test_srun_answers_from_both_nodes(slurm: SlurmCluster, tmp_path: Path) -> None:
    result = subprocess.run(["srun", "-N2", "hostname"], capture_output=True, text=True, env=slurm.env(tmp_path),
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()) == ["node1", "node2"]


@pytest.mark.smoke  # scripts/test.sh --quick
def test_launch_inside_an_allocation_trains_through_srun_without_sshd(slurm: SlurmCluster, tmp_path: Path) -> None:
    for index in range(1, slurm.num_nodes + 1):
        slurm.script("stop-sshd", str(index))
        assert not sshd_running(slurm, index)
    run_dir = tmp_path / "run"
    result = fstrain(slurm, tmp_path, "launch", "--model", "tiny", "--nproc-per-node", "2", "--steps", "4",
                     "--grace", "5", "--run-dir", str(run_dir), prefix=("salloc", "-N2"))
    assert result.returncode == 0, result.stderr[-4000:]
    assert "every node runs its part as an srun step" in result.stderr
    ranks = {(m.group(2), m.group(5)) for m in map(RANK_LINE.match, result.stdout.splitlines()) if m}
    assert ranks == {("0", "node1"), ("1", "node1"), ("2", "node2"), ("3", "node2")}
    assert all("/4 local" in line for line in result.stdout.splitlines() if RANK_LINE.match(line))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["last_loss"] < summary["first_loss"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [n["host"] for n in manifest["nodes"]] == ["node1", "node2"]
    assert manifest["exit_code"] == 0 and manifest["master_addr"] == f"198.18.{slurm.cluster_id}.11"
    assert (run_dir / "logs" / "node2.log").is_file() and list((run_dir / "logs").glob("node2.r*.log"))
    assert_nodes_idle(slurm, 10)


def test_doctor_inside_an_allocation_checks_the_nodes_through_srun(slurm: SlurmCluster, tmp_path: Path) -> None:
    result = fstrain(slurm, tmp_path, "doctor", "--json", prefix=("salloc", "-N2"))
    assert "reaching its nodes through srun" in result.stderr
    document = json.loads(result.stdout)
    assert document["summary"]["hosts"] == ["node1", "node2"] and document["summary"]["fail"] == 0
    verdicts = {c["id"]: c["verdict"] for c in document["checks"]}
    # The checks that need every node to answer and to reach the others passed, over srun steps.
    assert verdicts["ssh.connect"] == "ok" and verdicts["net.reachability"] == "ok"
    # No SSH login happened: the check names the path it took.
    connect = next(c for c in document["checks"] if c["id"] == "ssh.connect")
    assert connect["message"].startswith("reached through srun in Slurm job "), connect
    assert connect["message"].endswith(" (no SSH login)") and "authenticated" not in result.stdout
    assert verdicts["clock.skew"] == "ok" and verdicts["net.rendezvous_port"] == "ok"


def test_sbatch_submit_follows_the_job_to_its_training_summary(slurm: SlurmCluster, tmp_path: Path) -> None:
    run_dir, prom = tmp_path / "run", tmp_path / "prom"
    result = fstrain(slurm, tmp_path, "launch", "--slurm", "--nodes", "2", "--time", "10:00", "--nproc-per-node",
                     "2", "--model", "tiny", "--steps", "4", "--grace", "5", "--run-dir", str(run_dir),
                     "--metrics-textfile", str(prom))
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    job_id = (run_dir / "slurm_job_id").read_text().strip()
    assert f"submitted Slurm job {job_id}" in result.stderr
    assert f"Slurm job {job_id}: COMPLETED, exit code 0" in result.stderr
    # The job's output, followed: every rank's lines, the summary table and the training summary.
    assert "all nodes finished ok; exit code 0" in result.stdout
    assert '"world_size": 4' in result.stdout and "training summary (rank 0):" in result.stdout
    assert {m.group(5) for m in map(RANK_LINE.match, result.stdout.splitlines()) if m} == {"node1", "node2"}
    status = scontrol_job(slurm, tmp_path, job_id)
    assert (status.state, status.exit_code, status.nodes) == ("COMPLETED", 0, "node[1-2]")
    script = (run_dir / "sbatch.sh").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --time=10:00" in script
    assert json.loads((run_dir / f"job-{job_id}" / "manifest.json").read_text())["exit_code"] == 0
    # Each node's watchdog, an srun task here, wrote its Prometheus textfile: both ranks at the last step.
    from prometheus_client.parser import text_string_to_metric_families

    files = sorted(prom.glob("fstrain_*_node*.prom"))
    assert [path.name.rsplit("_", 1)[1] for path in files] == ["node0.prom", "node1.prom"]
    for node_rank, path in enumerate(files):
        steps = {s.labels["rank"]: s.value for f in text_string_to_metric_families(path.read_text())
                 if f.name == "fstrain_step" for s in f.samples}
        assert steps == {str(2 * node_rank): 4, str(2 * node_rank + 1): 4}
    # Its report gathers the job folder's output, manifest and summary as for any other run.
    report = fstrain(slurm, tmp_path, "report", str(run_dir), "--json")
    assert report.returncode == 0, report.stderr
    document = json.loads(report.stdout)
    summary = json.loads((run_dir / f"job-{job_id}" / "summary.json").read_text())
    assert (document["kind"], document["state"]["state"]) == ("slurm", "succeeded")
    assert document["planned_vs_measured"][1]["measured"] == summary["tokens_per_s"]
    assert [p["step"] for p in document["ranks"][0]["points"]] == [1, 2, 3, 4]
    assert {("node up", "node1"), ("node up", "node2")} <= {(e["kind"], e["where"]) for e in document["events"]}


def test_detach_returns_the_job_id_and_a_failing_rank_gives_its_exit_code(slurm: SlurmCluster,
                                                                           tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    started = time.monotonic()
    result = fstrain(slurm, tmp_path, "launch", "--slurm", "--detach", "--nodes", "2", "--nproc-per-node", "2",
                     "--backend", "deepspeed", "--no-local-rank", "--grace", "5", "--env", "FAULT_CODE=7",
                     "--run-dir", str(run_dir),
                     "--", "python3", "-c", RANK_PROGRAM)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 30  # returned at once, long before the job ends
    job_id = result.stdout.strip()
    assert job_id.isdigit() and (run_dir / "slurm_job_id").read_text().strip() == job_id
    status = wait_for_job(slurm, tmp_path, job_id)
    assert (status.state, status.exit_code) == ("FAILED", 7)
    manifest = json.loads((run_dir / f"job-{job_id}" / "manifest.json").read_text())
    assert manifest["exit_code"] == 7 and manifest["reason"] == "failed"
    assert manifest["nodes"][manifest["first_failure_node_rank"]]["host"] == "node2"
    output = (run_dir / f"slurm-{job_id}.out").read_text()
    assert len(READY_LINE.findall(output)) == 4 and "failed; exit code 7" in output
    assert_nodes_idle(slurm, 10)


def test_scancel_mid_run_stops_every_node_within_the_grace_period(slurm: SlurmCluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    follower = subprocess.Popen(
        [sys.executable, "-m", "fstrain", "launch", "--slurm", "--nodes", "2", "--nproc-per-node", "2", "--grace",
         "5", "--run-dir", str(run_dir), "--", "python3", "-c", RANK_PROGRAM],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=slurm.env(tmp_path), cwd=tmp_path,
        preexec_fn=interruptible)
    try:
        deadline = time.monotonic() + 300
        output = Path()
        while time.monotonic() < deadline:
            ids = run_dir / "slurm_job_id"
            if ids.is_file() and ids.read_text().strip():
                output = run_dir / f"slurm-{ids.read_text().strip()}.out"
                if output.is_file() and len(READY_LINE.findall(output.read_text())) == 4:
                    break
            time.sleep(0.5)
        else:
            raise AssertionError("the ranks never became ready")
        job_id = (run_dir / "slurm_job_id").read_text().strip()
        # Ctrl-C without a terminal leaves the job running: following stops, the job does not.
        follower.send_signal(signal.SIGINT)
        _, err = follower.communicate(timeout=30)
        assert follower.returncode == 130 and f"job {job_id} keeps running" in err
        assert scontrol_job(slurm, tmp_path, job_id).state == "RUNNING"
        subprocess.run(["scancel", job_id], check=True, env=slurm.env(tmp_path), timeout=60)
        cancelled = time.monotonic()
        assert_nodes_idle(slurm, 5 + 5)  # --grace 5, well below Slurm's own KillWait of 30 s
        assert time.monotonic() - cancelled < 10
    finally:
        if follower.poll() is None:
            follower.kill()
        cancel_left_job(slurm, tmp_path, run_dir)
    status = wait_for_job(slurm, tmp_path, job_id, timeout=60)
    manifest_path = run_dir / f"job-{job_id}" / "manifest.json"
    for _ in range(40):  # the batch step writes its manifest as it stops
        if manifest_path.is_file():
            break
        time.sleep(0.25)
    manifest = json.loads(manifest_path.read_text())
    # Slurm cancelled it with SIGTERM; fstrain's summary says the same, and its code is the job's.
    assert manifest["reason"] == "cancelled" and manifest["exit_code"] == 143
    # Each torchrun ended on Slurm's one SIGTERM (exit 1), none SIGKILLed: a node printing Slurm's
    # cancel line before the launcher handled its own SIGTERM once made that SIGTERM a "second
    # signal", and every node 137, in 3 of 3 runs.
    assert all(n["exit_code"] != 137 for n in manifest["nodes"]), manifest["nodes"]
    assert (status.state, status.shell_exit_code) == ("CANCELLED", 143), status


def test_repository_is_what_the_nodes_import(slurm: SlurmCluster, tmp_path: Path) -> None:
    """The nodes run this checkout's code (the environment reaches them through srun)."""
    result = subprocess.run(["srun", "-N1", sys.executable, "-c", "import fstrain; print(fstrain.__file__)"],
                            capture_output=True, text=True, env=slurm.env(tmp_path), timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(str(REPO))


def test_plan_inside_an_allocation_probes_its_nodes_through_srun(slurm: SlurmCluster, tmp_path: Path) -> None:
    result = fstrain(slurm, tmp_path, "plan", "--model", "tiny", prefix=("salloc", "-N2"))
    # The test nodes have no GPU: the probe ran on them (through srun) and says so, naming the node.
    assert result.returncode == 2, result.stderr
    assert "probing its 2 nodes through srun" in result.stderr
    # Slurm picks any 2 of the 3 nodes (node1 is not always free after the node-loss tests).
    assert re.search(r"^error: node[1-3]: no GPU to plan for", result.stderr, re.MULTILINE), result.stderr


def test_ctrl_c_on_a_terminal_asks_and_cancels_the_job(slurm: SlurmCluster, tmp_path: Path) -> None:
    import pty
    import select

    run_dir = tmp_path / "run"
    env = slurm.env(tmp_path)
    pid, fd = pty.fork()
    if pid == 0:  # the child: fstrain following its job on a terminal
        try:
            interruptible()
            os.chdir(tmp_path)
            os.execve(sys.executable, [sys.executable, "-m", "fstrain", "launch", "--slurm", "--nodes", "2",
                                       "--nproc-per-node", "2", "--grace", "5", "--run-dir", str(run_dir), "--",
                                       "python3", "-c", RANK_PROGRAM], env)
        finally:
            os._exit(127)
    seen = bytearray()

    def read_until(token: bytes, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    seen.extend(os.read(fd, 65536))
                except OSError:
                    return token in seen
            if token in seen:
                return True
        return False

    try:
        assert read_until(b"ready rank=3 world=4", 300), seen.decode(errors="replace")[-2000:]
        os.write(fd, b"\x03")  # Ctrl-C at the terminal
        assert read_until(b"[y/N]", 30), seen.decode(errors="replace")[-2000:]
        os.write(fd, b"y\n")
        assert read_until(b"CANCELLED, exit code 143", 120), seen.decode(errors="replace")[-2000:]
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 143
    finally:
        os.close(fd)
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        cancel_left_job(slurm, tmp_path, run_dir)
    job_id = (run_dir / "slurm_job_id").read_text().strip()
    assert f"cancelled job {job_id}" in seen.decode(errors="replace")
    assert_nodes_idle(slurm, 10)


def test_exec_and_topo_inside_an_allocation_go_through_srun(slurm: SlurmCluster, tmp_path: Path) -> None:
    for index in range(1, slurm.num_nodes + 1):  # no SSH server anywhere (the first test may not have run)
        if sshd_running(slurm, index):
            slurm.script("stop-sshd", str(index))
    result = fstrain(slurm, tmp_path, "exec", "--json", "--", "hostname", prefix=("salloc", "-N2"))
    assert result.returncode == 0, result.stderr
    assert [(h["host"], h["stdout"].strip()) for h in json.loads(result.stdout)["hosts"]] == [
        ("node1", "node1"), ("node2", "node2")]
    topo = fstrain(slurm, tmp_path, "topo", "show", "--json", prefix=("salloc", "-N2"))
    assert topo.returncode == 0, topo.stderr
    assert "reaching its nodes through srun" in topo.stderr


def test_bench_inside_an_allocation_runs_through_srun(slurm: SlurmCluster, tmp_path: Path) -> None:
    """`fstrain bench` takes the same srun path as launch: both nodes, pairs between them, no SSH."""
    for index in range(1, slurm.num_nodes + 1):
        if sshd_running(slurm, index):
            slurm.script("stop-sshd", str(index))
    result = fstrain(slurm, tmp_path, "bench", "--suite", "collectives,pairs", "--backend", "gloo", "--sizes", "256K",
                     "--seconds", "0.05", "--pair-bytes", "1M", "--nproc-per-node", "1", "--json",
                     prefix=("salloc", "-N2"))
    assert result.returncode in (0, 1), result.stderr[-3000:]  # 1: an outlier named (timing on a loaded machine)
    assert "reaching its nodes through srun" in result.stderr or "srun step" in result.stderr, result.stderr[-2000:]
    document = json.loads(result.stdout)
    assert document["world_size"] == 2
    links = {(p["src"], p["dst"]) for p in document["pairs"]["links"]}
    assert links == {("node1", "node2"), ("node2", "node1")}, document["pairs"]
