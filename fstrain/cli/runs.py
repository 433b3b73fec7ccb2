"""``fstrain runs``, ``status``, ``logs``, ``attach``, ``stop``, ``gc``: runs that outlive the
launcher (``fstrain launch --detach``), looked at from any later fstrain process."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from fstrain.cli import hostopts
from fstrain.cli import slurm as slurmopts
from fstrain.cli.output import console, print_json

if TYPE_CHECKING:
    from fstrain.core.launch.runstate import RunState
    from fstrain.io.launch import RunOutcome
    from fstrain.io.logs import NodeOutputs
    from fstrain.io.runs import RunRecord

PYTHON = typer.Option("python3", "--python", help="Interpreter on the hosts.")
FOLLOW_POLL_S = 1.0


def register(app: typer.Typer) -> None:
    app.command("runs", help="Runs started from this machine, with their state.")(runs_command)
    app.command("status", help="A run's state per node and per rank.")(status_command)
    app.command("logs", help="A run's output, tagged like an attached run's.")(logs_command)
    app.command("attach", help="Follow a detached run (Ctrl-C detaches; the run goes on).")(attach_command)
    app.command("stop", help="Stop a run on every host (the same teardown as Ctrl-C).")(stop_command)
    app.command("gc", help="Remove finished runs' folders on the hosts.")(gc_command)


# -- launch --detach ----------------------------------------------------------------------------


def start_detached_run(hosts: list[Any], launches: list[Any], connect: Any, python: str, options: Any,
                       rendezvous: Any, run_dirs: list[str], backend: str, ssh_config: str | None, facts: Any,
                       user_env: dict[str, str], plan: Any, json_output: bool) -> RunOutcome:
    """Start every node's watchdog detached; print the run id once all of them started."""
    from fstrain.io.launch import RunOutcome, write_manifest
    from fstrain.io.runs import record_detached, start_detached

    started = time.time()
    answers = start_detached(launches, connect, python, options, rendezvous)
    record_detached(options.run_dir, run_id=options.run_id, backend=backend, hosts=hosts, launches=launches,
                    run_dirs=run_dirs, answers=answers, rendezvous=rendezvous, ssh_config=ssh_config, python=python,
                    grace_s=options.grace_s)
    document = write_manifest(options.run_dir / "manifest.json", run_id=options.run_id, backend=backend,
                              rendezvous=rendezvous, launches=launches, outcome=None, facts=facts, env=user_env,
                              plan=plan.to_dict() if plan else None)
    document.update(reason="detached", started=started, detached=True)
    (options.run_dir / "manifest.json").write_text(json.dumps(document, indent=2) + "\n")
    if json_output:
        print_json({"run_id": options.run_id, "run_dir": str(options.run_dir), "nodes": answers})
    else:
        console().print(f"run {options.run_id} started detached on {len(hosts)} nodes; "
                        f"`fstrain status {options.run_id}`, `fstrain logs {options.run_id} --follow`, "
                        f"`fstrain stop {options.run_id}`")
        sys.stdout.write(options.run_id + "\n")
        sys.stdout.flush()
    return RunOutcome(0, "detached", None, [], started, time.time())


# -- helpers ------------------------------------------------------------------------------------


def _connector(record: RunRecord, ssh_config: str | None, accept_new_hosts: bool) -> Any:
    from fstrain.io.connect import make_connector

    stored = record.detached.ssh_config if record.detached else None
    return make_connector(ssh_config or stored, accept_new_hosts=accept_new_hosts)


def _views(record: RunRecord, connect: Any, python: str) -> list[dict[str, Any] | None] | None:
    from fstrain.io.runs import node_views

    return node_views(record, connect, python) if record.detached else None


def _python(record: RunRecord, python: str) -> str:
    return (record.detached.python if record.detached else "") or python


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def _describe(state: RunState) -> str:
    from fstrain.core.launch.rankexit import describe_code

    code = f", exit {describe_code(state.exit_code)}" if state.exit_code is not None else ""
    return f"{state.state}{code}"


