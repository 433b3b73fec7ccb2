"""``fstrain plan --calibrate FILE|RUN_DIR``: read the measurements, apply them, say what changed (stderr)."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from fstrain.cli.output import console

if TYPE_CHECKING:
    from fstrain.api.plan import PlanRequest
    from fstrain.core.calibrate.calibrate import Calibration
    from fstrain.core.plan.assumptions import Assumptions
    from fstrain.core.plan.gemmcurve import MeasuredGemmCurve
    from fstrain.core.plan.plancluster import PlanCluster
    from fstrain.core.plan.schema import ModelSpec


def calibrated(path: str, request: PlanRequest, assumptions: Assumptions, cluster: PlanCluster, precision: str,
               model: ModelSpec | None, quiet: bool, seq_len: int | None = None) -> Calibration:
    """The calibration of ``path``; what an explicit flag of ``request`` also sets is kept as the
    flag says; ``seq_len``: the plan's, for a run whose output does not say its own."""
    from fstrain.api.plan import measurements
    from fstrain.core.calibrate.calibrate import calibrate

    document = measurements(path)
    outliers = bench_outliers(document)
    if outliers:  # on stderr even with --json: a calibration that carries a faulty host is worth a line
        console().print(f"[yellow]warning:[/yellow] {path}: the bench named outliers ({', '.join(outliers)}); "
                        f"the calibration includes them (hint: fix them, or rerun `fstrain bench` with "
                        f"--exclude {','.join(outliers)}, and calibrate from that)", highlight=False, soft_wrap=True)
    result = calibrate(document, path, assumptions=assumptions, cluster=cluster, precision=precision,
                       model=model, seq_len=seq_len)
    flags = {pair.partition("=")[0].strip().replace("-", "_"): "--assume" for pair in request.assume}
    if request.mfu is not None:
        flags["mfu"] = "--mfu"
    if request.cluster.inter_node_gbps is not None:
        flags["inter_node_gbps"] = "--inter-node-gbps"
    kept = [r for r in result.replaced if r.name in flags]
    if kept:
        ignored = [*result.ignored, *(f"{r.name}: {flags[r.name]} given, the flag wins" for r in kept)]
        result = replace(result, replaced=[r for r in result.replaced if r.name not in flags], ignored=ignored,
                         cluster=cluster if "inter_node_gbps" in flags else result.cluster)
    if not quiet:
        print_calibration(path, result)
    return result


def bench_outliers(document: Any) -> list[str]:
    """The hosts a bench document's analysis names (none for any other document)."""
    from fstrain.core.bench.report import SCHEMA, analysis

    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        return []
    return list(analysis(document)["outlier_hosts"])


def print_calibration(path: str, result: Calibration) -> None:
    out = console()
    if result.note:
        out.print(f"calibration from {path} ({result.kind}): {result.note}", highlight=False, markup=False)
    if not result.replaced and result.gemm_curve is None:
        out.print(f"[yellow]calibration from {path} ({result.kind}): nothing replaced[/yellow]")
    for r in result.replaced:
        out.print(f"calibrated [bold]{r.name}[/bold]: {r.old:.4g} -> {r.new:.4g} ({r.source})", highlight=False)
    if result.gemm_curve is not None:
        out.print(f"calibrated [bold]gemm_curve[/bold]: {curve_text(result.gemm_curve)}", highlight=False)
    for reason in result.ignored:
        out.print(f"[dim]not calibrated: {reason}[/dim]", highlight=False)


def curve_text(curve: MeasuredGemmCurve) -> str:
    """``12 GEMMs from NVIDIA H200 (bf16 best 712 TFLOP/s; bench.json (GEMM-shape sweep))``."""
    best = ", ".join(f"{d} best {curve.best_tflops(d):.3g} TFLOP/s" for d in curve.dtypes)
    return f"{curve} ({best}; {curve.source})"


def calibration_document(path: str, result: Calibration) -> dict[str, Any]:
    curve = result.gemm_curve
    return {"file": path, "kind": result.kind, "note": result.note, "replaced": [asdict(r) for r in result.replaced],
            "ignored": list(result.ignored),
            "gemm_curve": None if curve is None else {
                "device_name": curve.device_name, "points": len(curve.points), "source": curve.source,
                "best_tflops": {d: curve.best_tflops(d) for d in curve.dtypes}}}
