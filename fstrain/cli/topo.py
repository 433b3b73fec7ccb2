"""``fstrain topo``: read, show and export node topologies (GPUs, NVLink, PCIe, NUMA, NICs).

- ``topo parse FILE``: a saved ``nvidia-smi topo -m`` (or an NCCL topology XML).
- ``topo show``: probe the node(s) and draw each one's matrix, NVLink domains, GPU-NIC affinity.
- ``topo xml``: write the NCCL topology file (``NCCL_TOPO_FILE``), one per distinct node shape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from fstrain.cli import hostopts
from fstrain.cli.output import console, print_json
from fstrain.errors import ConfigError, InputError

topo_app = typer.Typer(help="Node topology: GPUs, NVLink, PCIe, NUMA, NICs; NCCL topology XML.",
                       no_args_is_help=True)
JSON_OPTION = typer.Option(False, "--json", help="Print one JSON document on stdout.")


def register(app: typer.Typer) -> None:
    app.add_typer(topo_app, name="topo")


def _read_text(path: Path) -> str:
    from fstrain.io.userfiles import MAX_FILE_BYTES

    try:
        if path.is_file() and path.stat().st_size > MAX_FILE_BYTES:
            raise InputError(f"larger than {MAX_FILE_BYTES // 2**20} MiB", "is this really a topology file?", str(path))
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise InputError("file not found", hint="check the path", where=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", where=str(path)) from None


def _looks_like_xml(text: str) -> bool:
    return text.lstrip().startswith("<")


@topo_app.command("parse")
def parse_command(
    file: Path = typer.Argument(..., help="A saved `nvidia-smi topo -m` output (or an NCCL topology XML)."),
    json_output: bool = JSON_OPTION,
) -> None:
    """Parse a saved topology and show its matrix, NVLink domains and GPU-NIC affinity."""
    from fstrain.cli.topo_view import render_node
    from fstrain.core.parsers.topo_matrix import node_from_topo_matrix, parse_topo_matrix
    from fstrain.core.topo.ncclxml import read_nccl_topology
    from fstrain.core.topo.topology import node_to_dict

    text = _read_text(file)
    warnings: tuple[str, ...] = ()
    if _looks_like_xml(text):
        node, warnings = read_nccl_topology(text, source=str(file), hostname=file.name)
        kind = "nccl-xml"
    else:
        node = node_from_topo_matrix(parse_topo_matrix(text, source=str(file)), hostname=file.name)
        kind = "nvidia-smi topo -m"
    if json_output:
        print_json({"file": str(file), "format": kind, **node_to_dict(node), "warnings": list(warnings)})
        return
    render_node(node, console())
    for warning in warnings:
        console().print(f"[yellow]warning:[/] {warning}")


@topo_app.command("show")
def show_command(
    json_output: bool = JSON_OPTION,
    python: str | None = typer.Option(None, "--python", help="Interpreter that runs the probe "
                                      "(default: this one locally, python3 on remote hosts)."),
    hostfile: str | None = hostopts.HOSTFILE,
    hosts: str | None = hostopts.HOSTS,
    include: str | None = hostopts.INCLUDE,
    exclude: str | None = hostopts.EXCLUDE,
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    fanout: int = hostopts.FANOUT,
) -> None:
    """Probe this node, or every selected host, and draw the topology (nodes without GPUs say so)."""
    from fstrain.cli.topo_view import render_reports

    reports, failures = probe_selected(hostfile, hosts, include, exclude, ssh_config, accept_new_hosts, fanout,
                                       python)
    if json_output:
        print_json({**reports_document(reports), "unreachable": failures})
    elif reports:
        render_reports(reports, console())
    for failure in failures:
        console().print(f"[red]error: {failure['error']}[/red]", markup=True)
    if failures:
        raise typer.Exit(1)


def probe_selected(hostfile: str | None, hosts: str | None, include: str | None, exclude: str | None,
                   ssh_config: str | None, accept_new_hosts: bool, fanout: int,
                   python: str | None) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Probe reports of the selected hosts (this machine when none is selected), and the hosts
    that could not be probed with why."""
    from fstrain.api.hosts import resolve_hosts
    from fstrain.io.connect import is_local, make_connector
    from fstrain.io.probe import probe_inventory, probe_local

    selection = resolve_hosts(hostfile, hosts, include, exclude, None)
    if len(selection.hosts) == 1 and is_local(selection.hosts[0]):
        return [probe_local(python=python)], []
    from fstrain.cli.slurm import allocation_connector

    connect = allocation_connector(selection.source) or make_connector(ssh_config, accept_new_hosts=accept_new_hosts)
    reports, failed = probe_inventory(selection.hosts, connect, python=python or "python3", fanout=fanout)
    return reports, [{"host": host.label(), "error": error.one_line()} for host, error in failed]