# -- fstrain runs -------------------------------------------------------------------------------


def runs_command(
    all_runs: bool = typer.Option(False, "--all", help="Also finished runs (default: only live ones)."),
    hostfile: str | None = hostopts.HOSTFILE,
    hosts: str | None = hostopts.HOSTS,
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    python: str = PYTHON,
    json_output: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
) -> None:
    """Runs started from this machine: state, duration, nodes, exit code."""
    from rich.table import Table

    from fstrain.core.launch.runstate import FINAL
    from fstrain.io.runs import all_runs as list_runs
    from fstrain.io.runs import run_state

    rows: list[dict[str, Any]] = []
    for record in list_runs():
        if record.slurm is not None:  # Slurm's word, asked of scontrol here
            row = slurmopts.slurm_row(record)
            if all_runs or row["state"] not in FINAL:
                rows.append(row)
            continue
        cached = run_state(record, None)
        views = None
        if record.detached and cached.state not in FINAL:  # ask the nodes only while it may still run
            views = _views(record, _connector(record, ssh_config, accept_new_hosts), _python(record, python))
        state = run_state(record, views) if views is not None else cached
        if not all_runs and state.state in FINAL:
            continue
        ended = state.ended
        rows.append({"run_id": record.run_id, "state": state.state, "exit_code": state.exit_code,
                     "reason": state.reason, "detached": bool(record.detached), "started": record.started,
                     "seconds": round((ended or time.time()) - record.started, 1) if record.started else None,
                     "nodes": [h.label() for h in record.hosts], "run_dir": str(record.run_dir)})
    if hostfile or hosts:  # and the detached runs found on those hosts
        known = {row["run_id"] for row in rows}
        rows += [row for row in _runs_on_hosts(hostfile, hosts, ssh_config, accept_new_hosts, python)
                 if row["run_id"] not in known and (all_runs or row["state"] not in FINAL)]
    if json_output:
        print_json({"runs": rows})
        return
    table = Table(show_edge=False, pad_edge=False)
    for column in ("run", "state", "exit", "started", "duration", "nodes", "mode"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["run_id"], row["state"], "" if row["exit_code"] is None else str(row["exit_code"]),
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(row["started"])) if row["started"] else "",
                      _duration(row["seconds"] or 0), ",".join(row["nodes"]),
                      row.get("mode") or ("detached" if row["detached"] else "attached"))
    console().print(table if rows else "no runs" + ("" if all_runs else " running (--all lists finished ones)"))


def _runs_on_hosts(hostfile: str | None, hosts: str | None, ssh_config: str | None, accept_new_hosts: bool,
                   python: str) -> list[dict[str, Any]]:
    """Detached runs whose node records are in the hosts' ``~/.fstrain/runs``, merged per run."""
    from fstrain.core.launch.runstate import from_host_records
    from fstrain.io.connect import make_connector
    from fstrain.io.fanout import HostPool
    from fstrain.io.launch import REMOTE_RUNS
    from fstrain.io.remote import LINE_BOOTSTRAP, as_line
    from fstrain.io.runs import check_view

    selection = hostopts.resolve_hosts(hostfile, hosts, None, None, None)
    connect = make_connector(ssh_config, accept_new_hosts=accept_new_hosts)
    with HostPool(selection.hosts, connect) as pool:
        results = pool.run_all([python, "-u", "-c", LINE_BOOTSTRAP, "list", f"~/{REMOTE_RUNS}"],
                               stdin=as_line("runctl"), timeout_s=60)
    merged: dict[str, dict[str, Any]] = {}
    for host, result in zip(selection.hosts, results, strict=True):
        try:
            found = json.loads(result.stdout)["runs"] if result.ok else []
        except (ValueError, KeyError):
            found = []
        for run in found:
            entry = merged.setdefault(run["run_id"], {"run": None, "nodes": {}, "hosts": []})
            entry["run"] = entry["run"] or run.get("run")
            entry["hosts"].append(host.label())
            for node in run["nodes"]:  # hosts that share a home see every node's record
                check_view({"run": run.get("run"), "node": node}, f"{host.label()}:{run.get('run_dir')}",
                           node.get("node_rank"))
                entry["nodes"][node.get("node_rank")] = node
    rows = []
    for run_id, entry in sorted(merged.items()):
        nodes = [entry["nodes"][k] for k in sorted(entry["nodes"], key=lambda k: (k is None, k))]
        state = from_host_records(entry["run"], nodes)
        started = min((n.get("started") or 0 for n in nodes), default=0)
        rows.append({"run_id": run_id, "state": state.state, "exit_code": state.exit_code, "reason": state.reason,
                     "detached": True, "started": started,
                     "seconds": round((state.ended or time.time()) - started, 1) if started else None,
                     "nodes": sorted({str(n.get("hostname")) for n in nodes}), "run_dir": None,
                     "mode": "found on hosts"})
    return rows


