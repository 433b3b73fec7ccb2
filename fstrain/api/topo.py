"""``topo``: probe reports of the selected hosts (GPUs, NVLink, PCIe, NUMA, NICs), and the saved
files `fstrain topo parse` and `topo xml --from` read, bounded as every user file is.

A probe report is the JSON the node probe (fstrain/io/probe_remote.py) prints; the pure readers
of it are in fstrain/core (``parsers.probe_report.node_from_report``, ``topo.topology.group_nodes``,
``topofile.ncclxml_gen.xml_from_report``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fstrain.api.hosts import quiet
from fstrain.api.requests import HostRequest
from fstrain.errors import InputError

if TYPE_CHECKING:
    from fstrain.core.parsers.probe_report import Report


@dataclass(frozen=True)
class TopoRequest:
    """Which hosts to probe (default: this machine), and with which interpreter."""

    hosts: HostRequest = field(default_factory=HostRequest)
    python: str | None = None  # default: this interpreter here, python3 on remote hosts


@dataclass(frozen=True)
class Unprobed:
    host: str
    error: str  # the error's one line: what, where, what to do


@dataclass(frozen=True)
class Probed:
    """Every host's probe report, in the order the hosts were selected, and the hosts that
    could not be probed."""

    source: str  # where the hosts came from
    reports: tuple[Report, ...]
    hosts: tuple[str, ...]  # the host of each report, as selected ('user@node1:2222')
    failures: tuple[Unprobed, ...] = ()

    def document(self) -> dict[str, Any]:
        """`topo show --json`'s document: a summary per node, the groups of identical nodes, the
        raw reports, the hosts that could not be probed."""
        from fstrain.core.parsers.probe_report import node_from_report
        from fstrain.core.topo.topology import group_nodes, node_to_dict

        nodes = [node_from_report(r) for r in self.reports]
        summaries = []
        for report, node in zip(self.reports, nodes, strict=True):
            summary = node_to_dict(node)
            summary["gpu_source"] = report["gpu_source"]
            summary["gpu_source_reason"] = report.get("gpu_source_reason")
            summaries.append(summary)
        groups = [{"shape_hash": g.shape_hash, "hostnames": list(g.hostnames), "differences": list(g.differences)}
                  for g in group_nodes(nodes)]
        return {"nodes": summaries, "groups": groups, "reports": list(self.reports),
                "unreachable": [{"host": f.host, "error": f.error} for f in self.failures]}


def topo(request: TopoRequest, *, report: Callable[[str], None] = quiet) -> Probed:
    """Probe the selected hosts in parallel (this machine alone: here, without a connection);
    a host that cannot be probed is a failure of the result, not an exception."""
    from fstrain.api.hosts import reach, resolve_hosts
    from fstrain.io.connect import is_local
    from fstrain.io.probe import probe_inventory, probe_local

    hosts = request.hosts
    selection = resolve_hosts(hosts.hostfile, hosts.hosts, hosts.include, hosts.exclude, None)
    if len(selection.hosts) == 1 and is_local(selection.hosts[0]):
        return Probed(selection.source, (probe_local(python=request.python),), (selection.hosts[0].label(),))
    connect = reach(selection, hosts, report).connect
    reports, failed = probe_inventory(selection.hosts, connect, python=request.python or "python3",
                                      fanout=hosts.fanout)
    unprobed = {host.label() for host, _ in failed}
    return Probed(selection.source, tuple(reports),
                  tuple(h.label() for h in selection.hosts if h.label() not in unprobed),
                  tuple(Unprobed(host.label(), error.one_line()) for host, error in failed))


def read_topology_file(path: Path) -> str:
    """A saved ``nvidia-smi topo -m``, NCCL topology XML or probe report, bounded in size."""
    from fstrain.io.userfiles import MAX_FILE_BYTES

    try:
        if path.is_file() and path.stat().st_size > MAX_FILE_BYTES:
            raise InputError(f"larger than {MAX_FILE_BYTES // 2**20} MiB", "is this really a topology file?", str(path))
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise InputError("file not found", hint="check the path", where=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", where=str(path)) from None


def load_reports(text: str, source: str) -> list[Report]:
    """Probe reports from a saved file: one report, a list of them, or `topo show --json` output."""
    import json

    from fstrain.core.parsers.probe_report import validate_report
    from fstrain.errors import ParseError
    from fstrain.io.userfiles import check_json_depth

    check_json_depth(text, source)  # a hostile file must not end in RecursionError
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(f"not JSON: {exc.msg}", where=f"{source}:{exc.lineno}",
                         hint="pass a probe report (`fstrain topo show --json > report.json`)") from None
    items = data.get("reports") if isinstance(data, dict) and "reports" in data else data
    items = items if isinstance(items, list) else [items]
    return [validate_report(item, where=f"{source}[{i}]" if len(items) > 1 else source)
            for i, item in enumerate(items)]
