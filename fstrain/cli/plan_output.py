"""Human output of ``fstrain plan`` on stderr: the plans, the chosen plan's memory bar, assumptions."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from fstrain.cli.output import console

if TYPE_CHECKING:
    from fstrain.core.plan.assumptions import Assumptions
    from fstrain.core.plan.memory import MemoryBreakdown
    from fstrain.core.plan.plancluster import PlanCluster
    from fstrain.core.plan.planner import Plan, PlanModel, PlanResult, TrainingSpec
    from fstrain.core.plan.timemodel import StepTime

GIB = 1 << 30
BAR_WIDTH = 64
_SEGMENTS = (  # (component, colour)
    ("parameters", "blue"),
    ("gradients", "cyan"),
    ("optimizer_states", "magenta"),
    ("activations", "yellow"),
    ("buffers", "green"),
    ("overhead", "red"),
)


def print_plans(
    result: PlanResult,
    model: PlanModel,
    training: TrainingSpec,
    cluster: PlanCluster,
    assumptions: Assumptions,
    top: int,
    batch_note: str,
    out: str | None,
) -> None:
    out_console = console()
    if not out_console.is_terminal:
        # Piped or captured output is not squeezed to 80 columns: the tables would wrap unreadably.
        from rich.console import Console

        out_console = Console(stderr=True, highlight=False, width=140)

    def emit(renderable: object) -> None:
        out_console.print(renderable)

    for line in header_lines(result, model, training, cluster, batch_note, assumptions):
        emit(line)
    if result.plans:
        emit(_plans_table(result.plans[:top], training, fitting=True))
        best = result.plans[0]
        emit(f"\n[bold]chosen:[/bold] {best.describe()}")
        emit(memory_bar(best.memory, best.usable_bytes))
        if model.spec is not None:
            emit(band_line(best, cluster.num_nodes))
        if best.memory.peak > best.usable_bytes:
            emit(f"[yellow]tight:[/yellow] the live tensors, CUDA context and NCCL buffers "
                 f"({best.memory.required / GIB:.1f} GiB) fit, the allocator's cache margin does not: "
                 "PyTorch frees cached blocks and retries before it fails (expect slower steps)")
        emit(_details_lines(best.memory))
        if best.time is not None:
            emit(_time_lines(best.time))
    else:
        emit("[red bold]nothing fits.[/red bold] The closest configurations:")
        emit(_plans_table(result.rejected[:top], training, fitting=False))
        if model.spec is not None:
            emit(band_line(result.rejected[0], cluster.num_nodes, "#1 "))
        for suggestion in result.suggestions:
            emit(f"  would fit {suggestion}")
        if not result.suggestions:
            emit("  no nearby change fits: try more or larger GPUs, or a smaller model")
    emit("[bold]assumptions[/bold] (override with --assume KEY=VALUE; see docs/planner.md)")
    emit(_assumption_lines(assumptions, cluster))
    if out and result.plans:
        emit(f"saved the chosen plan to {out}")
    elif out:
        emit(f"nothing fits, so {out} was not written")


def header_lines(
    result: PlanResult, model: PlanModel, training: TrainingSpec, cluster: PlanCluster, batch_note: str,
    assumptions: Assumptions | None = None,
) -> list[str]:
    lines = []
    if model.spec is not None:
        s = model.spec
        ffn = (
            f"MoE {s.moe.num_experts}x{s.moe.expert_ffn_hidden_size} top-{s.moe.top_k}"
            if s.moe
            else f"{s.ffn_hidden_size}"
        )
        lines.append(
            f"[bold]model[/bold] {s.name}: {model.num_params / 1e9:.2f}B parameters ({s.num_layers} layers, hidden "
            f"{s.hidden_size}, {s.num_heads}/{s.num_kv_heads} heads, {s.activation} {ffn}, vocab {s.vocab_size})"
        )
    else:
        lines.append(
            f"[bold]model[/bold] {model.num_params / 1e9:.3g}B parameters, no architecture: model states, buffers and "
            "overhead only (no activations, no step time)"
        )
    network = min(cluster.nodes, key=lambda n: n.inter_node_gbps / n.num_gpus)  # the slowest NIC share
    counts = Counter(f"{n.num_gpus}x {n.gpu.label} ({n.memory_bytes / GIB:.1f} GiB)" for n in cluster.nodes)
    kinds = [f"{count} node{'s' if count > 1 else ''} of {kind}" for kind, count in sorted(counts.items())]
    lines.append(
        f"[bold]cluster[/bold] {cluster.world_size} GPUs: {', '.join(kinds)};"
        f" NVLink domain {cluster.nvlink_domain_size}; {network.inter_node_gbps:g} Gb/s per node between nodes"
        f" ({network.inter_node_source})"
    )
    if result.bounded_by:
        lines.append(f"  {result.bounded_by}")
    if model.spec is None:
        lines.append(
            f"[bold]training[/bold] {training.precision}, {training.optimizer}"
            " (no sequence or batch without an architecture)"
        )
    else:
        if training.global_batch_size is not None:
            tokens = training.global_batch_size * training.seq_len
            batch = (
                f"global batch {training.global_batch_size} sequences ({tokens / 1e6:.2f}M tokens, from {batch_note})"
            )
        else:
            batch = f"global batch = {batch_note}"
        flash = "FlashAttention" if training.flash_attention else "no FlashAttention"
        loss = "" if training.loss == "full" else f", {training.loss} loss"  # the bundled trainer's: full
        kernels = ", torch.compile" if training.compile else ", fused RMSNorm" if training.fused_rmsnorm else ""
        if training.loss == "none":
            loss = ", no vocabulary head (loss none)"
        if training.framework != "fstrain":
            kernels += f", as {training.framework} keeps it"
        if assumptions is not None:
            from fstrain.core.plan.frameworks import fused_kernels_note, profile

            fused = fused_kernels_note(profile(training.framework), assumptions, model.spec)
            kernels += f", {fused}" if fused else ""
        lines.append(
            f"[bold]training[/bold] seq {training.seq_len}, {batch}, {training.precision}"
            f"{FP8_NOTE if training.fp8 else ''}, {training.optimizer}, {flash}{loss}{kernels}"
        )
    fit, rejected = len(result.plans), len(result.rejected)
    plural = "s" if result.considered != 1 else ""
    lines.append(f"searched {result.considered} configuration{plural}: {fit} fit, {rejected} do not")
    return lines


_SHORT_STRATEGY = {
    "ddp": "DDP",
    "zero1": "ZeRO-1",
    "zero2": "ZeRO-2",
    "zero3": "ZeRO-3",
    "fsdp-full": "FSDP-full",
    "fsdp-grad-op": "FSDP-gradop",
    "fsdp-hybrid": "FSDP-hybrid",
}
_SHORT_OFFLOAD = {"none": "-", "optimizer": "opt", "optimizer+params": "opt+par"}


# MFU stays against the compute dtype's peak: with fp8 linears two peaks are in play and MFU is
# not well defined (torchtitan benchmarks/llama3_h100_202412_torchtitan.md says so).
FP8_NOTE = " with fp8 linears (MFU against the bf16 peak)"


def _plans_table(plans: tuple[Plan, ...], training: TrainingSpec, fitting: bool) -> object:
    from rich import box
    from rich.table import Table

    from fstrain.core.plan.pipeline import schedule_label

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1))
    numeric = ("#", "tp", "pp", "ep", "cp", "dp", "mbs", "gas", "GiB", "tokens/s", "MFU", "step s", "to train",
               "tokens/s if it fit")
    pipelined = any(p.knobs.pp > 1 for p in plans)  # the schedule column only when a pipeline is shown
    moe = any(p.moe for p in plans)  # the expert-parallel column only for a mixture of experts
    context = any(p.knobs.cp > 1 for p in plans)  # the context-parallel column only when pinned
    columns = ["#", "strategy", "tp", "pp", *(["schedule"] if pipelined else []), *(["ep"] if moe else []),
               *(["cp"] if context else []), "dp",
               "mbs", "gas", "AC",
               "offload", "GiB"]
    columns += ["tokens/s", "MFU", "step s", "to train"] if fitting else ["tokens/s if it fit", "why it does not fit"]
    for name in columns:
        table.add_column(name, justify="right" if name in numeric else "left", no_wrap=name != "why it does not fit")
    for index, p in enumerate(plans, 1):
        k = p.knobs
        label = _SHORT_STRATEGY[k.strategy] + (f" g{k.shard_group_size}" if k.strategy == "fsdp-hybrid" else "")
        row = [str(index), label, str(k.tp), str(k.pp)]
        if pipelined:
            row.append(schedule_label(k.pp_schedule, k.pp_virtual_stages) if k.pp > 1 else "-")
        if moe:
            row.append(str(k.ep))
        if context:
            row.append(str(k.cp))
        row += [str(k.dp), str(k.micro_batch_size), str(k.grad_accum_steps)]
        row += [k.activation_checkpointing, _SHORT_OFFLOAD[k.offload], f"{p.memory.peak / GIB:.1f}"]
        if fitting and p.time is not None:
            to_train = duration(p.time.seconds_for(training.train_tokens)) if training.train_tokens else "-"
            row += [f"{p.time.tokens_per_s:,.0f}", f"{p.time.mfu:.1%}", f"{p.time.step_time_s:.2f}", to_train]
        elif fitting:
            row += ["-", "-", "-", "-"]
        else:
            row.append(f"{p.time.tokens_per_s:,.0f}" if p.time is not None else "-")
            row.append(p.rejected_because.split(": ", 1)[-1])
        table.add_row(*row)
    return table


def memory_bar(memory: MemoryBreakdown, usable: int, width: int = BAR_WIDTH) -> str:
    """One line of coloured blocks, proportional to each component of the usable memory."""
    parts = []
    used_cells = 0
    for name, colour in _SEGMENTS:
        cells = round(getattr(memory, name) / usable * width)
        cells = min(cells, width - used_cells)
        used_cells += cells
        parts.append(f"[{colour}]{'█' * cells}[/{colour}]")
    free = max(0, usable - memory.peak)
    parts.append(f"[dim]{'░' * (width - used_cells)}[/dim]")
    legend = "  ".join(
        f"[{colour}]■[/{colour}] {name.replace('_', ' ')} {getattr(memory, name) / GIB:.1f}"
        for name, colour in _SEGMENTS
    )
    return f"{''.join(parts)} {memory.peak / GIB:.1f} of {usable / GIB:.1f} GiB ({free / GIB:.1f} free)\n{legend}"


def band_line(plan: Plan, num_nodes: int, which: str = "") -> str:
    """A plan's error bands (``which``: the plan's row, for one of several): 'likely (80 % band of
    measured runs like it): peak 36.7-60.3 GiB (zero3-fsdp, 21 runs); ...'
    (fstrain/core/plan/errorband.py; docs/planner.md "Error bands")."""
    from fstrain.core.plan.errorband import prediction_bands

    bands = prediction_bands(plan.knobs, num_nodes, plan.memory.peak, plan.time.tokens_per_s if plan.time else None)
    parts = []
    if bands.memory:
        parts.append(f"peak {bands.memory.low / GIB:.1f}-{bands.memory.high / GIB:.1f} GiB "
                     f"({bands.memory.band.label}, {bands.memory.band.runs} runs)")
    if bands.throughput:
        parts.append(f"{bands.throughput.low:,.0f}-{bands.throughput.high:,.0f} tokens/s "
                     f"({bands.throughput.band.label}, {bands.throughput.band.runs} runs)")
    return f"{which}[bold]likely[/bold] ({bands.nominal_pct} % band of measured runs like it): " + "; ".join(parts)


def _details_lines(memory: MemoryBreakdown) -> str:
    """Each item of the breakdown on its own line (plain aligned text: cheaper than a table)."""
    rows = [(name, f"{value / GIB:.2f}") for name, value in memory.details if value]
    rows.append((f"peak ({memory.phase} moment)", f"{memory.peak / GIB:.2f}"))
    others = [(name, value) for name, value in memory.moments if name != memory.phase]
    if others:  # the items above are the peak moment's; the other moments' totals, for comparison
        rows += [(f"  {name} moment", f"{value / GIB:.2f}") for name, value in others]
    if memory.host_bytes_per_node:
        rows.append(("host memory per node", f"{memory.host_bytes_per_node / GIB:.1f}"))
    width = max(len(name) for name, _ in rows)
    lines = [f"  {name:<{width}} {value:>8} GiB" for name, value in rows]
    return "\n".join(
        f"[bold]{line}[/bold]" if name.startswith("peak") else line for (name, _), line in zip(rows, lines, strict=True)
    )


def _time_lines(t: StepTime) -> str:
    """One step's time, term by term, each with its share of the step (aligned like memory's).

    Compute runs in the pipeline's slots; the optimizer's update, the exposed data-parallel
    traffic and offload come after them. Communication inside the slots (TP, PP, EP, CP) and the
    bubble add to the step as shown; the data-parallel traffic hidden behind compute does not."""
    rows: list[tuple[str, float]] = [("compute", t.compute_s)]
    if t.gemm_s or t.attention_s:
        rows += [("  GEMMs", t.gemm_s), ("  attention", t.attention_s), ("  elementwise, norms, loss (HBM)",
                                                                           t.elementwise_s),
                 ("  autocast casts (HBM)", t.autocast_s)]
        rows += [(f"  host time not hidden (of {t.host_s:.3f} s)", t.launch_s)] if t.launch_s else []
    rows += [("optimizer step", t.optimizer_s), ("gradient accumulation", t.grad_accumulation_s),
             ("pipeline bubble", t.bubble_s), ("TP communication", t.tp_comm_s),
             ("PP communication", t.pp_comm_s), ("EP all-to-all", t.ep_comm_s), ("CP ring attention", t.cp_comm_s),
             (f"DP communication exposed (of {t.dp_comm_s:.3f} s)", t.dp_exposed_s), ("offload", t.offload_s),
             ("  PCIe transfers", t.offload_pcie_s), ("  CPU optimizer step", t.cpu_optimizer_s)]
    shown = [(name, value) for name, value in rows if value or name == "compute"]
    shown.append(("step", t.step_time_s))
    width = max(len(name) for name, _ in shown)
    lines = [f"  {name:<{width}} {value:>9.3f} s {100 * value / t.step_time_s:>5.1f} %" for name, value in shown]
    lines[-1] = f"[bold]{lines[-1]}[/bold]"
    return "\n".join(lines)


def _assumption_lines(assumptions: Assumptions, cluster: PlanCluster) -> str:
    """Every assumption and its value, two to a line; docs/planner.md says why each is what it is."""
    from dataclasses import fields

    from fstrain.core.plan.blocktime import fitted_scale
    from fstrain.core.plan.kernelcost import generation

    cells: list[str] = []
    for field in fields(assumptions):
        key, value = field.name, getattr(assumptions, field.name)
        if key.endswith("_bytes") or key == "nccl_bytes_per_communicator":
            shown = f"{value / GIB:.2f} GiB"
        elif value is None:
            shown = "not measured"
        elif key == "mfu" and not value:
            shown = "0 (kernels)"
        elif key == "compute_time_scale" and not value:
            names = {n.gpu.name for n in cluster.nodes}
            shown = ", ".join(sorted(f"{fitted_scale(name):g} ({generation(name)})" for name in names))
        elif isinstance(value, float):
            shown = f"{value:g}"
        elif isinstance(value, int) and not isinstance(value, bool):
            shown = f"{value:,}"
        else:
            shown = str(value)
        cells.append(f"{key:<31}{shown:>16}")
    pairs = [cells[i : i + 2] for i in range(0, len(cells), 2)]
    return "\n".join("  " + "   ".join(pair) for pair in pairs)


def duration(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"
