"""`fstrain status RUN --watch`: the live view of a run, redrawn every few seconds.

It is a view for humans, so it goes where fstrain's human output goes, stderr: on a terminal a
rich Live display (redrawn in place), otherwise one plain line per refresh. With ``--json`` it
is for machines: one JSON document per line on stdout for each refresh that changed something
(:func:`watch_json`). The values come from fstrain/core/monitor/watch.py; this module only
draws them.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from fstrain.cli.output import console

if TYPE_CHECKING:
    from rich.console import RenderableType

    from fstrain.api.runs import Outputs, Run
    from fstrain.core.monitor.watch import Watch, WatchRow, WatchView


def duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def progress_text(view: WatchView) -> str:
    """``step 12/40 (30%), ETA 1m04s``; what is known of it."""
    if view.step is None:
        return "no step reported yet"
    text = f"step {view.step}/{view.steps}" if view.steps else f"step {view.step}"
    if view.fraction is not None:
        text += f" ({view.fraction:.0%})"
    if view.eta_s is not None and not view.ended:
        text += f", ETA {duration(view.eta_s)}"
    return text


def headline(view: WatchView) -> str:
    state = view.state + (f", exit {view.exit_code}" if view.exit_code is not None else "")
    return f"run {view.run_id}: {state}" + (f" ({view.reason})" if view.reason else "")


def _cells(row: WatchRow) -> list[str]:
    from fstrain.core.monitor.gpuusage import usage_cell

    alive = "" if row.alive is None else "yes" if row.alive else "no"
    return [row.host, str(row.rank), alive,
            "" if row.step is None else f"{row.step}" + (f"/{row.steps}" if row.steps else ""),
            "" if row.loss is None else f"{row.loss:.4f}",
            "" if row.tokens_per_s is None else f"{row.tokens_per_s:,.0f}",
            "" if row.step_s is None else f"{row.step_s:.2f} s",
            "" if row.memory_bytes is None else f"{row.memory_bytes / 2**30:.1f} GiB",
            usage_cell(list(row.gpus), row.gpus_error),
            "" if row.last_output_age_s is None else f"{row.last_output_age_s:.0f} s ago",
            "slowest" if row.slowest else "straggler" if row.straggler else ""]


COLUMNS = ("host", "rank", "alive", "step", "loss", "tokens/s", "step time", "memory", "gpus", "last output", "")


def render(view: WatchView, interval_s: float) -> RenderableType:
    """The whole screen: the run's state and first failure, the progress bar, a row per rank."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    from fstrain.cli.launch_output import describe_failure

    parts: list[RenderableType] = [Text(headline(view), style="bold")]
    if view.first_failure:
        parts.append(Text(f"first failure: {describe_failure(dict(view.first_failure))}", style="red"))
    if view.unreachable:
        parts.append(Text(f"not answering: {', '.join(view.unreachable)}", style="yellow"))
    bar = Table.grid(padding=(0, 1))
    bar.add_row(ProgressBar(total=float(view.steps or 1), completed=float(view.step or 0) if view.steps else 0,
                            width=40), Text(progress_text(view)))
    parts.append(bar)
    table = Table(show_edge=False, pad_edge=False)
    for column in COLUMNS:
        table.add_column(column)
    for row in view.rows:
        table.add_row(*_cells(row), style="bold yellow" if row.slowest else "yellow" if row.straggler else None)
    parts.append(table if view.rows else Text("no rank has started yet", style="dim"))
    if not view.ended:
        parts.append(Text(f"refreshing every {interval_s:g} s; Ctrl-C stops watching (the run goes on)",
                          style="dim"))
    return Group(*parts)


def plain_line(view: WatchView) -> str:
    """One refresh as one line, for a log (stderr not a terminal)."""
    text = f"{headline(view)}; {progress_text(view)}"
    if view.slowest_rank is not None:
        text += f"; slowest rank {view.slowest_rank}"
    others = [str(rank) for rank in view.stragglers if rank != view.slowest_rank]
    if others:
        text += f"; other stragglers: rank{'s' if len(others) > 1 else ''} {', '.join(others)}"
    return text


def read_view(handle: Run, outputs: Outputs, watch: Watch) -> WatchView:
    """One refresh: the run's status, then, where it does not carry every rank's numbers (a
    detached run's does while node 0 holds every node's view), the last lines of its ranks'
    output (a bounded tail)."""
    from fstrain.core.monitor.watch import numbers_in_status

    document = handle.status()
    if numbers_in_status(document):
        return watch.update(document, [], time.time())
    # One line per item; splitlines drops its newline and parts a progress bar's \r updates.
    lines = [text for line in outputs.read(watch.tail_lines(document)) for text in line.splitlines()]
    return watch.update(document, lines, time.time())


def watch_run(handle: Run, interval_s: float) -> WatchView:
    """Redraw the run's view every ``interval_s`` until it has ended; its last view. Ctrl-C
    (KeyboardInterrupt) goes to the caller: the run is left alone."""
    from fstrain.core.monitor.watch import Watch

    out = console()
    watch = Watch()
    outputs = handle.outputs()
    try:
        if not out.is_terminal:
            while True:
                view = read_view(handle, outputs, watch)
                out.print(plain_line(view), markup=False)
                if view.ended:
                    return view
                time.sleep(interval_s)
        from rich.live import Live

        with Live(console=out, auto_refresh=False, redirect_stdout=False, redirect_stderr=False) as live:
            while True:
                view = read_view(handle, outputs, watch)
                live.update(render(view, interval_s), refresh=True)
                if view.ended:
                    return view
                time.sleep(interval_s)
    finally:
        outputs.close()


FINISHED_WAIT_S = 5.0  # an ended run's last events: its writer records the end just after the state


def watch_json(handle: Run, interval_s: float) -> WatchView:
    """`status --watch --json`: a JSON line on stdout for each refresh that changed something
    (the view, and the run's events written since the line before), until the run has ended;
    its last view."""
    import json
    import sys

    from fstrain.core.monitor.watch import Watch, changed, view_document
    from fstrain.core.runs.runevents import FINISHED

    watch = Watch()
    outputs = handle.outputs()
    previous, seen = None, 0
    try:
        while True:
            view = read_view(handle, outputs, watch)
            deadline = time.monotonic() + FINISHED_WAIT_S
            while True:
                recorded = handle.events()
                events = recorded.events[seen:] if recorded is not None else ()
                done = recorded is None or any(e.kind == FINISHED for e in recorded.events)
                if not view.ended or done or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            seen += len(events)
            document = view_document(view, time.time(), [e.to_dict() for e in events])
            if changed(previous, document):
                sys.stdout.write(json.dumps(document) + "\n")
                sys.stdout.flush()
                previous = document
            if view.ended:
                return view
            time.sleep(interval_s)
    finally:
        outputs.close()