# -- fstrain status -----------------------------------------------------------------------------


def status_document(record: RunRecord, views: list[dict[str, Any] | None] | None) -> dict[str, Any]:
    from fstrain.core.launch.gpuusage import from_node
    from fstrain.core.launch.runstate import parse_progress
    from fstrain.io.runs import run_state

    state = run_state(record, views)
    nodes: list[dict[str, Any]] = []
    if record.detached is None:  # an attached run: what its manifest recorded
        nodes = [{"host": n.get("host"), "node_rank": n.get("node_rank"), "exit_code": n.get("exit_code"),
                  "error": n.get("error"), "last_lines": n.get("last_lines") or [], "ranks": []}
                 for n in (record.manifest or {}).get("nodes", [])]
    for index, host in enumerate(record.hosts if record.detached else []):
        view = views[index] if views else None
        node = (view or {}).get("node") or {}
        offset = record.detached.nodes[index].rank_offset if record.detached else None
        alive = set((view or {}).get("ranks_alive") or [])
        ranks = []
        for local, entry in sorted((node.get("ranks") or {}).items(), key=lambda kv: int(kv[0])):
            rank = int(local) + offset if offset is not None else int(local)
            progress = parse_progress(entry.get("progress_line") or "") if entry.get("progress_line") else None
            ranks.append({"rank": rank, "local_rank": int(local), "alive": rank in alive,
                          "last_output_at": entry.get("last_output_at"), "last_line": entry.get("last_line"),
                          "progress": progress})
        gpus, gpus_error = from_node((view or {}).get("gpus"), host.label())
        nodes.append({"host": host.label(), "node_rank": index, "reachable": view is not None,
                      "watchdog_alive": (view or {}).get("watchdog_alive"), "exit_code": node.get("exit_code"),
                      "failure": node.get("failure"), "last_output_at": node.get("last_output_at"),
                      "ranks_alive": sorted(alive), "ranks": ranks, "gpus": gpus, "gpus_error": gpus_error,
                      "last_lines": node.get("last_lines") or []})
    return {"run_id": record.run_id, "state": state.state, "exit_code": state.exit_code, "reason": state.reason,
            "detached": bool(record.detached), "started": record.started, "nodes": nodes}


