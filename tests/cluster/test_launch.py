"""`fstrain launch` on the namespace cluster: streaming, faults, teardown, secrets, concurrency.

Each fault test asserts the exit code, the summary, and that no job process is left in any
namespace within the grace period plus a few seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fstrain.core.progress import STAGES
from tests.cluster.launch_helpers import WORKER, assert_no_job_processes, job_processes, start_launch
from tests.conftest import NamespaceCluster
from tests.helpers import REPO, run_fstrain

pytestmark = pytest.mark.cluster

GRACE_S = 3
TWO_NODES = ("--hosts", "node[1-2]", "--nproc-per-node", "2", "--grace", str(GRACE_S))


def worker_args(tmp_path: Path, *extra: str) -> list[str]:
    return [*TWO_NODES, "--run-dir", str(tmp_path / "run"), *extra, "--", "python3", WORKER]


@pytest.mark.smoke  # scripts/test.sh --quick
def test_clean_run_streams_every_rank_and_writes_logs(cluster: NamespaceCluster, tmp_path: Path) -> None:
    launch = start_launch(cluster, *worker_args(tmp_path, "--env", "FSTRAIN_TEST_SECONDS=1"))
    assert launch.finish() == 0, launch.err
    for host, rank in (("node1", 0), ("node1", 1), ("node2", 2), ("node2", 3)):  # static rendezvous: global ranks
        assert any(line.startswith(f"[{host} r{rank}] ready rank={rank} ") for line in launch.stdout), launch.out
        assert (tmp_path / "run" / "logs" / f"{host}.r{rank}.log").read_text().count("ready rank=") == 1
    ranks = sorted(int(line.split("rank=")[1].split()[0]) for line in launch.stdout if "] ready rank=" in line)
    assert ranks == [0, 1, 2, 3]
    assert all("world=4" in line for line in launch.stdout if "] ready rank=" in line)
    assert "all nodes finished ok; exit code 0" in launch.err
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["exit_code"] == 0 and manifest["master_addr"] == cluster.address(1)
    assert [n["exit_code"] for n in manifest["nodes"]] == [0, 0]
    assert manifest["nodes"][1]["env"]["GLOO_SOCKET_IFNAME"] == "eth0"
    assert manifest["versions"]["node2"]["hostname"] == "node2"
    assert_no_job_processes(cluster, 5)


def test_one_rank_exits_7_gives_7_and_names_the_rank(cluster: NamespaceCluster, tmp_path: Path) -> None:
    launch = start_launch(cluster, *worker_args(tmp_path, "--env", "FSTRAIN_TEST_FAULT=exit7",
                                                "--env", "FSTRAIN_TEST_FAULT_RANK=3"))
    start = time.monotonic()
    code = launch.finish()
    assert code == 7, launch.err  # the rank's own code, not torchrun's aggregate 1
    assert "[node2 r3] rank 3 exits 7 on purpose" in launch.out
    assert "first failure: rank 3 (local rank 1) on node2 (node 1) exited with 7" in launch.err
    assert "exit code 7" in launch.err
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    failed = manifest["nodes"][manifest["first_failure_node_rank"]]
    assert failed["exit_code"] == 1  # torchrun's own code stays on record
    assert manifest["first_failure"] == {"rank": 3, "local_rank": 1, "exit_code": 7, "signal": None}
    assert manifest["exit_code"] == 7
    # The failed rank's own lines, not torchrun's report; the terminal shows the cause, folded.
    assert failed["last_lines"][-1].endswith("] rank 3 exits 7 on purpose"), failed["last_lines"]
    assert not any("ChildFailedError" in line for line in failed["last_lines"])
    summary = launch.err[launch.err.index("first failure: rank"):]
    assert "rank 3 exits 7 on purpose" in summary and "ChildFailedError" not in summary
    assert "torchrun: rank 3 (local rank 1), exit 7, failed first" in launch.out
    for noise in ("ChildFailedError", "SignalException", "node_rank is only used", "Traceback (most recent",
                  "frame #"):
        assert noise not in launch.out, noise
    assert time.monotonic() - start < 60
    assert_no_job_processes(cluster, GRACE_S + 5)


@pytest.mark.parametrize("backend", ["torchrun", "deepspeed", "direct"])
def test_one_rank_segfaults_gives_139(cluster: NamespaceCluster, tmp_path: Path, backend: str) -> None:
    launch = start_launch(cluster, *worker_args(tmp_path, "--backend", backend, "--env", "FSTRAIN_TEST_FAULT=segv",
                                                "--env", "FSTRAIN_TEST_FAULT_RANK=2"))
    assert launch.finish() == 139, launch.err
    assert "[node2 r2] rank 2 segfaults on purpose" in launch.out
    # DeepSpeed's launcher does not say which rank it was: the watchdog saw it exit (direct: fstrain's script).
    assert "first failure: rank 2 (local rank 0) on node2 (node 1) was killed by SIGSEGV" in launch.err
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["first_failure"] == {"rank": 2, "local_rank": 0, "exit_code": 139, "signal": "SIGSEGV"}
    assert "exit code 139" in launch.err
    assert_no_job_processes(cluster, GRACE_S + 5)


PARENT_PROGRAM = """\
import os
with open("/proc/%d/cmdline" % os.getppid(), "rb") as handle:
    parent = [arg.decode() for arg in handle.read().split(b"\\0") if arg]
