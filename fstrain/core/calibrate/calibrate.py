"""``fstrain plan --calibrate FILE``: measured numbers in place of the assumptions they measure.

FILE is one of two documents, told apart by their keys:

- a bench document (``fstrain bench --out``/``--json``, schema ``fstrain.bench/1``):
  - intra-node all_reduce bus bandwidth (NCCL, on GPUs) -> ``collective_efficiency``, the fraction
    of the per-GPU link bandwidth (NVLink one way, else PCIe) collectives reach;
  - inter-node bus bandwidth -> the nodes' ``inter_node_gbps``: the all_reduce across nodes (the
    slowest group times the groups that ran at once, i.e. what one node's NICs carried), else the
    all_reduce over the world when it has one rank per node, else the pairs suite's median link.
    It is divided by ``collective_efficiency`` because the time model multiplies them again, so
    the model's effective bandwidth equals the measured bus bandwidth;
  - the host's AdamW rate (torch's AdamW on CPU tensors, every rank at once), summed over each
    node's ranks, at the slowest node -> ``torch_cpu_adamw_params_per_s_per_node``, what FSDP's
    CPU offload updates a step with; a CPU bench measures it as well as a GPU one;
  - the GEMM-shape sweep (every shape at its slowest rank: a step waits for its slowest GPU; a
    document without one: the square matmul) -> ``gemm_curve`` (fstrain/core/plan/gemmcurve.py),
    only when it was measured on the plan's GPU kind: a curve from a CPU or another GPU is left
    out with the reason. The kernel time model prices GEMMs on it; the bench sets no ``mfu``,
    which would replace that model by FLOPs at one rate.
- a run's report (``fstrain report --json``, schema ``fstrain.report/1``; ``plan --calibrate
  RUN_DIR`` makes it from the run), once the run has ended: the trainer's summary it carries,
  else what its ranks printed (fstrain/core/calibrate/fromoutput.py: any format
  metricline.read_step reads), tokens/s -> ``mfu`` at the plan's sequence length, with one line
  that says what the output gave and what it lacked;
- the bundled trainer's summary (``summary.json``, fstrain/train/loop.py):
  - tokens/s -> ``mfu`` = tokens/s x model FLOPs per token / (ranks x peak FLOP/s);
  - max reserved and max allocated memory -> ``fragmentation_fraction`` = (reserved - allocated) /
    (allocated - parameters and optimizer states), the allocator's cache over what a step frees.

A number measured on CPUs (gloo, CPU ranks) says nothing about GPUs: it is left out and the
report says why, except the inter-node bandwidth, which is the network's whatever moves the bytes.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from fstrain.core.bench.gemm import gemm_curve
from fstrain.core.bench.pairs import link_table
from fstrain.core.bench.report import SCHEMA, collective_summaries, compute_rows, gpu_of
from fstrain.core.calibrate.fromoutput import OutputNumbers, output_numbers
from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.gemmcurve import MeasuredGemmCurve
from fstrain.core.plan.memory import model_states
from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.plan.plancluster import PlanCluster
from fstrain.core.plan.schema import ModelSpec
from fstrain.core.plan.timemodel import flops_per_token
from fstrain.core.report.numbers import SCHEMA as REPORT_SCHEMA
from fstrain.core.runs.runstate import FINAL
from fstrain.errors import InputError

SUMMARY_KEYS = ("tokens_per_s", "world_size", "peak_memory_max_over_ranks", "device")


@dataclass(frozen=True)
class Replacement:
    name: str
    old: float
    new: float
    source: str
    """What was measured, in words."""


@dataclass(frozen=True)
class Calibration:
    assumptions: Assumptions
    cluster: PlanCluster
    kind: str
    """``bench``, ``trainer summary`` or ``run <id> (<state>)``."""
    replaced: list[Replacement] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    """Measurements left out, each with the reason."""
    gemm_curve: MeasuredGemmCurve | None = None
    """The GEMM curve now in ``assumptions`` (None: the document had none for this plan)."""
    note: str = ""
    """One line on what the measurements were and what they lacked ("" where there is nothing to say)."""


def calibrate(document: Any, where: str, *, assumptions: Assumptions, cluster: PlanCluster, precision: str,
              model: ModelSpec | None, seq_len: int | None = None) -> Calibration:
    """Replace what ``document`` measures; ``where`` names the file in errors; ``seq_len``: the
    plan's tokens per sequence, for a run whose output does not say its own."""
    if isinstance(document, dict) and document.get("schema") == SCHEMA:
        return _from_bench(document, where, assumptions, cluster, precision)
    if isinstance(document, dict) and document.get("schema") == REPORT_SCHEMA:
        return _from_report(document, where, assumptions, cluster, precision, model, seq_len)
    if isinstance(document, dict) and all(key in document for key in SUMMARY_KEYS):
        return _from_summary(document, where, assumptions, cluster, precision, model)
    raise InputError("neither a bench document, a run's report nor a trainer summary",
                     "give the JSON from `fstrain bench --out FILE`, a run directory or the trainer's summary.json",
                     where)


