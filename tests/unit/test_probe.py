"""The node probe: the script itself (run here, for real), probe_host over a fake transport, reports."""

from __future__ import annotations

import ast
import json
import platform
import re
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from fstrain.core.parsers.probe_report import SCHEMA_VERSION, node_from_report, validate_report
from fstrain.core.parsers.topo_matrix import parse_topo_matrix
from fstrain.errors import ParseError, TransportError
from fstrain.io.probe import probe_host, probe_local, probe_source
from fstrain.io.transport import CommandResult, FakeTransport
from tests.helpers import require_tool

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
NCCL2397 = FIXTURES / "probe" / "nccl2397-a100-pcie-2x-cx6dx.json"
SIMAI = FIXTURES / "probe" / "simai-2a100-nvswitch-2bond.json"


def test_script_is_python36_and_stdlib_only() -> None:
    tree = ast.parse(probe_source(), feature_version=(3, 6))  # nodes may run old interpreters
    modules = {n.names[0].name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)}
    modules |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    # Nothing from fstrain (not installed on the nodes); pynvml is optional, imported inside a try.
    assert modules - set(sys.stdlib_module_names) == {"pynvml"}


@pytest.fixture(scope="module")
def local_report() -> dict:  # type: ignore[type-arg]
    """One real run of the probe on this machine, with a few variables it must (not) record."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NCCL_FSTRAIN_TEST", "1")
        patch.setenv("TORCH_FSTRAIN_TEST", "2")
        patch.setenv("OTHER_FSTRAIN_TEST", "3")
        return probe_local(timeout_s=120)


def test_local_probe_runs_the_same_script_here(local_report: dict) -> None:  # type: ignore[type-arg]
    report = local_report
    assert report["schema_version"] == SCHEMA_VERSION
    assert report["hostname"] == socket.gethostname()
    assert "lo" in {i["name"] for i in report["interfaces"]}
    assert report["software"]["python"] == platform.python_version()
    assert report["cpu"]["logical_cpus"] >= 1
    assert report["ulimits"]["nofile"]["soft"] >= 1
    assert report["dev_shm"] is None or report["dev_shm"]["total_bytes"] > 0
    assert set(report["timings_s"]) >= {"host", "cpu", "gpus", "rdma", "software"}
    assert report["errors"] == {}
    if not report["nvidia_pci_devices"]:
        # No GPU here: the report is still valid and says so, with the reason.
        assert report["gpus"] == [] and report["gpu_source"] == "none"
        assert report["gpu_source_reason"] == "no NVIDIA GPU on the PCI bus"
        node = node_from_report(report)
        assert node.gpus == () and node.matrix == ()


def test_local_probe_records_nccl_and_torch_variables(local_report: dict) -> None:  # type: ignore[type-arg]
    env = local_report["env"]
    assert env["NCCL_FSTRAIN_TEST"] == "1" and env["TORCH_FSTRAIN_TEST"] == "2"
    assert "OTHER_FSTRAIN_TEST" not in env


def fake(stdout: str = "", stderr: str = "", code: int | None = 0, error: str | None = None) -> FakeTransport:
    def respond(argv: Sequence[str], stdin: bytes | None) -> CommandResult:
        return CommandResult(code, stdout, stderr, 0.1, error)

    return FakeTransport("node7", respond)


def test_probe_host_sends_the_script_and_reads_the_last_json_line() -> None:
    report = json.loads(NCCL2397.read_text())
    transport = fake(stdout="Welcome to node7!\n" + json.dumps(report) + "\n")
    got = probe_host(transport, python="/opt/venv/bin/python3")
    assert got["hostname"] == "nccl2397-host11"
    assert got["gpus"][1]["pci_bus_id"] == "0000:b1:00.0"  # NVML's 8-digit domain, normalised
    ((argv, stdin),) = transport.calls
    assert argv == ("/opt/venv/bin/python3", "-")
    assert stdin == probe_source().encode()


@pytest.mark.parametrize(("transport", "error", "needle"), [
    (fake(code=127, stderr="bash: python3: command not found"), TransportError, "not found"),
    (fake(code=1, stderr='  File "<stdin>", line 40\nSyntaxError: invalid syntax'), TransportError, "SyntaxError"),
    (fake(code=None, error="timed out after 180 s"), TransportError, "did not finish"),
    (fake(stdout="motd only\n"), ParseError, "no JSON report"),
    (fake(stdout='{"schema": "fstrain-probe", "schema_ver'), ParseError, "not valid JSON"),
    (fake(stdout='{"schema": "fstrain-probe", "schema_version": 99}'), ParseError, "newer"),
    (fake(stdout='{"schema": "other"}'), ParseError, "not an fstrain probe report"),
])
def test_probe_host_failures_are_one_clear_error(transport: FakeTransport, error: type, needle: str) -> None:
    with pytest.raises(error) as info:
        probe_host(transport)
    assert needle in info.value.message and info.value.where == "node7"


def test_report_fields_are_checked() -> None:
    report = json.loads(NCCL2397.read_text())
    del report["hostname"]
    with pytest.raises(ParseError, match="hostname"):
        validate_report(report, "r.json")


def test_nvidia_smi_fallback_becomes_gpus() -> None:
    """Without pynvml the probe keeps nvidia-smi's text; the controller parses it into the same GPUs."""
    q_text = (FIXTURES / "misc" / "nvidia-smi-q_h100-8x_driver535.161.08_gpud.txt").read_text()
    buses = re.findall(r"Bus Id\s+: (\S+)", q_text)
    csv = "index, name, pci.bus_id, memory.total [MiB], compute_cap\n" + "".join(
        f"{i}, NVIDIA H100 80GB HBM3, {bus}, 81559 MiB, 9.0\n" for i, bus in enumerate(buses))
    report = json.loads(NCCL2397.read_text())
    report.update(gpus=[], gpu_source="nvidia-smi", nvidia_smi={
        "query_gpu": {"exit_code": 0, "stdout": csv, "error": None},
        "q": {"exit_code": 0, "stdout": q_text, "error": None},
        "topo_m": {"exit_code": 0, "error": None,
                   "stdout": (FIXTURES / "topo" / "h20-8x-8nic-sglang-env-driver535.txt").read_text()}})
    got = validate_report(report, "r")
    assert [g["index"] for g in got["gpus"]] == list(range(8))
    assert got["gpus"][0]["pci_bus_id"] == "0000:19:00.0"
    assert got["gpus"][0]["memory_total_bytes"] == 81559 * 2**20
    assert got["gpus"][0]["ecc"]["volatile_uncorrected"] == 0
    assert got["gpus"][0]["throttle_reasons"] == ["HW Power Brake Slowdown", "HW Slowdown"]
    node = node_from_report(got)
    assert node.source == "probe (NVML + nvidia-smi topo -m)"
    topo = parse_topo_matrix((FIXTURES / "topo" / "h20-8x-8nic-sglang-env-driver535.txt").read_text())
    assert node.matrix == topo.matrix
    assert [n.name for n in node.nics] == list(topo.nic_names)
    assert any("RDMA devices not in topo -m: mlx5_0" in m for m in node.missing)


