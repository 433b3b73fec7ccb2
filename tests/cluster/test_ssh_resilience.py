"""SSH on a stranger's machine: unusual known_hosts, host certificates, frozen hosts, ssh_config
with Include and ProxyCommand. Real sshd in network namespaces; every test restores what it
stops (a stopped sshd is always continued)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.test_ssh_exec import exec_json, write_config
from tests.conftest import NamespaceCluster
from tests.helpers import REPO

pytestmark = pytest.mark.cluster

CORRUPT = "node9 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA!!!corrupt"


def host_key(cluster: NamespaceCluster, index: int) -> str:
    """``TYPE BASE64`` of host ``index``'s key."""
    return " ".join((cluster.state / f"node{index}" / "ssh_host_ed25519_key.pub").read_text().split()[:2])


def _keygen(*args: str) -> None:
    subprocess.run(["ssh-keygen", "-q", *args], check=True, capture_output=True)


def test_known_hosts_with_markers_and_a_corrupt_line(cluster: NamespaceCluster, tmp_path: Path) -> None:
    _keygen("-t", "ed25519", "-N", "", "-f", str(tmp_path / "someone"))
    other = " ".join((tmp_path / "someone.pub").read_text().split()[:2])
    known = tmp_path / "known_hosts"
    known.write_text(
        f"{CORRUPT}\n"
        f"@cert-authority *.corp.example {other}\n"
        f"@revoked * {other}\n"
        + "".join(f"node{i},{cluster.address(i)} {host_key(cluster, i)}\n" for i in (1, 2, 3))
    )
    config = write_config(cluster, tmp_path / "cfg", UserKnownHostsFile=str(known))
    code, hosts, stderr = exec_json(cluster, "--hosts", "node[1-3]", "--", "hostname", ssh_config=config)
    assert code == 0, hosts
    assert [hosts[n]["stdout"] for n in ("node1", "node2", "node3")] == ["node1\n", "node2\n", "node3\n"]
    assert stderr.count("warning:") == 1  # one warning, not one per host
    assert f"warning: {known}:1: the key is not valid base64: line skipped" in stderr

    # @revoked names node2's own key: node2 is refused, the others go on.
    with known.open("a") as handle:
        handle.write(f"@revoked node2 {host_key(cluster, 2)}\n")
    code, hosts, _ = exec_json(cluster, "--hosts", "node[1-3]", "--", "true", ssh_config=config)
    assert code == 1
    assert hosts["node1"]["exit_code"] == 0 and hosts["node3"]["exit_code"] == 0
    assert f"is marked @revoked at {known}:7" in str(hosts["node2"]["error"])


@contextmanager
def certified_sshd(cluster: NamespaceCluster, folder: Path, port: int = 2222,
                   user_certificates_only: bool = False) -> Iterator[Path]:
    """A second sshd on host 1 (``port``) presenting a host certificate signed by a new CA
    (and, with ``user_certificates_only``, accepting only user certificates of that CA);
    yields the CA's private key file (its public key is next to it)."""
    _keygen("-t", "ed25519", "-N", "", "-f", str(folder / "ca"))
    node = cluster.state / "node1"
    key = folder / "ssh_host_ed25519_key"
    key.write_bytes((node / "ssh_host_ed25519_key").read_bytes())
    key.chmod(0o600)
    (folder / "ssh_host_ed25519_key.pub").write_bytes((node / "ssh_host_ed25519_key.pub").read_bytes())
    _keygen("-s", str(folder / "ca"), "-I", "node1-host", "-h", "-n", f"{cluster.address(1)},node1",
            "-V", "-1h:+1h", str(folder / "ssh_host_ed25519_key.pub"))
    lines = [line for line in (node / "sshd_config").read_text().splitlines()
             if not line.startswith(("ListenAddress", "HostKey", "PidFile"))]
    lines += [f"ListenAddress {cluster.address(1)}:{port}", f"HostKey {key}",
              f"HostCertificate {folder / 'ssh_host_ed25519_key-cert.pub'}", f"PidFile {folder / 'sshd.pid'}"]
    if user_certificates_only:
        lines = [line for line in lines if not line.startswith("AuthorizedKeysFile")]
        lines += ["AuthorizedKeysFile none", f"TrustedUserCAKeys {folder / 'ca.pub'}"]
    (folder / "sshd_config").write_text("\n".join(lines) + "\n")
    cluster.in_namespace(1, "/usr/sbin/sshd", "-f", str(folder / "sshd_config"), "-E", str(folder / "sshd.log"))
    try:
        for _ in range(100):
            if (folder / "sshd.pid").exists():
                break
            time.sleep(0.1)
        yield folder / "ca"
    finally:
        pid = int((folder / "sshd.pid").read_text())
        os.kill(pid, signal.SIGTERM)


