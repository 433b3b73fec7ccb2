"""The compute suite's GEMM-shape sweep: which shapes, how they travel to the worker, what came back.

Without ``--model`` the sweep times a default grid, scaled to the device by its largest side
(``top``: 8192 on a GPU, 512 on a CPU, so a CPU sweep takes about a second):

- square ``n x n x n`` from ``top/32`` to ``top`` (doubling): the plateau and how small squares
  fall off it;
- few rows ``(m, top, top)`` with ``m`` = ``top/64``, ``top/16``, ``top/4``: a small micro-batch's
  activations against a wide weight;
- narrow outputs ``(top, n, top)`` with ``n`` = ``top/16``, ``top/8``: the k and v projections of
  grouped-query attention;
- a long inner dimension ``(top/4, top/4, 4 top)``: weight gradients summed over many tokens.

With ``--model`` it times :func:`fstrain.core.plan.gemmshapes.model_gemms` for the model, sequence
length, micro-batch and TP degree. Shapes above ``--max-gemm-flops`` (2 m n k) are not timed and
are listed in the document as skipped.

The shapes travel to the worker as one argument, ``MxNxK=label;MxNxK=label``; the document keeps
every rank's points under ``compute.gemm``; :func:`gemm_rows` reads them back (per shape, the
slowest rank: a step waits for its slowest GPU) and :func:`gemm_curve` makes the planner's curve.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fstrain.core.plan.gemmcurve import GemmPoint, MeasuredGemmCurve, dtype_name
from fstrain.core.plan.gemmshapes import GemmShape
from fstrain.errors import InputError

GPU_GRID_TOP = 8192
CPU_GRID_TOP = 512
CPU_MAX_GEMM_FLOPS = 2e10
"""On a CPU, GEMMs above this many FLOPs are not timed unless ``--max-gemm-flops`` says otherwise
(about 0.2 s each at 100 GFLOP/s): a large model's shapes would take minutes per sample."""
_SHAPE = re.compile(r"^\s*(\d+)x(\d+)x(\d+)\s*(?:=(.*))?$")