print("parent", "-c" in parent, parent[-1], os.environ.get("GLOO_SOCKET_IFNAME"), os.environ["RANK"], flush=True)
"""


@pytest.mark.parametrize(("backend", "module"), [("torchrun", "torch.distributed.run"),
                                                 ("deepspeed", "deepspeed.launcher.launch")])
def test_each_node_launcher_is_the_python_started_during_the_checks(cluster: NamespaceCluster, tmp_path: Path,
                                                                    backend: str, module: str) -> None:
    # Every rank's parent is its node's launcher: the interpreter the watchdog started with
    # `-c PREWARM MODULE` before the preflight, which then ran the module with the final
    # environment (the interface found by the rendezvous check).
    program = tmp_path / "parent.py"
    program.write_text(PARENT_PROGRAM)
    launch = start_launch(cluster, *TWO_NODES, "--backend", backend, "--no-local-rank", "--run-dir",
                          str(tmp_path / "run"), "--", "python3", str(program))
    assert launch.finish() == 0, launch.err
    lines = sorted(line.split("] ", 1)[1].strip() for line in launch.stdout if "] parent " in line)
    assert lines == [f"parent True {module} eth0 {rank}" for rank in range(4)], launch.out
    assert_no_job_processes(cluster, 5)


def test_one_rank_sigkilled(cluster: NamespaceCluster, tmp_path: Path) -> None:
    launch = start_launch(cluster, *worker_args(tmp_path, "--env", "FSTRAIN_TEST_FAULT=sigkill",
                                                "--env", "FSTRAIN_TEST_FAULT_RANK=2"))
    code = launch.finish()
    assert code != 0
    assert "failed; exit code" in launch.err
    assert_no_job_processes(cluster, GRACE_S + 5)


@pytest.mark.parametrize(("sig", "expected"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_fstrain_tears_down(cluster: NamespaceCluster, tmp_path: Path, sig: signal.Signals,
                                      expected: int) -> None:
    launch = start_launch(cluster, *worker_args(tmp_path))
    launch.wait_for("] ready rank=", count=4)
    launch.proc.send_signal(sig)
    assert launch.finish(timeout=GRACE_S + 30) == expected
    assert ("interrupted (Ctrl-C)" if sig == signal.SIGINT else "terminated (SIGTERM)") in launch.err
    assert "SignalException" not in launch.out and "node_rank is only used" not in launch.out
    assert_no_job_processes(cluster, GRACE_S + 5)


def test_second_ctrl_c_skips_the_grace_period(cluster: NamespaceCluster, tmp_path: Path) -> None:
    launch = start_launch(cluster, *TWO_NODES[:-1], "60", "--run-dir", str(tmp_path / "run"),
                          "--env", "FSTRAIN_TEST_IGNORE_TERM=1", "--", "python3", WORKER)
    launch.wait_for("] ready rank=", count=4)
    start = time.monotonic()
    launch.proc.send_signal(signal.SIGINT)
    time.sleep(1)
    launch.proc.send_signal(signal.SIGINT)
    assert launch.finish(timeout=50) == 130
    # One Ctrl-C takes 31 s here (torchrun waits 30 s for ranks that ignore SIGTERM); two take ~2 s.
    assert time.monotonic() - start < 15
    assert_no_job_processes(cluster, 5)


def test_sigkill_to_fstrain_watchdogs_clean_up(cluster: NamespaceCluster, tmp_path: Path) -> None:
    launch = start_launch(cluster, *worker_args(tmp_path))
    launch.wait_for("] ready rank=", count=4)
    assert job_processes(cluster)
    launch.proc.kill()
    launch.finish()
    assert_no_job_processes(cluster, GRACE_S + 8)


def test_node_sshd_and_processes_killed_mid_run(cluster: NamespaceCluster, tmp_path: Path) -> None:
    launch = start_launch(cluster, *worker_args(tmp_path, "--heartbeat-timeout", "4"))
    launch.wait_for("] ready rank=", count=4)
    cluster.script("stop-sshd", "2")
    try:
        code = launch.finish(timeout=60)
        assert code != 0
        manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
        assert manifest["nodes"][1]["exit_code"] is None
        assert manifest["nodes"][1]["error"]
        assert "failed; exit code 255" in launch.err
        assert_no_job_processes(cluster, GRACE_S + 5)
    finally:
        cluster.script("start-sshd", "2")


def test_node_link_down_mid_run(cluster: NamespaceCluster, tmp_path: Path) -> None:
    launch = start_launch(cluster, *worker_args(tmp_path, "--heartbeat-timeout", "4"))
    launch.wait_for("] ready rank=", count=4)
    subprocess.run(["ip", "link", "set", cluster.veth(2), "down"], check=True)
    try:
        start = time.monotonic()
        code = launch.finish(timeout=60)
        assert code == 255, launch.err
        assert "no answer from the host for 4 s" in launch.err
        assert time.monotonic() - start < 4 + 2 * 2 + GRACE_S + 15
        # node2 is cut off: its own watchdog misses the heartbeats and ends the job there.
        assert_no_job_processes(cluster, 4 + GRACE_S + 8)
    finally:
        subprocess.run(["ip", "link", "set", cluster.veth(2), "up"], check=True)


HOSTILE = ["a b", "'single'", '"double"', "$(touch /tmp/fstrain-launch-pwned)", "`id`", "x; echo injected",
           "new\nline", "*", "$HOME", ""]


def test_hostile_arguments_and_env_values_arrive_literally_and_secrets_never_show(
    cluster: NamespaceCluster, tmp_path: Path
) -> None:
    secret = "s3cr3t-Value-42"
    odd = "it's $(id) `x` ; \"q\""
    launch = start_launch(cluster, *TWO_NODES, "--run-dir", str(tmp_path / "run"),
                          "--env", "FSTRAIN_TEST_SECONDS=0", "--env", "FSTRAIN_TEST_ECHO=1",
                          "--env", "FSTRAIN_TEST_ECHO_NAMES=ODD_VALUE,API_TOKEN",
                          "--env", f"ODD_VALUE={odd}", "--env", f"API_TOKEN={secret}",
                          "--", "python3", WORKER, *HOSTILE)
    assert launch.finish() == 0, launch.err
    echoes = [json.loads(line.split("] ", 1)[1]) for line in launch.stdout if '] {"argv"' in line]
    assert len(echoes) == 4
    for echo in echoes:
        assert echo["argv"] == HOSTILE
        assert echo["env"]["ODD_VALUE"] == odd
        assert echo["env"]["API_TOKEN"] == "****"  # the program printed it; fstrain redacted it
    assert not Path("/tmp/fstrain-launch-pwned").exists()
    everything = launch.out + launch.err + "".join(
        p.read_text() for p in (tmp_path / "run").rglob("*") if p.is_file())
    assert secret not in everything
    dry = run_fstrain("launch", "--dry-run", "--hosts", "node[1-2]", "--nproc-per-node", "1",
                      "--env", f"API_TOKEN={secret}", "--", "python3", WORKER)
    assert dry.returncode == 0 and secret not in dry.stdout + dry.stderr and "API_TOKEN='****'" in dry.stdout


def test_secret_never_on_a_remote_command_line(cluster: NamespaceCluster, tmp_path: Path) -> None:
    secret = "cmdline-secret-9876"
    launch = start_launch(cluster, *worker_args(tmp_path, "--env", f"DB_PASSWORD={secret}"))
    try:
        launch.wait_for("] ready rank=", count=4)
        for index in (1, 2):
            for pid in subprocess.run(["ip", "netns", "pids", cluster.namespace(index)], capture_output=True,
                                      text=True, check=True).stdout.split():
                with contextlib.suppress(FileNotFoundError):
                    assert secret.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    finally:
        launch.proc.send_signal(signal.SIGINT)
        launch.finish()
    assert_no_job_processes(cluster, GRACE_S + 5)


def test_two_concurrent_runs_do_not_collide(cluster: NamespaceCluster, tmp_path: Path) -> None:
    first = start_launch(cluster, *TWO_NODES, "--run-dir", str(tmp_path / "a"), "--", "python3", WORKER)
    second = start_launch(cluster, *TWO_NODES, "--run-dir", str(tmp_path / "b"),
                          "--env", "FSTRAIN_TEST_SECONDS=20", "--", "python3", WORKER)
    first.wait_for("] ready rank=", count=4)
    second.wait_for("] ready rank=", count=4)
    first.proc.send_signal(signal.SIGINT)
    assert first.finish() == 130
    assert second.proc.poll() is None, "stopping one run stopped the other"
    assert second.finish() == 0, second.err
    ports = {json.loads((tmp_path / d / "manifest.json").read_text())["master_port"] for d in ("a", "b")}
    assert len(ports) == 2
    assert_no_job_processes(cluster, GRACE_S + 5)


def said(stderr: str) -> list[str]:
    """stderr's lines but the plain progress lines of the stages (``[preflight] ...``)."""
    stages = tuple(f"[{stage}]" for stage in STAGES)
    return [line for line in stderr.splitlines() if not line.startswith(stages)]