def current_mfu(assumptions: Assumptions, cluster: PlanCluster, precision: str) -> float:
    return assumptions.mfu or cluster.speed_node(precision, assumptions.mfu).gpu.achievable_mfu


def _from_bench(doc: Mapping[str, Any], where: str, assumptions: Assumptions, cluster: PlanCluster,
                precision: str) -> Calibration:
    replaced: list[Replacement] = []
    ignored: list[str] = []
    on_gpus = doc.get("backend") == "nccl" and doc.get("device_type") == "cuda"
    summaries = {(s.scope, s.collective): s for s in collective_summaries(doc)}
    ranks_per_node = doc.get("world_size", 1) // max(1, doc.get("num_nodes", 1))

    intra = summaries.get(("intra_node", "all_reduce"))
    if intra is None and doc.get("num_nodes") == 1 and ranks_per_node > 1:
        intra = summaries.get(("world", "all_reduce"))
    efficiency = assumptions.collective_efficiency
    if intra is not None and not on_gpus:
        ignored.append("intra-node all_reduce: measured with gloo on CPUs, not over the GPUs' links")
    elif intra is not None:
        links = cluster.links()
        nvlink = links.nvlink_domain_size > 1
        link_bytes_per_s = links.nvlink_bytes_per_s if nvlink else links.pcie_bytes_per_s
        measured = intra.busbw_gbps * 1e9 / link_bytes_per_s
        efficiency = min(1.0, measured)
        replaced.append(Replacement(
            "collective_efficiency", assumptions.collective_efficiency, efficiency,
            f"intra-node all_reduce bus bandwidth {intra.busbw_gbps:.1f} GB/s over {intra.group_size} GPUs = "
            f"{100 * measured:.0f} % of {link_bytes_per_s / 1e9:.0f} GB/s {'NVLink' if nvlink else 'PCIe'} "
            "per GPU and direction" + (" (capped at 100 %)" if measured > 1 else "")))

    new_cluster = cluster
    node_gbps, how = _inter_node_gbps(doc, summaries, ranks_per_node)
    if node_gbps is not None:
        new_gbps = node_gbps / efficiency
        old = min(node.inter_node_gbps for node in cluster.nodes)
        new_cluster = PlanCluster(tuple(replace(node, inter_node_gbps=new_gbps, inter_node_source="fstrain bench")
                                        for node in cluster.nodes))
        replaced.append(Replacement("inter_node_gbps", old, new_gbps,
                                    f"{how}: {node_gbps:.3g} Gb/s per node, / collective_efficiency "
                                    f"{efficiency:.2f}"))

    host_adamw = _host_adamw_per_node(doc)
    if host_adamw is not None:
        rate, ranks, node = host_adamw
        replaced.append(Replacement(
            "torch_cpu_adamw_params_per_s_per_node", assumptions.torch_cpu_adamw_params_per_s_per_node, rate,
            f"torch AdamW on the host: {rate:.3g} parameters/s on {node or 'the node'}, {ranks} ranks at once "
            "(the slowest node)"))

    rows = compute_rows(doc)
    if rows and not any(r.peak_tflops for r in rows):
        ignored.append("compute: measured on CPUs (or GPUs not in the table), no GPU peak to compare with")
    result = _result(assumptions, new_cluster, "bench", replaced, ignored)
    curve = gemm_curve(doc, where)
    mismatch = curve_mismatch(curve, cluster) if curve is not None else ""
    if curve is None:
        return result
    if mismatch:
        ignored.append(f"GEMM curve ({curve}): {mismatch}")
        return result
    return replace(result, assumptions=replace(result.assumptions, gemm_curve=curve), gemm_curve=curve)


