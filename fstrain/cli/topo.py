"""``fstrain topo``: read, show and export node topologies (GPUs, NVLink, PCIe, NUMA, NICs).

- ``topo parse FILE``: a saved ``nvidia-smi topo -m`` (or an NCCL topology XML).
- ``topo show``: probe the node(s) and draw each one's matrix, NVLink domains, GPU-NIC affinity.
- ``topo xml``: write the NCCL topology file (``NCCL_TOPO_FILE``), one per distinct node shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from fstrain.cli import hostopts
from fstrain.cli.output import console, print_json, say
from fstrain.errors import ConfigError, InputError

if TYPE_CHECKING:
    from fstrain.api.topo import Probed

topo_app = typer.Typer(help="Node topology: GPUs, NVLink, PCIe, NUMA, NICs; NCCL topology XML.",
                       no_args_is_help=True)
JSON_OPTION = typer.Option(False, "--json", help="Print one JSON document on stdout.")


def register(app: typer.Typer) -> None:
    app.add_typer(topo_app, name="topo")


def _read_text(path: Path) -> str:
    from fstrain.api.topo import read_topology_file

    return read_topology_file(path)


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

    probed = probe_selected(hostfile, hosts, include, exclude, ssh_config, accept_new_hosts, fanout, python)
    if json_output:
        print_json(probed.document())
    elif probed.reports:
        render_reports(list(probed.reports), console())
    for failure in probed.failures:
        console().print(f"[red]error: {failure.error}[/red]", markup=True)
    if probed.failures:
        raise typer.Exit(1)


def probe_selected(hostfile: str | None, hosts: str | None, include: str | None, exclude: str | None,
                   ssh_config: str | None, accept_new_hosts: bool, fanout: int, python: str | None) -> Probed:
    """Probe reports of the selected hosts (this machine when none is selected), and the hosts
    that could not be probed with why."""
    from fstrain.api.requests import HostRequest
    from fstrain.api.topo import TopoRequest, topo

    request = TopoRequest(HostRequest(hostfile=hostfile, hosts=hosts, include=include, exclude=exclude,
                                      ssh_config=ssh_config, accept_new_hosts=accept_new_hosts, fanout=fanout),
                          python=python)
    return topo(request, report=say)


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
            from fstrain.api.topo import load_reports

            reports = load_reports(_read_text(source), str(source))
        else:
            probed = probe_selected(hostfile, hosts, include, exclude, ssh_config, accept_new_hosts, fanout, python)
            if probed.failures:
                raise ConfigError("could not probe " + "; ".join(f"{f.host}: {f.error}" for f in probed.failures),
                                  hint="fix or --exclude those hosts, or pass --from with saved reports",
                                  where="topo xml")
            reports = list(probed.reports)
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
