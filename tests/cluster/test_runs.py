"""Detached runs on the namespace cluster: they outlive the client, are looked at and stopped
from fresh fstrain processes, and tear themselves down on a failure with no client connected."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.launch_helpers import (
    WORKER,
    assert_no_job_processes,
    job_processes,
    start_launch,
    wait_until_none,
)
from tests.conftest import NamespaceCluster
from tests.helpers import REPO

pytestmark = pytest.mark.cluster

GRACE_S = 3


def fstrain(home: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """A fresh fstrain process with its own HOME (its index of runs), as a later shell would run it."""
    env = {**os.environ, "HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("FSTRAIN_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "fstrain", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO, check=False)


def detach(cluster: NamespaceCluster, home: Path, run_dir: Path, *args: str) -> str:
    """A detached run on node1 and node2. Its ranks start with fstrain's own starter (``--backend
    direct``) unless ``args`` name a backend: torchrun's agent imports torch on every node (about
    2.3 s of CPU) for programs that use nothing of it; the tests about torchrun name it."""
    backend = () if "--backend" in args else ("--backend", "direct")
    result = fstrain(home, "launch", "--detach", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-2]",
                     "--nproc-per-node", "2", "--grace", str(GRACE_S), "--run-dir", str(run_dir),
                     "--env", f"PYTHONPATH={REPO}", *backend, *args)
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.strip()
    assert run_id and "started detached on 2 nodes" in result.stderr
    return run_id


def node_files(cluster: NamespaceCluster, run_dir: Path) -> list[dict]:
    """Each node's own state file, read on the node (its run directory under the remote home)."""
    detached = json.loads((run_dir / "detached.json").read_text())
    found = []
    for index, node in enumerate(detached["nodes"], start=1):
        text = cluster.in_namespace(index, "cat", f"{node['run_dir']}/node{node['node_rank']}.json").stdout
        found.append(json.loads(text))
    return found


def wait_finals(cluster: NamespaceCluster, run_dir: Path, timeout: float, nodes: int = 2) -> list[dict]:
    """The run's final record as each of the first ``nodes`` nodes wrote it. A run reads as ended
    once one node has the record; the others write their copy moments later."""
    deadline = time.monotonic() + timeout
    while True:
        finals = [f.get("final") for f in node_files(cluster, run_dir)[:nodes]]
        if all(finals) or time.monotonic() > deadline:
            assert all(finals), f"no final record on every node after {timeout} s: {finals}"
            return finals
        time.sleep(1)


