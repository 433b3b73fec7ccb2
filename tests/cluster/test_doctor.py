"""`fstrain doctor` on the namespace cluster: healthy, then each broken set-up of issue 7.

Every test restores what it breaks (the cluster is shared by the session). Each host's sessions
have their own HOME (the cluster fixture's): the launcher's run records (~/.fstrain/active) of
other test sessions on this machine stay out of the orphan check, and root's ~/.bashrc (pyenv)
does not rewrite PATH, so a host's PATH is what the test sets.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fstrain.core.job.spec import SCRIPT_FLAGS
from fstrain.io.remote import source
from fstrain.io.remote.watchdog import BOOTSTRAP
from tests.conftest import NamespaceCluster
from tests.helpers import run_fstrain

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def homes(cluster: NamespaceCluster) -> dict[int, Path]:
    """Each host's own HOME, which the cluster fixture gives every test (tests/conftest.py)."""
    return {i: cluster.home(i) for i in range(1, cluster.num_hosts + 1)}


def doctor(cluster: NamespaceCluster, *args: str, ssh_config: str | None = None) -> tuple[int, dict[str, Any]]:
    result = run_fstrain("doctor", "--ssh-config", ssh_config or cluster.ssh_config, "--json", *args, timeout=300)
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout)


def by_id(document: dict[str, Any], check_id: str) -> list[dict[str, Any]]:
    return [c for c in document["checks"] if c["id"] == check_id]


def row(document: dict[str, Any], check_id: str, host: str) -> dict[str, Any]:
    return next(c for c in by_id(document, check_id) if host in c["hosts"])


def test_healthy_cluster_is_all_ok(cluster: NamespaceCluster, homes: dict[int, Path]) -> None:
    start = time.monotonic()
    code, document = doctor(cluster, "--hostfile", cluster.hostfile, "--workdir", "/tmp")
    elapsed = time.monotonic() - start
    bad = [c for c in document["checks"] if c["verdict"] not in ("ok", "skipped")]
    assert bad == [] and code == 0
    assert document["summary"]["verdict"] == "ok" and document["summary"]["fail"] == 0
    gpu = [c for c in document["checks"] if c["id"].startswith(("gpu.", "topo."))]
    assert {c["verdict"] for c in gpu} == {"skipped"}
    assert all("no NVIDIA GPU on any host" in c["message"] or c["message"] == "--plan not given" for c in gpu)
    assert by_id(document, "net.reachability") == [{
        "id": "net.reachability", "verdict": "ok", "hosts": cluster.names,
        "message": "reachable from every host on eth0; use NCCL_SOCKET_IFNAME=eth0", "fix": ""}]
    rendezvous = by_id(document, "net.rendezvous_port")
    assert len(rendezvous) == 1 and rendezvous[0]["hosts"] == cluster.names
    assert rendezvous[0]["message"].startswith(f"reaches the master node1 at {cluster.address(1)}:")
    for check in ("ssh.connect", "clock.skew", "net.hostname", "sw.python", "sw.torch", "sw.workdir",
                  "env.consistency", "proc.orphans"):
        assert [c["verdict"] for c in by_id(document, check)] == ["ok"], check
    assert elapsed < 90


def test_checkpoint_dir_is_shared_and_timed(cluster: NamespaceCluster, homes: dict[int, Path],
                                            tmp_path: Path) -> None:
    code, document = doctor(cluster, "--hostfile", cluster.hostfile, "--only", "ckpt", "--checkpoint-dir",
                            str(tmp_path / "ckpt"), "--write-test-mib", "8")
    assert row(document, "ckpt.shared", "node1") == {
        "id": "ckpt.shared", "verdict": "ok", "hosts": cluster.names,
        "message": f"shared: a marker written on node1 (in {tmp_path}) is seen by every host", "fix": ""}
    space = by_id(document, "ckpt.space")
    assert [c["verdict"] for c in space] == ["ok"] and space[0]["message"].startswith("writable, ")
    speed = by_id(document, "ckpt.throughput")
    assert {c["verdict"] for c in speed} <= {"ok", "warn"} and "MB/s with fsync" in speed[0]["message"]
    assert list(tmp_path.iterdir()) == []  # nothing left behind: no directory, no marker, no test file
    assert code in (0, 1)