def test_preflight_names_the_host_with_a_missing_workdir(cluster: NamespaceCluster, tmp_path: Path) -> None:
    result = run_fstrain("launch", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-2]", "--nproc-per-node",
                         "1", "--workdir", "/nonexistent/dir", "--", "python3", WORKER)
    assert result.returncode == 2
    assert "node1: working directory '/nonexistent/dir' does not exist" in result.stderr
    assert len(said(result.stderr)) == 1, result.stderr  # one error line after the stages' progress


def test_a_host_that_cannot_reach_the_first_is_named_before_anything_starts(cluster: NamespaceCluster,
                                                                             tmp_path: Path) -> None:
    """node3's route to node1 refuses (its SSH from here still works): the one-session check of
    every host names it and the address, and nothing starts."""
    cluster.in_namespace(3, "ip", "route", "add", "prohibit", f"{cluster.address(1)}/32")
    try:
        result = run_fstrain("launch", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-3]", "--nproc-per-node",
                             "1", "--backend", "direct", "--run-dir", str(tmp_path / "run"), "--", "python3", WORKER)
    finally:
        cluster.in_namespace(3, "ip", "route", "del", "prohibit", f"{cluster.address(1)}/32")
    assert result.returncode == 2, result.stderr
    (line,) = said(result.stderr)
    assert line.startswith(f"error: rendezvous: no address of node1 is reachable from every host: node3 cannot "
                           f"reach {cluster.address(1)}:"), line
    assert "node2" not in line and "(hint: check routes and firewalls, or run `fstrain doctor`)" in line, line
    assert not job_processes(cluster)


