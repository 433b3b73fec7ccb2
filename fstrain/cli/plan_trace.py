"""``fstrain plan --trace``'s table: the planner's numbers beside PyTorch's trace (fstrain/api/trace.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fstrain.api.trace import GIB, ROWS

if TYPE_CHECKING:
    from fstrain.api.plan import Planned


def run_trace(planned: Planned) -> dict[str, Any]:
    """The trace of the chosen plan, its stages on stderr (live on a terminal)."""
    from fstrain.api.trace import trace
    from fstrain.cli.progress_output import progress_reporter
    from fstrain.core.progress import Event

    with progress_reporter() as reporter:
        doc = trace(planned, progress=lambda text: reporter.event(Event("trace", text=text)))
        reporter.event(Event("trace", ended=True, text=f"{doc['traced']['seconds']:.0f} s"))
    return doc


def print_trace(doc: dict[str, Any]) -> None:
    """The side-by-side table on stderr."""
    from rich.table import Table

    from fstrain.cli.output import console

    traced = doc["traced"]
    how = (
        f"traced at {', '.join(map(str, traced['depths']))} blocks and extrapolated"
        if traced["extrapolated"]
        else f"traced at {traced['depths'][-1]} blocks"
    )
    table = Table(title=f"memory per GPU: analytic vs PyTorch's trace (peak in {traced['moment']}; {how}, "
                  f"{traced['seconds']:.0f} s)", title_justify="left")
    for column in ("category", "analytic GiB", "traced GiB", "analytic vs traced"):
        table.add_column(column, justify="left" if column == "category" else "right")
    for key in (*ROWS, "total"):
        analytic = doc["analytic"][key]
        value = traced["total"] if key == "total" else traced["categories"][key]
        error = doc["error_pct"][key]
        table.add_row(key.replace("_", " "), f"{analytic / GIB:.2f}", f"{value / GIB:.2f}",
                      "-" if error is None else f"{error:+.1f} %")
    out = console()
    out.print(f"trace of: {doc['plan']}", markup=False)
    out.print(f"model traced: {doc['model']}", markup=False)
    if doc["stand_in"]:
        out.print(doc["stand_in"], markup=False)
    out.print(table)
    out.print("not traced: CUDA context, NCCL buffers, allocator fragmentation (the planner's overhead row)")
    for note in doc.get("notes", ()):
        out.print(f"note: {note}")
