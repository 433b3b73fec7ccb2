"""Host resolution from an OpenSSH client config: `ssh -G` when installed, paramiko otherwise."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fstrain.core.hosts.hostfile import Host
from fstrain.io.sshconfig import DEFAULT_SERVER_ALIVE_INTERVAL_S, SshConfig
from tests.helpers import require_tool


def write_configs(folder: Path) -> Path:
    (folder / "included.conf").write_text(
        "Host inc-*\n    User bob\n    Port 2200\n    IdentityFile ~/.ssh/cluster_key\n"
        "Host inc-2\n    HostName 10.9.8.2\n    ProxyCommand nc -X connect %h %p %r %%\n"
        "    CertificateFile ~/.ssh/cluster_key-cert.pub\n    ServerAliveInterval 2\n    ServerAliveCountMax 4\n")
    main = folder / "config"
    main.write_text(f"Include {folder / 'included.conf'}\nHost plain\n    HostName 10.9.8.1\n"
                    "    StrictHostKeyChecking no\n    ConnectTimeout 3\n")
    return main


def test_ssh_g_follows_include_and_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    require_tool("ssh", "apt-get install openssh-client")
    monkeypatch.setenv("HOME", str(tmp_path))
    config = SshConfig(str(write_configs(tmp_path)), use_openssh=True)
    assert config.resolver == "ssh -G"
    target = config.resolve(Host("inc-2"))
    assert (target.hostname, target.user, target.port) == ("10.9.8.2", "bob", 2200)
    assert target.identity_files == (f"{tmp_path}/.ssh/cluster_key",)
    assert target.proxy_command == "nc -X connect 10.9.8.2 2200 bob %"
    assert target.certificate_files == (f"{tmp_path}/.ssh/cluster_key-cert.pub",)
    assert (target.server_alive_interval_s, target.server_alive_count_max) == (2.0, 4)
    plain = config.resolve(Host("plain", user="root", port=22))
    assert (plain.hostname, plain.user, plain.port, plain.strict_host_key_checking, plain.connect_timeout_s) == (
        "10.9.8.1", "root", 22, "no", 3.0)
    assert plain.server_alive_interval_s == DEFAULT_SERVER_ALIVE_INTERVAL_S
    assert plain.known_hosts_files[0] == f"{tmp_path}/.ssh/known_hosts"  # $HOME, not the passwd entry
    assert capsys.readouterr().err == ""


def test_paramiko_fallback_warns_once_about_include(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = SshConfig(str(write_configs(tmp_path)), use_openssh=False)
    assert config.resolver == "paramiko"
    assert config.resolve(Host("inc-2")).hostname == "inc-2"  # the included file is not read
    assert config.resolve(Host("plain")).hostname == "10.9.8.1"
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "Include is not honoured without the OpenSSH client" in err


def test_keys_fstrain_cannot_honour_are_named_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config"
    path.write_text("Host a b\n    HostKeyAlias shared\n")
    config = SshConfig(str(path), use_openssh=shutil.which("ssh") is not None)
    config.resolve(Host("a"))
    config.resolve(Host("b"))
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "hostkeyalias (shared) for a is not honoured" in err


def test_an_alias_and_its_hostname_are_one_host(tmp_path: Path) -> None:
    from fstrain.core.hosts.hostfile import parse_host_list
    from fstrain.errors import InventoryError
    from fstrain.io.connect import check_distinct_endpoints

    path = tmp_path / "config"
    path.write_text("Host gpu-a\n    HostName 10.9.8.1\nHost gpu-b\n    HostName 10.9.8.2\n")
    check_distinct_endpoints(parse_host_list("gpu-a,gpu-b,10.9.8.1:2222"), str(path))
    with pytest.raises(InventoryError, match=r"duplicate host 'root@10.9.8.1': the same machine as 'gpu-a' "
                                             r"\(10.9.8.1, port 22 after the SSH config\)"):
        check_distinct_endpoints(parse_host_list("gpu-a,gpu-b,root@10.9.8.1"), str(path))


def test_one_machine_under_two_names_is_refused_naming_both_lines(tmp_path: Path) -> None:
    from fstrain.core.hosts.hostfile import parse_hostfile
    from fstrain.errors import InventoryError
    from fstrain.io.connect import check_distinct_endpoints

    require_tool("ssh", "apt-get install openssh-client")
    config = tmp_path / "config"
    config.write_text("Host gpu-a\n    HostName Node7.example\nHost gpu-b\n    HostName node7.example\n"
                      "    Port 22\nHost gpu-c\n    HostName node7.example\n    Port 2222\n")
    hostfile = tmp_path / "hosts"
    cases = {"gpu-a slots=8\ngpu-c slots=8\nnode7.example:22 slots=8\n": ("node7.example:22", "gpu-a"),
             "gpu-a slots=8\ngpu-c slots=8\ngpu-b slots=8\n": ("gpu-b", "gpu-a")}
    for text, (second, first) in cases.items():
        hosts = parse_hostfile(text, str(hostfile))  # apart by their names: the config makes them one
        with pytest.raises(InventoryError) as info:
            check_distinct_endpoints(hosts, str(config))
        assert info.value.one_line() == (
            f"{hostfile}:3: duplicate host '{second}': the same machine as '{first}' at {hostfile}:1 "
            "(node7.example, port 22 after the SSH config) (hint: list each machine once and raise its slots instead)")


class _SilentTransport:
    """A transport whose server never answers a keep-alive (a frozen sshd)."""

    def __init__(self, answers: bool) -> None:
        self.answers = answers
        self.asked = 0

    def global_request(self, kind: str, wait: bool = True) -> None:
        import time

        self.asked += 1
        if not self.answers:
            time.sleep(30)

    def is_active(self) -> bool:
        return True


@pytest.mark.parametrize("answers", [True, False])
def test_liveness_declares_a_silent_host_lost(answers: bool) -> None:
    import time

    from fstrain.io.transport.ssh import Liveness

    transport = _SilentTransport(answers)
    liveness = Liveness(transport, 0.2, 3, "h")  # type: ignore[arg-type]
    start = time.monotonic()
    lost = False
    while time.monotonic() - start < 1.5 and not lost:
        lost = liveness.lost()
        time.sleep(0.02)
    assert lost is not answers
    assert transport.asked >= 1
    if not answers:
        assert 0.55 < time.monotonic() - start < 1.2  # 0.2 s x 3 probes of silence
