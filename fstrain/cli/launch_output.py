"""What `fstrain launch` prints at the end of a run, and what `runs`, `status`, `attach` and
`bench` print the same way: the per-node table, the first failure, a stall's report, the
training summary. Nodes are named by host (the node rank, where given, after it)."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fstrain.cli.output import console

if TYPE_CHECKING:
    from fstrain.api.launch import NodeState, RunOutcome
    from fstrain.core.runs.runstate import RunState


def print_training_summary(summary: dict[str, Any]) -> None:
    import json

    console().print("training summary (rank 0):")
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    sys.stdout.flush()


def describe_exit(code: int | None, error: str | None, rank: int | None = None) -> str:
    """``139 (SIGSEGV, rank 3)``: an exit code, the signal it stands for, the rank it is of."""
    import signal

    if code is None:
        return error or "unknown"
    notes = [signal.Signals(code - 128).name] if code > 128 and code - 128 in signal.valid_signals() else []
    notes += [f"rank {rank}"] if rank is not None else []
    return f"{code} ({', '.join(notes)})" if notes else str(code)


def node_exit(node: NodeState) -> str:
    """A node's exit as the run counts it (the supervisor's rule): its failed rank's own code
    where known (torchrun itself exits 1 whatever the rank's code), else the node's."""
    if node.failure is not None:
        return describe_exit(node.failure.exit_code, None, node.failure.rank)
    return describe_exit(node.exit_code, node.error)


def print_attempts(attempts: Sequence[Mapping[str, Any]]) -> None:
    """One line per attempt of a run with a recovery policy (docs/recovery.md)."""
    from fstrain.core.launch.recovery import describe_attempt

    for attempt in attempts:
        console().print(describe_attempt(attempt), markup=False)


def print_summary(outcome: RunOutcome) -> None:
    from rich.table import Table

    from fstrain.api.launch import failure_lines

    table = Table(show_edge=False, pad_edge=False)
    for column in ("host", "node", "exit", "seconds", "error"):
        table.add_column(column)
    for node in outcome.nodes:
        ok = node.exit_code == 0
        seconds = (node.ended or time.time()) - node.started
        code = node_exit(node)
        table.add_row(node.launch.host.label(), str(node.launch.node_rank),
                      f"[{'green' if ok else 'red'}]{code}[/]", f"{seconds:.1f}", node.error or "")
    out = console()
    out.print(table)
    if outcome.first_failure is not None:
        failed = outcome.nodes[outcome.first_failure]
        where = f"{failed.launch.host.label()} (node {failed.launch.node_rank})"
        if failed.failure is not None:  # the rank's own code (torchrun itself exits 1)
            what = rank_failure_words(where, {"rank": failed.failure.rank, "local_rank": failed.failure.local_rank,
                                              "exit_code": failed.failure.exit_code})
        else:
            what = f"{where}, exit {describe_exit(failed.exit_code, failed.error)}"
        out.print(f"[red]first failure: {what}[/red]; its last lines:")
        for line in failure_lines(failed):
            out.print(f"  {line}", markup=False)
    if outcome.stall is not None:
        print_stall(outcome.stall, [node.launch.host.label() for node in outcome.nodes])
    verdict = {"ok": "[green]all nodes finished ok[/green]", "interrupted": "[yellow]interrupted (Ctrl-C)[/yellow]",
               "stalled": "[red]stalled[/red]", "terminated": "[yellow]terminated (SIGTERM)[/yellow]",
               "cancelled": f"[yellow]{outcome.detail}[/yellow]"}.get(outcome.reason, "[red]failed[/red]")
    out.print(f"{verdict}; exit code {outcome.exit_code}")


def print_stall(report: dict[str, Any], hosts: Sequence[str]) -> None:
    """Why the job counts as stalled, where each group of ranks was, and the odd ranks
    (``hosts``: the run's, by node rank)."""
    out = console()
    odd = report.get("odd_ranks") or []
    named = f"; odd {'rank' if len(odd) == 1 else 'ranks'}: {', '.join(map(str, odd))}" if odd else ""
    out.print(f"[red]stalled: {report['reason']}{named}[/red]")
    for line in report.get("summary", []):
        out.print(f"  {line}", markup=False)
    for trace in report.get("nccl_traces", []):
        out.print(f"  NCCL flight recorder dump: {trace}", markup=False)
    out.print(f"  stacks: {report['folder']}", markup=False)
    if report.get("unanswered_nodes"):
        names = [hosts[i] if isinstance(i, int) and 0 <= i < len(hosts) else f"node rank {i}"
                 for i in report["unanswered_nodes"]]
        out.print(f"  no stacks from {', '.join(names)}", markup=False)


def describe_failure(failure: Mapping[str, Any]) -> str:
    """``rank 3 (local rank 1) on node2 exited with 7``: a run's first failure (``status
    --json``'s ``first_failure``) as `status`, `attach` and `runs` name it; a node that failed
    without a rank's code (lost, or no exit status) by its host and why."""
    host = failure.get("host") or f"node rank {failure.get('node_rank')}"
    if failure.get("exit_code") is None:
        reason = str(failure.get("reason") or "failed")
        return reason if host in reason else f"{host}: {reason}"
    return rank_failure_words(host, failure)


def rank_failure_words(where: str, failure: Mapping[str, Any]) -> str:
    """A failed rank in the run's own words (the supervisor's, which the manifest's reason has)."""
    from fstrain.core.launch.supervisor import describe_failure as words
    from fstrain.core.monitor.rankexit import signal_name

    code = int(failure["exit_code"])
    return words(where, code, {**failure, "signal": failure.get("signal") or signal_name(code) or None})


def describe_state(state: RunState) -> str:
    """``failed, exit 7 (...)``: a run's state and exit code, as every run command says it."""
    from fstrain.core.monitor.rankexit import describe_code

    code = f", exit {describe_code(state.exit_code)}" if state.exit_code is not None else ""
    return f"{state.state}{code}"
