"""``fstrain launch``: run a training job on every selected host and never leave an orphan."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from fstrain.cli import hostopts
from fstrain.cli.output import console, print_json

if TYPE_CHECKING:
    from fstrain.core.launchspec import NodeLaunch
    from fstrain.io.launch import RunOutcome

ENV_FILES = (".deepspeed_env", ".fstrain_env")  # read from ~ then the current directory; later wins


def register(app: typer.Typer) -> None:
    app.command(
        "launch",
        context_settings={"allow_interspersed_args": False},
        help="Launch a job on every selected host: fstrain launch --hostfile F -- python train.py ...",
    )(launch_command)


def launch_command(
    program: list[str] = typer.Argument(None, help="The program and its arguments (after --).", show_default=False),
    hostfile: str | None = hostopts.HOSTFILE,
    hosts: str | None = hostopts.HOSTS,
    include: str | None = hostopts.INCLUDE,
    exclude: str | None = hostopts.EXCLUDE,
    gpus_per_node: int | None = hostopts.GPUS_PER_NODE,
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    fanout: int = hostopts.FANOUT,
    nproc_per_node: str = typer.Option("auto", "--nproc-per-node", help="Processes per node, or 'auto' (slots)."),
    backend: str = typer.Option("torchrun", "--backend", help="torchrun or deepspeed."),
    env: list[str] = typer.Option([], "--env", help="NAME=VALUE for every rank (repeatable)."),
    env_file: str | None = typer.Option(None, "--env-file", help="File of NAME=VALUE lines."),
    workdir: str | None = typer.Option(None, "--workdir", help="Working directory on every host (checked first)."),
    python: str = typer.Option("python3", "--python", help="Interpreter on the hosts."),
    master_port: int | None = typer.Option(None, "--master-port", min=1, max=65535, help="Rendezvous port."),
    max_restarts: int = typer.Option(0, "--max-restarts", min=0, help="torchrun worker-group restarts."),
    run_dir: str | None = typer.Option(None, "--run-dir", help="Logs and manifest (default runs/<run id>)."),
    grace: float = typer.Option(15.0, "--grace", min=0, help="Seconds between SIGTERM and SIGKILL on teardown."),
    heartbeat_timeout: float = typer.Option(
        30.0, "--heartbeat-timeout", min=1, help="Seconds without an answer before a host counts as lost."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the per-node commands; connect to nothing."),
    json_output: bool = typer.Option(False, "--json", help="Print the summary as one JSON document on stdout."),
) -> None:
    """Launch PROGRAM on every selected host (one torchrun or DeepSpeed launcher per node)."""
    from fstrain.core.launchspec import BACKENDS
    from fstrain.errors import InputError

    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}", f"use one of {', '.join(BACKENDS)}", "--backend")
    if not program:
        raise InputError("no program to launch", "put it after --: fstrain launch --hosts h1,h2 -- python train.py",
                         "PROGRAM")
    selection = hostopts.resolve_hosts(hostfile, hosts, include, exclude, gpus_per_node)
    user_env = collect_env(env, env_file)
    run_id = new_run_id()
    folder = Path(run_dir) if run_dir else Path("runs") / run_id
    requested = parse_nproc(nproc_per_node)
    if dry_run:
        dry_run_output(selection.hosts, requested, backend, list(program), python, master_port, max_restarts,
                       run_id, user_env, json_output)
        return
    outcome = execute(selection.hosts, requested, backend, list(program), python, master_port, max_restarts,
                      run_id, folder, user_env, workdir, grace, heartbeat_timeout, ssh_config, accept_new_hosts,
                      fanout, json_output)
    raise typer.Exit(outcome.exit_code)


def parse_nproc(value: str) -> int | None:
    from fstrain.errors import InputError

    if value == "auto":
        return None
    if not value.isdigit() or int(value) < 1:
        raise InputError(f"--nproc-per-node must be a positive integer or 'auto', got {value!r}", "",
                         "--nproc-per-node")
    return int(value)


def collect_env(assignments: list[str], env_file: str | None) -> dict[str, str]:
    """.deepspeed_env and .fstrain_env (home, then here), then --env-file, then --env: later wins."""
    from fstrain.core.launchspec import parse_env_assignment, parse_env_file
    from fstrain.errors import InputError

    merged: dict[str, str] = {}
    for folder in (Path.home(), Path.cwd()):
        for name in ENV_FILES:
            path = folder / name
            if path.is_file():
                merged.update(parse_env_file(path.read_text(), str(path)))
    if env_file:
        path = Path(env_file)
        if not path.is_file():
            raise InputError("env file not found", "check the path given to --env-file", env_file)
        merged.update(parse_env_file(path.read_text(), env_file))
    for assignment in assignments:
        name, value = parse_env_assignment(assignment, "--env")
        merged[name] = value
    return merged


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + os.urandom(3).hex()


def dry_run_output(hosts: list[Any], requested: int | None, backend: str, program: list[str], python: str,
                   master_port: int | None, max_restarts: int, run_id: str, user_env: dict[str, str],
                   json_output: bool) -> None:
    """The exact per-node commands and (masked) environment; no connection is opened."""
    from fstrain.core.launchspec import master_port_candidates, plan_launches, resolve_nproc
    from fstrain.io.connect import is_local
    from fstrain.io.launch import node_summary

    nprocs = [resolve_nproc(h, requested, None) for h in hosts]
    master = "127.0.0.1" if all(is_local(h) for h in hosts) else hosts[0].name
    port = master_port or master_port_candidates(run_id)[0]
    launches = plan_launches(hosts, backend=backend, nprocs=nprocs, program=program, python=python,
                             master_addr=master, master_port=port, run_id=run_id, max_restarts=max_restarts,
                             env=user_env, per_node_env=[])
    note = ("dry run: nothing was contacted; the master address and port are checked, and "
            "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME chosen per node, at launch")
    if json_output:
        print_json({"run_id": run_id, "dry_run": True, "note": note, "master_addr": master, "master_port": port,
                    "nodes": [node_summary(launch, None) for launch in launches]})
        return
    print_launches(launches)
    console().print(f"[dim]{note}[/dim]")


def print_launches(launches: list[NodeLaunch]) -> None:
    from fstrain.core.launchspec import mask_env

    for launch in launches:
        sys.stdout.write(f"# node {launch.node_rank}: {launch.host.label()} ({launch.nproc} processes)\n")
        for name, value in mask_env(launch.env).items():
            sys.stdout.write(f"{name}={shlex.quote(value)}\n")
        sys.stdout.write(shlex.join(launch.argv) + "\n")
    sys.stdout.flush()


def execute(hosts: list[Any], requested: int | None, backend: str, program: list[str], python: str,
            master_port: int | None, max_restarts: int, run_id: str, folder: Path, user_env: dict[str, str],
            workdir: str | None, grace: float, heartbeat_timeout: float, ssh_config: str | None,
            accept_new_hosts: bool, fanout: int, json_output: bool) -> RunOutcome:
    from fstrain.core.launchspec import plan_launches, resolve_nproc
    from fstrain.io.connect import make_connector
    from fstrain.io.fanout import HostPool
    from fstrain.io.launch import RunOptions, choose_rendezvous, preflight, run_nodes, write_manifest

    out = console()
    connect = make_connector(ssh_config, accept_new_hosts=accept_new_hosts)
    with HostPool(hosts, connect, fanout=fanout) as pool:
        facts = preflight(pool, python, workdir)
        rendezvous = choose_rendezvous(pool, connect, facts, python, run_id, master_port)
    nprocs = [resolve_nproc(h, requested, None) for h in hosts]
    per_node = [interface_env(ifname, user_env) for ifname in rendezvous.interfaces]
    launches = plan_launches(hosts, backend=backend, nprocs=nprocs, program=program, python=python,
                             master_addr=rendezvous.master_addr, master_port=rendezvous.master_port, run_id=run_id,
                             max_restarts=max_restarts, env=user_env, per_node_env=per_node)
    out.print(f"run {run_id}: {len(hosts)} nodes x {nprocs[0] if len(set(nprocs)) == 1 else nprocs} processes, "
              f"{backend}, master {rendezvous.master_addr}:{rendezvous.master_port}; logs in {folder}/logs")
    options = RunOptions(run_id=run_id, run_dir=folder, grace_s=grace, heartbeat_timeout_s=heartbeat_timeout,
                         workdir=workdir, color=sys.stdout.isatty() and not json_output,
                         out=sys.stderr if json_output else sys.stdout)
    outcome = run_nodes(launches, connect, python, options)
    document = write_manifest(folder / "manifest.json", run_id=run_id, backend=backend, rendezvous=rendezvous,
                              launches=launches, outcome=outcome, facts=facts, env=user_env, plan=None)
    if json_output:
        print_json(document)
    else:
        print_summary(outcome)
    return outcome


def interface_env(ifname: str, user_env: dict[str, str]) -> dict[str, str]:
    """NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME: the interface that routes to the master,
    unless the user set them."""
    if not ifname:
        return {}
    return {name: ifname for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") if name not in user_env}


def describe_exit(code: int | None, error: str | None) -> str:
    import signal

    if code is None:
        return error or "unknown"
    if code > 128 and code - 128 in signal.valid_signals():
        return f"{code} ({signal.Signals(code - 128).name})"
    return str(code)


def print_summary(outcome: RunOutcome) -> None:
    from rich.table import Table

    table = Table(show_edge=False, pad_edge=False)
    for column in ("host", "node", "exit", "seconds", "error"):
        table.add_column(column)
    for node in outcome.nodes:
        ok = node.exit_code == 0
        seconds = (node.ended or time.time()) - node.started
        code = describe_exit(node.exit_code, node.error)
        table.add_row(node.launch.host.label(), str(node.launch.node_rank),
                      f"[{'green' if ok else 'red'}]{code}[/]", f"{seconds:.1f}", node.error or "")
    out = console()
    out.print(table)
    if outcome.first_failure is not None:
        failed = outcome.nodes[outcome.first_failure]
        out.print(f"[red]first failure: node {failed.launch.node_rank} ({failed.launch.host.label()}), "
                  f"exit {describe_exit(failed.exit_code, failed.error)}[/red]; its last lines:")
        for line in failed.tail[-10:]:
            out.print(f"  {line}", markup=False)
    verdict = {"ok": "[green]all nodes finished ok[/green]", "interrupted": "[yellow]interrupted (Ctrl-C)[/yellow]",
               "terminated": "[yellow]terminated (SIGTERM)[/yellow]"}.get(outcome.reason, "[red]failed[/red]")
    out.print(f"{verdict}; exit code {outcome.exit_code}")
