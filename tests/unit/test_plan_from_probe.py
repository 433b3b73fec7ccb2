"""`fstrain plan` on a probed cluster: probe reports -> NodeGpus -> plans, and `plan --render`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from fstrain.core.hosts.hostfile import Host
from fstrain.core.plan.plancluster import build_cluster, node_gpus_from_report
from fstrain.errors import ConfigError
from fstrain.io.fanout import HostPool
from fstrain.io.probe import probe_hosts
from fstrain.io.transport import CommandResult, FakeTransport
from tests.helpers import run_fstrain

PROBES = Path(__file__).resolve().parents[1] / "fixtures" / "probe"


def report(name: str) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((PROBES / name).read_text())
    return loaded


def test_node_gpus_from_real_probe_reports() -> None:
    nvswitch = node_gpus_from_report(report("simai-2a100-nvswitch-2bond.json"), "a")
    assert (nvswitch.num_gpus, nvswitch.nvlink_domain_size) == (2, 2)
    assert nvswitch.gpu.startswith("NVIDIA A100")
    assert nvswitch.memory_bytes and nvswitch.memory_bytes > 70 * 2**30
    pcie = node_gpus_from_report(report("nccl2397-a100-pcie-2x-cx6dx.json"), "b")
    assert (pcie.gpu, pcie.num_gpus, pcie.nvlink_domain_size) == ("NVIDIA A100 80GB PCIe", 2, 1)


def test_gpu_less_report_is_a_clear_error() -> None:
    bare = dict(report("simai-2a100-nvswitch-2bond.json"), gpus=[], gpu_source="none",
                gpu_source_reason="no NVIDIA GPU on the PCI bus")
    with pytest.raises(ConfigError, match="node1: no GPU to plan for \\(no NVIDIA GPU on the PCI bus\\)"):
        node_gpus_from_report(bare, "node1")


def test_probed_pool_feeds_the_planner() -> None:
    text = (PROBES / "simai-2a100-nvswitch-2bond.json").read_text()

    def answer(argv: Sequence[str], stdin: bytes | None) -> CommandResult:
        assert argv == ["python3", "-"] and stdin and b"def main" in stdin  # the probe script itself
        return CommandResult(0, json.dumps(json.loads(text)) + "\n", "", 0.1)

    hosts = [Host("g1"), Host("g2")]
    with HostPool(hosts, lambda h: FakeTransport(h.name, answer)) as pool:
        reports = probe_hosts(pool)
    nodes = [node_gpus_from_report(r, h.name) for h, r in zip(hosts, reports, strict=True)]  # type: ignore[arg-type]
    cluster = build_cluster(nodes, None, "probe")
    assert cluster.world_size == 4


def test_plan_render_writes_configs_and_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "rendered"
    args = ["plan", "--model", "tiny", "--gpu", "h100-sxm", "--gpus-per-node", "2", "--render", str(out)]
    first = run_fstrain(*args)
    assert first.returncode == 0, first.stderr
    names = sorted(p.name for p in out.iterdir())
    assert {"ds_config.json", "fsdp.yaml", "accelerate.yaml", "fstrain.env", "plan.yaml"} <= set(names)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    second = run_fstrain(*args)
    assert second.returncode == 2
    assert second.stderr.startswith(f"error: {out}: output directory is not empty")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    forced = run_fstrain(*args, "--force")
    assert forced.returncode == 0 and {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_nothing_fits_with_out_prints_the_document_and_writes_no_file(tmp_path: Path) -> None:
    out = tmp_path / "plan.yaml"
    result = run_fstrain("plan", "--model", "llama3.1-405b", "--gpu", "l4", "--gpus-per-node", "1", "--json",
                         "--out", str(out))
    assert result.returncode == 1
    document = json.loads(result.stdout)
    assert document["fitting_total"] == 0 and all(not p["fits"] for p in document["plans"])
    assert not out.exists()
    human = run_fstrain("plan", "--model", "llama3.1-405b", "--gpu", "l4", "--gpus-per-node", "1", "--out", str(out))
    assert human.returncode == 1 and f"nothing fits, so {out} was not written" in human.stderr
