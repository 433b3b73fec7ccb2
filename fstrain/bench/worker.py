"""``python -m fstrain.bench``: the benchmark worker every rank runs.

Standalone (``python -m fstrain.bench --suite compute --json-out r.json``) it is a world of one
on loopback; under ``python -m torch.distributed.run`` (or ``fstrain bench``, which starts it
through torchrun on every host) it joins the process group torchrun describes. Rank 0 collects one
JSON document with every sample; the first rank of every node writes it to ``--json-out`` (written
whole, then renamed into place).

Before the document is written, every suspect is timed again (the rule is in
:mod:`fstrain.core.bench.report`): rank 0 decides what to re-time from the gathered results and
broadcasts it, so every rank takes part in the same operations. Rank 0 prints what is being
timed, n of m, on stderr (``fstrain bench`` shows it on the user's stderr).

Exit codes: 0 done, 2 bad arguments (one ``error:`` line on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from fstrain.bench.collectives import time_collective
from fstrain.bench.compute import (
    CPU_HOST_ADAMW_ELEMENTS,
    HOST_ADAMW_ELEMENTS,
    cpu_adamw_params_per_s,
    gemm_tflops,
    matmul_tflops,
    memory_bandwidth_gbps,
)
from fstrain.bench.pairs import time_pairs
from fstrain.core.bench.arithmetic import COLLECTIVES, format_size, parse_size, parse_sizes, parse_suites
from fstrain.core.bench.gemm import (
    CPU_GRID_TOP,
    CPU_MAX_GEMM_FLOPS,
    GPU_GRID_TOP,
    default_grid,
    parse_flops,
    parse_shapes,
)
from fstrain.core.bench.pairs import MAX_RETIMES, link_table, retime_links
from fstrain.core.bench.report import SCHEMA, compute_stragglers, slow_groups
from fstrain.core.plan.gemmshapes import GemmShape
from fstrain.errors import FstrainError

DEFAULT_SIZES = {"nccl": "1M-1G", "gloo": "64K-16M"}
"""Bandwidth sizes per backend: gloo moves bytes through the CPU and TCP, 1 GiB takes seconds."""
DEFAULT_PAIR_BYTES = {"nccl": "256M", "gloo": "16M"}
QUICK_SIZES = {"nccl": "16M,256M", "gloo": "1M,8M"}
"""``--quick`` (``fstrain doctor --bench``): two sizes, all_reduce and all_gather, three pair samples."""
LATENCY_SIZES = (8, 1 << 10, 1 << 16)
"""Small messages timed besides the bandwidth sizes: their time is the collective's latency."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fstrain.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="all", help="compute, collectives, pairs, all, or a comma list")
    parser.add_argument("--json-out", type=Path, required=True, help="where rank 0 writes the JSON document")
    parser.add_argument("--sizes", default="", help="message sizes, e.g. 1M-1G (x2 steps), 1M-1G:4, 1M,64M")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="",
                        help="default: nccl with CUDA, gloo without")
    parser.add_argument("--collectives", default=",".join(COLLECTIVES), help="comma list of collectives to time")
    parser.add_argument("--seconds", type=float, default=0.5, help="time budget per collective and size")
    parser.add_argument("--compute-seconds", type=float, default=3.0, help="seconds per compute measurement")
    parser.add_argument("--cpu-adamw-elements", type=int, default=0,
                        help="fp32 parameters of the host AdamW measurement (default 2**24, 2**22 on CPUs)")
    parser.add_argument("--gemm-shapes", default="",
                        help="GEMMs the compute suite times, MxNxK=label;... (default: the default grid)")
    parser.add_argument("--gemm-model", default="", help="JSON saying which model the shapes are of (recorded)")
    parser.add_argument("--gemm-dtype", choices=("auto", "bf16", "fp16", "fp32"), default="auto",
                        help="auto: bf16 on a GPU; on a CPU bf16 where it is faster than float32, else float32")
    parser.add_argument("--gemm-seconds", type=float, default=0.25, help="seconds per GEMM shape")
    parser.add_argument("--max-gemm-flops", default="",
                        help=f"skip GEMMs over this many FLOPs (default: none on GPUs, {CPU_MAX_GEMM_FLOPS:g} on CPUs)")
    parser.add_argument("--no-gemm", action="store_true", help="the compute suite without the GEMM-shape sweep")
    parser.add_argument("--pair-bytes", default="", help="bytes each pair transfer moves (default 256M nccl, 16M gloo)")
    parser.add_argument("--pair-samples", type=int, default=5, help="timed transfers per link")
    parser.add_argument("--pairs-mode", choices=("auto", "all", "ring"), default="auto",
                        help="every ordered pair (n-1 rounds) or a ring and its reverse (2 rounds)")
    parser.add_argument("--no-latency", action="store_true", help="skip the small-message latency sizes")
    parser.add_argument("--quick", action="store_true",
                        help="a short run: two sizes, all_reduce and all_gather, 3 samples per link")
    parser.add_argument("--scopes", default="world,intra,inter",
                        help="groups to time collectives over: world, intra (each node), inter (across nodes)")
    return parser