def default_grid(top: int) -> list[GemmShape]:
    """The default sweep for a device whose largest timed side is ``top`` (see the module's doc)."""
    square = [GemmShape(top >> i, top >> i, top >> i, "square") for i in range(5, -1, -1)]
    rows = [GemmShape(top // d, top, top, "few rows") for d in (64, 16, 4)]
    narrow = [GemmShape(top, top // d, top, "narrow output") for d in (16, 8)]
    return [*square, *rows, *narrow, GemmShape(top // 4, top // 4, 4 * top, "long inner")]


def format_shapes(shapes: Sequence[GemmShape]) -> str:
    """Shapes as the worker's ``--gemm-shapes`` argument."""
    return ";".join(f"{s.m}x{s.n}x{s.k}" + (f"={s.label}" if s.label else "") for s in shapes)


def parse_shapes(text: str, where: str = "--gemm-shapes") -> list[GemmShape]:
    """The inverse of :func:`format_shapes`; one InputError naming the part that is wrong."""
    shapes = []
    for part in (p for p in text.split(";") if p.strip()):
        match = _SHAPE.match(part)
        if not match or min(int(match.group(i)) for i in (1, 2, 3)) < 1:
            raise InputError(f"cannot read {part.strip()!r} as a GEMM shape", "write MxNxK, e.g. 4096x4096x4096",
                             where)
        shapes.append(GemmShape(int(match.group(1)), int(match.group(2)), int(match.group(3)),
                                (match.group(4) or "").strip()))
    if not shapes:
        raise InputError("no GEMM shapes given", "write MxNxK;MxNxK", where)
    return shapes


def parse_flops(text: str, where: str = "--max-gemm-flops") -> float:
    """``2e10`` -> 2e10: a positive FLOP count."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise InputError(f"cannot read {text!r} as a positive FLOP count", "write e.g. 2e10", where)
    return value


@dataclass(frozen=True)
class GemmRow:
    """One shape of the sweep: the slowest rank's median rate and where it ran."""

    m: int
    n: int
    k: int
    label: str
    dtype: str
    tflops: float
    rank: int
    device_name: str
    device: str

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


def gemm_rows(document: Mapping[str, Any]) -> list[GemmRow]:
    """Per measured shape and dtype, in the order measured: the slowest rank's median TFLOP/s."""
    gemm = document.get("compute", {}).get("gemm", {})
    slowest: dict[tuple[int, int, int, str], GemmRow] = {}
    for record in gemm.get("per_rank", []):
        for point in record.get("points", []):
            key = (int(point["m"]), int(point["n"]), int(point["k"]), str(point["dtype"]))
            row = GemmRow(*key[:3], str(point.get("label", "")), key[3], float(point["tflops"]["median"]),
                          int(record["rank"]), str(record.get("device_name", "")), str(record.get("device", "")))
            if key not in slowest or row.tflops < slowest[key].tflops:
                slowest[key] = row
    return list(slowest.values())


def gemm_summary(document: Mapping[str, Any]) -> dict[str, Any] | None:
    """The sweep for the document's ``analysis``: what was measured, every shape's slowest rank
    and its fraction of the best shape of its dtype; None when the sweep did not run."""
    gemm = document.get("compute", {}).get("gemm")
    if not gemm:
        return None
    rows = gemm_rows(document)
    best = {d: max(r.tflops for r in rows if r.dtype == d) for d in {r.dtype for r in rows}}
    hosts = {r["rank"]: r.get("hostname", "") for r in document.get("ranks", [])}
    return {
        "grid": gemm.get("grid"), "model": gemm.get("model"), "dtype": gemm.get("dtype"),
        "max_gemm_flops": gemm.get("max_gemm_flops"), "skipped": gemm.get("skipped", []),
        "out_of_memory": [{**shape, "rank": record["rank"]} for record in gemm.get("per_rank", [])
                          for shape in record.get("out_of_memory", [])],
        "shapes": [{**r.__dict__, "host": hosts.get(r.rank, ""), "fraction_of_best": r.tflops / best[r.dtype]}
                   for r in rows],
    }


def gemm_curve(document: Mapping[str, Any], where: str) -> MeasuredGemmCurve | None:
    """The planner's GEMM curve from a bench document: the sweep's shapes (each at its slowest
    rank), else the square matmul every rank times (one point per rank's dtype: a document written
    before the sweep existed, such as a captured GPU run); None when it measured no compute."""
    rows = gemm_rows(document)
    points = [GemmPoint(r.m, r.n, r.k, dtype_name(r.dtype, where), r.tflops) for r in rows]
    devices = [(str(record.get("device_name", "")), str(record.get("device", "")))  # every rank's, not only the slowest
               for record in document.get("compute", {}).get("gemm", {}).get("per_rank", [])]
    if not rows:
        for record in document.get("compute", {}).get("per_rank", []):
            matmul = record.get("matmul", {})
            if "size" in matmul:
                n = int(matmul["size"])
                points.append(GemmPoint(n, n, n, dtype_name(matmul["dtype"], where), float(matmul["tflops"]["median"])))
                devices.append((str(record.get("device_name", "")), str(record.get("device", ""))))
    if not points:
        return None
    names = sorted({name for name, _ in devices})
    device_type = "cuda" if all(device.startswith("cuda") for _, device in devices) else "cpu"
    how = "GEMM-shape sweep" if rows else "square matmul"
    return MeasuredGemmCurve(tuple(points), device_name=" + ".join(names), device_type=device_type,
                             source=f"{where} ({how})")


def gemm_lines(document: Mapping[str, Any]) -> list[str]:
    """The sweep as a short plain-text table: shape, what runs it, TFLOP/s (slowest rank),
    fraction of the best shape; then the shapes not timed."""
    summary = gemm_summary(document)
    if summary is None:
        return []
    model = summary["model"]
    what = (f"{model['name']} at {model['micro_batch']} x {model['seq_len']} tokens, tp {model['tp']}"
            if model else "the default grid")
    shapes = summary["shapes"]
    devices = sorted({s["device_name"] for s in shapes})
    title = f"compute: GEMM TFLOP/s, {what}, {summary['dtype']}" + (f" on {', '.join(devices)}" if devices else "") \
        + (", slowest rank per shape" if len(document.get("compute", {}).get("gemm", {}).get("per_rank", [])) > 1
           else "")
    # Several hosts: which one was the slowest at each shape (the table's rate is that host's rank's).
    by_host = len({s["host"] for s in shapes}) > 1 or int(document.get("num_nodes", 1)) > 1
    cells = [(f"{s['m']}x{s['n']}x{s['k']}", s["label"], f"{s['tflops']:.3g}", f"{100 * s['fraction_of_best']:.0f} %",
              *([f"{s['host']} r{s['rank']}"] if by_host else [])) for s in shapes]
    header = ("m x n x k", "GEMM", "TFLOP/s", "of best", *(["slowest"] if by_host else []))
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in (2, 3) else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths,
                                                                                                 strict=True)))

    lines = [title, line(header), *(line(row) for row in cells)]
    lines += [f"not timed (over {summary['max_gemm_flops']:.3g} FLOPs, --max-gemm-flops): {s['m']}x{s['n']}x{s['k']} "
              f"{s['label']}".rstrip() for s in summary["skipped"]]
    lines += [f"not timed (out of memory on rank {s['rank']}): {s['m']}x{s['n']}x{s['k']} {s['label']}".rstrip()
              for s in summary["out_of_memory"]]
    return [line.rstrip() for line in lines]