def _files_holding(roots: list[Path], needle: bytes) -> list[str]:
    found = []
    for root in roots:
        for path in [root] if root.is_file() else root.rglob("*"):
            with contextlib.suppress(OSError):
                if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                    found.append(str(path))
    return found


@pytest.mark.parametrize("backend", ["torchrun", "deepspeed"])
def test_no_secret_at_rest_on_the_nodes_and_none_left_in_tmp(cluster: NamespaceCluster, tmp_path: Path,
                                                             backend: str) -> None:
    secret = f"at-rest-{backend}-{os.urandom(6).hex()}"
    before = set(Path("/tmp").glob("torchelastic_*"))
    launch = start_launch(cluster, *worker_args(tmp_path, "--backend", backend, "--env", "FSTRAIN_TEST_SECONDS=0",
                                                "--env", "FSTRAIN_TEST_ECHO=1",
                                                "--env", "FSTRAIN_TEST_ECHO_NAMES=SERVICE_TOKEN",
                                                "--env", "SERVICE_TOKEN"),
                          env={"SERVICE_TOKEN": secret})
    assert launch.finish() == 0, launch.err
    assert launch.out.count('"SERVICE_TOKEN": "****"') == 4  # every rank printed it, masked on the way
    new_tmp = sorted(set(Path("/tmp").glob("torchelastic_*")) - before)
    homes = [cluster.home(i) for i in (1, 2)]
    assert _files_holding([*homes, *new_tmp, tmp_path], secret.encode()) == []
    # What the launchers copied of the output is gone from this run's directory on each node.
    run_id = json.loads((tmp_path / "run" / "manifest.json").read_text())["run_id"]
    for home in homes:
        run = home / ".fstrain" / "runs" / run_id
        assert run.is_dir()
        assert not (run / "torchrun").exists() and not (run / "ranklogs").exists(), sorted(run.rglob("*"))
    assert_no_job_processes(cluster, GRACE_S + 5)


