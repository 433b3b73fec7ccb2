"""GPU memory and utilisation for `fstrain status`, from ``nvidia-smi --query-gpu`` (NVML's own
numbers) as each node printed it: pure, the node only runs the tool and sends the text back.

The query asks for the CSV with its header and units (``memory.used [MiB]``, ``utilization.gpu
[%]``), so the columns are read by name; a GPU without a value (``[N/A]`` under MIG,
``[Not Supported]``) keeps the values it has and gets None for the rest.
"""

from __future__ import annotations

from typing import Any

from fstrain.core.parsers.query_gpu import parse_query_gpu
from fstrain.errors import ParseError

USAGE_FIELDS = ("index", "memory.used", "memory.total", "utilization.gpu")
USAGE_QUERY = ["--query-gpu=" + ",".join(USAGE_FIELDS), "--format=csv"]


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def gpu_usage(text: str, source: str = "<nvidia-smi --query-gpu>") -> list[dict[str, Any]]:
    """One dict per GPU: index, memory_used_mib, memory_total_mib, utilization_percent (None
    where nvidia-smi has no value). Raises ParseError on output that is not the query's CSV."""
    rows = []
    for row in parse_query_gpu(text, source=source):
        index = _number(row.get("index"))
        rows.append({"index": int(index) if index is not None else None,
                     "memory_used_mib": _number(row.get("memory.used")),
                     "memory_total_mib": _number(row.get("memory.total")),
                     "utilization_percent": _number(row.get("utilization.gpu"))})
    return rows


def usage_cell(gpus: list[dict[str, Any]], error: str | None = None) -> str:
    """The status table's cell: ``0:61440/81920MiB 97%`` per GPU, ``?`` for a missing value;
    without GPUs, the node's reason in brackets where it gave one."""
    def value(number: float | None, unit: str = "") -> str:
        return "?" if number is None else f"{number:.0f}{unit}"

    if not gpus:
        return f"({error})" if error else ""
    return " ".join(f"{value(g['index'])}:{value(g['memory_used_mib'])}/{value(g['memory_total_mib'], 'MiB')} "
                    f"{value(g['utilization_percent'], '%')}" for g in gpus)


def from_node(answer: Any, host: str) -> tuple[list[dict[str, Any]], str | None]:
    """A node's ``gpus`` answer (fstrain/io/remote/runctl.py): (the GPUs, why there are none or
    None). A node without nvidia-smi answers {}: no GPUs, no error."""
    if not isinstance(answer, dict) or not answer:
        return [], None
    if answer.get("error"):
        return [], str(answer["error"])
    try:
        return gpu_usage(str(answer.get("csv") or ""), source=f"{host}: nvidia-smi {' '.join(USAGE_QUERY)}"), None
    except ParseError as exc:
        return [], str(exc)