def init(backend: str) -> tuple[str, torch.device]:
    """Join torchrun's process group (or a world of one on loopback); the backend and device."""
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise FstrainError("--backend nccl needs CUDA, and torch sees no GPU", "use --backend gloo",
                               where="--backend")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if "MASTER_ADDR" not in os.environ:
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0",
                           "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    device_id = device if device.type == "cuda" else None
    dist.init_process_group(backend=backend, timeout=timedelta(minutes=10), device_id=device_id)
    return backend, device


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def describe_ranks() -> list[dict[str, Any]]:
    """Every rank's place: node (torchrun's GROUP_RANK, else the host name), local rank, host."""
    me = {
        "rank": dist.get_rank(),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "node_rank": int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "-1"))),
        "hostname": os.environ.get("FSTRAIN_BENCH_NODE_NAME") or socket.gethostname(),
    }
    gathered: list[dict[str, Any] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, me)
    ranks = [r for r in gathered if r is not None]
    for r in ranks:
        r["node"] = r["hostname"] if r["node_rank"] < 0 else f"{r['node_rank']}:{r['hostname']}"
    return ranks


def node_groups(ranks: list[dict[str, Any]]) -> list[list[int]]:
    """Global ranks per node, nodes in order of their lowest rank."""
    nodes: dict[str, list[int]] = {}
    for r in sorted(ranks, key=lambda r: r["rank"]):
        nodes.setdefault(r["node"], []).append(r["rank"])
    return list(nodes.values())


def node_names(leaders: list[dict[str, Any]]) -> list[str]:
    """One name per node: its host name, or ``node_rank:hostname`` where host names repeat."""
    hostnames = [r["hostname"] for r in leaders]
    if len(set(hostnames)) == len(hostnames):
        return hostnames
    return [r["node"] for r in leaders]


def progress(text: str) -> None:
    """One line on stderr from rank 0: what is being timed now."""
    if dist.get_rank() == 0:
        print(f"[fstrain.bench] {text}", file=sys.stderr, flush=True)