def test_relative_program_runs_in_the_current_directory_by_default(cluster: NamespaceCluster,
                                                                    tmp_path: Path) -> None:
    # Like DeepSpeed's launcher: the job starts in the directory fstrain was started from.
    launch = start_launch(cluster, *TWO_NODES, "--run-dir", str(tmp_path / "run"), "--env", "FSTRAIN_TEST_SECONDS=0",
                          "--", "python3", "tests/cluster/programs/worker.py")
    assert launch.finish() == 0, launch.err
    assert launch.out.count("] ready rank=") == 4
    assert_no_job_processes(cluster, GRACE_S + 5)


def test_preflight_names_the_host_where_the_current_directory_is_missing(cluster: NamespaceCluster,
                                                                         tmp_path: Path) -> None:
    # A folder only this fstrain sees (a tmpfs in its own mount namespace): the hosts lack it.
    here = tmp_path / "only-here"
    here.mkdir()
    script = f"mount -t tmpfs fstrain-here {here} && mkdir {here}/project && cd {here}/project && exec \"$@\""
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                             sys.executable, "-m", "fstrain", "launch", "--ssh-config", cluster.ssh_config,
                             "--hosts", "node[1-2]", "--nproc-per-node", "1", "--", "python3", "train.py"],
                            capture_output=True, text=True, timeout=120, check=False,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 2, result.stderr
    assert (f"node1: working directory '{here}/project' (the current directory here, the default) does not exist"
            in result.stderr)
    assert "node2: working directory" in result.stderr
    assert "pass --workdir DIR" in result.stderr and len(said(result.stderr)) == 1, result.stderr


def test_shell_init_that_puts_another_python3_first(cluster: NamespaceCluster, tmp_path: Path) -> None:
    # As pyenv or conda in ~/.bashrc do (bash reads it for ssh commands too): node1's python3
    # becomes an interpreter without torch. Preflight says so and names the interpreter to pass;
    # with it, the launch runs.
    fake_bin = tmp_path / "fake-bin"
    fake_bin.mkdir()
    (fake_bin / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')  # -S: no site-packages
    (fake_bin / "python3").chmod(0o755)
    bashrc = cluster.home(1) / ".bashrc"
    bashrc.write_text(f'export PATH="{fake_bin}:$PATH"\n')
    try:
        refused = run_fstrain("launch", "--ssh-config", cluster.ssh_config, *TWO_NODES[:4], "--run-dir",
                              str(tmp_path / "a"), "--", "python3", WORKER)
        assert refused.returncode == 2, refused.stderr
        assert "node1: python3 (" in refused.stderr and ") cannot import torch" in refused.stderr
        assert "node2" not in "\n".join(said(refused.stderr))  # the error names node1 only
        assert f"pass --python {sys.executable} (" in refused.stderr
        launch = start_launch(cluster, *worker_args(tmp_path, "--python", sys.executable,
                                                    "--env", "FSTRAIN_TEST_SECONDS=0"))
        assert launch.finish() == 0, launch.err
        assert launch.out.count("] ready rank=") == 4
    finally:
        bashrc.unlink()
    assert_no_job_processes(cluster, GRACE_S + 5)