def _host_adamw_per_node(doc: Mapping[str, Any]) -> tuple[float, int, str] | None:
    """(parameters/s, ranks, node) of the slowest node's host AdamW, its ranks' medians summed;
    None when the bench did not measure it."""
    nodes = {r["rank"]: r.get("hostname", "") for r in doc.get("ranks", [])}
    per_node: dict[str, list[float]] = {}
    for record in doc.get("compute", {}).get("per_rank", []):
        measured = record.get("cpu_adamw")
        if measured:
            per_node.setdefault(nodes.get(record["rank"], ""), []).append(float(measured["params_per_s"]["median"]))
    if not per_node:
        return None
    node = min(per_node, key=lambda name: sum(per_node[name]))
    return sum(per_node[node]), len(per_node[node]), node


def curve_mismatch(curve: MeasuredGemmCurve, cluster: PlanCluster) -> str:
    """Why a measured GEMM curve cannot price this plan's GPUs ("" when it can: same GPU kind)."""
    planned = sorted({node.gpu.label for node in cluster.nodes})
    if curve.device_type != "cuda":
        return f"measured on a CPU, and the plan is for {', '.join(planned)} GPUs"
    if " + " in curve.device_name:  # gemm_curve joins the names of the ranks' devices
        return "measured on GPUs of several kinds: calibrate from a bench of the plan's GPU kind alone"
    spec = gpu_of(curve.device_name)
    if spec is None:
        return (f"{curve.device_name} is not in the GPU table, so it cannot be matched with the plan's "
                f"{', '.join(planned)}")
    if {node.gpu.name for node in cluster.nodes} != {spec.name}:
        return f"measured on {spec.label}, and the plan is for {', '.join(planned)}: measure on the plan's GPUs"
    return ""


def _inter_node_gbps(doc: Mapping[str, Any], summaries: Mapping[tuple[str, str], Any],
                     ranks_per_node: int) -> tuple[float | None, str]:
    """One node's measured scale-out bandwidth in Gb/s, and how it was measured."""
    inter = summaries.get(("inter_node", "all_reduce"))
    if inter is not None:
        return inter.busbw_gbps * 8 * inter.groups, (
            f"all_reduce across {inter.group_size} nodes, {inter.groups} groups at once")
    world = summaries.get(("world", "all_reduce"))
    if world is not None and doc.get("num_nodes", 1) > 1 and ranks_per_node == 1:
        return world.busbw_gbps * 8, f"all_reduce across {world.group_size} nodes"
    links = doc.get("pairs", {}).get("links", [])
    if links:
        table = link_table(links)
        return statistics.median(table.values()) * 8, f"median of {len(table)} node-to-node links"
    return None, ""


def _allocated_once_bytes(doc: Mapping[str, Any], model: ModelSpec, precision: str, assumptions: Assumptions) -> int:
    """One rank's parameters and optimizer states in the run the summary describes: what is
    allocated once, outside the allocator's cache of freed blocks (AdamW, as the trainer runs)."""
    strategy = str(doc.get("strategy") or "fsdp-full")
    states = model_states(count_parameters(model).total, strategy, int(doc["world_size"]), precision,
                          assumptions=assumptions)
    return states.parameters + states.optimizer_states


def _from_summary(doc: Mapping[str, Any], where: str, assumptions: Assumptions, cluster: PlanCluster,
                  precision: str, model: ModelSpec | None) -> Calibration:
    replaced: list[Replacement] = []
    ignored: list[str] = []
    if doc["device"] != "cuda":
        ignored.append(f"the run was on {doc['device']}: its speed and memory say nothing about GPUs")
        return _result(assumptions, cluster, "trainer summary", replaced, ignored)
    memory = doc["peak_memory_max_over_ranks"]
    allocated, reserved = memory.get("max_allocated_bytes"), memory.get("max_reserved_bytes")
    if allocated and reserved and model is None:
        ignored.append("fragmentation_fraction: the plan has no architecture to count the parameters and optimizer "
                       "states with, which the allocator's cache does not hold")
    elif allocated and reserved and model is not None:
        once = _allocated_once_bytes(doc, model, precision, assumptions)
        if allocated > once:
            fragmentation = max(0.0, (reserved - allocated) / (allocated - once))
            replaced.append(Replacement(
                "fragmentation_fraction", assumptions.fragmentation_fraction, fragmentation,
                f"(max reserved {reserved / 2**30:.2f} GiB - max allocated {allocated / 2**30:.2f} GiB) / "
                f"(max allocated - {once / 2**30:.2f} GiB of parameters and optimizer states)"))
    if model is None:
        ignored.append("tokens/s: the plan has no architecture (--model-params) to count FLOPs with")
    elif doc.get("model") != model.name:
        raise InputError(f"the summary is of model {doc.get('model')!r}, the plan is for {model.name!r}",
                         "calibrate with a run of the same model", where)
    elif doc.get("tokens_per_s"):
        world = int(doc["world_size"])
        seq_len = int(doc["tokens_per_step"]) // (int(doc["micro_batch_size"]) * int(doc["grad_accum_steps"]) * world)
        gpu = cluster.speed_node(precision, assumptions.mfu).gpu
        achieved = doc["tokens_per_s"] * flops_per_token(model, seq_len).training / (world * gpu.peak_flops(precision))
        replaced.append(Replacement("mfu", current_mfu(assumptions, cluster, precision), achieved,
                                    f"{doc['tokens_per_s']:,.0f} tokens/s on {world} {gpu.label} at {seq_len} "
                                    f"tokens per sequence"))
    return _result(assumptions, cluster, "trainer summary", replaced, ignored)