def test_sysfs_paths_give_the_matrix_when_topo_m_is_missing() -> None:
    a100 = node_from_report(validate_report(json.loads(NCCL2397.read_text())))
    assert a100.devices == ("GPU0", "GPU1", "mlx5_0", "mlx5_1")
    assert a100.matrix == (("X", "SYS", "NODE", "NODE"), ("SYS", "X", "SYS", "SYS"),
                           ("NODE", "SYS", "X", "PIX"), ("NODE", "SYS", "PIX", "X"))
    assert a100.nvswitch is None
    simai = node_from_report(validate_report(json.loads(SIMAI.read_text())))
    assert simai.matrix == (("X", "NV12", "PHB", "PXB"), ("NV12", "X", "PHB", "PXB"),
                            ("PHB", "PHB", "X", "PHB"), ("PXB", "PXB", "PHB", "X"))
    assert simai.nvswitch is True
    assert [n.rate_gbps for n in simai.nics] == [200.0, 200.0]


def test_addresses_without_iproute2_match_ip() -> None:
    """A node without `ip` (minimal images, the H200 VM in tests/fixtures/gpu) still reports addresses."""
    ip = require_tool("ip", "apt-get install iproute2")
    namespace: dict[str, object] = {}
    exec(compile(probe_source(), "probe_remote.py", "exec"), namespace)  # our own script, as nodes run it
    by_kernel = namespace["kernel_addresses"]()  # type: ignore[operator]
    links = json.loads(subprocess.run([ip, "-j", "addr", "show"], capture_output=True, text=True, check=True).stdout)
    by_ip = {link["ifname"]: sorted(f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []))
             for link in links if link.get("addr_info")}

    def stable(found: dict[str, list[str]]) -> dict[str, list[str]]:
        # Test clusters (fst*) of runs beside this one come and go between the two reads.
        return {name: sorted(addresses) for name, addresses in found.items() if not name.startswith("fst")}

    assert stable(by_kernel) == stable(by_ip)
    assert "127.0.0.1/8" in by_kernel["lo"]