def test_host_down_is_a_failed_check_not_a_crash(cluster: NamespaceCluster, homes: dict[int, Path]) -> None:
    cluster.script("stop-sshd", "3")
    try:
        code, document = doctor(cluster, "--hostfile", cluster.hostfile, "--only", "ssh,net.rendezvous_port")
        human = run_fstrain("doctor", "--ssh-config", cluster.ssh_config, "--hostfile", cluster.hostfile, "--only",
                            "ssh", env={"COLUMNS": "400"})
    finally:
        cluster.script("start-sshd", "3")
    assert code == 2
    down = row(document, "ssh.connect", "node3")
    assert down["verdict"] == "fail"
    assert down["message"] == f"cannot connect: cannot connect to {cluster.address(3)}:22: Connection refused"
    assert down["fix"].endswith("or leave it out: --exclude node3")
    assert row(document, "ssh.connect", "node1")["verdict"] == "ok"
    assert row(document, "net.rendezvous_port", "node2")["verdict"] == "ok"  # the others went on
    assert human.returncode == 2 and human.stdout == ""
    assert "Connection refused" in human.stderr and "--exclude node3" in human.stderr
    assert human.stderr.rstrip().splitlines()[-1] == "1 checks: 0 ok, 0 skipped, 0 warn, 1 fail; verdict fail (exit 2)"


def test_changed_host_key_is_caught_with_the_command_to_run(cluster: NamespaceCluster, homes: dict[int, Path],
                                                            tmp_path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "impostor")], check=True)
    impostor = " ".join((tmp_path / "impostor.pub").read_text().split()[:2])
    known = tmp_path / "known_hosts"
    lines = cluster.known_hosts.read_text().splitlines()
    known.write_text("".join(f"node2,{cluster.address(2)} {impostor}\n" if line.startswith("node2,") else line + "\n"
                             for line in lines))
    config = tmp_path / "ssh_config"
    config.write_text(Path(cluster.ssh_config).read_text().replace(str(cluster.known_hosts), str(known)))
    code, document = doctor(cluster, "--hostfile", cluster.hostfile, "--only", "ssh", ssh_config=str(config))
    assert code == 2
    changed = row(document, "ssh.connect", "node2")
    assert changed["verdict"] == "fail" and changed["hosts"] == ["node2"]
    assert changed["message"].startswith(f"cannot connect: HOST KEY CHANGED for {cluster.address(2)}")
    assert f"ssh-keygen -R {cluster.address(2)}" in changed["fix"]
    assert row(document, "ssh.connect", "node1")["hosts"] == [n for n in cluster.names if n != "node2"]