def reports_document(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The --json document of ``topo show``: a summary per node, the groups, and the raw reports."""
    from fstrain.core.parsers.probe_report import node_from_report
    from fstrain.core.topo.topology import group_nodes, node_to_dict

    nodes = [node_from_report(r) for r in reports]
    summaries = []
    for report, node in zip(reports, nodes, strict=True):
        summary = node_to_dict(node)
        summary["gpu_source"] = report["gpu_source"]
        summary["gpu_source_reason"] = report.get("gpu_source_reason")
        summaries.append(summary)
    groups = [{"shape_hash": g.shape_hash, "hostnames": list(g.hostnames), "differences": list(g.differences)}
              for g in group_nodes(nodes)]
    return {"nodes": summaries, "groups": groups, "reports": reports}


def load_reports(text: str, source: str) -> list[dict[str, Any]]:
    """Probe reports from a saved file: one report, a list of them, or `topo show --json` output."""
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


def _shape_path(output: Path, shape: str, many: bool) -> Path:
    return output.with_name(f"{output.stem}.{shape}{output.suffix or '.xml'}") if many else output


@topo_app.command("xml")
def xml_command(
    source: Path | None = typer.Option(None, "--from", help="A saved probe report (JSON) or `nvidia-smi topo -m`."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Where to write the XML (default: stdout)."),
    hostfile: str | None = hostopts.HOSTFILE,
    hosts: str | None = hostopts.HOSTS,
    include: str | None = hostopts.INCLUDE,
    exclude: str | None = hostopts.EXCLUDE,
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    fanout: int = hostopts.FANOUT,
    python: str | None = typer.Option(None, "--python", help="Interpreter that runs the probe."),
) -> None:
    """Write the NCCL topology file (NCCL_TOPO_FILE), one per distinct node shape."""
    import sys

    from fstrain.core.hosts.hostfile import compress_hostlist
    from fstrain.core.parsers.topo_matrix import parse_topo_matrix
    from fstrain.core.topofile.ncclxml_gen import GeneratedXml, distinct_shapes, xml_from_report, xml_from_topo_matrix

    outputs: list[tuple[str, GeneratedXml, str]] = []  # (shape, xml, hosts)
    if source is not None and not _read_text(source).lstrip().startswith(("{", "[")):
        generated = xml_from_topo_matrix(parse_topo_matrix(_read_text(source), source=str(source)))
        outputs.append(("paste", generated, str(source)))
    else:
        if source is not None:
            reports = load_reports(_read_text(source), str(source))
        else:
            reports, failures = probe_selected(hostfile, hosts, include, exclude, ssh_config, accept_new_hosts,
                                               fanout, python)
            if failures:
                raise ConfigError("could not probe " + "; ".join(f"{f['host']}: {f['error']}" for f in failures),
                                  hint="fix or --exclude those hosts, or pass --from with saved reports",
                                  where="topo xml")
        for shape, group in distinct_shapes(reports):
            # GUIDs are per node: leave them out of a file that several nodes share.
            generated = xml_from_report(group[0], node_specific=len(group) == 1)
            outputs.append((shape, generated, compress_hostlist([r["hostname"] for r in group])))
    if len(outputs) > 1 and output is None:
        raise ConfigError(f"{len(outputs)} distinct node shapes need {len(outputs)} files",
                          hint="give -o PATH: each shape is written to PATH with its shape hash", where="-o")
    for shape, generated, hosts in outputs:
        if output is None:
            sys.stdout.write(generated.text)
        else:
            path = _shape_path(output, shape, len(outputs) > 1)
            try:
                path.write_text(generated.text, encoding="utf-8")
            except OSError as exc:
                raise InputError(f"cannot write: {exc.strerror}", where=str(path)) from None
            console().print(f"wrote {path} ({hosts})")
        for fact in generated.missing:
            console().print(f"[dim]  not in the file: {fact}[/]")