def status_command(
    run: str = typer.Argument(..., metavar="RUN", help="Run id (or a unique prefix), or its local run directory."),
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    python: str = PYTHON,
    json_output: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
) -> None:
    """A run's state per node and per rank: alive, last output, last step/loss/tokens/s, GPUs."""
    from rich.table import Table

    from fstrain.core.launch.gpuusage import usage_cell
    from fstrain.io.runs import find_run

    record = find_run(run)
    if record.slurm is not None:
        document = slurmopts.slurm_status_document(record, python)
        if json_output:
            print_json(document)
        else:
            slurmopts.print_slurm_status(document)
        return
    views = _views(record, _connector(record, ssh_config, accept_new_hosts), _python(record, python))
    document = status_document(record, views)
    if json_output:
        print_json(document)
        return
    out = console()
    state = f"{document['state']}" + (f", exit {document['exit_code']}" if document["exit_code"] is not None else "")
    out.print(f"run {record.run_id}: {state}" + (f" ({document['reason']})" if document["reason"] else ""))
    table = Table(show_edge=False, pad_edge=False)
    for column in ("host", "rank", "alive", "last output", "step", "loss", "tokens/s", "gpus"):
        table.add_column(column)
    now = time.time()
    if not record.detached:
        for node in document["nodes"]:
            out.print(f"  node {node['node_rank']} {node['host']}: exit {node['exit_code']}"
                      + (f" ({node['error']})" if node["error"] else ""), markup=False)
        return
    for node in document["nodes"]:
        gpus = usage_cell(node["gpus"], node["gpus_error"])
        if not node["reachable"]:
            table.add_row(node["host"], "", "unreachable", "", "", "", "", "")
        for rank in node["ranks"]:
            progress = rank["progress"] or {}
            ago = f"{now - rank['last_output_at']:.0f} s ago" if rank["last_output_at"] else ""
            table.add_row(node["host"], str(rank["rank"]), "yes" if rank["alive"] else "no", ago,
                          str(progress.get("step") or ""), str(progress.get("loss") or ""),
                          f"{progress['tokens_per_s']:,.0f}" if progress.get("tokens_per_s") else "", gpus)
    out.print(table)


# -- fstrain logs / attach ----------------------------------------------------------------------


def _node_outputs(record: RunRecord, connect: Any, python: str, hosts: list[str], rank: int | None,
                  since: float | None) -> NodeOutputs:
    """The chosen nodes' output files of a detached run (every node's without ``hosts``)."""
    from fstrain.io.logs import NodeFile, NodeOutputs

    assert record.detached is not None
    nodes = [NodeFile(n.host, n.run_dir, n.node_rank, n.rank_offset) for n in record.detached.nodes
             if not hosts or n.host.name in hosts or n.host.label() in hosts]
    return NodeOutputs(nodes, connect, python, rank=rank, since=since)


def _write(lines: Iterable[str]) -> bool:
    """Print the lines (each ends with a newline) as they come; whether there was any."""
    printed = False
    for text in lines:
        sys.stdout.write(text)
        printed = True
    sys.stdout.flush()
    return printed


def _say_unread(failed: dict[str, str], said: set[str]) -> None:
    """One line on stderr for each host whose output could not be read, once per outage."""
    for host, why in failed.items():
        if host not in said:
            sys.stderr.write(f"error: {host}: its output could not be read: {why}\n")
    said.intersection_update(failed)
    said.update(failed)


def _follow(record: RunRecord, connect: Any, python: str, outputs: NodeOutputs, *, tail: int | None,
            follow: bool) -> RunState | None:
    """Print the run's lines, then, with ``follow``, new ones until the run has ended (its
    state then; None without ``follow``). Hosts that could not be read are named on stderr and
    left in ``outputs.failed``."""
    from fstrain.core.launch.runstate import FINAL
    from fstrain.io.runs import node_views, run_state

    first, final, last_check = True, None, 0.0
    said: set[str] = set()
    try:
        while True:
            printed = _write(outputs.read(tail if first else None))
            _say_unread(outputs.failed, said)
            first = False
            if not follow:
                return None
            if final is not None and not printed:
                return final
            if time.monotonic() - last_check > 3:
                last_check = time.monotonic()
                views = node_views(record, connect, python)
                state = run_state(record, views)
                if state.state in FINAL and not any((v or {}).get("watchdog_alive") for v in views):
                    final = state  # one more read for the last lines
                    continue
            time.sleep(FOLLOW_POLL_S)
    finally:
        outputs.close()


