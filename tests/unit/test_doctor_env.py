"""NCCL/Gloo environment checks: names, deprecations, values, NCCL_TOPO_FILE, consistency."""

from __future__ import annotations

from typing import Any

import pytest

from fstrain.core.doctor.catalogue import run_checks, select
from fstrain.core.doctor.facts import FileFacts, merged_env
from fstrain.core.doctor.ncclcatalogue import KNOWN_NAMES, parse_c_integer, value_problem
from fstrain.core.doctor.ncclenv import suggestion
from tests.unit.doctor_reports import FIXTURES, facts, host, minimal_report

XML = FIXTURES / "nccl-xml" / "nccl2397_a100-pcie-2x-cx6dx-roce_nccl2.30.4_host10.153.235.11.xml"


def node(name: str, env: dict[str, str], **extra: Any) -> Any:
    return host(name, minimal_report(name, env=env), **extra)


def run(check_id: str, *hosts: Any) -> dict[tuple[str, ...], list[tuple[str, str, str]]]:
    out: dict[tuple[str, ...], list[tuple[str, str, str]]] = {}
    for r in run_checks(facts(*hosts), select(check_id)):
        out.setdefault(r.hosts, []).append((r.verdict, r.message, r.fix))
    return out


def test_the_catalogue_holds_what_nccl_reads() -> None:
    for name in ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_DEBUG", "NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL",
                 "NCCL_TOPO_FILE", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE", "NCCL_COMM_ID", "NCCL_IB_GID_INDEX"):
        assert name in KNOWN_NAMES
    assert "NCCL_ASYNC_ERROR_HANDLING" not in KNOWN_NAMES  # PyTorch's, not NCCL's


@pytest.mark.parametrize(("typo", "meant"), [
    ("NCCL_SOKET_IFNAME", "NCCL_SOCKET_IFNAME"), ("NCCL_IB_HCAS", "NCCL_IB_HCA"),
    ("NCCL_DEBUG_SUBSYSTEM", "NCCL_DEBUG_SUBSYS"), ("NCCL_MY_PLUGIN_KNOB", None), ("NCCL_P2P_LVL", "NCCL_P2P_LEVEL"),
])
def test_did_you_mean(typo: str, meant: str | None) -> None:
    assert suggestion(typo) == meant


def test_unknown_names() -> None:
    result = run("env.unknown", node("a", {"NCCL_SOKET_IFNAME": "eth0", "NCCL_DEBUG": "INFO"}),
                 node("b", {"NCCL_MY_PLUGIN_KNOB": "1"}), node("c", {}))
    assert result[("a",)] == [("fail", "NCCL_SOKET_IFNAME is not an NCCL variable: NCCL ignores it (did you mean "
                                        "NCCL_SOCKET_IFNAME?)", "rename it to NCCL_SOCKET_IFNAME")]
    assert result[("b",)][0][0] == "warn" and "a network plugin may read it" in result[("b",)][0][1]
    assert result[("c",)] == [("ok", "every NCCL_* variable is one NCCL reads", "")]


def test_deprecated_names() -> None:
    result = run("env.deprecated", node("a", {"NCCL_ASYNC_ERROR_HANDLING": "1"}),
                 node("b", {"NCCL_IB_GDR_LEVEL": "PHB", "NCCL_NET_GDR_LEVEL": "SYS"}))
    assert result[("a",)] == [("warn", "NCCL_ASYNC_ERROR_HANDLING is a PyTorch setting, renamed in torch 2.2",
                               "use TORCH_NCCL_ASYNC_ERROR_HANDLING=1 instead")]
    assert result[("b",)][0][1] == "NCCL_IB_GDR_LEVEL is renamed in NCCL 2.4.0; NCCL_NET_GDR_LEVEL is set too, and wins"


@pytest.mark.parametrize(("name", "value", "problem"), [
    ("NCCL_P2P_LEVEL", "NODE", "NCCL_P2P_LEVEL=NODE is nvidia-smi's word, not NCCL's: NCCL silently ignores it"),
    ("NCCL_NET_GDR_LEVEL", "phb", "NCCL_NET_GDR_LEVEL=phb: NCCL compares case-sensitively and silently ignores it"),
    ("NCCL_P2P_LEVEL", "PXN", None),
    ("NCCL_NET_GDR_LEVEL", "3", None),
    ("NCCL_DEBUG", "info", None),
    ("NCCL_DEBUG", "DEBUG", "NCCL_DEBUG=DEBUG is not a debug level NCCL knows, so it does not take effect"),
    ("NCCL_DEBUG_SUBSYS", "INIT,GRAPH,NETWORK", "NCCL_DEBUG_SUBSYS=INIT,GRAPH,NETWORK: unknown subsystem NETWORK"),
    ("NCCL_PROTO", "^LL128", None),
    ("NCCL_ALGO", "ring,collnetdirect;allreduce:tree", None),
    ("NCCL_ALGO", "Ring,Trees", "NCCL_ALGO=Ring,Trees: unknown algorithm Trees"),
    ("NCCL_IB_DISABLE", "true", "NCCL_IB_DISABLE=true is not a number: NCCL reads it as 0"),
    ("NCCL_IB_TIMEOUT", "22", None),
    ("NCCL_IB_TIMEOUT", "32", "NCCL_IB_TIMEOUT=32 is out of range"),
    ("NCCL_BUFFSIZE", "0x400000", None),
    ("NCCL_SOCKET_FAMILY", "ipv4", "NCCL_SOCKET_FAMILY=ipv4 is not one of AF_INET, AF_INET6"),
    ("NCCL_NSOCKS_PERTHREAD", "4 ", "NCCL_NSOCKS_PERTHREAD=4  is not a number: NCCL reads it as 4"),
])
def test_values(name: str, value: str, problem: str | None) -> None:
    found = value_problem(name, value)
    assert (found[0] if found else None) == problem


