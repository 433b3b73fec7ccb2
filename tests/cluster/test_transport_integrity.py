"""The SSH transport returns every byte of a command's output, under CPU contention.

sshd sends a command's exit status as soon as the command ends, while the end of its output may
still be in flight: a reader that stops at the exit status returns a short output with exit 0.
These tests fetch multi-MB outputs repeatedly while busy loops take the CPUs, and compare every
byte (``FSTRAIN_INTEGRITY_ROUNDS`` sets the number of fetches; 100 for a soak).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fstrain.core.hosts.hostfile import Host
from fstrain.io.sshconfig import SshConfig
from fstrain.io.transport.ssh import SshTransport
from tests.conftest import NamespaceCluster
from tests.integrity import CAT_TWICE, cpu_hogs, payload, payload_lines, started_lines

pytestmark = pytest.mark.cluster
ROUNDS = int(os.environ.get("FSTRAIN_INTEGRITY_ROUNDS", "30"))
SIZE = int(os.environ.get("FSTRAIN_INTEGRITY_BYTES", "1500000"))


@pytest.fixture
def transport(cluster: NamespaceCluster) -> SshTransport:
    config = SshConfig(cluster.ssh_config)
    return SshTransport(config.resolve(Host("node1")), config)


def _file_on_node1(cluster: NamespaceCluster, name: str, text: str) -> Path:
    path = cluster.home(1) / name
    path.write_bytes(text.encode())
    return path


def test_run_returns_every_byte_of_stdout_and_stderr_under_load(cluster: NamespaceCluster,
                                                                transport: SshTransport) -> None:
    text = payload(SIZE)
    path = _file_on_node1(cluster, "integrity.txt", text)
    short = []
    try:
        with cpu_hogs(3):
            for round_ in range(ROUNDS):
                result = transport.run([*CAT_TWICE, str(path)], timeout_s=120)
                assert result.ok, result.error
                if result.stdout != text or result.stderr != text:
                    short.append((round_, len(result.stdout), len(result.stderr)))
    finally:
        transport.close()
    assert not short, f"outputs came back short (round, stdout chars, stderr chars of {len(text)}): {short}"


def test_output_after_the_exit_status_is_read_to_the_end(cluster: NamespaceCluster, transport: SshTransport) -> None:
    """sshd sends the exit status when the command exits; a process it left behind still holds
    the output and writes after that. The output ends at the channel's end of file."""
    text = payload(200_000, seed=5)
    path = _file_on_node1(cluster, "integrity-late.txt", text)
    try:
        result = transport.run(["sh", "-c", '(sleep 1; cat "$1"; cat "$1" >&2) & exit 3', "sh", str(path)],
                               timeout_s=60)
    finally:
        transport.close()
    assert (result.exit_code, result.error) == (3, None)
    assert result.stdout == text and result.stderr == text


def test_started_command_yields_every_line_whole_under_load(cluster: NamespaceCluster,
                                                             transport: SshTransport) -> None:
    lines = payload_lines(SIZE, seed=7)
    path = _file_on_node1(cluster, "integrity-lines.txt", "\n".join(lines) + "\n")
    try:
        with cpu_hogs(3):
            for _ in range(max(1, ROUNDS // 4)):
                assert started_lines(transport, str(path)) == ((0, None), {"stdout": lines, "stderr": lines})
    finally:
        transport.close()