def test_host_certificate_signed_by_a_known_ca(cluster: NamespaceCluster, tmp_path: Path) -> None:
    with certified_sshd(cluster, tmp_path) as ca:
        known = tmp_path / "known_hosts"
        config = tmp_path / "cfg"
        config.write_text(
            f"Host certified\n    HostName {cluster.address(1)}\n    Port 2222\n    User root\n"
            f"    IdentityFile {cluster.state}/id_ed25519\n    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {known}\n    StrictHostKeyChecking yes\n    ConnectTimeout 5\n")
        known.write_text(f"{CORRUPT}\n")  # no CA: the host is unknown
        code, hosts, _ = exec_json(cluster, "--hosts", "certified", "--", "hostname", ssh_config=str(config))
        assert code == 1 and "unknown host key" in str(hosts["certified"]["error"])

        ca_key = " ".join(Path(f"{ca}.pub").read_text().split()[:2])
        known.write_text(f"{CORRUPT}\n@cert-authority [{cluster.subnet}.*]:2222 {ca_key}\n")
        code, hosts, stderr = exec_json(cluster, "--hosts", "certified", "--", "sh", "-c", 'echo "$SSH_CONNECTION"',
                                        ssh_config=str(config))
        assert code == 0, hosts
        assert str(hosts["certified"]["stdout"]).split()[2:] == [cluster.address(1), "2222"]
        assert "line skipped" in stderr

        # The same CA, revoked: refused.
        known.write_text(f"@cert-authority [{cluster.subnet}.*]:2222 {ca_key}\n@revoked * {ca_key}\n")
        code, hosts, _ = exec_json(cluster, "--hosts", "certified", "--", "true", ssh_config=str(config))
        assert code == 1 and "is marked @revoked" in str(hosts["certified"]["error"])


def namespace_pids(cluster: NamespaceCluster, index: int, command: str) -> list[int]:
    """The processes of host ``index``'s namespace whose command name starts with ``command``."""
    listed = subprocess.run(["ip", "netns", "pids", cluster.namespace(index)], capture_output=True, text=True,
                            check=True).stdout.split()
    pids = []
    for pid in listed:
        try:
            if Path(f"/proc/{pid}/comm").read_text().startswith(command):
                pids.append(int(pid))
        except OSError:
            continue
    return pids


def sshd_pids(cluster: NamespaceCluster, index: int) -> list[int]:
    """The sshd processes (listener and sessions) of host ``index``'s namespace."""
    return namespace_pids(cluster, index, "sshd")


def wait_for_process(cluster: NamespaceCluster, index: int, command: str, timeout_s: float = 60) -> None:
    """Until host ``index`` runs ``command`` (however long connecting takes on a loaded machine)."""
    deadline = time.monotonic() + timeout_s
    while not namespace_pids(cluster, index, command):
        assert time.monotonic() < deadline, f"host {index} never ran {command}"
        time.sleep(0.05)


@contextmanager
def frozen(pids: list[int]) -> Iterator[None]:
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def test_host_frozen_mid_command_is_reported_lost(cluster: NamespaceCluster, tmp_path: Path) -> None:
    config = write_config(cluster, tmp_path / "cfg", extra="Host *\n    ServerAliveInterval 1\n")
    argv = [sys.executable, "-m", "fstrain", "exec", "--ssh-config", config, "--json", "--hosts", "node[1-3]",
            "--", "sleep", "4"]
    start = time.monotonic()
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO) as proc:
        wait_for_process(cluster, 2, "sleep")  # connected, the command running there
        with frozen(sshd_pids(cluster, 2)):
            try:
                stdout, _ = proc.communicate(timeout=60)
            finally:
                proc.kill()
    elapsed = time.monotonic() - start
    hosts: dict[str, Any] = {h["host"]: h for h in json.loads(stdout)["hosts"]}
    assert proc.returncode == 1
    assert hosts["node1"]["exit_code"] == 0 and hosts["node3"]["exit_code"] == 0
    assert hosts["node2"]["exit_code"] is None
    assert "host lost: no answer for 3 s while the command ran" in hosts["node2"]["error"]
    assert "frozen" in hosts["node2"]["error"]
    assert elapsed < 30


def test_frozen_sshd_does_not_freeze_exec_or_doctor(cluster: NamespaceCluster, tmp_path: Path) -> None:
    listener = int((cluster.state / "node2" / "sshd.pid").read_text())
    config = write_config(cluster, tmp_path / "cfg", ConnectTimeout="2")
    with frozen([listener]):  # TCP still accepted by the kernel, never a greeting
        start = time.monotonic()
        code, hosts, _ = exec_json(cluster, "--hosts", "node[1-3]", "--", "true", ssh_config=config)
        exec_s = time.monotonic() - start
        start = time.monotonic()
        doctor = subprocess.run([sys.executable, "-m", "fstrain", "doctor", "--ssh-config", config, "--json",
                                 "--hosts", "node[1-3]", "--only", "ssh"], capture_output=True, text=True,
                                cwd=REPO, timeout=120, check=False)
        doctor_s = time.monotonic() - start
    assert code == 1 and hosts["node1"]["exit_code"] == 0 and hosts["node3"]["exit_code"] == 0
    # The greeting or the key exchange, whichever deadline passes first: both name the host and 2 s.
    assert f"{cluster.address(2)}:22" in str(hosts["node2"]["error"]) and "within 2 s" in str(hosts["node2"]["error"])
    assert "frozen" in str(hosts["node2"]["error"])
    assert exec_s < 20
    checks = json.loads(doctor.stdout)["checks"]
    node2 = next(c for c in checks if c["id"] == "ssh.connect" and "node2" in c["hosts"])
    assert node2["verdict"] == "fail" and "within 2 s" in node2["message"], node2
    assert doctor_s < 40