def wait_state(home: Path, run_id: str, states: set[str], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        result = fstrain(home, "status", run_id, "--json")
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        if document["state"] in states or time.monotonic() > deadline:
            return document
        time.sleep(2)


def wait_all_ranks(home: Path, run_id: str, timeout: float = 120) -> dict:
    """The run's status once it runs and all 4 ranks are alive (asserted)."""
    status = wait_state(home, run_id, {"running"}, timeout)
    deadline = time.monotonic() + timeout
    while sum(len(n["ranks_alive"]) for n in status["nodes"]) < 4 and time.monotonic() < deadline:
        time.sleep(2)
        status = json.loads(fstrain(home, "status", run_id, "--json").stdout)
    assert sorted(r for n in status["nodes"] for r in n["ranks_alive"]) == [0, 1, 2, 3], status
    return status


def test_detached_training_outlives_the_client_and_is_followed_to_its_end(
    cluster: NamespaceCluster, tmp_path: Path
) -> None:
    home, run_dir = tmp_path / "home", tmp_path / "run"
    run_id = detach(cluster, home, run_dir, "--backend", "torchrun", "--model", "tiny", "--steps", "6")
    # A client following the run is killed outright: the run goes on without it.
    follower = subprocess.Popen([sys.executable, "-m", "fstrain", "attach", run_id], cwd=REPO,
                                env={**os.environ, "HOME": str(home)}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    time.sleep(3)
    follower.kill()
    follower.wait()
    listed = fstrain(home, "runs", "--json")
    rows = json.loads(listed.stdout)["runs"]
    assert [r["run_id"] for r in rows] == [run_id] and rows[0]["state"] in ("starting", "running")
    status = wait_state(home, run_id, {"running", "succeeded"}, 120)
    assert [n["host"] for n in status["nodes"]] == ["node1", "node2"]
    follow = fstrain(home, "logs", run_id, "--follow", timeout=900)
    assert follow.returncode == 0, follow.stderr
    assert "[fstrain.train] step 6/6 loss" in follow.stdout
    for rank, host in ((0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")):
        assert f"[{host} r{rank}] [fstrain.train] rank {rank}/4" in follow.stdout, follow.stdout[-3000:]
    attach = fstrain(home, "attach", run_id)  # after the end: the last lines, the summary, the exit code
    assert attach.returncode == 0, attach.stderr
    assert f"run {run_id} succeeded, exit 0" in attach.stderr
    assert json.loads(attach.stdout[attach.stdout.rindex("\n{\n") + 1:])["world_size"] == 4
    status = json.loads(fstrain(home, "status", run_id, "--json").stdout)
    assert status["state"] == "succeeded" and status["exit_code"] == 0
    # Every rank's numbers: rank 0's progress line, and the metric line each rank prints.
    progress = {rank["rank"]: rank["progress"] for node in status["nodes"] for rank in node["ranks"]}
    assert sorted(progress) == [0, 1, 2, 3], progress
    assert all(p["step"] == 6 and p["loss"] > 0 and p["tokens_per_s"] > 0 for p in progress.values()), progress
    assert [f["state"] for f in wait_finals(cluster, run_dir, 30)] == ["succeeded", "succeeded"]
    assert_no_job_processes(cluster, 10)
    assert json.loads(fstrain(home, "runs", "--json").stdout)["runs"] == []  # --all lists finished runs
    assert json.loads(fstrain(home, "runs", "--all", "--json").stdout)["runs"][0]["state"] == "succeeded"


def test_stop_leaves_no_process_on_any_host_within_the_grace_period(cluster: NamespaceCluster, tmp_path: Path) -> None:
    home = tmp_path / "home"
    run_id = detach(cluster, home, tmp_path / "run", "--", "python3", WORKER)
    status = wait_all_ranks(home, run_id)
    # The test hosts have no nvidia-smi: no GPU column, and no error either.
    assert [(n["gpus"], n["gpus_error"]) for n in status["nodes"]] == [([], None), ([], None)]
    # A short tail of the live run comes from node 0's views: the same lines as each node's file
    # read on the node (once the views have caught up with the ranks' last lines: a heartbeat).
    deadline = time.monotonic() + 15
    while True:
        whole = fstrain(home, "logs", run_id).stdout.splitlines(keepends=True)
        tail = fstrain(home, "logs", run_id, "--tail", "3")
        if tail.stdout.splitlines(keepends=True) == whole[-3:] or time.monotonic() > deadline:
            break
    assert tail.returncode == 0 and tail.stdout.splitlines(keepends=True) == whole[-3:], (tail.stdout, whole)
    stop = fstrain(home, "stop", run_id)
    assert stop.returncode == 0, stop.stderr
    assert f"run {run_id} stopped" in stop.stderr
    assert_no_job_processes(cluster, GRACE_S + 5)
    assert json.loads(fstrain(home, "status", run_id, "--json").stdout)["state"] == "stopped"
    # Another machine (another HOME, no index entry) finds the run on the hosts.
    found = fstrain(tmp_path / "elsewhere", "runs", "--all", "--hosts", "node[1-2]", "--ssh-config",
                    cluster.ssh_config, "--json")
    rows = [r for r in json.loads(found.stdout)["runs"] if r["run_id"] == run_id]
    assert [(r["state"], r["nodes"], r["mode"], r["first_failure"]) for r in rows] == [
        ("stopped", ["node1", "node2"], "found on hosts", None)]


def test_stop_force_kills_at_once_and_says_sigkill(cluster: NamespaceCluster, tmp_path: Path) -> None:
    home = tmp_path / "home"
    # Ranks that ignore SIGTERM and a grace period longer than the test waits: only SIGKILL ends them in time.
    run_id = detach(cluster, home, tmp_path / "run", "--grace", "60", "--env", "FSTRAIN_TEST_IGNORE_TERM=1",
                    "--", "python3", WORKER)
    wait_all_ranks(home, run_id)
    started = time.monotonic()
    stop = fstrain(home, "stop", run_id, "--force")
    assert stop.returncode == 0, stop.stderr
    assert f"run {run_id} stopped, exit 137 (SIGKILL)" in stop.stderr
    assert_no_job_processes(cluster, 15)
    assert time.monotonic() - started < 45
    status = json.loads(fstrain(home, "status", run_id, "--json").stdout)
    assert (status["state"], status["exit_code"]) == ("stopped", 137)


def test_a_rank_exiting_7_fails_the_detached_run_with_7_on_every_host(
    cluster: NamespaceCluster, tmp_path: Path
) -> None:
    home, run_dir = tmp_path / "home", tmp_path / "run"
    run_id = detach(cluster, home, run_dir, "--env", "FSTRAIN_TEST_FAULT=exit7", "--env", "FSTRAIN_TEST_FAULT_RANK=3",
                    "--", "python3", WORKER)
    # No client is connected: the nodes tear the job down themselves.
    finals = wait_finals(cluster, run_dir, 180)
    assert [(f["state"], f["exit_code"]) for f in finals] == [("failed", 7), ("failed", 7)]
    assert finals[0]["first_failure"] == {"rank": 3, "local_rank": 1, "exit_code": 7, "signal": None}
    assert_no_job_processes(cluster, GRACE_S + 5)
    status = json.loads(fstrain(home, "status", run_id, "--json").stdout)
    assert (status["state"], status["exit_code"]) == ("failed", 7)
    assert status["reason"] == "rank 3 (local rank 1) on node2 exited with 7"  # the host by name, not node 1
    assert status["first_failure"] == {"rank": 3, "local_rank": 1, "exit_code": 7, "signal": None, "node_rank": 1,
                                       "host": "node2", "reason": status["reason"]}
    # Every command names the first failure as an attached launch does: rank, local rank, code, host.
    named = "first failure: rank 3 (local rank 1) on node2 exited with 7"
    shown = fstrain(home, "status", run_id)
    assert f"run {run_id}: failed, exit 7 (rank 3 (local rank 1) on node2 exited with 7)" in shown.stderr
    assert named in shown.stderr, shown.stderr
    assert json.loads(fstrain(home, "runs", "--all", "--json").stdout)["runs"][0]["first_failure"] == \
        status["first_failure"]
    attach = fstrain(home, "attach", run_id)
    assert attach.returncode == 7 and named in attach.stderr, attach.stderr
    found = fstrain(tmp_path / "elsewhere", "runs", "--all", "--hosts", "node[1-2]", "--ssh-config",
                    cluster.ssh_config, "--json")
    rows = [r for r in json.loads(found.stdout)["runs"] if r["run_id"] == run_id]
    assert [r["first_failure"]["host"] for r in rows] == ["node2"] and rows[0]["first_failure"]["rank"] == 3
    logs = fstrain(home, "logs", run_id, "--rank", "3")
    assert "[node2 r3] rank 3 exits 7 on purpose" in logs.stdout
    assert "[node1 r0]" not in logs.stdout
    tail = fstrain(home, "logs", run_id, "--host", "node1", "--tail", "2").stdout.splitlines()
    assert len(tail) == 2 and all(line.startswith("[node1") for line in tail)
    assert fstrain(home, "logs", run_id, "--since", "10m").stdout.count("ready rank=") == 4
    unknown = fstrain(home, "logs", run_id, "--host", "node9")
    assert unknown.returncode == 2 and "'node9' is not one of the run's hosts" in unknown.stderr
    # No keeper: node 0's coordinator decided the run and wrote its events there; `status --watch
    # --json` of the ended run prints them in its one line and exits with the run's code.
    watched = fstrain(home, "status", run_id, "--watch", "--json")
    assert watched.returncode == 7, watched.stderr
    (line,) = watched.stdout.splitlines()
    events = json.loads(line)["events"]
    assert [e["kind"] for e in events] == ["started", "failure", "finished"], events
    assert events[0]["hosts"] == ["node1", "node2"]
    assert (events[1]["host"], events[1]["rank"], events[1]["exit_code"]) == ("node2", 3, 7)
    assert (events[2]["state"], events[2]["exit_code"]) == ("failed", 7)
    assert not (run_dir / "events.jsonl").exists()  # one writer: node 0's, not this machine


def test_a_detached_deepspeed_run_names_the_rank_that_failed(cluster: NamespaceCluster, tmp_path: Path) -> None:
    """DeepSpeed's launcher exits with the rank's code only; the watchdog says which rank."""
    home, run_dir = tmp_path / "home", tmp_path / "run"
    run_id = detach(cluster, home, run_dir, "--backend", "deepspeed", "--no-local-rank",
                    "--env", "FSTRAIN_TEST_FAULT=segv", "--env", "FSTRAIN_TEST_FAULT_RANK=3", "--", "python3", WORKER)
    status = wait_state(home, run_id, {"failed", "succeeded", "stopped", "lost", "stalled"}, 180)
    assert (status["state"], status["exit_code"]) == ("failed", 139), status
    finals = wait_finals(cluster, run_dir, 30)
    assert finals[1]["first_failure"] == {"rank": 3, "local_rank": 1, "exit_code": 139, "signal": "SIGSEGV"}
    assert_no_job_processes(cluster, GRACE_S + 5)


def test_gc_keeps_a_run_until_its_folder_is_gone_from_every_host(cluster: NamespaceCluster, tmp_path: Path) -> None:
    home, run_dir = tmp_path / "home", tmp_path / "run"
    run_id = detach(cluster, home, run_dir, "--env", "FSTRAIN_TEST_SECONDS=1", "--", "python3", WORKER)
    wait_state(home, run_id, {"succeeded"}, 180)
    wait_finals(cluster, run_dir, 30)
    folders = [n["run_dir"] for n in json.loads((run_dir / "detached.json").read_text())["nodes"]]
    assert cluster.in_namespace(1, "test", "-d", folders[0], check=False).returncode == 0
    kept = fstrain(home, "gc", "--older-than", "1d")
    assert "0 run(s) removed" in kept.stderr
    cluster.script("stop-sshd", "2")
    try:
        partly = fstrain(home, "gc", "--older-than", "1s")
    finally:
        cluster.script("start-sshd", "2")
    # node2 is down: node1's folder goes, the run's entry stays so that a later gc tries again.
    assert partly.returncode == 1, partly.stderr
    assert f"{run_id}: node1: removed" in partly.stderr
    assert f"{run_id}: node2: kept: " in partly.stderr
    assert f"{run_id}: its entry here is kept until its folder is gone from node2" in partly.stderr
    assert "0 run(s) removed" in partly.stderr
    assert cluster.in_namespace(1, "test", "-d", folders[0], check=False).returncode != 0
    assert cluster.in_namespace(2, "test", "-d", folders[1], check=False).returncode == 0
    assert [r["run_id"] for r in json.loads(fstrain(home, "runs", "--all", "--json").stdout)["runs"]] == [run_id]
    removed = fstrain(home, "gc", "--older-than", "1s")
    assert removed.returncode == 0, removed.stderr
    assert f"{run_id}: node1: already gone" in removed.stderr and f"{run_id}: node2: removed" in removed.stderr
    assert "1 run(s) removed" in removed.stderr
    assert cluster.in_namespace(2, "test", "-d", folders[1], check=False).returncode != 0
    assert json.loads(fstrain(home, "runs", "--all", "--json").stdout)["runs"] == []


@pytest.mark.parametrize(("others", "flag"), [("collective", "--stall-timeout"), ("exit", "--finish-timeout")])
def test_a_detached_run_with_a_blocked_rank_ends_stalled(
    cluster: NamespaceCluster, tmp_path: Path, others: str, flag: str
) -> None:
    home, run_dir = tmp_path / "home", tmp_path / "run"
    hang = str(REPO / "tests" / "cluster" / "programs" / "hang.py")
    run_id = detach(cluster, home, run_dir, flag, "20s", "--env", "FSTRAIN_TEST_HANG_RANK=3",
                    "--env", f"FSTRAIN_TEST_OTHERS={others}", "--", "python3", hang)
    final = wait_finals(cluster, run_dir, 300)[1]
    assert (final["state"], final["exit_code"]) == ("stalled", 124)
    assert final["stall"]["odd_ranks"] == [3]
    if others == "collective":  # the three others wait in the same all_reduce
        assert final["stall"]["common"].startswith("all_reduce ")
    else:
        assert final["stall"]["reason"].startswith("some ranks finished 20 s ago")
    folder = final["stall"]["folder"]
    stack = cluster.in_namespace(1, "cat", f"{folder}/rank3.faulthandler.txt").stdout
    assert f'File "{hang}", line' in stack
    assert_no_job_processes(cluster, GRACE_S + 5)
    attach = fstrain(home, "attach", run_id)
    assert attach.returncode == 124
    assert "odd rank: 3" in attach.stderr and "rank 3 is in <module> (hang.py:" in attach.stderr


def test_a_node_cut_off_tears_the_detached_run_down(cluster: NamespaceCluster, tmp_path: Path) -> None:
    home, run_dir = tmp_path / "home", tmp_path / "run"
    run_id = detach(cluster, home, run_dir, "--heartbeat-timeout", "4", "--", "python3", WORKER)
    wait_all_ranks(home, run_id)
    subprocess.run(["ip", "link", "set", cluster.veth(2), "down"], check=True)
    try:
        # The coordinator misses node2's heartbeats and stops node1; node2's watchdog misses the
        # coordinator's and ends its own job.
        assert_no_job_processes(cluster, 4 + 2 * GRACE_S + 15)
    finally:
        subprocess.run(["ip", "link", "set", cluster.veth(2), "up"], check=True)
    node1 = wait_finals(cluster, run_dir, 30, nodes=1)[0]
    assert (node1["state"], node1["exit_code"]) == ("lost", 255)
    assert "node2 was lost: no heartbeat for 4 s" in node1["reason"]  # named by host
    assert json.loads(fstrain(home, "status", run_id, "--json").stdout)["state"] == "lost"


def test_node_0s_watchdog_killed_leaves_no_job_on_any_host(cluster: NamespaceCluster, tmp_path: Path) -> None:
    """SIGKILL of the coordinator (node 0's watchdog), whose ranks ignore SIGTERM: it can clean
    nothing up, yet its reaper ends node 0's job within the grace period (SIGKILL at its end), and
    the other nodes miss its heartbeats and end theirs."""
    home, run_dir = tmp_path / "home", tmp_path / "run"
    run_id = detach(cluster, home, run_dir, "--heartbeat-timeout", "4", "--env", "FSTRAIN_TEST_IGNORE_TERM=1",
                    "--", "python3", WORKER)
    wait_all_ranks(home, run_id)
    launchers = [entry for entry in job_processes(cluster)[cluster.namespace(1)] if "fstrain-ranks.py" in entry]
    assert len(launchers) == 1, launchers
    stat = Path(f"/proc/{launchers[0].split()[0]}/stat").read_text()
    watchdog = int(stat[stat.rfind(")") + 2:].split()[1])
    os.kill(watchdog, signal.SIGKILL)
    killed = time.monotonic()
    node0 = cluster.namespace(1)
    wait_until_none(lambda: {k: v for k, v in job_processes(cluster).items() if k == node0}, GRACE_S + 5)
    assert time.monotonic() - killed > GRACE_S - 1  # the ranks ignore SIGTERM: the grace was given
    assert_no_job_processes(cluster, 4 + GRACE_S + 5)


def test_stop_of_an_attached_run_from_another_process(cluster: NamespaceCluster, tmp_path: Path) -> None:
    home = tmp_path / "home"
    launch = start_launch(cluster, "--hosts", "node[1-2]", "--nproc-per-node", "2", "--grace", str(GRACE_S),
                          "--run-dir", str(tmp_path / "run"), "--", "python3", WORKER, env={"HOME": str(home)})
    launch.wait_for("] ready rank=", count=4)
    run_id = json.loads(fstrain(home, "runs", "--json").stdout)["runs"][0]["run_id"]
    follower = subprocess.Popen([sys.executable, "-m", "fstrain", "logs", run_id, "--follow"], cwd=REPO,
                                env={**os.environ, "HOME": str(home)}, stdout=subprocess.PIPE, text=True)
    stop = fstrain(home, "stop", run_id)
    assert stop.returncode == 0, stop.stderr
    assert launch.finish(timeout=GRACE_S + 30) == 143
    assert f"run {run_id} stopped, exit 143 (SIGTERM)" in stop.stderr
    followed, _ = follower.communicate(timeout=30)  # --follow ends with the launcher
    assert follower.returncode == 0 and followed.count("] ready rank=") == 4
    assert_no_job_processes(cluster, GRACE_S + 5)


def test_logs_keep_rank_tags_after_invalid_utf8_and_name_an_unreachable_host(
    cluster: NamespaceCluster, tmp_path: Path
) -> None:
    """The ranks' log files reach node<I>.out byte for byte: offsets must count those bytes, not
    their decoded text."""
    home, run_dir = tmp_path / "home", tmp_path / "run"
    program = str(REPO / "tests" / "cluster" / "programs" / "badbytes.py")
    run_id = detach(cluster, home, run_dir, "--backend", "deepspeed", "--no-local-rank", "--", "python3", program)
    follow = fstrain(home, "logs", run_id, "--follow", timeout=300)
    assert follow.returncode == 0, follow.stderr
    logs = fstrain(home, "logs", run_id)
    hosts = {0: "node1", 1: "node1", 2: "node2", 3: "node2"}
    for output in (follow.stdout, logs.stdout):
        for rank, host in hosts.items():
            assert f"[{host} r{rank}] rank {rank} bad bytes \ufffd\ufffd\ufffd\ufffd here\n" in output, output[-3000:]
            for line in range(3):
                assert f"[{host} r{rank}] after rank={rank} line={line}\n" in output, output[-3000:]
            assert f"[{host} r{rank}] done rank={rank}\n" in output
        assert all(line.startswith(("[node1", "[node2")) for line in output.splitlines())
    tail = fstrain(home, "logs", run_id, "--rank", "2", "--tail", "2")
    assert tail.stdout == "[node2 r2] after rank=2 line=2\n[node2 r2] done rank=2\n"
    cluster.script("stop-sshd", "2")
    try:
        missing = fstrain(home, "logs", run_id, "--tail", "100")
    finally:
        cluster.script("start-sshd", "2")
    assert missing.returncode == 1
    assert "[node1 r1] done rank=1\n" in missing.stdout and "[node2" not in missing.stdout
    assert missing.stderr.startswith("error: node2: its output could not be read: "), missing.stderr
    assert missing.stderr.count("\n") == 1
    assert_no_job_processes(cluster, 10)


def test_a_run_whose_client_was_killed_while_starting_it_is_listed_and_stopped(
    cluster: NamespaceCluster, tmp_path: Path
) -> None:
    """The client dies after node 0's coordinator started and before node 2 answered: node 2's
    watchdog cannot reach the coordinator's port (its packets to node1 crawl, but for ssh and the
    rendezvous port), so its start hangs for the watchdog's 30 s; the client is killed in there."""
    home, run_dir, master_port = tmp_path / "home", tmp_path / "run", 29533
    node1 = cluster.address(1)
    shaping = [["qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10"],
               ["class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10", "htb", "rate", "1gbit"],
               ["class", "add", "dev", "eth0", "parent", "1:", "classid", "1:20", "htb", "rate", "8bit", "ceil", "8bit",
                "burst", "1", "cburst", "1"]]
    for prio, port in ((1, 22), (2, master_port)):
        shaping.append(["filter", "add", "dev", "eth0", "parent", "1:", "prio", str(prio), "protocol", "ip", "u32",
                        "match", "ip", "dst", f"{node1}/32", "match", "ip", "dport", str(port), "0xffff",
                        "flowid", "1:10"])
    shaping.append(["filter", "add", "dev", "eth0", "parent", "1:", "prio", "3", "protocol", "ip", "u32",
                    "match", "ip", "dst", f"{node1}/32", "flowid", "1:20"])
    for command in shaping:
        cluster.in_namespace(2, "tc", *command)
    try:
        client = subprocess.Popen(
            [sys.executable, "-m", "fstrain", "launch", "--detach", "--ssh-config", cluster.ssh_config,
             "--hosts", "node[1-2]", "--nproc-per-node", "2", "--grace", str(GRACE_S), "--run-dir", str(run_dir),
             "--master-port", str(master_port), "--env", f"PYTHONPATH={REPO}", "--", "python3", WORKER],
            cwd=REPO, env={**os.environ, "HOME": str(home)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while not any("fstrain-watchdog" in p for p in job_processes(cluster).get(cluster.namespace(2), [])):
                assert client.poll() is None and time.monotonic() < deadline, "node2's watchdog never started"
                time.sleep(0.2)
            assert any("fstrain-watchdog" in p for p in job_processes(cluster)[cluster.namespace(1)])
        finally:
            client.kill()
            client.wait()
        rows = json.loads(fstrain(home, "runs", "--json").stdout)["runs"]
        assert [(r["state"], r["nodes"]) for r in rows] == [("starting", ["node1", "node2"])], rows
        run_id = rows[0]["run_id"]
        stop = fstrain(home, "stop", run_id)
        assert stop.returncode == 0, stop.stderr
        assert f"run {run_id} stopped" in stop.stderr
        # node2's watchdog gives up on the coordinator after 30 s and never starts its job.
        assert_no_job_processes(cluster, 45)
        assert json.loads(fstrain(home, "status", run_id, "--json").stdout)["state"] == "stopped"
    finally:
        cluster.in_namespace(2, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)


def test_a_detached_start_that_failed_on_node_0_is_lost_not_starting(
    cluster: NamespaceCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the API, whose process lives on after a failed launch: node 1 cannot make its run
    directory (a file where ~/.fstrain/runs should be), so its watchdog never answers."""
    from fstrain import api
    from fstrain.errors import FstrainError

    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # this machine's index of runs
    blocker = cluster.home(1) / ".fstrain" / "runs"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    saved = tmp_path / "runs-saved"
    if blocker.exists():
        blocker.rename(saved)
    blocker.write_text("not a folder\n")
    try:
        request = api.LaunchRequest(
            hosts=api.HostRequest(hosts="node[1-2]", ssh_config=cluster.ssh_config),
            job=api.JobRequest(program=("python3", WORKER), nproc_per_node=2, env={"PYTHONPATH": str(REPO)}),
            run=api.RunSettings(run_dir=str(tmp_path / "run"), grace_s=GRACE_S, detach=True))
        with open(os.devnull, "w") as sink, pytest.raises(FstrainError, match="node1"):
            api.launch(request, out=sink, report=lambda line: None)
    finally:
        blocker.unlink()
        if saved.exists():
            saved.rename(blocker)
    handles = api.runs()
    assert len(handles) == 1
    state = handles[0].state()
    assert (state.state, state.reason) == ("lost", "the launch ended before node1's watchdog answered")
    assert_no_job_processes(cluster, 10)


def namespace_rank(cluster: NamespaceCluster, index: int, run_id: str, local_rank: int) -> int | None:
    """The pid of a rank of run ``run_id`` on host ``index`` (its environment names the run and the
    local rank; torchrun itself has no LOCAL_RANK), None while there is none."""
    pids = subprocess.run(["ip", "netns", "pids", cluster.namespace(index)], capture_output=True, text=True,
                          check=False).stdout.split()
    for pid in pids:
        try:
            environ = set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if f"FSTRAIN_RUN_ID={run_id}".encode() in environ and f"LOCAL_RANK={local_rank}".encode() in environ:
            return int(pid)
    return None


def keeper_pid(run_dir: Path) -> int:
    return int(json.loads((run_dir / "keeper.json").read_text())["pid"])


def wait_keeper_gone(run_dir: Path, within_s: float) -> None:
    pid, deadline = keeper_pid(run_dir), time.monotonic() + within_s
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not Path(f"/proc/{pid}").exists() or b"fstrain.api.keeper" not in Path(f"/proc/{pid}/cmdline").read_bytes()


def test_a_detached_run_restarts_on_its_own_after_a_rank_dies(cluster: NamespaceCluster, tmp_path: Path) -> None:
    """--detach --on-failure restart: the launch returns once the nodes started; a rank of the
    bundled trainer is killed once; the recovery keeper starts the run again from its last
    checkpoint, with no client connected, and the run succeeds with both attempts recorded."""
    home, run_dir = tmp_path / "home", tmp_path / "run"
    run_id = detach(cluster, home, run_dir, "--nproc-per-node", "1", "--model", "tiny", "--precision", "fp32",
                    "--steps", "6", "--checkpoint-interval", "2", "--heartbeat-timeout", "4",
                    "--on-failure", "restart", "--max-restarts", "1")
    try:
        rows = json.loads(fstrain(home, "runs", "--json").stdout)["runs"]
        assert [r["state"] for r in rows] in (["starting"], ["running"])  # the launch did not wait for the run
        # Node 1's output file, read where the namespace host keeps it (this machine's disk).
        output = Path(json.loads((run_dir / "detached.json").read_text())["nodes"][0]["run_dir"]) / "node0.out"
        deadline = time.monotonic() + 120
        while "[fstrain.train] step 3/6 " not in (output.read_text(errors="replace") if output.exists() else ""):
            assert time.monotonic() < deadline, "rank 0 did not reach step 3 within 120 s"
            time.sleep(0.2)  # then step 2's checkpoint is written
        pid = namespace_rank(cluster, 2, run_id, 0)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        status = wait_state(home, run_id, {"succeeded", "failed", "stopped", "lost", "stalled"}, 180)
        assert status["state"] == "succeeded" and status["exit_code"] == 0, status
        first, second = status["attempts"]
        assert first["exit_code"] == 137 and first["next"] == "restart" and first["last_checkpoint_step"] >= 2
        assert first["steps_lost"] >= 0  # from the ranks' progress lines the nodes recorded
        assert second["hosts"] == ["node1", "node2"] and second["exit_code"] == 0
        assert second["resumed_from_step"] == first["last_checkpoint_step"] and second["progress"] is True
        logs = fstrain(home, "logs", run_id).stdout
        assert logs.count("==== attempt 2 (hosts node1,node2) ====") == 2  # in each node's output
        assert f"restart 1: resumed from step {first['last_checkpoint_step']}" in logs
        assert "[fstrain.train] step 6/6 loss" in logs
        assert "attempt 2 on 2 nodes (node1, node2)" in (run_dir / "keeper.log").read_text()
        wait_keeper_gone(run_dir, 10)
        # The keeper wrote the run's events; `status --watch --json` of the ended run gives them all.
        watched = fstrain(home, "status", run_id, "--watch", "--json")
        assert watched.returncode == 0, watched.stderr
        (line,) = watched.stdout.splitlines()
        document = json.loads(line)
        assert (document["state"], document["exit_code"], document["ended"]) == ("succeeded", 0, True)
        events = document["events"]
        written = [json.loads(e) for e in (run_dir / "events.jsonl").read_text().splitlines()]
        assert events == [{k: v for k, v in e.items() if k != "fstrain"} for e in written]
        assert [(e["kind"], e["attempt"]) for e in events] == [
            ("started", 1), ("first_step", 1), ("failure", 1), ("blame", 1), ("attempt", 2), ("resumed", 2),
            ("first_step", 2), ("finished", 2)], events
        assert (events[2]["host"], events[2]["exit_code"], events[2]["signal"]) == ("node2", 137, "SIGKILL")
        assert events[5]["step"] == first["last_checkpoint_step"]
        assert (events[-1]["state"], events[-1]["exit_code"]) == ("succeeded", 0)
        assert_no_job_processes(cluster, GRACE_S + 8)
    finally:
        fstrain(home, "stop", run_id, "--force")


def test_stop_of_a_detached_recovering_run_leaves_no_next_attempt(cluster: NamespaceCluster, tmp_path: Path) -> None:
    home, run_dir = tmp_path / "home", tmp_path / "run"
    program = str(REPO / "tests" / "cluster" / "programs" / "recovering.py")
    run_id = detach(cluster, home, run_dir, "--nproc-per-node", "1", "--heartbeat-timeout", "4", "--on-failure",
                    "restart", "--max-restarts", "3", "--", "python3", program, "--steps", "200", "--exit-at-step", "2",
                    "--exit-host", "node2", "--first-attempt-only")
    status = wait_state(home, run_id, set(), 0)
    deadline = time.monotonic() + 90
    while len(status["attempts"]) < 1 and time.monotonic() < deadline:  # attempt 1 failed, attempt 2 starts
        time.sleep(1)
        status = json.loads(fstrain(home, "status", run_id, "--json").stdout)
    assert status["state"] in ("starting", "running") and status["keeper"]["alive"], status
    stopped = fstrain(home, "stop", run_id)
    assert stopped.returncode == 0, stopped.stderr
    wait_keeper_gone(run_dir, 30)
    status = json.loads(fstrain(home, "status", run_id, "--json").stdout)
    assert status["state"] == "stopped" and len(status["attempts"]) == 2, status
    assert status["attempts"][0]["next"] == "restart" and status["attempts"][1]["next"] == "stop"
    time.sleep(3)
    assert len(json.loads(fstrain(home, "status", run_id, "--json").stdout)["attempts"]) == 2  # none after
    assert_no_job_processes(cluster, GRACE_S + 8)


def test_a_detached_run_whose_keeper_dies_runs_its_attempt_to_the_end(cluster: NamespaceCluster,
                                                                      tmp_path: Path) -> None:
    home, run_dir = tmp_path / "home", tmp_path / "run"
    program = str(REPO / "tests" / "cluster" / "programs" / "recovering.py")
    run_id = detach(cluster, home, run_dir, "--nproc-per-node", "1", "--on-failure", "restart", "--max-restarts",
                    "1", "--", "python3", program, "--steps", "16", "--step-s", "0.5")
    os.kill(keeper_pid(run_dir), signal.SIGKILL)  # as a reboot of the launching machine would
    wait_keeper_gone(run_dir, 10)
    status = wait_state(home, run_id, {"running"}, 60)
    assert status["state"] == "running" and "recovery keeper gone: no further attempt" in status["reason"], status
    assert "recovery keeper gone" in fstrain(home, "status", run_id).stderr
    status = wait_state(home, run_id, {"succeeded", "failed", "stopped", "lost"}, 90)
    assert status["state"] == "succeeded" and "recovery keeper gone" in status["reason"], status
    assert_no_job_processes(cluster, GRACE_S + 8)
