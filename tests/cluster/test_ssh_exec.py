"""`fstrain exec` and the SSH transport against real sshd in network namespaces."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from fstrain.core.hosts.hostfile import Host
from fstrain.errors import HostKeyError
from fstrain.io.sshconfig import SshConfig
from fstrain.io.transport.ssh import SshTransport
from tests.conftest import NamespaceCluster
from tests.helpers import require_tool, run_fstrain

pytestmark = pytest.mark.cluster

HOSTILE = ["a b", "'single'", '"double"', "$(touch /tmp/fstrain-pwned)", "`id`", "x; echo injected",
           "new\nline", "*", "~", "$HOME", "\\", "", "--", "-n"]


def exec_json(cluster: NamespaceCluster, *args: str, ssh_config: str | None = None,
              env: dict[str, str] | None = None) -> tuple[int, dict[str, dict[str, object]], str]:
    result = run_fstrain("exec", "--ssh-config", ssh_config or cluster.ssh_config, "--json", *args, env=env)
    document = json.loads(result.stdout)
    return result.returncode, {h["host"]: h for h in document["hosts"]}, result.stderr


def write_config(cluster: NamespaceCluster, path: Path, extra: str = "", **overrides: str) -> str:
    """A copy of the cluster's ssh_config with some keys replaced in every Host block."""
    lines = []
    for line in (cluster.state / "ssh_config").read_text().splitlines():
        key = line.strip().split(" ")[0]
        if key in overrides:
            value = overrides[key]
            if value:
                lines.append(f"    {key} {value}")
            continue
        lines.append(line)
    path.write_text("\n".join(lines) + "\n" + extra)
    return str(path)


def test_exec_runs_on_every_host_with_own_hostname(cluster: NamespaceCluster) -> None:
    code, hosts, _ = exec_json(cluster, "--hostfile", cluster.hostfile, "--", "hostname")
    assert code == 0
    assert {name: h["stdout"] for name, h in hosts.items()} == {n: f"{n}\n" for n in cluster.names}
    assert all(h["exit_code"] == 0 and h["error"] is None for h in hosts.values())


def test_exec_groups_identical_output(cluster: NamespaceCluster) -> None:
    result = run_fstrain("exec", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-3]", "--", "echo", "same")
    assert result.returncode == 0
    assert result.stdout == "----------------\nnode[1-3]\n----------------\nsame\n"
    assert "3 hosts: all ok" in result.stderr


def test_hostile_arguments_reach_the_program_literally(cluster: NamespaceCluster) -> None:
    marker = Path("/tmp/fstrain-pwned")
    marker.unlink(missing_ok=True)
    code, hosts, _ = exec_json(cluster, "--hosts", "node[1-3]", "--", "python3", "-c",
                               "import json, sys; print(json.dumps(sys.argv[1:]))", *HOSTILE)
    assert code == 0
    for host in hosts.values():
        assert json.loads(str(host["stdout"])) == HOSTILE
    assert not marker.exists()


def test_exit_codes_and_signals_per_host(cluster: NamespaceCluster) -> None:
    code, hosts, _ = exec_json(cluster, "--hosts", "node[1-3]", "--", "sh", "-c",
                               'case $(hostname) in node1) exit 0;; node2) exit 7;; *) kill -9 $$;; esac')
    assert code == 1
    assert [hosts[n]["exit_code"] for n in ("node1", "node2", "node3")] == [0, 7, 137]


def test_host_down_and_unreachable_are_reported_and_others_go_on(cluster: NamespaceCluster, tmp_path: Path) -> None:
    config = write_config(cluster, tmp_path / "cfg", extra=(
        f"Host ghost\n    HostName {cluster.subnet}.99\n    User root\n"
        f"    IdentityFile {cluster.state}/id_ed25519\n    ConnectTimeout 1\n"
    ))
    cluster.script("stop-sshd", "3")
    try:
        start = time.monotonic()
        code, hosts, stderr = exec_json(cluster, "--hosts", "node[1-3],ghost", "--", "true", ssh_config=config)
        elapsed = time.monotonic() - start
    finally:
        cluster.script("start-sshd", "3")
    assert code == 1
    assert hosts["node1"]["exit_code"] == 0 and hosts["node2"]["exit_code"] == 0
    assert hosts["node3"]["exit_code"] is None
    assert f"cannot connect to {cluster.address(3)}:22: Connection refused" in str(hosts["node3"]["error"])
    assert "timed out after 1 s" in str(hosts["ghost"]["error"])
    assert elapsed < 20
    assert stderr == ""