def test_ssh_config_include_resolved_with_ssh_g(cluster: NamespaceCluster, tmp_path: Path) -> None:
    included = tmp_path / "cluster.conf"
    included.write_text(
        f"Host inc-*\n    User root\n    IdentityFile {cluster.state}/id_ed25519\n    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {cluster.known_hosts}\n    StrictHostKeyChecking yes\n"
        f"Host inc-2\n    HostName {cluster.address(2)}\n")
    main = tmp_path / "config"
    main.write_text(f"Include {included}\n")
    code, hosts, stderr = exec_json(cluster, "--hosts", "inc-2", "--", "hostname", ssh_config=str(main))
    assert code == 0, hosts
    assert hosts["inc-2"]["stdout"] == "node2\n"
    assert stderr == ""
    # Without the OpenSSH client, paramiko cannot follow Include: said once, not a silent wrong host.
    no_ssh = {"PATH": str(tmp_path / "empty-bin")}
    code, hosts, stderr = exec_json(cluster, "--hosts", "inc-2", "--", "hostname", ssh_config=str(main), env=no_ssh)
    assert code == 1
    assert stderr.count("warning:") == 1 and "Include is not honoured without the OpenSSH client" in stderr


def test_proxy_command_is_honoured(cluster: NamespaceCluster, tmp_path: Path) -> None:
    # ProxyCommand through node1 with the OpenSSH client itself (`ssh -W`), to reach node3.
    jump = f"ssh -F {cluster.ssh_config} -W %h:%p node1"
    config = write_config(cluster, tmp_path / "cfg", extra=(
        f"Host via-proxy\n    HostName {cluster.address(3)}\n    ProxyCommand {jump}\n    User root\n"
        f"    IdentityFile {cluster.state}/id_ed25519\n    UserKnownHostsFile {cluster.known_hosts}\n"))
    code, hosts, _ = exec_json(cluster, "--hosts", "via-proxy", "--", "sh", "-c", 'hostname; echo "$SSH_CONNECTION"',
                               ssh_config=config)
    assert code == 0, hosts
    name, connection = str(hosts["via-proxy"]["stdout"]).splitlines()
    assert name == "node3" and connection.split()[0] == cluster.address(1)


def test_frozen_sshd_stops_launch_at_preflight(cluster: NamespaceCluster, tmp_path: Path) -> None:
    listener = int((cluster.state / "node2" / "sshd.pid").read_text())
    config = write_config(cluster, tmp_path / "cfg", ConnectTimeout="2")
    with frozen([listener]):
        start = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "fstrain", "launch", "--ssh-config", config, "--hosts",
                                 "node[1-3]", "--nproc-per-node", "1", "--run-dir", str(tmp_path / "run"), "--",
                                 "true"], capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
        elapsed = time.monotonic() - start
    assert result.returncode == 2, result.stderr
    assert "preflight failed on node2" in result.stderr and "within 2 s" in result.stderr
    assert "Traceback" not in result.stderr
    assert elapsed < 40


def test_certificate_file_is_offered_with_its_key(cluster: NamespaceCluster, tmp_path: Path) -> None:
    (tmp_path / "sshd").mkdir()
    with certified_sshd(cluster, tmp_path / "sshd", user_certificates_only=True) as ca:
        keys = tmp_path / "keys"
        keys.mkdir()
        _keygen("-t", "ed25519", "-N", "", "-f", str(keys / "user"))
        _keygen("-s", str(ca), "-I", "someone", "-n", "root", "-V", "-1h:+1h", str(keys / "user.pub"))
        cert = keys / "issued.cert"  # not user-cert.pub: found through CertificateFile only
        (keys / "user-cert.pub").rename(cert)
        known = tmp_path / "known_hosts"
        ca_key = " ".join(Path(f"{ca}.pub").read_text().split()[:2])
        known.write_text(f"@cert-authority [{cluster.subnet}.*]:2222 {ca_key}\n")
        base = (f"Host certified\n    HostName {cluster.address(1)}\n    Port 2222\n    User root\n"
                f"    IdentityFile {keys / 'user'}\n    IdentitiesOnly yes\n    UserKnownHostsFile {known}\n")
        config = tmp_path / "cfg"
        config.write_text(base)
        code, hosts, _ = exec_json(cluster, "--hosts", "certified", "--", "true", ssh_config=str(config))
        assert code == 1 and "authentication failed" in str(hosts["certified"]["error"])
        config.write_text(base + f"    CertificateFile {cert}\n")
        code, hosts, _ = exec_json(cluster, "--hosts", "certified", "--", "true", ssh_config=str(config))
        assert code == 0, hosts