def decided(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (what to re-time is decided once, and alike everywhere)."""
    shared = [value if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


def run_compute_confirmed(device_kind: str, seconds: float, adamw_elements: int = 0) -> dict[str, Any]:
    """Compute on every rank; when a rank is a straggler, every rank once more (same conditions)."""
    progress(f"compute: matmul, memory copy and host AdamW on every rank, {3 * seconds:g} s")
    compute = run_compute(device_kind, seconds, adamw_elements)
    if decided(sorted(compute_stragglers(compute["per_rank"]))):
        progress(f"compute: re-timing every rank, stragglers in the first pass, {3 * seconds:g} s")
        compute["retime"] = run_compute(device_kind, seconds, adamw_elements)["per_rank"]
    return compute


def run_compute(device_kind: str, seconds: float, adamw_elements: int = 0) -> dict[str, Any]:
    # Each rank its own GPU, also when the collectives run over gloo (which set no device).
    local_gpu = int(os.environ.get("LOCAL_RANK", "0")) % max(1, torch.cuda.device_count())
    device = torch.device("cuda", local_gpu) if device_kind == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        matmul = matmul_tflops(device, torch.bfloat16, seconds=seconds)
        name = torch.cuda.get_device_name(device)
    else:
        # bf16 matmuls on most CPUs run through a slow emulation: float32 says what a CPU can do.
        matmul = matmul_tflops(device, torch.float32, seconds=seconds)
        name = platform.processor() or platform.machine()
    copy = memory_bandwidth_gbps(device, seconds=seconds)
    elements = adamw_elements or (HOST_ADAMW_ELEMENTS if device.type == "cuda" else CPU_HOST_ADAMW_ELEMENTS)
    host_adamw = cpu_adamw_params_per_s(seconds, elements)  # every rank at once, as offloaded training runs it
    mine = {"rank": dist.get_rank(), "device": str(device), "device_name": name, "matmul": matmul, "memory": copy,
            "cpu_adamw": host_adamw}
    gathered: list[dict[str, Any] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return {"per_rank": [g for g in gathered if g is not None]}


GEMM_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def gemm_dtype(choice: str, device: torch.device) -> tuple[torch.dtype, dict[str, float]]:
    """The sweep's dtype and, for ``auto`` on a CPU, the two rates it was chosen by (bf16 on most
    CPUs runs through a slow emulation; on one with AMX or AVX512-BF16 it is the faster)."""
    if choice != "auto":
        return GEMM_DTYPES[choice], {}
    if device.type == "cuda":
        return torch.bfloat16, {}
    rates = {name: gemm_tflops(device, GEMM_DTYPES[name], 256, 256, 256, 0.05, warmup=1)["tflops"]["median"]
             for name in ("fp32", "bf16")}
    return (torch.bfloat16 if rates["bf16"] > rates["fp32"] else torch.float32), rates


def gemm_shapes(args: argparse.Namespace, device_kind: str) -> tuple[list[GemmShape], float | None]:
    """The shapes to time and the FLOPs cap (checked before anything starts)."""
    shapes = parse_shapes(args.gemm_shapes) if args.gemm_shapes else \
        default_grid(GPU_GRID_TOP if device_kind == "cuda" else CPU_GRID_TOP)
    if args.max_gemm_flops:
        return shapes, parse_flops(args.max_gemm_flops)
    return shapes, (None if device_kind == "cuda" else CPU_MAX_GEMM_FLOPS)


def run_gemm(args: argparse.Namespace, device_kind: str) -> dict[str, Any]:
    """Every rank times every shape at once (as in training, every GPU busy); rank 0 chooses the dtype."""
    local_gpu = int(os.environ.get("LOCAL_RANK", "0")) % max(1, torch.cuda.device_count())
    device = torch.device("cuda", local_gpu) if device_kind == "cuda" else torch.device("cpu")
    shapes, cap = gemm_shapes(args, device_kind)
    dtype, probe = decided(gemm_dtype(args.gemm_dtype, device) if dist.get_rank() == 0 else None)
    timed = [s for s in shapes if cap is None or s.flops <= cap]
    points, out_of_memory = [], []
    for index, shape in enumerate(timed, 1):
        progress(f"compute: GEMM {shape.m}x{shape.n}x{shape.k} {str(dtype).removeprefix('torch.')} "
                 f"({index} of {len(timed)})")
        try:
            timing = gemm_tflops(device, dtype, shape.m, shape.n, shape.k, args.gemm_seconds)
        except (torch.cuda.OutOfMemoryError, MemoryError):  # a head's GEMM on a small GPU: the other shapes stand
            out_of_memory.append(shape.__dict__)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        points.append({**timing, "label": shape.label})
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    mine = {"rank": dist.get_rank(), "device": str(device), "device_name": name, "points": points,
            "out_of_memory": out_of_memory}
    gathered: list[dict[str, Any] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return {
        "grid": "model" if args.gemm_shapes else "default",
        "model": json.loads(args.gemm_model) if args.gemm_model else None,
        "dtype": str(dtype).removeprefix("torch."),
        "dtype_probe_tflops": probe,
        "max_gemm_flops": cap,
        "skipped": [{**shape.__dict__, "flops": shape.flops} for shape in shapes if shape not in timed],
        "per_rank": [g for g in gathered if g is not None],
    }


def run_collectives(
    args: argparse.Namespace, sizes: list[int], device: torch.device, groups: list[list[int]]
) -> dict[str, Any]:
    names = [c.strip() for c in args.collectives.split(",") if c.strip()]
    bad = [c for c in names if c not in COLLECTIVES]
    if bad:
        raise FstrainError(f"unknown collective {', '.join(bad)}", f"use {', '.join(COLLECTIVES)}",
                           where="--collectives")
    all_sizes = sorted(set(sizes) | (set() if args.no_latency else set(LATENCY_SIZES)))
    scopes: list[dict[str, Any]] = []
    wanted = {s.strip() for s in args.scopes.split(",") if s.strip()}
    world = dist.get_world_size()
    plan: list[tuple[str, list[list[int]]]] = [("world", [list(range(world))])] if "world" in wanted else []
    if len(groups) > 1 and "intra" in wanted and max(len(g) for g in groups) > 1:
        plan.append(("intra_node", groups))
    # Across nodes: local rank k of every node together; only where every node has as many ranks.
    if len(groups) > 1 and "inter" in wanted and min(len(g) for g in groups) > 1 and len({len(g) for g in groups}) == 1:
        plan.append(("inter_node", [list(ranks) for ranks in zip(*groups, strict=False)]))
    total, done = len(plan) * len(names) * len(all_sizes), 0
    for scope, members in plan:
        # Every rank creates every group, in the same order (torch.distributed requires it).
        handles = [None if len(m) == world else dist.new_group(m) for m in members]
        mine = next(i for i, m in enumerate(members) if dist.get_rank() in m)
        rows = []
        for collective in names:
            for size in all_sizes:
                done += 1
                progress(f"collectives: {scope} {collective} {format_size(size)} ({done} of {total})")
                row = time_collective(collective, size, device=device, group=handles[mine], seconds=args.seconds)
                row["scope"] = scope
                row["latency_size"] = size in LATENCY_SIZES and size not in sizes
                rows.append(row)
        results = gather_groups(rows, members, mine)
        entry: dict[str, Any] = {"scope": scope, "groups": members, "results": results}
        suspects = decided(slow_groups(results)) if scope == "intra_node" else {}
        if suspects:
            # A node whose own collective is slow: that collective at the largest size, on every
            # node at once as in the first pass, before the node is named.
            progress(f"collectives: re-timing {', '.join(suspects)} at {format_size(max(all_sizes))} on every node")
            again = [{**time_collective(c, max(all_sizes), device=device, group=handles[mine],
                                        seconds=args.seconds), "scope": scope, "latency_size": False}
                     for c in suspects]
            entry["retime"] = gather_groups(again, members, mine)
        scopes.append(entry)
    return {"sizes": sizes, "latency_sizes": [] if args.no_latency else list(LATENCY_SIZES), "scopes": scopes}


def gather_groups(rows: list[dict[str, Any]], members: list[list[int]], mine: int) -> list[dict[str, Any]]:
    """Every group's rows (its first rank's), tagged with the group's index, on every rank."""
    per_group: list[list[dict[str, Any]] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(per_group, rows if dist.get_rank() == members[mine][0] else None)
    return [{**row, "group": i} for i, m in enumerate(members) for row in (per_group[m[0]] or [])]


def run_pairs(args: argparse.Namespace, pair_bytes: int, device: torch.device, leaders: list[int],
              names: list[str]) -> dict[str, Any]:
    """Every link, then the suspects and their yardsticks again (:func:`retime_links`); another
    re-time (up to ``MAX_RETIMES``) only for slow links the last one did not time."""

    def timed(links: list[tuple[int, int]] | None, what: str) -> list[dict[str, Any]]:
        return time_pairs(leaders, names, pair_bytes, device=device, mode=args.pairs_mode,
                          samples=args.pair_samples, links=links, progress=lambda text: progress(f"{what}: {text}"))

    first = timed(None, "pairs")
    records = list(first)
    retimes: list[dict[str, Any]] = []
    last: list[tuple[str, str]] = []
    for attempt in range(MAX_RETIMES):
        last = decided(retime_links(link_table(records), confirmed=last))
        if not last:
            break
        index = {name: i for i, name in enumerate(names)}
        again = timed([(index[src], index[dst]) for src, dst in last], f"pairs re-time {attempt + 1}")
        retimes.append({"links": again})
        records += again
    return {"size_bytes": pair_bytes, "size": format_size(pair_bytes), "mode": args.pairs_mode,
            "links": first, "retimes": retimes}


def run(args: argparse.Namespace) -> dict[str, Any]:
    suites = parse_suites(args.suite)
    gemm_shapes(args, "cpu")  # bad shapes or cap: one line before the process group starts
    backend, device = init(args.backend)
    if args.quick:
        args.collectives, args.pair_samples = "all_reduce,all_gather", min(args.pair_samples, 3)
    sizes = parse_sizes(args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)[backend])
    pair_bytes = parse_size(args.pair_bytes or DEFAULT_PAIR_BYTES[backend], where="--pair-bytes")
    ranks = describe_ranks()
    groups = node_groups(ranks)
    by_rank = {r["rank"]: r for r in ranks}
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "suites": suites,
        "backend": backend,
        "device_type": device.type,  # where collectives and pairs ran; compute records its own
        "world_size": dist.get_world_size(),
        "num_nodes": len(groups),
        "nodes": node_names([by_rank[g[0]] for g in groups]),
        "ranks": ranks,
        "torch_version": torch.__version__,
    }
    if "compute" in suites:
        device_kind = "cuda" if torch.cuda.is_available() else "cpu"
        document["compute"] = run_compute_confirmed(device_kind, args.compute_seconds, args.cpu_adamw_elements)
        if not args.no_gemm:
            document["compute"]["gemm"] = run_gemm(args, device_kind)
    if "collectives" in suites:
        document["collectives"] = run_collectives(args, sizes, device, groups)
    if "pairs" in suites:
        document["pairs"] = run_pairs(args, pair_bytes, device, [g[0] for g in groups], document["nodes"])
    return document


def write_document(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # nodes may share a file system
    tmp.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        document = run(args)
        # Every node's first rank writes the document: a launcher finds it on whichever node it
        # asks, whatever rank order the rendezvous chose.
        shared: list[Any] = [document if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(shared, src=0)
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            write_document(args.json_out, shared[0])
            print(f"[fstrain.bench] wrote {args.json_out}", flush=True)
        dist.barrier()
    except FstrainError as error:
        print(f"error: {error.one_line()}", file=sys.stderr)
        return error.exit_code
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0