def _from_report(doc: Mapping[str, Any], where: str, assumptions: Assumptions, cluster: PlanCluster,
                 precision: str, model: ModelSpec | None, seq_len: int | None) -> Calibration:
    """A finished run's measured step time (as tokens/s) and memory: the summary its report
    carries, else what its ranks printed."""
    state = (doc.get("state") or {}).get("state")
    run = f"run {doc.get('run_id')}"
    if state not in FINAL:
        raise InputError(f"{run} has not ended ({state}): its numbers are not final",
                         "calibrate from it once it has ended (`fstrain status` says when)", where)
    summary = doc.get("summary")
    if isinstance(summary, dict) and all(key in summary for key in SUMMARY_KEYS):
        return replace(_from_summary(summary, where, assumptions, cluster, precision, model), kind=f"{run} ({state})")
    numbers = output_numbers(doc)
    if not numbers.read_from:
        raise InputError(f"{run} ({state}) left no trainer summary, and its ranks printed no step fstrain reads",
                         "calibrate from a run whose program prints the metric line or a trainer's own step line "
                         "(docs/observability.md, \"Trainers' own output\")", where)
    return _from_output(numbers, doc.get("device"), f"{run} ({state})", assumptions, cluster, precision, model,
                        seq_len)


def _from_output(numbers: OutputNumbers, device: Any, kind: str, assumptions: Assumptions, cluster: PlanCluster,
                 precision: str, model: ModelSpec | None, seq_len: int | None) -> Calibration:
    """``mfu`` from the tokens/s a run's ranks printed, and the one line on what was used and lacked."""
    replaced: list[Replacement] = []
    ignored: list[str] = []
    used: list[str] = []
    lacked = list(numbers.lacked)
    rate = numbers.tokens_per_s_per_rank
    if device == "cpu":
        ignored.append("the run was on cpu: its speed and memory say nothing about GPUs")
    elif rate is not None and model is None:
        ignored.append("tokens/s: the plan has no architecture (--model-params) to count FLOPs with")
    elif rate is not None and not seq_len:
        lacked.append("the sequence length, to count a token's FLOPs (the output does not say it, nor does the plan)")
    elif rate is not None and model is not None and seq_len:
        gpu = cluster.speed_node(precision, assumptions.mfu).gpu
        achieved = rate * flops_per_token(model, seq_len).training / gpu.peak_flops(precision)
        replaced.append(Replacement("mfu", current_mfu(assumptions, cluster, precision), achieved,
                                    f"{numbers.tokens_how}, x FLOPs per token at the plan's {seq_len} tokens per "
                                    f"sequence (the output does not say its own) / {gpu.label} peak"))
        used.append(numbers.tokens_how)
        if device is None:
            used.append("its device taken as the plan's GPU (the output does not say it)")
    also = [f"step time {numbers.step_s:.3g} s"] if numbers.step_s is not None else []
    also += [f"memory peak {numbers.memory_bytes / 2**30:.2f} GiB"] if numbers.memory_bytes is not None else []
    if also:
        used.append(f"also read: {', '.join(also)}")
    said = [*used, *(["lacked: " + "; ".join(lacked)] if lacked else [])]
    note = f"from its ranks' output ({', '.join(numbers.read_from)})" + (": " + "; ".join(said) if said else "")
    return replace(_result(assumptions, cluster, kind, replaced, ignored), note=note)


def _result(assumptions: Assumptions, cluster: PlanCluster, kind: str, replaced: list[Replacement],
            ignored: list[str]) -> Calibration:
    changes: dict[str, Any] = {r.name: r.new for r in replaced if r.name != "inter_node_gbps"}
    return Calibration(replace(assumptions, **changes), cluster, kind, replaced, ignored)
