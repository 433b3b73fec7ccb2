"""Rich rendering of node topologies on stderr: link matrix, NVLink domains, GPU-NIC affinity, cluster.

:func:`render_reports` takes probe reports (one per node, from any number of hosts) so that the
command can hand it whatever the fan-out collected.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fstrain.core.parsers.probe_report import Report, node_from_report
from fstrain.core.topo.topology import (
    LinkClass,
    Node,
    closest_nics,
    format_cpu_list,
    group_nodes,
    nic_numa_node,
    nvlink_domains,
    nvlink_summary,
    parse_link_label,
)

if TYPE_CHECKING:
    from rich.console import Console

# One colour per link class, closest (greenest) first, so a slow path stands out at a glance.
LINK_STYLE = {
    LinkClass.SELF: "dim",
    LinkClass.NVLINK: "bold green",
    LinkClass.PIX: "cyan",
    LinkClass.PXB: "blue",
    LinkClass.PHB: "yellow",
    LinkClass.NODE: "magenta",
    LinkClass.SYS: "bold red",
    LinkClass.UNKNOWN: "dim",
}

SHORT = {LinkClass.NVLINK: "# NVLinks", LinkClass.PIX: "one PCIe switch", LinkClass.PXB: "several PCIe switches",
         LinkClass.PHB: "PCIe host bridge", LinkClass.NODE: "host bridges of one NUMA node",
         LinkClass.SYS: "across NUMA nodes"}


def _cell(label: str) -> str:
    cls, _ = parse_link_label(label)
    return f"[{LINK_STYLE[cls]}]{label}[/]"


def render_matrix(node: Node, console: Console) -> None:
    from rich.table import Table

    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("")
    for device in node.devices:
        table.add_column(device, justify="center")
    table.add_column("NUMA", justify="right")
    table.add_column("CPUs")
    for i, device in enumerate(node.devices):
        numa: Any = ""
        cpus = ""
        if i < len(node.gpus):
            gpu = node.gpus[i]
            numa = gpu.numa_node if gpu.numa_node is not None else "?"
            cpus = format_cpu_list(gpu.cpu_affinity) if gpu.cpu_affinity else "?"
        else:
            nic_numa = nic_numa_node(node, node.nics[i - len(node.gpus)])
            numa = nic_numa if nic_numa is not None else ""
        table.add_row(f"[bold]{device}[/]", *(_cell(label) for label in node.matrix[i]), str(numa), cpus)
    console.print(table)
    legend = ", ".join(f"[{LINK_STYLE[c]}]{c.value if c is not LinkClass.NVLINK else 'NV#'}[/] {SHORT[c]}"
                       for c in SHORT)
    console.print(f"[dim]closest first:[/] {legend}")


def render_node(node: Node, console: Console) -> None:
    """Matrix, NVLink domains, GPU-NIC affinity and what the source could not tell."""
    names = sorted({g.name for g in node.gpus if g.name})
    title = f"[bold]{node.hostname}[/]: {len(node.gpus)} GPU{'s' if len(node.gpus) != 1 else ''}"
    title += f" ({', '.join(names)})" if names else ""
    title += f", {len(node.nics)} NIC{'s' if len(node.nics) != 1 else ''}  [dim]{node.source}[/]"
    console.print(title)
    if node.matrix:
        render_matrix(node, console)
    domains = nvlink_domains(node)
    switch = "" if node.nvswitch is None else " via NVSwitch" if node.nvswitch else " direct"
    console.print(f"NVLink: {nvlink_summary(node)}{switch if domains else ''}")
    for domain in domains:
        lanes = f"NV{domain.min_lanes}" if domain.min_lanes == domain.max_lanes else \
            f"NV{domain.min_lanes}-NV{domain.max_lanes}"
        console.print(f"  GPUs {', '.join(str(i) for i in domain.gpu_indices)}: {domain.kind}, {lanes}")
    if node.nics:
        from rich.table import Table

        table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
        for column in ("GPU", "NUMA", "closest NIC(s)", "path"):
            table.add_column(column)
        for gpu in node.gpus:
            nics, cls = closest_nics(node, gpu.index)
            table.add_row(gpu.label, str(gpu.numa_node if gpu.numa_node is not None else "?"),
                          ", ".join(nics) or "-", _cell(cls.value if cls is not LinkClass.NVLINK else "NV1")
                          if cls else "-")
        console.print(table)
    for fact in node.missing:
        console.print(f"[dim]  not known: {fact}[/]")


def render_cluster(nodes: Sequence[Node], console: Console) -> None:
    """Identical nodes grouped by shape; every other group says how it differs from the largest."""
    from rich.table import Table

    from fstrain.core.hosts.hostfile import compress_hostlist

    groups = group_nodes(nodes)
    table = Table(title="cluster", show_edge=False, pad_edge=False, header_style="bold")
    for column in ("shape", "nodes", "hosts", "GPUs", "NVLink", "NICs", "differs from the largest group"):
        table.add_column(column)
    for group in groups:
        rep = group.representative
        names = sorted({g.name or "?" for g in rep.gpus})
        table.add_row(group.shape_hash, str(len(group.hostnames)), compress_hostlist(group.hostnames),
                      f"{len(rep.gpus)}x {'/'.join(names)}" if rep.gpus else "none", nvlink_summary(rep),
                      str(len(rep.nics)), "; ".join(group.differences) or "-")
    console.print(table)


def render_reports(reports: Sequence[Report], console: Console) -> None:
    """Render every probed node, then the cluster summary (when there is more than one node)."""
    nodes = []
    for report in reports:
        if not report["gpus"]:
            reason = report.get("gpu_source_reason") or "the probe found none"
            console.print(f"[bold]{report['hostname']}[/]: [yellow]no NVIDIA GPU[/] ({reason})")
            nodes.append(node_from_report(report))
            continue
        node = node_from_report(report)
        render_node(node, console)
        nodes.append(node)
        console.print()
    if len(nodes) > 1:
        render_cluster(nodes, console)