def test_wrong_key_is_refused_by_name(cluster: NamespaceCluster, tmp_path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    config = write_config(cluster, tmp_path / "cfg", IdentityFile=str(tmp_path / "other"))
    code, hosts, _ = exec_json(cluster, "--hosts", "node1,node2", "--", "true", ssh_config=config,
                               env={"SSH_AUTH_SOCK": ""})
    assert code == 1
    for host in hosts.values():
        assert str(host["error"]).startswith(f"authentication failed for root@{cluster.subnet}.1")
        assert "rejected" in str(host["error"])


def test_unknown_host_key_refused_then_accepted_with_flag(cluster: NamespaceCluster, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    config = write_config(cluster, tmp_path / "cfg", UserKnownHostsFile=str(known))
    code, hosts, _ = exec_json(cluster, "--hosts", "node1", "--", "true", ssh_config=config)
    assert code == 1
    assert f"unknown host key for {cluster.address(1)}" in str(hosts["node1"]["error"])
    assert "--accept-new-hosts" in str(hosts["node1"]["error"])
    assert not known.exists()
    code, hosts, _ = exec_json(cluster, "--hosts", "node1", "--accept-new-hosts", "--", "true", ssh_config=config)
    assert code == 0
    assert known.read_text().startswith(f"{cluster.address(1)} ssh-ed25519 ")
    code, _, _ = exec_json(cluster, "--hosts", "node1", "--", "true", ssh_config=config)
    assert code == 0


def test_changed_host_key_is_always_refused(cluster: NamespaceCluster, tmp_path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "impostor")], check=True)
    fake_key = (tmp_path / "impostor.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"{cluster.address(1)} {fake_key[0]} {fake_key[1]}\n")
    config = write_config(cluster, tmp_path / "cfg", UserKnownHostsFile=str(known))
    code, hosts, _ = exec_json(cluster, "--hosts", "node1", "--accept-new-hosts", "--", "true", ssh_config=config)
    assert code == 1
    assert f"HOST KEY CHANGED for {cluster.address(1)}" in str(hosts["node1"]["error"])
    assert f"ssh-keygen -R {cluster.address(1)}" in str(hosts["node1"]["error"])
    assert known.read_text().count("\n") == 1


def test_proxy_jump_goes_through_the_jump_host(cluster: NamespaceCluster, tmp_path: Path) -> None:
    config = write_config(cluster, tmp_path / "cfg", extra=(
        f"Host behind2\n    HostName {cluster.address(2)}\n    ProxyJump node1\n    User root\n"
        f"    IdentityFile {cluster.state}/id_ed25519\n    UserKnownHostsFile {cluster.known_hosts}\n"
    ))
    script = 'hostname; echo "$SSH_CONNECTION"'
    code, hosts, _ = exec_json(cluster, "--hosts", "behind2,node2", "--", "sh", "-c", script, ssh_config=config)
    assert code == 0
    jumped = str(hosts["behind2"]["stdout"]).splitlines()
    direct = str(hosts["node2"]["stdout"]).splitlines()
    assert jumped[0] == direct[0] == "node2"
    assert jumped[1].split()[0] == cluster.address(1)  # the connection came from node1
    assert direct[1].split()[0] == cluster.bridge_address  # the bridge address of this machine


def test_default_user_config_and_ssh_agent(cluster: NamespaceCluster, tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    # ~/.ssh/config without IdentityFile: the key must come from ssh-agent.
    write_config(cluster, home / ".ssh" / "config", IdentityFile="", IdentitiesOnly="")
    agent = subprocess.run(["ssh-agent", "-s"], capture_output=True, text=True, check=True).stdout
    agent_env = dict(part.split("=", 1) for part in agent.replace(";", "\n").split() if "=" in part)
    env = {"HOME": str(home), "SSH_AUTH_SOCK": agent_env["SSH_AUTH_SOCK"]}
    try:
        no_key = run_fstrain("exec", "--json", "--hosts", "node1", "--", "true", env=env)
        assert json.loads(no_key.stdout)["hosts"][0]["error"].startswith("authentication failed")
        subprocess.run(["ssh-add", "-q", str(cluster.state / "id_ed25519")], check=True,
                       env={**os.environ, **env}, capture_output=True)
        with_agent = run_fstrain("exec", "--json", "--hosts", "node1", "--", "hostname", env=env)
        assert json.loads(with_agent.stdout)["hosts"][0]["stdout"] == "node1\n"
    finally:
        subprocess.run(["kill", agent_env["SSH_AGENT_PID"]], check=False)


def test_user_and_port_in_the_inventory_win(cluster: NamespaceCluster, tmp_path: Path) -> None:
    config = tmp_path / "cfg"
    config.write_text(
        f"Host {cluster.subnet}.*\n    User nobody-here\n    Port 2200\n"
        f"    IdentityFile {cluster.state}/id_ed25519\n    UserKnownHostsFile {cluster.known_hosts}\n"
    )
    target = f"root@{cluster.address(2)}:22"
    code, hosts, _ = exec_json(cluster, "--hosts", target, "--", "hostname", ssh_config=str(config))
    assert code == 0
    assert hosts[f"root@{cluster.address(2)}:22"]["stdout"] == "node2\n"


def test_fanout_runs_hosts_in_parallel_on_one_connection(cluster: NamespaceCluster) -> None:
    config = SshConfig(cluster.ssh_config)
    transport = SshTransport(config.resolve(Host("node1")), config)
    try:
        first = transport.run(["sh", "-c", "echo $SSH_CONNECTION"])
        second = transport.run(["sh", "-c", "echo $SSH_CONNECTION"])
    finally:
        transport.close()
    assert first.stdout == second.stdout  # same client port: the connection was reused
    # Each host says when its 1 s sleep began and ended (the namespaces share this machine's
    # clock): side by side, every sleep began before any ended, however slow the machine is.
    code, hosts, _ = exec_json(cluster, "--hosts", "node[1-3]", "--fanout", "3", "--", "sh", "-c",
                               "date +%s.%N; sleep 1; date +%s.%N")
    assert code == 0 and len(hosts) == 3
    spans = [[float(x) for x in str(h["stdout"]).split()] for h in hosts.values()]
    assert max(began for began, _ in spans) < min(ended for _, ended in spans), spans


def test_transport_api_raises_typed_errors(cluster: NamespaceCluster, tmp_path: Path) -> None:
    config_path = write_config(cluster, tmp_path / "cfg", UserKnownHostsFile=str(tmp_path / "empty"))
    config = SshConfig(config_path)
    transport = SshTransport(config.resolve(Host("node1")), config)
    with pytest.raises(HostKeyError, match="unknown host key"):
        transport.connect()
    result = transport.run(["true"])
    assert result.exit_code is None and result.error and "unknown host key" in result.error


@pytest.fixture(autouse=True, scope="module")
def _need_ssh_client() -> None:
    require_tool("ssh-agent", "apt-get install openssh-client")