def logs_command(
    run: str = typer.Argument(..., metavar="RUN", help="Run id (or a unique prefix), or its local run directory."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines until the run has ended."),
    host: list[str] = typer.Option([], "--host", help="Only this host's lines (repeatable)."),
    rank: int | None = typer.Option(None, "--rank", min=0, help="Only this global rank's lines."),
    since: str | None = typer.Option(None, "--since", metavar="DURATION", help="Only lines of the last DURATION."),
    tail: int | None = typer.Option(None, "--tail", min=0, help="Start with the last N lines only."),
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    python: str = PYTHON,
) -> None:
    """A run's output from the nodes' files, tagged ``[host rN]`` like an attached run's."""
    from fstrain.core.launch.duration import parse_duration_s
    from fstrain.errors import InputError
    from fstrain.io.runs import find_run

    since_s = parse_duration_s(since, "--since") if since else None
    record = find_run(run)
    if since_s is not None and record.detached is None:
        kind = "a Slurm run's" if record.slurm is not None else "an attached run's"
        raise InputError(f"--since needs the time of each line, and {kind} log lines have none", "use --tail N",
                         "--since")
    if record.slurm is not None:
        _file_logs(lambda: slurmopts.slurm_log_files(record, host, rank), tail, follow,
                   slurmopts.slurm_running(record))
        return
    if record.detached is None:
        _attached_logs(record, host, rank, tail, follow)
        return
    known = {h.name for h in record.hosts} | {h.label() for h in record.hosts}
    for name in host:
        if name not in known:
            raise InputError(f"{name!r} is not one of the run's hosts", f"use one of {', '.join(sorted(known))}",
                             "--host")
    connect = _connector(record, ssh_config, accept_new_hosts)
    py = _python(record, python)
    outputs = _node_outputs(record, connect, py, host, rank, time.time() - since_s if since_s else None)
    _follow(record, connect, py, outputs, tail=tail, follow=follow)
    if outputs.failed:
        raise typer.Exit(1)


def _attached_logs(record: RunRecord, hosts: list[str], rank: int | None, tail: int | None, follow: bool) -> None:
    """An attached run's lines, from the launcher's own log files; with ``follow``, new lines
    until its launcher has exited."""
    import re

    folder = record.run_dir / "logs"

    def chosen() -> list[Path]:
        paths = []
        for path in sorted(folder.glob("*.log")) if folder.is_dir() else []:
            match = re.fullmatch(r"(.+?)(?:\.r(\d+))?\.log", path.name)
            if match is None or (hosts and match.group(1) not in hosts):
                continue
            if (rank is None and match.group(2) is None) or (rank is not None and match.group(2) == str(rank)):
                paths.append(path)
        return paths

    _file_logs(chosen, tail, follow, lambda: _running(record.client_pid))


def _file_logs(files: Callable[[], list[Path]], tail: int | None, follow: bool, running: Callable[[], bool]) -> None:
    """Print the files' whole lines; with ``follow``, their new lines until ``running()`` is false
    (asked before each read, so the last read comes after the end)."""
    from fstrain.io.logs import FileOutputs

    outputs = FileOutputs(files)
    first = True
    while True:
        alive = running() if follow else False
        _write(outputs.read(tail if first else None))
        first = False
        if not follow or not alive:
            return
        time.sleep(FOLLOW_POLL_S)


def attach_command(
    run: str = typer.Argument(..., metavar="RUN", help="Run id (or a unique prefix), or its local run directory."),
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    python: str = PYTHON,
) -> None:
    """Follow a detached run's output as an attached launch would print it; at its end, its
    state and exit code. Ctrl-C detaches: the run goes on."""
    from fstrain.errors import InputError
    from fstrain.io.runs import find_run, run_state

    record = find_run(run)
    if record.detached is None and record.slurm is None:
        raise InputError(f"run {record.run_id} was not started with --detach", "`fstrain logs` shows its lines",
                         "RUN")
    connect = _connector(record, ssh_config, accept_new_hosts)
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if record.slurm is not None:  # the job's output file, to the job's end
            _file_logs(lambda: slurmopts.slurm_log_files(record, [], None), 20, True, slurmopts.slurm_running(record))
            ended = run_state(record, None)
            console().print(f"run {record.run_id} {_describe(ended)}" + (f": {ended.reason}" if ended.reason else ""))
            raise typer.Exit(ended.exit_code or 0)
        py = _python(record, python)
        final = _follow(record, connect, py, _node_outputs(record, connect, py, [], None, None), tail=20,
                        follow=True)
    except KeyboardInterrupt:
        console().print(f"detached from run {record.run_id}; it goes on (`fstrain attach {record.run_id}`)")
        raise typer.Exit(0) from None
    finally:
        signal.signal(signal.SIGINT, previous)
    assert final is not None
    _print_end(record, final, connect, _python(record, python))
    raise typer.Exit(final.exit_code or 0)


def _print_end(record: RunRecord, state: RunState, connect: Any, python: str) -> None:
    from fstrain.core.launch.rankexit import RankFailure
    from fstrain.io.runs import node_views

    out = console()
    views = node_views(record, connect, python)
    final = next(((v or {}).get("node", {}).get("final") for v in views if (v or {}).get("node", {}).get("final")),
                 None) or {}
    if final.get("stall"):
        from fstrain.cli.launch import print_stall

        print_stall(final["stall"])
    failure = final.get("first_failure")
    if failure:
        described = RankFailure(failure.get("rank"), failure.get("local_rank"), failure["exit_code"]).describe()
        where = final.get("first_failure_host") or f"node {final.get('first_failure_node_rank')}"
        out.print(f"[red]first failure: {described} on {where}[/red]")
    summary = _training_summary(record, connect)
    if summary is not None:
        from fstrain.cli.launch import print_training_summary

        print_training_summary(summary)
    colour = "green" if state.state == "succeeded" else "red"
    out.print(f"[{colour}]run {record.run_id} {_describe(state)}[/{colour}]"
              + (f": {state.reason}" if state.reason else ""))


def _training_summary(record: RunRecord, connect: Any) -> dict[str, Any] | None:
    """The bundled trainer's rank-0 summary (node 0's run directory), copied into the local one."""
    assert record.detached is not None
    node0 = record.detached.nodes[0]
    transport = connect(node0.host)
    try:
        result = transport.run(["cat", f"{node0.run_dir}/summary.json"], timeout_s=30)
    finally:
        transport.close()
    if not result.ok:
        return None
    try:
        summary: dict[str, Any] = json.loads(result.stdout)
    except ValueError:
        return None
    (record.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


# -- fstrain stop -------------------------------------------------------------------------------


def stop_command(
    run: str = typer.Argument(..., metavar="RUN", help="Run id (or a unique prefix), or its local run directory."),
    grace: float | None = typer.Option(None, "--grace", min=0, help="Seconds between SIGTERM and SIGKILL "
                                       "(default: the run's --grace at launch)."),
    force: bool = typer.Option(False, "--force", help="SIGKILL at once, no grace period."),
    wait: float = typer.Option(60.0, "--wait", min=0, help="Seconds to wait for every node to end."),
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    python: str = PYTHON,
) -> None:
    """Stop a detached run on every host: SIGTERM, SIGKILL after the run's grace period."""
    from fstrain.core.launch.runstate import FINAL
    from fstrain.errors import FstrainError
    from fstrain.io.runs import find_run, node_views, run_state, stop_on_node

    record = find_run(run)
    if record.slurm is not None:
        slurmopts.stop_slurm_run(record, grace, force, wait)
        return
    if record.detached is None:
        _stop_attached(record, force, wait)
        return
    connect = _connector(record, ssh_config, accept_new_hosts)
    py = _python(record, python)
    node0 = record.detached.nodes[0]
    answer = stop_on_node(connect, node0.host, py, node0.run_dir, "kill" if force else "term", grace)
    out = console()
    if "error" in answer:
        state = run_state(record, node_views(record, connect, py))
        if state.state in FINAL:
            out.print(f"run {record.run_id} has already ended: {_describe(state)}")
            return
        raise FstrainError(f"could not reach run {record.run_id}'s coordinator: {answer['error']}",
                           "check node 0 with `fstrain status`", "stop")
    deadline = time.monotonic() + wait
    while True:
        views = node_views(record, connect, py)
        state = run_state(record, views)
        if state.state in FINAL and not any((v or {}).get("watchdog_alive") for v in views):
            break
        if time.monotonic() > deadline:
            raise FstrainError(f"run {record.run_id} has not ended {wait:g} s after the stop",
                               "check with `fstrain status`; `fstrain stop --force` skips the grace period", "stop")
        time.sleep(1)
    out.print(f"run {record.run_id} {_describe(state)}")


def _stop_attached(record: RunRecord, force: bool, wait: float) -> None:
    """An attached run started on this machine: SIGTERM to its launcher, as Ctrl-C would (a
    second one, with --force, skips the grace period)."""
    import os

    from fstrain.errors import FstrainError, InputError
    from fstrain.io.runs import read_document, run_state

    pid = record.client_pid
    state = run_state(record, None)
    if state.state != "running":
        console().print(f"run {record.run_id} has already ended: {_describe(state)}")
        return
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        cmdline = b""
    if b"fstrain" not in cmdline:  # the pid was reused: not our launcher
        raise InputError(f"run {record.run_id}'s launcher (pid {pid}) is gone", "", "RUN")
    os.kill(pid, signal.SIGTERM)
    if force:
        time.sleep(0.5)
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _running(pid):
        raise FstrainError(f"run {record.run_id}'s launcher has not exited {wait:g} s after SIGTERM",
                           "`fstrain stop --force` skips the grace period", "stop")
    record.manifest = read_document(record.run_dir / "manifest.json", "manifest")
    console().print(f"run {record.run_id} {_describe(run_state(record, None))}")


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited launcher its parent has not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] != "Z"


# -- fstrain gc ---------------------------------------------------------------------------------


def gc_command(
    older_than: str = typer.Option("7d", "--older-than", metavar="DURATION",
                                   help="Only runs that started at least this long ago."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would be removed."),
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    python: str = PYTHON,
) -> None:
    """Remove finished runs' folders on the hosts (~/.fstrain/runs/<id>) and their entries here;
    a run still running, or whose state cannot be told, is kept."""
    from fstrain.core.launch.duration import parse_duration_s
    from fstrain.core.launch.runstate import FINAL
    from fstrain.io.runs import all_runs, gc_on_nodes, index_dir, run_state

    age_s = parse_duration_s(older_than, "--older-than")
    out = console()
    removed = 0
    for record in all_runs():
        if time.time() - record.started < age_s:
            continue
        connect = _connector(record, ssh_config, accept_new_hosts)
        py = _python(record, python)
        state = run_state(record, _views(record, connect, py))
        if state.state not in FINAL:
            out.print(f"{record.run_id}: kept ({state.state})")
            continue
        if dry_run:
            out.print(f"{record.run_id}: would be removed ({state.state})")
            continue
        if record.slurm is not None:  # its nodes are Slurm's: only this machine's entry goes
            out.print(f"{record.run_id}: Slurm job {record.slurm.get('job_id')}: forgotten here; its run directory "
                      f"{record.run_dir} is kept")
        for host, result in gc_on_nodes(record, connect, py) if record.slurm is None else []:
            out.print(f"{record.run_id}: {host}: {result}")
        Path(index_dir() / f"{record.run_id}.json").unlink(missing_ok=True)
        removed += 1
    out.print(f"{removed} run(s) removed" if not dry_run else "dry run: nothing removed")