def test_blocked_rendezvous_port(cluster: NamespaceCluster, homes: dict[int, Path]) -> None:
    port = 29500  # torch's default: the classic collision with a leftover job
    listener = subprocess.Popen(
        ["ip", "netns", "exec", cluster.namespace(1), sys.executable, "-c",
         "import socket,sys,time; s=socket.socket(); s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen();"
         "print('ready', flush=True); time.sleep(120)", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
        code, document = doctor(cluster, "--hostfile", cluster.hostfile, "--only", "net.rendezvous_port",
                                "--master-port", str(port))
    finally:
        listener.kill()
        listener.wait()
        if listener.stdout is not None:
            listener.stdout.close()
    assert code == 2
    busy, reached = by_id(document, "net.rendezvous_port")
    assert busy["verdict"] == "fail" and busy["hosts"] == ["node1"]
    assert busy["message"] == f"port {port} is already in use on the master (another process listens on it)"
    free = int(busy["fix"].split("--master-port ")[1].split()[0])
    assert free != port and f"(free now), or stop that process (`ss -ltnp 'sport = :{port}'` on node1)" in busy["fix"]
    assert reached == {"id": "net.rendezvous_port", "verdict": "ok", "hosts": cluster.names,
                       "message": f"reaches the master node1 at {cluster.address(1)}:{free}", "fix": ""}


@pytest.fixture(scope="module")
def misconfigured(cluster: NamespaceCluster, homes: dict[int, Path],
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """node1: a typo'd NCCL variable; node2: its hostname resolves to 127.0.1.1; node3: another
    python first on PATH and a bogus NCCL_SOCKET_IFNAME. One doctor run, then everything restored."""
    alt = tmp_path_factory.mktemp("altpython")
    (alt / "python3").symlink_to("/usr/bin/python3")
    configs = {i: cluster.state / f"node{i}" / "sshd_config" for i in (1, 3)}
    before = {i: path.read_text() for i, path in configs.items()}
    hosts_file = Path(f"/etc/netns/{cluster.namespace(2)}/hosts")
    hosts_before = hosts_file.read_text()
    path = next(t for t in before[3].split() if t.startswith("PATH="))
    try:
        cluster.script("set-env", "1", "NCCL_SOKET_IFNAME=eth0")
        cluster.script("set-hosts-entry", "2", "127.0.1.1 node2")
        cluster.script("set-env", "3", f"PATH={alt}:{path[len('PATH='):]}")
        cluster.script("set-env", "3", "NCCL_SOCKET_IFNAME=ib0")
        code, document = doctor(cluster, "--hostfile", cluster.hostfile, "--only", "net,sw,env")
    finally:
        cluster.script("unset-env", "1", "NCCL_SOKET_IFNAME")
        cluster.script("set-hosts-entry", "2", f"{cluster.address(2)} node2")
        cluster.script("set-env", "3", path)
        cluster.script("unset-env", "3", "NCCL_SOCKET_IFNAME")
    assert {i: p.read_text() for i, p in configs.items()} == before and hosts_file.read_text() == hosts_before
    yield {"code": code, "doc": document, "alt": alt}


def test_hostname_resolving_to_127_0_1_1(cluster: NamespaceCluster, misconfigured: dict[str, Any]) -> None:
    found = row(misconfigured["doc"], "net.hostname", "node2")
    assert found["verdict"] == "fail" and found["hosts"] == ["node2"]
    assert found["message"].startswith("its hostname node2 resolves to 127.0.1.1 (loopback)")
    assert found["fix"].startswith(f"on node2, in /etc/hosts replace `127.0.1.1 node2` with `{cluster.address(2)} "
                                   "node2`")
    assert misconfigured["code"] == 2


def test_a_different_python_on_path(misconfigured: dict[str, Any]) -> None:
    python = row(misconfigured["doc"], "sw.python", "node3")
    assert python["verdict"] == "warn" and python["hosts"] == ["node3"]
    assert python["message"].startswith(f"Python: 3.11.2 ({misconfigured['alt']}/python3); most hosts have ")
    assert "or pass --python /" in python["fix"]
    torch = row(misconfigured["doc"], "sw.torch", "node3")
    assert torch["verdict"] == "fail" and torch["message"].startswith("torch: not importable; most hosts have ")


def test_bogus_nccl_socket_ifname(misconfigured: dict[str, Any]) -> None:
    found = row(misconfigured["doc"], "net.socket_ifname", "node3")
    assert found == {"id": "net.socket_ifname", "verdict": "fail", "hosts": ["node3"],
                     "message": "NCCL_SOCKET_IFNAME=ib0 matches no usable interface (it has eth0, lo): NCCL fails "
                                "with 'no socket interface found'",
                     "fix": "set it to eth0 (the interface that reaches the master)"}


def test_typo_in_an_nccl_variable(misconfigured: dict[str, Any]) -> None:
    found = row(misconfigured["doc"], "env.unknown", "node1")
    assert found["verdict"] == "fail" and found["hosts"] == ["node1"]
    assert found["message"] == ("NCCL_SOKET_IFNAME is not an NCCL variable: NCCL ignores it (did you mean "
                                "NCCL_SOCKET_IFNAME?)")
    assert found["fix"] == "rename it to NCCL_SOCKET_IFNAME"


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.parametrize("job_ignores_sigterm", [True, False])
def test_orphans_of_a_lost_watchdog_are_listed_then_ended(cluster: NamespaceCluster, homes: dict[int, Path],
                                                          tmp_path: Path, job_ignores_sigterm: bool) -> None:
    """A watchdog killed with SIGKILL together with its reaper (`kill -9` of all of a user's
    processes, an OOM killer taking both) cleans nothing up. Its job gets SIGTERM from the kernel (a
    parent-death signal): a job that ignores it is left whole; one that dies leaves the child it
    started. Either way `doctor --orphans` lists what is left, by the run's id, and ends it."""
    run_id = f"doctor-test-{os.urandom(3).hex()}"
    state = homes[1] / ".fstrain" / "active"
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN); " if job_ignores_sigterm else ""
    header = {"source": source("watchdog"), "run_id": run_id, "node_rank": 0, "state_dir": str(state),
              "run_dir": str(tmp_path / "run"), "workdir": None, "files": {}, "env": {}, "grace_s": 1,
              "heartbeat_timeout_s": 600,
              "argv": [sys.executable, "-c", f"import signal,subprocess,time; {ignore}"
                                             "subprocess.Popen(['sleep','600']); time.sleep(600)"]}
    watchdog = subprocess.Popen(["ip", "netns", "exec", cluster.namespace(1), sys.executable, *SCRIPT_FLAGS, "-c",
                                 BOOTSTRAP], stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert watchdog.stdin is not None
    watchdog.stdin.write((json.dumps(header) + "\n").encode())
    watchdog.stdin.flush()
    record = state / f"{run_id}.node0.json"
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while not record.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        job = json.loads(record.read_text())["job_pid"]
        started_by = time.monotonic() + 30
        while not _children(job) and time.monotonic() < started_by:  # the job starts its child
            time.sleep(0.05)
        assert _children(job), "the job never started its child"
        reapers = [pid for pid in _children(watchdog.pid) if pid != job]
        assert len(reapers) == 1, reapers
        os.kill(reapers[0], signal.SIGKILL)  # first, or it would end the job the moment the watchdog dies
        os.kill(watchdog.pid, signal.SIGKILL)  # the watchdog dies without cleaning up: its job is orphaned
        watchdog.wait()
        if not job_ignores_sigterm:  # the parent-death signal ends the job itself
            gone_by = time.monotonic() + 5
            while Path(f"/proc/{job}").exists() and "Z" not in _state(job) and time.monotonic() < gone_by:
                time.sleep(0.05)
            assert not Path(f"/proc/{job}").exists() or "Z" in _state(job)
        code, listed = doctor(cluster, "--hosts", "node1", "--orphans")
        orphans = [o for o in listed["orphans"] if o["run_id"] == run_id]
        pids = orphans[0]["pids"]
        assert code == 2 and orphans[0]["state"] == "orphan"
        found = row(listed, "proc.orphans", "node1")
        assert found["verdict"] == "fail"
        if job_ignores_sigterm:  # the job and its child
            assert pids[0] == job and len(pids) == 2
            assert f"run {run_id} node 0 (pids {pids[0]},{pids[1]})" in found["message"]
        else:  # the job died of its parent-death signal; its child is left
            assert job not in pids and len(pids) == 1
            assert f"run {run_id} node 0 (pids {pids[0]})" in found["message"]
        assert found["fix"] == "end them: `fstrain doctor --kill-orphans` (by the recorded ids only)"
        code, ended = doctor(cluster, "--hosts", "node1", "--kill-orphans")
        assert code == 0, ended
        assert sorted(next(o for o in ended["orphans"] if o["run_id"] == run_id)["killed"]) == sorted(pids)
        assert row(ended, "proc.orphans", "node1")["message"].startswith(f"ended orphans of run {run_id}")
        assert not any(Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) for pid in pids)
        assert not record.exists()
    finally:
        if watchdog.poll() is None:
            watchdog.kill()
            watchdog.wait()
        watchdog.stdin.close()
        for pid in pids:
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
        record.unlink(missing_ok=True)  # a failed case leaves no record for the next one's doctor to find


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"