def test_c_integers() -> None:
    assert parse_c_integer("0x10") == (16, True)
    assert parse_c_integer("010") == (8, True)
    assert parse_c_integer("08") == (0, False)
    assert parse_c_integer("yes") == (0, False)
    assert parse_c_integer("-3") == (-3, True)


def test_conf_files_merge_as_nccl_does() -> None:
    # NCCL: the environment wins over NCCL_CONF_FILE/~/.nccl.conf, which wins over /etc/nccl.conf;
    # nothing is trimmed and '#' is a comment only at column 0.
    h = node("a", {"NCCL_DEBUG": "WARN"}, nccl_conf=(
        ("/root/.nccl.conf", "NCCL_DEBUG=INFO\nNCCL_IB_HCA=mlx5_0\n # NCCL_X=1\n"),
        ("/etc/nccl.conf", "NCCL_IB_HCA=mlx5_1\nNCCL_P2P_LEVEL = SYS\n#NCCL_Y=2\n")))
    env = merged_env(h)
    assert env["NCCL_DEBUG"] == ("WARN", "environment")
    assert env["NCCL_IB_HCA"] == ("mlx5_0", "/root/.nccl.conf")
    assert env["NCCL_P2P_LEVEL "] == (" SYS", "/etc/nccl.conf")
    assert " # NCCL_X" in env and "#NCCL_Y" not in env
    values = run("env.values", host("b", minimal_report("b"), nccl_conf=(("/etc/nccl.conf", "NCCL_DEBUG=LOUD\n"),)))
    assert values[("b",)][0][1].endswith("(in /etc/nccl.conf)")


def test_topo_file_checks_with_a_real_nccl_dump() -> None:
    text = XML.read_text()
    good = node("g", {"NCCL_TOPO_FILE": "/etc/topo.xml"},
                files={"/etc/topo.xml": FileFacts("/etc/topo.xml", True, text)})
    tabbed = text.replace("  <cpu", "\t<cpu", 1)
    broken = node("b", {"NCCL_TOPO_FILE": "/etc/topo.xml"},
                  files={"/etc/topo.xml": FileFacts("/etc/topo.xml", True, tabbed)})
    missing = node("m", {"NCCL_TOPO_FILE": "/etc/topo.xml"},
                   files={"/etc/topo.xml": FileFacts("/etc/topo.xml", False, error="No such file or directory")})
    result = run("env.topo_file", good, broken, missing)
    assert result[("g",)] == [("ok", "NCCL_TOPO_FILE=/etc/topo.xml is readable and parses (2 GPUs)", "")]
    assert result[("b",)][0][0] == "fail" and "NCCL cannot parse it" in result[("b",)][0][1]
    assert result[("m",)][0][1] == ("NCCL_TOPO_FILE=/etc/topo.xml cannot be read (No such file or directory): NCCL "
                                    "silently falls back to its own detection")
    assert "fstrain topo xml -o /etc/topo.xml" in result[("m",)][0][2]


def test_consistency_between_hosts() -> None:
    result = run("env.consistency", node("a", {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0"}),
                 node("b", {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "ens5"}), node("c", {}))
    assert result[("a", "b")] == [("fail", "NCCL_IB_DISABLE=1; hosts disagree on NCCL_IB_DISABLE",
                                   "give NCCL_IB_DISABLE one value on every host: set it in the environment the jobs "
                                   "get (/etc/environment, or fstrain launch --env / --env-file)")]
    assert result[("c",)][0][1] == "NCCL_IB_DISABLE is not set; hosts disagree on NCCL_IB_DISABLE"
    soft = run("env.consistency", node("a", {"TORCH_NCCL_BLOCKING_WAIT": "1"}), node("b", {}))
    assert {v for rows in soft.values() for v, _, _ in rows} == {"warn"}
    same = run("env.consistency", node("a", {"NCCL_DEBUG": "WARN"}), node("b", {"NCCL_DEBUG": "WARN"}))
    assert same[("a", "b")][0][0] == "ok"
