"""RDMA checks on real ibstat captures and recorded probe reports."""

from __future__ import annotations

from typing import Any

from fstrain.core.doctor.catalogue import run_checks, select
from fstrain.core.doctor.rdma import ib_hca_selection
from tests.unit.doctor_reports import MISC, NCCL2397, SIMAI, facts, host, probe_report, rdma_from_ib_text

ALL_ACTIVE = MISC / "ibstat_h100-node_cx7-400g-all-active_gpud.txt"
SOME_DOWN = MISC / "ibstat_h100-node_some-down_gpud.txt"


def node(name: str, ib: Any = ALL_ACTIVE, env: dict[str, str] | None = None, **fields: Any) -> Any:
    report = probe_report(SIMAI, name)
    report["rdma"]["devices"] = rdma_from_ib_text(ib) if ib is not None else []
    report["env"] = env or {}
    report.update(fields)
    return report


def run(check_id: str, *hosts: Any) -> dict[tuple[str, ...], tuple[str, str, str]]:
    return {r.hosts: (r.verdict, r.message, r.fix) for r in run_checks(facts(*hosts), select(check_id))}


def test_all_ports_active() -> None:
    result = run("rdma.ports", host("a", node("a")), host("b", node("b")))
    assert result == {("a", "b"): ("ok", "12 RDMA devices, every port ACTIVE at the expected rate", "")}


def test_ports_down_in_a_real_capture() -> None:
    result = run("rdma.ports", host("a", node("a")), host("d", node("d", SOME_DOWN)))
    verdict, message, fix = result[("d",)]
    assert verdict == "warn"
    assert message == "not active: mlx5_2:1 DOWN, mlx5_7:1 DOWN, mlx5_8:1 DOWN"
    assert "ibstat" in fix


def test_a_down_port_named_in_nccl_ib_hca_fails() -> None:
    result = run("rdma.ports", host("d", node("d", SOME_DOWN, env={"NCCL_IB_HCA": "=mlx5_0,mlx5_2"})))
    assert result[("d",)][0] == "fail"


def test_a_slow_port_against_its_peers() -> None:
    slow = node("s")
    port = next(d for d in slow["rdma"]["devices"] if d["name"] == "mlx5_3")["ports"][0]
    port["rate"] = "200 Gb/sec (4X HDR)"
    result = run("rdma.ports", host("a", node("a")), host("s", slow))
    assert result[("s",)][:2] == ("warn", "slow: mlx5_3:1 at 200 Gb/s (others 400)")


def test_a_host_without_rdma_among_hosts_with_it() -> None:
    result = run("rdma.ports", host("a", node("a")), host("n", node("n", None)))
    assert result[("n",)][0] == "fail" and "--exclude n" in result[("n",)][2]
    nobody = run("rdma.ports", host("n", node("n", None)))
    assert nobody[("n",)][:2] == ("skipped", "no RDMA device on any host: NCCL uses TCP sockets")


def test_nccl_ib_hca_selection_follows_nccl() -> None:
    names = [d["name"] for d in rdma_from_ib_text(ALL_ACTIVE)]
    assert ib_hca_selection("mlx5_1", names)[0] == ["mlx5_1", "mlx5_10", "mlx5_11"]  # the documented prefix trap
    assert ib_hca_selection("=mlx5_1:1", names)[0] == ["mlx5_1"]
    assert ib_hca_selection("^=mlx5_1,mlx5_4", names)[0] == [n for n in names if n not in ("mlx5_1", "mlx5_4")]
    assert ib_hca_selection("=mlx5_0::0:0,mlx5_99", names)[:2] == (["mlx5_0"], ["mlx5_99"])


def test_nccl_ib_hca_check() -> None:
    trap = run("rdma.ib_hca", host("t", node("t", env={"NCCL_IB_HCA": "mlx5_1"})))
    assert trap[("t",)] == ("warn", "NCCL_IB_HCA=mlx5_1: mlx5_1 is a prefix, so it also selects mlx5_10, mlx5_11",
                            "write exact names: NCCL_IB_HCA==mlx5_1")
    missing = run("rdma.ib_hca", host("m", node("m", env={"NCCL_IB_HCA": "=mlx5_0,ib0"})))
    assert missing[("m",)][0] == "fail" and "ib0 matches no device" in missing[("m",)][1]
    exact = run("rdma.ib_hca", host("e", node("e", env={"NCCL_IB_HCA": "=mlx5_0:1,mlx5_3:1"})))
    assert exact[("e",)][:2] == ("ok", "NCCL_IB_HCA selects mlx5_0, mlx5_3")
    assert run("rdma.ib_hca", host("u", node("u")))[()][0] == "skipped"


def test_peermem_from_recorded_reports() -> None:
    loaded = host("s", node("s"))  # SimAI's node has nvidia_peermem
    missing = probe_report(NCCL2397, "p")  # nccl2397's does not
    result = run("rdma.peermem", loaded, host("p", missing))
    assert result[("s",)][0] == "ok"
    assert result[("p",)][0] == "warn" and "modprobe nvidia_peermem" in result[("p",)][2]


def test_memlock_limit_with_rdma() -> None:
    limited = {"memlock_bytes": {"soft": 8388608, "hard": 8388608}, "nofile": {"soft": 1024, "hard": 4096}}
    unlimited = {"memlock_bytes": {"soft": None, "hard": None}, "nofile": {"soft": 65536, "hard": 65536}}
    result = run("rdma.memlock", host("l", node("l", ulimits=limited)), host("u", node("u", ulimits=unlimited)),
                 host("c", node("c", ulimits=limited), cap_ipc_lock=True))
    assert result[("l",)][:2] == ("fail", "ulimit -l is 8192 KiB: NCCL cannot register its buffers with the HCA "
                                          "(ibv_reg_mr fails)")
    assert "memlock unlimited" in result[("l",)][2]
    assert result[("u",)][:2] == ("ok", "ulimit -l unlimited")
    assert result[("c",)][0] == "ok"
